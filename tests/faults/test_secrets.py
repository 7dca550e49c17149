"""No secret in anything a run leaves behind: a whole ``areal train`` run (the quickstart, shrunk,
real processes) whose rewards come from a judge model through the gateway's upstream channel,
paid for with a recognisable upstream key that the stand-in upstream echoes back in its error
answers (as some providers do); then every file under the run's folder (logs, checkpoints,
trajectories, metrics, TensorBoard events; binary files too, as bytes) and the stdout/stderr of
every process is searched for the key, for the run's own admin token and gateway key (read from
the gateway's environment while it runs), and for the variables' names' values: 0 hits."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from aiohttp import web

from areal.host.http_server import ServerThread
from support import eventually
from support.runs import small

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
STEPS, BATCH = 2, 8
# The quickstart, made small: a step every 8 episodes.
SMALL = (
    *small(BATCH),
    # An agent that returns its answer as text, so the judge scores it through the channel.
    "agent.entrypoint=agent:solve",  # examples/openai_math/agent.py, on PYTHONPATH below
    "agent.max_turns=1",
    "agent.reward_source=judge",
    "logging.save_interval=1",  # a checkpoint per step: they are searched too
)


class JudgeUpstream:
    """A hosted judge model: scores every answer 7, but first answers each fourth call with a
    500 and each seventh with a 429, both quoting the key it was sent."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.calls = 0
        self.keyed = 0  # calls that carried the key

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls += 1
        presented = request.headers.get("Authorization", "")
        self.keyed += presented == f"Bearer {self.key}"
        if self.calls % 4 == 0 or self.calls % 7 == 0:
            status = 500 if self.calls % 4 == 0 else 429
            message = f"trouble with key {presented[7:]}; retry"
            headers = {"Retry-After": "0"} if status == 429 else {}
            return web.json_response(
                {"error": {"message": message}}, status=status, headers=headers
            )
        message = {"role": "assistant", "content": "7"}
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        )


def gateway_secrets(run: psutil.Process, found: dict[str, str]) -> None:
    """The admin token and gateway key the run gave its gateway (it makes them up per run)."""
    for proc in run.children(recursive=True):
        try:
            if "areal.gateway.server" in " ".join(proc.cmdline()):
                env = proc.environ()
                for name in ("AREAL_ADMIN_TOKEN", "AREAL_GATEWAY_KEY"):
                    if env.get(name):
                        found[name] = env[name]
        except psutil.Error:
            continue


def hits(path: Path, needles: dict[str, bytes]) -> list[str]:
    data = path.read_bytes()
    return [name for name, needle in needles.items() if needle in data]


@pytest.mark.slow
@pytest.mark.serial
def test_a_whole_run_leaves_no_secret_anywhere(tmp_path: Path) -> None:
    out, captured = tmp_path / "run", tmp_path / "captured"
    captured.mkdir()
    key_var = "AREAL_TEST_KEY_" + secrets.token_hex(4).upper()
    upstream_key = "AREALTESTSECRET" + secrets.token_hex(16)  # no sk- prefix: no pattern hides it
    judge = JudgeUpstream(upstream_key)
    up = ServerThread(judge.app(), "127.0.0.1", 0).start()
    router = tmp_path / "router.yaml"
    router.write_text(
        "api_gateway:\n"
        f"  base_url: {up.url}/v1\n"
        f"  api_key: ${{{key_var}}}\n"
        "  retry_backoff: 0.01\n"
        "model_routing:\n"
        "  judge_model: {model_id: judge-1, temperature: 0.0, max_tokens: 8}\n"
    )
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "examples" / "openai_math")])
    env = {**os.environ, "PYTHONPATH": path, key_var: upstream_key}
    env.pop("AREAL_ADMIN_TOKEN", None)
    env.pop("AREAL_GATEWAY_KEY", None)
    logs = out / "logs"
    command = [sys.executable, "-m", "areal", "train", str(QUICKSTART), "--output-dir", str(out)]
    for override in (
        f"train.max_steps={STEPS}",
        f"logging.log_dir={logs}",
        f"model.path={out / 'model'}",
        f"agent.gateway_config={router}",
        *SMALL,
    ):
        command += ["--set", override]
    found: dict[str, str] = {}
    with (captured / "stdout").open("wb") as stdout, (captured / "stderr").open("wb") as stderr:
        proc = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=stdout, stderr=stderr)
        run = psutil.Process(proc.pid)

        def read_or_ended() -> bool:
            gateway_secrets(run, found)
            return len(found) == 2 or proc.poll() is not None

        try:
            eventually(read_or_ended, 240, "the gateway's secrets in its environment")
            proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            up.stop()
    outputs = (captured / "stdout").read_text(errors="replace")
    outputs += (captured / "stderr").read_text(errors="replace")
    assert proc.returncode == 0, outputs[-3000:]
    assert judge.keyed >= BATCH * STEPS, (judge.calls, judge.keyed)  # the key was used
    assert set(found) == {"AREAL_ADMIN_TOKEN", "AREAL_GATEWAY_KEY"}, found

    files = [p for p in [*out.rglob("*"), *captured.iterdir()] if p.is_file()]
    names = {p.name for p in files}
    # What the search covers: each process's output, the gateway's log, the metrics, the
    # trained trajectories' audit, checkpoints, and TensorBoard's events when it is installed.
    assert {"gateway.out", "gateway.log", "rollout0.log", "metrics.jsonl", "stdout"} <= names
    assert any(p.name == "trained.jsonl" for p in files), sorted(names)
    assert any(p.suffix == ".safetensors" for p in files), sorted(names)  # a checkpoint
    if importlib.util.find_spec("tensorboard") is not None:
        assert any(p.name.startswith("events.out.tfevents") for p in files), sorted(names)
    assert "upstream=" in (logs / "gateway.log").read_text()  # judge calls went the channel
    retried = [
        line for line in (logs / "gateway.log").read_text().splitlines() if "retries=1" in line
    ]
    assert retried, "the stand-in's key-quoting errors were never met"
    needles: dict[str, bytes] = {
        "upstream key": upstream_key.encode(),
        "upstream key, half": upstream_key[len(upstream_key) // 2 :].encode(),
        **{name: value.encode() for name, value in found.items()},
    }
    leaks = {str(p.relative_to(tmp_path)): hits(p, needles) for p in files}
    assert {p: h for p, h in leaks.items() if h} == {}
    assert len(files) > 10


def test_the_stand_in_quotes_the_key() -> None:
    """(The secrets test would pass vacuously if its upstream never put the key in a body.)"""
    judge = JudgeUpstream("k-123")

    async def call() -> list[dict[str, Any]]:
        import aiohttp

        runner = web.AppRunner(judge.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        answers = []
        async with aiohttp.ClientSession() as http:
            for _ in range(4):
                async with http.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={"model": "j"},
                    headers={"Authorization": "Bearer k-123"},
                ) as resp:
                    answers.append({"status": resp.status, "body": await resp.json()})
        await runner.cleanup()
        return answers

    answers = asyncio.run(call())
    assert answers[3]["status"] == 500 and "k-123" in answers[3]["body"]["error"]["message"]
