"""``areal serve inference --attach GATEWAY_URL``: a real engine process joins a running gateway
started with no engine, loads the weights the trainer published, serves, and on SIGTERM leaves
(its running call drained) before it stops. Real gateway, real subprocesses, all on 127.0.0.1."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from areal.cli.main import main
from areal.gateway.app import build_app
from areal.gateway.server import build_state
from areal.host.http_server import ServerThread
from areal.host.process import ServerProcess, pick_free_port, start_on_free_port
from areal.plugins.inference.embedded.server import InferenceServer, build_server
from areal.plugins.models.tiny import init_tiny
from support import eventually
from support.gateway import ADMIN_TOKEN, GATEWAY_KEY, POLICY, engine_paused, router
from support.http import bearer

ADMIN = bearer(ADMIN_TOKEN)
PROMPT_IDS = [5, 17, 42, 99, 7, 3, 250, 11]


# The call that runs when the engine is told to stop (held paused until the drain has begun);
# the policy's cap on max_tokens is raised to allow it.
LONG = 3000
ROUTING = {"model_routing": {"policy_model": {"model_id": POLICY, "max_tokens": LONG}}}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    """A gateway with no engine and an admin token; its URL."""
    state = build_state(
        router(ROUTING), [], gateway_key=GATEWAY_KEY, admin_token=ADMIN_TOKEN, log_dir=tmp_path
    )
    state.policy.pool.health_every = 0.2
    http = ServerThread(build_app(state), "127.0.0.1", 0).start()
    try:
        yield http.url
    finally:
        http.stop()


@pytest.fixture(scope="module")
def published_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Weights a trainer published: the nano model with other random weights (seed 1)."""
    path = tmp_path_factory.mktemp("published") / "v3"
    init_tiny(path, size="nano", seed=1)
    return path


def attach_command(model: str, gateway_url: str, port: int) -> list[str]:
    command = [sys.executable, "-m", "areal", "serve", "inference", "--model", model]
    command += ["--port", str(port), "--max-total-tokens", "4096", "--log-level", "warning"]
    return [*command, "--attach", gateway_url]


def serve_attached(
    model: str, gateway_url: str, log: Path, token: str | None = ADMIN_TOKEN
) -> tuple[ServerProcess, str]:
    """An engine started, not waited for: one that fails to attach exits, maybe before a
    health check would see it up (``start_on_free_port`` would take that for a failed start)."""
    port = pick_free_port()
    env = {"AREAL_ADMIN_TOKEN": token} if token else {}
    command = attach_command(model, gateway_url, port)
    return ServerProcess(command, log_path=log, env=env, name="engine").start(), (
        f"http://127.0.0.1:{port}"
    )


def first_line(proc: ServerProcess, prefix: str) -> str:
    """The engine's first output line that starts with ``prefix`` (it fails at once if the
    engine exits without one)."""
    return prefix + proc.wait_for_line(prefix, timeout=120)


def engines(gateway_url: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{gateway_url}/rl/engines", headers=ADMIN, timeout=30)
    assert answer.status_code == 200, answer.text
    listed: list[dict[str, Any]] = answer.json()["engines"]
    return listed


def chat(gateway_url: str, **options: Any) -> Any:
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=GATEWAY_KEY, max_retries=0)
    return client.chat.completions.create(
        model=POLICY, messages=[{"role": "user", "content": "hello"}], **options
    )


def greedy(url: str) -> list[float]:
    """The log-probs of a greedy continuation: a fingerprint of the weights that sampled it."""
    body = {
        "input_ids": PROMPT_IDS,
        "sampling_params": {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True},
        "return_logprob": True,
    }
    answer = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return [float(t[0]) for t in answer.json()["meta_info"]["output_token_logprobs"]]


@pytest.fixture(scope="module")
def reference(published_dir: Path) -> Iterator[str]:
    """The published weights served in this process, to compare the attached engine with."""
    server: InferenceServer = build_server(str(published_dir), max_total_tokens=4096)
    http = server.http().start()
    try:
        yield http.url
    finally:
        server.engine.stop()
        http.stop()


@pytest.mark.slow
@pytest.mark.serial
def test_an_attached_engine_loads_the_published_weights_serves_and_leaves_on_sigterm(
    gateway: str,
    gateway_model_dir: str,
    published_dir: Path,
    reference: str,
    engine: tuple[str, InferenceServer],
    tmp_path: Path,
) -> None:
    published = httpx.post(
        f"{gateway}/rl/version",
        json={"version": 3, "weights": str(published_dir)},
        headers=ADMIN,
        timeout=30,
    )
    assert published.status_code == 200, published.text
    proc = start_on_free_port(
        lambda port: attach_command(gateway_model_dir, gateway, port),
        log_path=tmp_path / "engine.log",
        timeout=120,
        env={"AREAL_ADMIN_TOKEN": ADMIN_TOKEN},
        name="engine",
    )
    assert proc.url is not None
    url = proc.url
    try:
        line = first_line(proc, "attached ")
        assert line == (f"attached {url} to the gateway at {gateway}, serving weights version 3")
        [listed] = engines(gateway)
        assert listed["url"] == url and listed["healthy"] and listed["weight_version"] == "3"
        assert "areal serve inference" in listed["owner"]
        # The engine itself says it serves version 3, and it generates as the published weights
        # do, not as the checkpoint it was started from.
        info = httpx.get(f"{url}/model_info", timeout=30).json()
        assert info["weight_version"] == "3"
        served = greedy(url)
        assert served == pytest.approx(greedy(reference), abs=1e-3)
        assert served != pytest.approx(greedy(engine[0]), abs=1e-3)

        reply = chat(gateway, max_tokens=4)
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert engines(gateway)[0]["served"] == 1

        # A call running when SIGTERM comes finishes before the engine leaves and stops: the
        # engine is held paused until the gateway lists it draining, so the call is still
        # running when the drain begins.
        out: dict[str, Any] = {}
        long = threading.Thread(
            target=lambda: out.update(
                reply=chat(gateway, max_tokens=LONG, extra_body={"ignore_eos": True})
            ),
            daemon=True,
        )
        stopped: dict[str, int | None] = {}
        stopping = threading.Thread(target=lambda: stopped.update(code=proc.stop(timeout=120)))
        with engine_paused(url):
            long.start()
            eventually(lambda: engines(gateway)[0]["running"], 60, "the long call running")
            stopping.start()  # SIGTERM
            eventually(
                lambda: engines(gateway)[0]["draining"], 60, "the engine draining on SIGTERM"
            )
        stopping.join(180)
    finally:
        if proc.running:
            proc.stop(timeout=60)
    assert stopped.get("code") == 0, proc.log_tail()
    long.join(60)
    assert out["reply"].usage.completion_tokens == LONG
    log = proc.log_path.read_text()
    assert f"detached {url} from the gateway at {gateway} (1 running calls finished" in log
    assert engines(gateway) == []
    with pytest.raises(openai.InternalServerError) as caught:
        chat(gateway, max_tokens=4)
    assert caught.value.status_code == 503


def test_without_the_admin_token_it_stops_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AREAL_ADMIN_TOKEN", raising=False)
    # The model does not exist: the token is checked before anything is loaded.
    argv = ["serve", "inference", "--model", "/nonexistent/model", "--attach", "http://127.0.0.1:9"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --attach needs the gateway's admin token in $AREAL_ADMIN_TOKEN (the token "
        "the gateway was started with); it is not set"
    ]


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("case", ["wrong token", "no gateway"])
def test_a_gateway_that_refuses_or_is_not_there_stops_the_engine_with_exit_1(
    case: str, gateway: str, gateway_model_dir: str, tmp_path: Path
) -> None:
    if case == "wrong token":
        target, token = gateway, "not-the-admin-token"
        said = "refused the admin token on POST /rl/engines (HTTP 401 invalid_api_key)"
    else:
        target, token = f"http://127.0.0.1:{pick_free_port()}", ADMIN_TOKEN
        said = f"cannot reach the gateway at {target} for POST /rl/engines"
    proc, url = serve_attached(gateway_model_dir, target, tmp_path / "engine.log", token)
    try:
        line = first_line(proc, "error: ")
        eventually(lambda: not proc.running, 60, "the engine to exit after its error")
    finally:
        code = proc.stop(timeout=30)
    assert code == 1, proc.log_tail()
    assert line.startswith(f"error: could not attach {url}: ") and said in line
    assert engines(gateway) == []
