"""Starting the gateway as users do: the seed's ``python -m areal.gateway.server`` and
``areal serve gateway``, as real subprocesses on 127.0.0.1 (one gateway process each, some with the nano model's
engine beside it: light enough for the two-worker tier)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from areal.host.process import ServerProcess, pick_free_port, start_on_free_port, with_port
from areal.plugins.inference.embedded.server import InferenceServer

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(ROOT / "configs" / "router.yaml")
SEED_ROUTER = str(ROOT / "configs" / "taotoken_router.yaml")
SERVER = [sys.executable, "-m", "areal.gateway.server"]
CLI = [sys.executable, "-m", "areal", "serve", "gateway"]
KEY_LINE = re.compile(r"gateway key \(shown once[^)]*\): (\S+)")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No keys from the developer's shell: the gateway must make its own."""
    for name in ("AREAL_GATEWAY_KEY", "AREAL_ADMIN_TOKEN", "TAOTOKEN_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def models(url: str, key: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)


def serve(command: list[str], out: Path, timeout: float = 120) -> ServerProcess:
    """The gateway ``command`` started on a free port (``--port`` added), healthy; its output
    goes to ``out``."""
    return start_on_free_port(with_port(command), log_path=out, timeout=timeout, name="gateway")


def is_up(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=2)
    except httpx.TransportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.usefixtures("clean_env")
def test_seed_command_with_an_embedded_engine(gateway_model_dir: str, tmp_path: Path) -> None:
    command = [*SERVER, "--config", ROUTER, "--model", gateway_model_dir]
    command += ["--log-dir", str(tmp_path / "logs"), "--log-level", "info"]
    proc = serve(command, tmp_path / "gateway.out", timeout=180)
    assert proc.url is not None
    url = proc.url
    try:
        output = proc.output()  # this start's: one that lost its port printed its own key
        keys = KEY_LINE.findall(output)
        assert len(keys) == 1, output  # printed once
        key = keys[0]
        resp = models(url, key)
        assert resp.status_code == 200 and resp.json()["data"][0]["id"] == "areal-tiny"
        assert models(url, "not-the-key").status_code == 401
        engine = re.search(r"policy areal-tiny on (http://127\.0\.0\.1:\d+)", output)
        assert engine is not None, output
        assert is_up(engine.group(1))
    finally:
        code = proc.stop(timeout=20)
    assert code == 0, f"SIGTERM did not stop the gateway cleanly (exit {code})"
    assert not is_up(url) and not is_up(engine.group(1)), "the embedded engine outlived the gateway"
    assert key not in (tmp_path / "logs" / "gateway.log").read_text()


def test_areal_serve_gateway_with_an_engine_url(
    engine: tuple[str, InferenceServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AREAL_GATEWAY_KEY", "chosen-gateway-key-0123456789")
    monkeypatch.delenv("AREAL_ADMIN_TOKEN", raising=False)
    command = [*CLI, "--config", ROUTER, "--engine", engine[0], "--log-dir", str(tmp_path / "logs")]
    with serve(command, tmp_path / "gateway.out") as proc:
        assert proc.url is not None
        url = proc.url
        resp = models(url, "chosen-gateway-key-0123456789")
        assert resp.status_code == 200 and resp.json()["data"][0]["id"] == "areal-tiny"
        assert not KEY_LINE.search(proc.log_tail(200))  # a chosen key is not printed
        assert f"listening on {url}" in proc.output()  # said once bound
        code = proc.stop(timeout=20)
    assert code == 0, f"SIGTERM did not stop the gateway cleanly (exit {code})"
    assert "path=/v1/models" in (tmp_path / "logs" / "gateway.log").read_text()


def test_a_gateway_on_a_taken_port_says_so_and_never_that_it_listens(
    engine: tuple[str, InferenceServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AREAL_GATEWAY_KEY", "chosen-gateway-key-0123456789")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [*CLI, "--config", ROUTER, "--engine", engine[0], "--port", str(port)]
        command += ["--log-dir", str(tmp_path / "logs")]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "address already in use" in result.stderr and "listening on" not in result.stderr


def one_line_error(command: list[str]) -> str:
    """The one ``error:`` line a failed start prints, after its INFO lines; never a traceback."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


@pytest.mark.usefixtures("clean_env")
def test_seed_command_with_an_unreachable_engine_is_one_line() -> None:
    url = f"http://127.0.0.1:{pick_free_port()}"  # nothing listens there
    command = [sys.executable, "-m", "areal.gateway.server", "--engine", url]
    line = one_line_error([*command, "--port", str(pick_free_port())])
    assert line.startswith(f"error: the engine at {url} cannot be attached"), line


@pytest.mark.usefixtures("clean_env")
def test_a_bad_event_loop_choice_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_EVENT_LOOP", "trio")
    line = one_line_error([*SERVER, "--port", str(pick_free_port())])
    assert line.startswith("error: AREAL_EVENT_LOOP='trio' is not one of auto, uvloop, asyncio")


def seed_model_ids() -> list[str]:
    routing = yaml.safe_load(Path(SEED_ROUTER).read_text())["model_routing"]
    return [entry["model_id"] for entry in routing.values()]


@pytest.mark.usefixtures("clean_env")
def test_seed_command_starts_with_no_engine(
    engine: tuple[str, InferenceServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The article's first step as written: the gateway comes up with no engine, lists the routed
    models, answers the policy with 503 in schema until an engine is attached, then serves it."""
    monkeypatch.setenv("AREAL_GATEWAY_KEY", "seed-gateway-key-0123456789")
    monkeypatch.setenv("AREAL_ADMIN_TOKEN", "seed-admin-token-0123456789")
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-unused-upstream-key")
    command = [*SERVER, "--config", SEED_ROUTER, "--log-level", "info"]
    auth = {"Authorization": "Bearer seed-gateway-key-0123456789"}
    admin = {"Authorization": "Bearer seed-admin-token-0123456789"}
    policy, *_ = ids = seed_model_ids()
    with serve(command, tmp_path / "gateway.out") as proc:
        assert proc.url is not None
        url = proc.url
        listed = httpx.get(f"{url}/gateway/v1/models", headers=auth, timeout=10).json()["data"]
        assert sorted(m["id"] for m in listed) == sorted(ids)
        chat = {"model": policy, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        before = httpx.post(
            f"{url}/gateway/v1/chat/completions", json=chat, headers=auth, timeout=10
        )
        assert before.status_code == 503 and before.headers["Retry-After"]
        error = before.json()["error"]
        assert error["code"] == "no_engine" and "POST /rl/engines" in error["message"]
        attached = httpx.post(
            f"{url}/rl/engines", json={"url": engine[0]}, headers=admin, timeout=60
        )
        assert attached.status_code == 201, attached.text
        after = httpx.post(
            f"{url}/gateway/v1/chat/completions", json=chat, headers=auth, timeout=60
        )
        assert after.status_code == 200, after.text
        assert after.json()["usage"]["completion_tokens"] >= 1
        assert "no engine yet" in proc.log_tail(200)
        assert "event loop: uvloop" in proc.log_tail(200)  # areal.host.event_loop's default
        assert "heap: freed memory kept (glibc)" in proc.log_tail(200)  # areal.host.heap


@pytest.mark.usefixtures("clean_env")
def test_unset_key_variable_starts_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed router with TAOTOKEN_API_KEY unset: the gateway starts (the policy needs no key),
    says so in one warning, and a call routed to the upstream gets an error in the protocol's
    schema naming the variable; no secret reaches the output or gateway.log."""
    secrets = {
        "AREAL_GATEWAY_KEY": "gk-unset-test-0123456789",
        "AREAL_ADMIN_TOKEN": "adm-0123456789ab",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    for i, command in enumerate(
        ([*SERVER, "--config", SEED_ROUTER], [*CLI, "--config", SEED_ROUTER])
    ):
        logs = tmp_path / f"logs{i}"
        out = tmp_path / f"gateway{i}.out"
        with serve([*command, "--log-dir", str(logs)], out, timeout=60) as proc:
            assert proc.url is not None
            url = proc.url
            headers = {"Authorization": f"Bearer {secrets['AREAL_GATEWAY_KEY']}"}
            judge = {
                "model": "your-judge-model-id",
                "messages": [{"role": "user", "content": "hi"}],
            }
            chat = httpx.post(f"{url}/v1/chat/completions", json=judge, headers=headers, timeout=10)
            messages = httpx.post(
                f"{url}/v1/messages", json={**judge, "max_tokens": 8}, headers=headers, timeout=10
            )
            proc.stop(timeout=20)
        assert chat.status_code == 502, chat.text
        error = chat.json()["error"]
        assert error["code"] == "upstream_key_unset"
        assert "TAOTOKEN_API_KEY" in error["message"] and "taotoken.net" in error["message"]
        assert messages.status_code == 502 and messages.json()["type"] == "error"
        assert "TAOTOKEN_API_KEY" in messages.json()["error"]["message"]
        output = proc.output()  # a start that lost its port said "error:" and warned too
        warnings = [line for line in output.splitlines() if " WARNING " in line]
        assert len(warnings) == 1, output
        assert (
            "api_gateway.api_key: environment variable TAOTOKEN_API_KEY is not set" in warnings[0]
        )
        assert "Traceback" not in output and "error:" not in output
        gateway_log = (logs / "gateway.log").read_text()
        assert "model=your-judge-model-id route=taotoken.net status=502" in gateway_log
        for value in secrets.values():  # in no start's output
            assert value not in out.read_text() and value not in gateway_log


def test_help_is_light() -> None:
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from areal.cli.main import app\n"
        "result = CliRunner().invoke(app, ['serve', 'gateway', '--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "assert '--engine' in result.output and 'Example' in result.output\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
