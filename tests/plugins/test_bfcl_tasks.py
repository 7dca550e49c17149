"""The ``bfcl_multi_turn`` task set: BFCL's items as BFCL's own loader reads them, BFCL's checker in
the sandbox (ground truth passes, wrong calls fail), what the sandbox refuses (network, writes
outside its scratch directory, processes, the parent's environment), the agent's loop against a
scripted model, an episode through a real gateway and engine, and two steps of ``areal train``."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import areal
from areal.core.config import ConfigError
from areal.plugins.tasks import bfcl, bfcl_data
from areal.plugins.tasks.bfcl_sandbox import Sandbox
from areal.run.rollout import RolloutWorker
from support.engines import running_server
from support.gateway import running_gateway, trajectories

REPO = Path(__file__).parents[2]
# The smallest prompt of multi_turn_base with compact docs (~1,500 nano tokens, 3 user turns):
# it fits the tiny model's 4,096 positions with room for the turns.
SMALL_ITEM = "multi_turn_base_37"
ONE_PER_CATEGORY = [f"{c}_{n}" for c in bfcl_data.CATEGORIES for n in (0, 37)]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- the items, as BFCL reads them ---------------------------------------------------------------

BFCL_LOADER = """
import json, sys
from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry
out = {}
for category in sys.argv[1:]:
    truth = {g["id"]: g["ground_truth"] for g in load_ground_truth_entry(category)}
    for e in load_dataset_entry(category):
        e.setdefault("missed_function", {})  # ours has one, empty, outside miss_func
        out[e["id"]] = {**e, "ground_truth": truth[e["id"]]}
print(json.dumps(out))
"""


def test_items_are_what_bfcls_own_loader_gives(tmp_path: Path) -> None:
    # BFCL's loader writes file locks under its project root: a scratch one, in a process of its own.
    env = {**os.environ, "BFCL_PROJECT_ROOT": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", BFCL_LOADER, *bfcl_data.CATEGORIES],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    theirs = json.loads(done.stdout)
    ours = {i: e for c in bfcl_data.CATEGORIES for i, e in bfcl_data.entries(c).items()}
    assert len(ours) == 800
    assert ours == theirs


def test_tool_docs_become_openai_tools() -> None:
    item = bfcl_data.entry("multi_turn_base_0")
    tools = bfcl_data.openai_tools(item["function"])
    assert len(tools) == len(item["function"])
    (mv,) = [t["function"] for t in tools if t["function"]["name"] == "mv"]
    assert mv["parameters"]["type"] == "object"  # BFCL's "dict"
    assert mv["description"].endswith(bfcl_data.PYTHON_HINT)
    assert {p["type"] for p in mv["parameters"]["properties"].values()} == {"string"}
    compact = bfcl_data.openai_tools(item["function"], compact=True)
    assert "description" not in json.dumps(compact)
    assert [t["function"]["name"] for t in compact] == [t["function"]["name"] for t in tools]


def test_bfcls_constants_are_the_ones_mirrored() -> None:
    from bfcl_eval.constants.default_prompts import (
        DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
        MAXIMUM_STEP_LIMIT,
    )

    assert bfcl.MAX_STEPS_PER_TURN == MAXIMUM_STEP_LIMIT
    assert bfcl_data.MORE_FUNCTIONS_PROMPT == DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("cd", '{"folder": "a b"}', "cd(folder='a b')"),
        ("ls", "", "ls()"),
        ("ls", '{"a": true}', "ls(a=True)"),
        ("mv", '{"source": "x", "destination": null}', "mv(source='x',destination=None)"),
        ("touch", '{"file_name": "x\\")\\n__import__(\'os\')"}', None),  # stays one literal
    ],
)
def test_a_call_becomes_the_text_bfcl_evaluates(
    name: str, arguments: str, expected: str | None
) -> None:
    text = bfcl_data.call_string(name, arguments, ["cd", "ls", "mv", "touch"])
    if expected is not None:
        assert text == expected
    call = ast.parse(text, mode="eval").body
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
    assert all(isinstance(k.value, ast.Constant) for k in call.keywords)


@pytest.mark.parametrize(
    ("name", "arguments", "error"),
    [
        ("rm_rf", "{}", "no function named 'rm_rf'"),
        ("cd", '{"folder": ', "not valid JSON"),
        ("cd", '["x"]', "must be a JSON object"),
        ("cd", '{"folder=1,x": 2}', "not a parameter name"),
        ("cd", '{"class": 2}', "not a parameter name"),
    ],
)
def test_a_malformed_call_is_refused_with_a_message(name: str, arguments: str, error: str) -> None:
    with pytest.raises(bfcl_data.MalformedCall, match=error):
        bfcl_data.call_string(name, arguments, ["cd"])


# --- the task set and its options ----------------------------------------------------------------


def test_tasks_are_deterministic_and_visit_every_item_once_an_epoch() -> None:
    first = [bfcl.task(i, 0) for i in range(200)]
    assert first == [bfcl.task(i, 0) for i in range(200)]
    assert {t["bfcl_id"] for t in first} == set(bfcl_data.entries("multi_turn_base"))
    assert [t["bfcl_id"] for t in first[:20]] != [bfcl.task(i, 1)["bfcl_id"] for i in range(20)]
    assert {bfcl.task(i, 0)["bfcl_id"] for i in range(200, 400)} == {t["bfcl_id"] for t in first}


def test_options_choose_items_and_settings() -> None:
    chosen = bfcl.configure(
        {"category": "multi_turn_miss_func", "ids": [3, "multi_turn_miss_func_7"]}
    )
    assert chosen.name == bfcl.NAME and chosen.success_reward == 1.0
    assert {chosen.task(i, 0)["bfcl_id"] for i in range(4)} == {
        "multi_turn_miss_func_3",
        "multi_turn_miss_func_7",
    }
    one = bfcl.configure({"max_steps_per_turn": 3, "tool_docs": "compact", "max_tokens": 9})
    assert one.task(0, 0)["max_steps_per_turn"] == 3
    assert one.task(0, 0)["tool_docs"] == "compact" and one.task(0, 0)["max_tokens"] == 9


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"categroy": "x"}, "dataset.options.categroy"),
        ({"category": "simple_python"}, "dataset.options.category"),
        ({"ids": ["multi_turn_base_9999"]}, "dataset.options.ids"),
        ({"ids": "multi_turn_base_1"}, "dataset.options.ids"),
        ({"max_steps_per_turn": 0}, "dataset.options.max_steps_per_turn"),
        ({"tool_docs": "short"}, "dataset.options.tool_docs"),
        ({"max_tokens": True}, "dataset.options.max_tokens"),
    ],
)
def test_a_wrong_option_names_itself(options: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        bfcl.configure(options)


# --- (a) the sandbox ------------------------------------------------------------------------------


@pytest.mark.parametrize("bfcl_id", ONE_PER_CATEGORY)
def test_bfcls_checker_passes_the_ground_truth_and_fails_wrong_calls(bfcl_id: str) -> None:
    item = bfcl_data.entry(bfcl_id)
    truth = item["ground_truth"]

    async def verdicts() -> tuple[Any, Any, Any]:
        async with await Sandbox.open(item) as box:
            right = await box.check([[turn] if turn else [] for turn in truth], truth)
            # The last turn that does something, left undone: its state is not the truth's.
            last = max(i for i, turn in enumerate(truth) if turn)
            short = [[turn] if turn and i != last else [] for i, turn in enumerate(truth)]
            missing = await box.check(short, truth)
            lost = await box.check([[["ls()"]] if turn else [] for turn in truth], truth)
        return right, missing, lost

    right, missing, lost = run(verdicts())
    assert right.valid, right
    assert not missing.valid and missing.error_type.startswith("multi_turn:")
    assert not lost.valid


def execute(item_id: str, *calls: str) -> tuple[list[str], Path, str]:
    """Run ``calls`` (BFCL's Python text) in a fresh sandbox; its results, scratch dir, and how
    it was confined."""

    async def go() -> tuple[list[str], Path, str]:
        async with await Sandbox.open(bfcl_data.entry(item_id)) as box:
            return await box.execute(list(calls)), box.scratch, box.isolation.name

    result: tuple[list[str], Path, str] = run(go())
    return result


def test_the_sandbox_has_no_network() -> None:
    connect = "__import__('socket').create_connection(('1.1.1.1', 53), 5)"
    raw = "__import__('socket').socket().connect(('8.8.8.8', 53))"
    (by_name, by_address, interfaces), _, how = execute(
        SMALL_ITEM, connect, raw, "open('/proc/self/net/dev').read()"
    )
    assert by_name.startswith("Error during execution: sandbox: socket.")
    assert by_address.startswith("Error during execution: sandbox: socket.")
    if os.geteuid() == 0:
        assert how == "netns+nobody"
    if how != "audit-hook":  # the kernel's wall behind the hook: only a loopback exists
        names = [line.split(":")[0].strip() for line in interfaces.splitlines()[2:]]
        assert names == ["lo"], interfaces


def test_the_sandbox_writes_only_in_its_scratch_dir(tmp_path: Path) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("mine")
    outside = tmp_path / "outside.txt"
    results, scratch, _ = execute(
        SMALL_ITEM,
        f"open({str(outside)!r}, 'w').write('x')",
        f"__import__('os').rename({str(kept)!r}, 'stolen.txt')",
        f"__import__('shutil').rmtree({str(tmp_path)!r})",
        "open('/tmp/areal-bfcl-escape.txt', 'a')",
        "open('inside.txt', 'w').write('in')",
        "__import__('os').getcwd()",
    )
    *refused, wrote, cwd = results
    assert all(r.startswith("Error during execution: sandbox:") for r in refused), refused
    assert not outside.exists() and kept.read_text() == "mine"
    assert not Path("/tmp/areal-bfcl-escape.txt").exists()
    assert wrote == "2" and cwd == str(scratch)
    assert not scratch.exists()  # removed with the sandbox


def test_the_sandbox_starts_no_process_and_sees_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_TEST_SECRET", "s3cret")
    results, _, _ = execute(
        SMALL_ITEM,
        "__import__('os').system('true')",
        "__import__('os').fork()",
        "__import__('os').environ.get('AREAL_TEST_SECRET')",
        "sorted(__import__('os').environ)",
    )
    assert results[0].startswith("Error during execution: sandbox: os.system")
    assert results[1].startswith("Error during execution: sandbox: os.fork")
    assert results[2] == "None"
    assert "AREAL_TEST_SECRET" not in results[3]


def test_the_tools_keep_their_state_across_calls() -> None:
    results, _, _ = execute(SMALL_ITEM, "pwd()", "mkdir(dir_name='made')", "ls()")
    assert "made" in results[2]


# --- the agent's loop, against a scripted model -------------------------------------------------


class ScriptedClient:
    """An ``openai.AsyncOpenAI`` stand-in that answers each call with the next scripted reply (a
    list of ``(name, arguments)`` calls, or text), built as the SDK's own response objects."""

    def __init__(self, replies: list[list[tuple[str, dict[str, Any] | str]] | str]) -> None:
        self.replies = iter(replies)
        self.requests: list[dict[str, Any]] = []
        self.chat = self
        self.completions = self

    async def create(self, **request: Any) -> Any:
        from openai.types.chat import ChatCompletion

        self.requests.append(json.loads(json.dumps(request)))
        reply = next(self.replies, "done")
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if isinstance(reply, str):
            message["content"] = reply
        else:
            message["tool_calls"] = [
                {
                    "id": f"call_{len(self.requests)}_{i}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
                for i, (name, args) in enumerate(reply)
            ]
        return ChatCompletion.model_validate(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": request["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
            }
        )


def as_tool_calls(item: dict[str, Any], calls: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """BFCL's ground-truth Python calls as a model's tool calls: positional arguments named by
    the tool class's own signature."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    methods: dict[str, Any] = {}
    for name in item["involved_classes"]:
        module = __import__(CLASS_FILE_PATH_MAPPING[name], fromlist=[name])
        methods.update(inspect.getmembers(getattr(module, name), inspect.isfunction))
    out = []
    for text in calls:
        call = ast.parse(text, mode="eval").body
        assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
        params = [p for p in inspect.signature(methods[call.func.id]).parameters if p != "self"]
        args = {params[i]: ast.literal_eval(a) for i, a in enumerate(call.args)}
        args.update({k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg})
        out.append((call.func.id, args))
    return out


def ground_truth_script(item: dict[str, Any]) -> list[Any]:
    """Each turn: all its ground-truth calls in one reply, then a text reply ending the turn."""
    script: list[Any] = []
    for turn in item["ground_truth"]:
        if turn:
            script.append(as_tool_calls(item, turn))
        script.append("done")
    return script


def play(bfcl_id: str, script: list[Any], max_calls: int = 100, **options: Any) -> Any:
    task = bfcl.configure({"category": bfcl_id.rsplit("_", 1)[0], "ids": [bfcl_id], **options})
    client = ScriptedClient(script)
    outcome = run(bfcl.play(client, "policy", task.task(0, 0), max_calls))
    return outcome, client


@pytest.mark.parametrize("bfcl_id", ["multi_turn_base_0", "multi_turn_long_context_3"])
def test_an_agent_making_the_ground_truths_calls_scores_one(bfcl_id: str) -> None:
    item = bfcl_data.entry(bfcl_id)
    outcome, client = play(bfcl_id, ground_truth_script(item))
    assert outcome.verdict is not None and outcome.verdict.valid, outcome.verdict
    assert outcome.reward == 1.0 and outcome.malformed == 0 and not outcome.stopped
    made = [[as_tool_calls(item, step) for step in turn] for turn in outcome.model_calls]
    truth = [[as_tool_calls(item, turn)] if turn else [] for turn in item["ground_truth"]]
    assert made == truth
    first = client.requests[0]
    assert first["messages"] == item["question"][0]
    assert first["tools"] == bfcl_data.openai_tools(item["function"])
    tool_messages = [m for m in client.requests[1]["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == len(item["ground_truth"][0])


def test_the_held_out_function_arrives_at_its_turn() -> None:
    bfcl_id = "multi_turn_miss_func_0"
    item = bfcl_data.entry(bfcl_id)
    ((turn, held),) = item["missed_function"].items()
    outcome, client = play(bfcl_id, ground_truth_script(item))
    assert outcome.reward == 1.0, outcome.verdict
    offered = [{t["function"]["name"] for t in r["tools"]} for r in client.requests]
    names = {d["name"] for d in held}
    assert not names & offered[0] and names <= offered[-1]
    user = [m for m in client.requests[-1]["messages"] if m["role"] == "user"]
    assert user[int(turn)]["content"] == bfcl_data.MORE_FUNCTIONS_PROMPT


def test_a_malformed_call_is_counted_and_answered_with_an_error() -> None:
    script = [[("nope", {}), ("cd", "{not json"), ("pwd", {})], "done"]
    outcome, client = play(SMALL_ITEM, script)
    assert outcome.malformed == 2
    answers = [m for m in client.requests[1]["messages"] if m["role"] == "tool"]
    assert answers[0]["content"] == "Error: there is no function named 'nope'."
    assert answers[1]["content"].startswith("Error: the arguments of cd are not valid JSON")
    assert "current_working_directory" in answers[2]["content"]
    assert outcome.model_calls[0] == [["pwd()"]]  # only what ran reaches BFCL's checker
    assert outcome.verdict is not None and outcome.reward == 0.0  # the turns' work is not done


def test_too_many_steps_in_a_turn_end_the_episode() -> None:
    outcome, client = play(SMALL_ITEM, [[("pwd", {})]] * 5, max_steps_per_turn=2)
    assert outcome.stopped == "step_limit" and len(client.requests) == 3
    assert outcome.verdict is None and outcome.reward == 0.0


def test_the_call_budget_ends_the_episode() -> None:
    outcome, client = play(SMALL_ITEM, ["done"] * 5, max_calls=2)
    assert outcome.stopped == "call_budget" and len(client.requests) == 2
    assert outcome.reward == 0.0


# --- (b) an episode through a real gateway and engine -----------------------------------------


@pytest.fixture
def gateway(hub_source_dir: Path, tmp_path: Path) -> Iterator[Any]:
    with (
        running_server(str(hub_source_dir), max_total_tokens=16384) as server,
        running_gateway(server.url, server.server, tmp_path) as gw,
    ):
        yield gw


def test_episodes_through_a_real_gateway_are_recorded_and_scored(gateway: Any) -> None:
    chosen = bfcl.configure(
        {"ids": [SMALL_ITEM], "tool_docs": "compact", "max_steps_per_turn": 2, "max_tokens": 16}
    )
    worker = RolloutWorker(
        gateway.url, gateway.admin, bfcl.agent, model=gateway.model, concurrency=2, max_turns=8
    )
    stats = run(worker.run([{**chosen.task(i, 0), "task_index": i} for i in range(2)]))
    assert (stats.finished, stats.failed, stats.timed_out) == (2, 0, 0)
    assert set(stats.rewards) <= {0.0, 1.0}
    recorded = trajectories(gateway.log_dir)
    assert len(recorded) == 2
    for t in recorded:
        assert t.reward in (0.0, 1.0)
        # At least 3 model calls: one per user turn of the item, or 3 replies with calls in a
        # turn (the step limit of 2 passed), whichever came first.
        assert t.completions >= 3 and all(c.output_ids for c in t.turns)


# --- (c) two steps of `areal train` -----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.serial
def test_areal_train_runs_two_steps_on_bfcl(tmp_path: Path) -> None:
    env = dict(os.environ)
    # The subprocesses run the areal under test, wherever it is imported from.
    src = str(Path(areal.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    options = f"{{ids: [{SMALL_ITEM}], tool_docs: compact, max_steps_per_turn: 1, max_tokens: 8}}"
    sets = {
        "dataset.name": "bfcl_multi_turn",
        "dataset.options": options,
        "agent.max_turns": 4,
        "warm_start.steps": 0,
        "model.init_tiny": "nano",
        "algorithm.group_size": 2,
        "async.trigger_batch_size": 2,
        "train.global_batch_size": 2,
        "train.mini_batch_size": 2,
        "agent.concurrency": 2,
        "sampling.max_new_tokens": 8,
        "inference.max_total_tokens": 16384,
        "train.max_steps": 2,
        "model.path": str(tmp_path / "model"),
        "logging.log_dir": str(tmp_path / "logs"),
    }
    command = [sys.executable, "-m", "areal", "train", str(REPO / "configs" / "quickstart.yaml")]
    for key, value in sets.items():
        command += ["--set", f"{key}={value}"]
    command += ["--output-dir", str(tmp_path / "out")]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = (tmp_path / "logs" / "train.log").read_text().splitlines()
    trained = [line for line in lines if line.startswith("[train] ")]
    assert [line.split()[1] for line in trained] == ["step=1", "step=2"]
    for line in trained:  # the samples hold BFCL's prompt: the item's tools and first turn
        fields = dict(f.split("=", 1) for f in line.split()[1:])
        assert float(fields["tokens"]) / int(fields["updated"]) > 1400, line
    assert "done: 2 steps, version 2" in done.stdout + done.stderr


def test_the_task_set_is_registered_with_its_agent_and_options() -> None:
    from areal.core.tasks import task_set

    found = task_set(bfcl.NAME)
    assert found.agent == "areal.plugins.tasks.bfcl:agent"
    assert found.configure is bfcl.configure and found.success_reward == 1.0
    assert found.task(5, 0) == bfcl.task(5, 0)


def test_a_sandbox_whose_parent_is_gone_exits_and_removes_its_scratch_dir() -> None:
    from support.wait import eventually

    async def orphan() -> tuple[Path, int]:
        box = await Sandbox.open(bfcl_data.entry(SMALL_ITEM))
        assert box.proc.stdin is not None
        box.proc.stdin.close()  # what the child sees when the rollout worker is killed
        return box.scratch, await box.proc.wait()

    scratch, code = run(orphan())
    assert code == 0
    eventually(lambda: not scratch.exists(), 30, "the orphaned sandbox's scratch dir removed")
