"""``areal serve inference`` as the run supervisor starts it: the real CLI in its own process,
built by :func:`build_command` and managed by :class:`ServerProcess`."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from areal.host.process import (
    ServerExitedError,
    ServerProcess,
    pick_free_port,
    start_on_free_port,
)
from areal.plugins.inference.embedded.launcher import EmbeddedServerConfig, build_command
from support import eventually

STARTUP_S = 90  # the ceiling for loading torch and the tokenizer; a healthy start takes seconds


def _config(model_path: str, port: int) -> EmbeddedServerConfig:
    return EmbeddedServerConfig(
        model_path=model_path, port=port, max_total_tokens=8192, log_level="warning"
    )


def _start(model_path: str, tmp_path: Path) -> tuple[ServerProcess, str]:
    proc = start_on_free_port(
        lambda port: build_command(_config(model_path, port)),
        log_path=tmp_path / "serve.log",
        timeout=STARTUP_S,
        name="serve",
    )
    assert proc.url is not None
    return proc, proc.url


def _stop_timed(proc: ServerProcess, timeout: float) -> tuple[int | None, float]:
    start = time.monotonic()
    code = proc.stop(timeout=timeout)
    return code, time.monotonic() - start


def test_serve_generates_and_stops_on_sigterm(nano_model_dir: str, tmp_path: Path) -> None:
    proc, url = _start(nano_model_dir, tmp_path)
    try:
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
            info = http.get("/model_info").json()
            # by default decode steps attend in the C++ kernel (setup built it)
            attention = http.get("/server_info").json()["decode_attention"]
            out = http.post(
                "/generate",
                json={
                    "input_ids": [11, 402, 77],
                    "sampling_params": {"max_new_tokens": 5, "ignore_eos": True},
                    "return_logprob": True,
                },
            )
        assert info["model_path"] == nano_model_dir and info["weight_version"] == "0"
        assert attention["kernel"] is True and attention["layers_in_one_call"] is True, attention
        assert out.status_code == 200, out.text
        body = out.json()
        assert len(body["output_ids"]) == 5
        assert len(body["meta_info"]["output_token_logprobs"]) == 5
        assert body["meta_info"]["finish_reason"]["type"] == "length"
    finally:
        code, took = _stop_timed(proc, timeout=10)
    assert code == 0, proc.log_tail()  # exited on SIGTERM by itself, not SIGKILLed
    assert took < 10
    assert not proc.running
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=2, trust_env=False)


def test_sigterm_with_a_request_in_flight_exits_promptly(
    nano_model_dir: str, tmp_path: Path
) -> None:
    proc, url = _start(nano_model_dir, tmp_path)
    body = {"input_ids": [5], "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}

    def long_request() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server went away: expected here
            httpx.post(url + "/generate", json=body, timeout=30, trust_env=False)

    client = threading.Thread(target=long_request, daemon=True)
    client.start()
    try:
        eventually(
            lambda: httpx.get(url + "/server_info", timeout=5, trust_env=False).json()["running"],
            60,
            "the long request running",
        )
    finally:
        code, took = _stop_timed(proc, timeout=3)  # SIGKILL after 3 s: the test fails fast
    client.join(timeout=30)
    assert code == 0 and took < 3, f"exit code {code} after {took:.1f}s"


def test_bad_model_path_exits_with_one_error_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    port = pick_free_port()
    proc = ServerProcess(
        build_command(_config(str(missing), port)), log_path=tmp_path / "serve.log"
    ).start()
    try:
        with pytest.raises(ServerExitedError, match="exited with code 1"):
            proc.wait_healthy(f"http://127.0.0.1:{port}", timeout=STARTUP_S)
    finally:
        proc.stop()
    assert proc.returncode == 1
    lines = [line for line in proc.log_tail().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and str(missing) in lines[0]
    assert "config.json" in lines[0]


def test_port_in_use_exits_non_zero(nano_model_dir: str, tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = ServerProcess(
            build_command(_config(nano_model_dir, port)), log_path=tmp_path / "serve.log"
        ).start()
        try:
            eventually(lambda: not proc.running, STARTUP_S, "the server exiting on a taken port")
        finally:
            proc.stop()
    assert proc.returncode not in (0, None)
    log = proc.log_tail()
    assert "address already in use" in log
    assert f"could not start on 127.0.0.1:{port}" in log
    assert "Traceback" not in log


def test_an_engine_off_loopback_is_started_with_the_remote_bind_allowed() -> None:
    """The run asks for it with ``launcher.listen: node``; the CLI refuses such a host without
    ``--allow-remote``, and the engine command of a loopback run never carries it."""
    assert "--allow-remote" not in build_command(_config("/m", 9))
    remote = build_command(EmbeddedServerConfig(model_path="/m", host="10.0.0.7", port=9))
    assert remote[remote.index("--host") + 1] == "10.0.0.7" and "--allow-remote" in remote


@pytest.mark.parametrize(
    ("field", "on", "off"),
    [
        ("pack_weights", "--pack-weights", "--no-pack-weights"),
        ("decode_kernel", "--decode-kernel", "--no-decode-kernel"),
    ],
)
def test_an_engine_choice_is_passed_only_when_made(field: str, on: str, off: str) -> None:
    """By default neither flag is passed (the engine measures whether packing pays; it uses the
    decode kernel when it builds); the field True / False is the CLI's ``on`` / ``off`` flag,
    which the CLI itself accepts (its help lists both spellings)."""
    default = build_command(_config("/m", 9))
    assert on not in default and off not in default
    chose_off = build_command(EmbeddedServerConfig(model_path="/m", port=9, **{field: False}))
    assert off in chose_off and on not in chose_off
    chose_on = build_command(EmbeddedServerConfig(model_path="/m", port=9, **{field: True}))
    assert on in chose_on and off not in chose_on
    from typer.testing import CliRunner

    from areal.cli.main import app

    result = CliRunner().invoke(app, ["serve", "inference", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and off in result.output
