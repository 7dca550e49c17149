"""The gateway's side of a training run, against real gateways and the real engine on 127.0.0.1:
the training flags of both front ends (a real server process feeding a real ZeroMQ trajectory
queue), the trainer's version clock, the idle-session reaper, discarding by metadata, and the
router's sampling defaults reaching the engine."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import httpx
import openai
import pytest
import typer.main
from aiohttp import ClientSession, web

from areal.cli.serve_cmd import app as serve_app
from areal.core.staleness import StalenessBudget
from areal.gateway.app import build_app
from areal.gateway.policy import Generation
from areal.gateway.router_config import RouterConfig
from areal.gateway.server import add_training_arguments, build_state
from areal.gateway.sessions import SessionManager
from areal.host.http_server import ServerThread
from areal.host.process import start_on_free_port
from areal.plugins.inference.embedded.server import InferenceServer
from areal.plugins.queues.zmq_queue import ZmqTrajectorySource

SERVER = [sys.executable, "-m", "areal.gateway.server"]
CLI = [sys.executable, "-m", "areal", "serve", "gateway"]
ADMIN = "training-admin-token-0123456789"
KEY = "training-gateway-key-0123456789"


def post(gw: Any, path: str, key: str | None, body: Any = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{gw.url}{path}", json=body, headers=headers, timeout=30)


def get(gw: Any, path: str, key: str | None) -> httpx.Response:
    return httpx.get(f"{gw.url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def create(gw: Any, body: dict[str, Any] | None = None) -> httpx.Response:
    return post(gw, "/rl/sessions", gw.admin, body or {})


def error_of(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err: dict[str, Any] = resp.json()["error"]
    assert isinstance(err["message"], str) and err["type"]
    return err


def chat(url: str, key: str, content: str) -> dict[str, Any]:
    body = {"model": "areal-tiny", "messages": [{"role": "user", "content": content}]}
    resp = httpx.post(
        f"{url}/v1/chat/completions",
        json={**body, "max_tokens": 4},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


# --- the flags ---------------------------------------------------------------------------------


def test_flags_reach_a_real_gateway_process_and_its_zmq_sink(
    engine: tuple[str, InferenceServer], tmp_path: Path
) -> None:
    router = tmp_path / "router.yaml"
    router.write_text("model_routing:\n  policy_model: {model_id: areal-tiny, max_tokens: 8}\n")

    def journal(port: int | None) -> Path:
        return tmp_path / f"episodes-{port}.journal"

    with ZmqTrajectorySource("tcp://127.0.0.1:*", queue_max_size=4) as source:
        command = [*SERVER, "--config", str(router), "--engine", engine[0]]
        command += ["--log-dir", str(tmp_path / "logs"), "--sink", "zmq"]
        # A bound of 5: the engine's tokens are version 0, 4 behind the clock, still trainable.
        command += ["--sink-address", source.address, "--staleness-threshold", "5"]
        command += ["--trigger-batch-size", "2", "--max-concurrent", "8", "--start-version", "4"]
        command += ["--discount", "0.5", "--session-idle-timeout", "30"]
        # A restarted gateway: the trainer had received 15 episodes and dropped 1 of them.
        command += ["--start-consumed", "15", "--start-dropped", "1"]
        env = {"AREAL_ADMIN_TOKEN": ADMIN, "AREAL_GATEWAY_KEY": KEY}
        # One journal per port: a start that lost its port to another process booted ("b") too.
        with start_on_free_port(
            lambda port: [*command, "--port", str(port), "--episode-journal", str(journal(port))],
            log_path=tmp_path / "gateway.out",
            timeout=120,
            env=env,
            name="gateway",
        ) as proc:
            assert proc.url is not None
            url = proc.url
            headers = {"Authorization": f"Bearer {ADMIN}"}
            status = httpx.get(f"{url}/rl/sessions", headers=headers).json()
            # capacity = min((threshold 5 + version 4 + 1) * batch 2 - (15 - 1), max_concurrent 8)
            assert status["budget"] == {
                "version": 4,
                "accepted": 14,
                "running": 0,
                "rejected": 0,
                "capacity": 6,
                "accepted_total": 15,
                "released": 1,
            }
            assert (status["discount"], status["idle_timeout"]) == (0.5, 30.0)

            session = httpx.post(f"{url}/rl/sessions", headers=headers, json={"task_id": 7}).json()
            first = chat(url, session["api_key"], "hello")
            second = chat(url, session["api_key"], "something else")  # a second, unmerged sample
            end = httpx.post(
                f"{url}/rl/sessions/{session['session_id']}/end",
                headers=headers,
                json={"reward": 1},
            )
            assert end.status_code == 200 and end.json()["sent"] is True, end.text
            trajectory = source.get(timeout=30)
            after = httpx.get(f"{url}/rl/version", headers=headers).json()
    assert trajectory is not None, proc.log_tail()
    assert trajectory.session_id == session["session_id"] and trajectory.reward == 1.0
    assert trajectory.metadata["task_id"] == 7
    assert trajectory.turns == []  # the trainer reads samples only: raw turns stay behind
    assert [s.completion_ids for s in trajectory.samples] == [[first["id"]], [second["id"]]]
    # Two samples; the episode reward reaches the earlier one discounted by --discount 0.5.
    assert [s.reward for s in trajectory.samples] == [0.5, 1.0]
    # capacity = min((5 + 4 + 1) * 2 - 15 accepted, 8 - 0 running) = 5
    assert after == {
        "version": 4,
        "accepted": 15,
        "running": 0,
        "rejected": 0,
        "capacity": 5,
        "accepted_total": 16,
        "released": 1,
    }
    sid = session["session_id"].encode()
    assert journal(urlsplit(url).port).read_bytes() == b"b\ns %s\na %s\n" % (sid, sid)


def one_line_error(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_bad_flags_are_one_clear_line_in_both_front_ends(tmp_path: Path) -> None:
    router = tmp_path / "router.yaml"
    router.write_text("model_routing:\n  policy_model: {model_id: areal-tiny}\n")
    base = ["--config", str(router), "--engine", "http://127.0.0.1:9"]
    for front in (SERVER, CLI):
        assert "--sink-address" in one_line_error([*front, *base, "--sink", "zmq"])
    assert "--discount" in one_line_error([*SERVER, *base, "--discount", "1.5"])
    assert "--staleness-threshold" in one_line_error([*CLI, *base, "--staleness-threshold", "-1"])


def test_both_front_ends_have_the_same_training_flags() -> None:
    parser = argparse.ArgumentParser()
    add_training_arguments(parser)
    argparse_flags = {
        a.option_strings[0]: (a.default, a.help) for a in parser._actions if a.option_strings
    }
    argparse_flags.pop("-h")
    command = typer.main.get_command(serve_app).commands["gateway"]  # type: ignore[attr-defined]
    typer_flags = {p.opts[0]: p for p in command.params if p.opts[0] in argparse_flags}
    assert (
        set(typer_flags)
        == set(argparse_flags)
        == {
            "--sink",
            "--sink-address",
            "--staleness-threshold",
            "--trigger-batch-size",
            "--max-concurrent",
            "--start-version",
            "--start-consumed",
            "--start-dropped",
            "--episode-journal",
            "--discount",
            "--session-idle-timeout",
            "--online",
            "--online-idle-timeout",
            "--online-reward-wait",
        }
    )
    for flag, (default, help_text) in argparse_flags.items():
        param = typer_flags[flag]
        got = param.default.value if hasattr(param.default, "value") else param.default
        assert (got, param.help) == (default, help_text), flag
    assert argparse_flags["--sink"][0] == "jsonl"
    assert argparse_flags["--session-idle-timeout"][0] == 600.0


# --- the version clock --------------------------------------------------------------------------


def test_version_route_moves_the_clock_and_the_admission(start_gateway: Any) -> None:
    budget = StalenessBudget(trigger_batch_size=1, staleness_threshold=0)
    with start_gateway(budget=budget) as gw:
        first = create(gw).json()
        assert error_of(create(gw), 429)["code"] == "staleness_budget_full"
        moved = post(gw, "/rl/version", gw.admin, {"version": 1})
        assert moved.status_code == 200, moved.text
        # (threshold 0 + version 1 + 1) * 1 - (0 accepted + 1 running) = 1 more episode
        assert moved.json() == {
            "version": 1,
            "accepted": 0,
            "running": 1,
            "rejected": 0,
            "capacity": 1,
            "accepted_total": 0,
            "released": 0,
        }
        assert create(gw).status_code == 200
        error_of(create(gw), 429)

        # The clock never moves back, and also follows the versions the engines report.
        assert post(gw, "/gateway/rl/version", gw.admin, {"version": 0}).json()["version"] == 1
        session = gw.state.sessions.get(first["session_id"])
        generation = Generation("x", [5, 6], [-1.0, -2.0], [2, 3], [1, 2], finish_reason="stop")
        assert gw.run(gw.state.sessions.record(session, model=gw.model, generation=generation))
        assert get(gw, "/rl/version", gw.admin).json()["version"] == 3
        assert post(gw, "/rl/version", gw.admin, {"version": 2}).json()["version"] == 3
        assert post(gw, "/rl/version", gw.admin, {"version": 5}).json()["version"] == 5
        assert get(gw, "/gateway/rl/version", gw.admin).json()["capacity"] == 4  # 6 - 2 running

        for bad in ({"version": -1}, {"version": "6"}, {"version": True}, {"version": 1.5}, {}):
            assert error_of(post(gw, "/rl/version", gw.admin, bad), 400)["param"] == "version"
        error_of(
            httpx.post(f"{gw.url}/rl/version", content=b"{", headers=gw.headers(gw.admin)), 400
        )
        assert error_of(post(gw, "/rl/version", gw.key, {"version": 9}), 403)["code"] == (
            "admin_required"
        )
        error_of(post(gw, "/rl/version", first["api_key"], {"version": 9}), 403)
        error_of(post(gw, "/rl/version", None, {"version": 9}), 401)
        error_of(get(gw, "/rl/version", gw.key), 403)
        assert budget.version == 5


# --- stale sessions ----------------------------------------------------------------------------


def test_idle_sessions_are_reaped_and_give_their_slot_back(start_gateway: Any) -> None:
    # The premise "calls keep a session alive" holds only while the test process calls more
    # often than the timeout; on a loaded machine (the suite runs on two busy workers) it once
    # stood still longer. Such a round proves nothing either way and is run again on a fresh
    # gateway; a session ended while the calls came in time always fails the test.
    for _ in range(3):
        if reap_idle_session(start_gateway, timeout=2.0):
            return
    pytest.fail("in three rounds the test process stood still past the idle timeout")


def reap_idle_session(start_gateway: Any, *, timeout: float) -> bool:
    """One round of the test above; ``False`` when the test process's calls came too late."""
    budget = StalenessBudget(max_concurrent=1)
    with start_gateway(budget=budget, session_idle_timeout=timeout) as gw:
        # Calls with its key keep a session alive well past the timeout: each call touches the
        # session between its own send and its answer, so the session is never idle longer than
        # the span from one call's send to the next one's answer (its opening counts as one).
        last_sent = time.monotonic()
        alive = create(gw).json()
        error_of(create(gw), 429)
        until = time.monotonic() + 2 * timeout
        longest_idle = 0.0
        while True:
            sent = time.monotonic()
            assert get(gw, "/v1/models", alive["api_key"]).status_code in (200, 401)
            longest_idle = max(longest_idle, time.monotonic() - last_sent)
            last_sent = sent  # the session's last activity is after this instant
            if time.monotonic() >= until:
                break
            time.sleep(0.1)
        status = get(gw, f"/rl/sessions/{alive['session_id']}", gw.admin).json()["status"]
        if longest_idle >= timeout:
            return False
        assert status == "open"
        # Then the worker "crashes": the reaper ends the session and its slot comes back (the
        # status call above was admin's: not activity).
        # (Up to 30 s: with vLLM's three processes starting beside it on 2 cores, this test
        # once took 28 s and its reaper more than 10.)
        while (resp := create(gw)).status_code == 429 and time.monotonic() < last_sent + 30:
            time.sleep(0.05)
        assert resp.status_code == 200, resp.text
        # Not before the timeout: the last call touched the session after ``last_sent``, so its
        # slot cannot be free before ``last_sent + timeout`` however slow the machine is.
        assert time.monotonic() - last_sent >= timeout
        ended = get(gw, f"/rl/sessions/{alive['session_id']}", gw.admin).json()
        assert ended["status"] == "ended" and ended["expired"] is True and ended["sent"] is False
        error_of(get(gw, "/v1/models", alive["api_key"]), 401)
        listing = get(gw, "/rl/sessions", gw.admin).json()
        # The new session is idle too: a test process stalled past the timeout since it was
        # opened (a loaded machine; seen once) lets the reaper end it as well, which the same
        # snapshot shows (it is no longer open), and the counts must say exactly that.
        also_reaped = resp.json()["session_id"] not in listing["open"]
        assert (listing["expired"], listing["idle_timeout"]) == (1 + also_reaped, timeout)
        assert listing["budget"]["rejected"] == 1
        assert listing["budget"]["running"] == (0 if also_reaped else 1)
    return True


def test_a_gateway_that_stood_still_does_not_reap_its_clients_for_it(
    start_gateway: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway whose loop stood still past the idle timeout (a stopped process, a paused
    machine) could not hear its clients: the reaper does not count the stall as their silence,
    and a call made while it stood still, answered when it resumes, keeps the session. A client
    silent after that is still reaped. (The session is silent until the loop stands still, and
    at most one reaper round more, 0.5 s, before the stall is noticed; the rest of the timeout,
    about 1.5 s, is the waiting call's to be handled once the loop resumes. A test process
    starved past that tries again: the premise did not hold, not the reaper.)"""
    caplog.set_level(logging.INFO, logger="areal.gateway")
    timeout = 2.0
    with start_gateway(
        budget=StalenessBudget(max_concurrent=1), session_idle_timeout=timeout
    ) as gw:
        moments: dict[str, float] = {}  # wall-clock times, for the failure's timeline

        async def stand_still() -> float:
            moments["stood still"] = time.time()
            time.sleep(2.5 * timeout)  # blocks the gateway's event loop, reaper included
            moments["resumed"] = time.time()
            return time.monotonic()  # the loop resumes now

        assert gw.http is not None and gw.http.loop is not None
        for _attempt in range(4):
            moments.clear()
            alive = create(gw).json()
            moments["created"] = time.time()
            still = asyncio.run_coroutine_threadsafe(stand_still(), gw.http.loop)
            time.sleep(2 * timeout)  # silent past the idle timeout, the loop still standing
            moments["called"] = time.time()
            answer = get(gw, "/v1/models", alive["api_key"]).status_code  # waits for the loop
            moments["answered"] = time.time()
            resumed = still.result(timeout=30)
            # heard silence so far: until the loop stood still, and at most a round more
            left = timeout - (moments["stood still"] - moments["created"]) - timeout / 4
            if answer == 200 or time.monotonic() - resumed < left - 0.1:
                break
        if answer != 200:
            ended = get(gw, f"/rl/sessions/{alive['session_id']}", gw.admin).json()["ended"]
            moments["session ended"] = ended or 0.0
        start = min(moments.values())
        timeline = sorted(
            [(at - start, what) for what, at in moments.items()]
            + [(r.created - start, r.getMessage()) for r in caplog.records if r.created >= start]
        )
        assert answer == 200, "\n".join(f"{at:7.3f} s  {what}" for at, what in timeline)
        deadline = time.monotonic() + 10 * timeout
        while time.monotonic() < deadline:
            status = get(gw, f"/rl/sessions/{alive['session_id']}", gw.admin).json()["status"]
            if status == "ended":
                break
            time.sleep(0.1)
        assert status == "ended"


def test_a_session_with_a_call_running_is_not_idle() -> None:
    sessions = SessionManager("admin", idle_timeout=10.0)

    async def scenario() -> tuple[list[str], list[str], int]:
        busy, quiet = sessions.open(), sessions.open()
        busy.busy = 1  # a long call with its key is in flight
        later = time.monotonic() + 60
        first = await sessions.expire_idle(now=later)
        busy.busy = 0
        busy.touch()
        second = await sessions.expire_idle(now=time.monotonic() + 5)
        assert first == [quiet.session_id] and second == []
        return first, second, sessions.budget.running

    _, _, running = asyncio.run(scenario())
    assert running == 1 and sessions.expired == 1


def test_discard_sessions_by_metadata(start_gateway: Any) -> None:
    with start_gateway(sink="jsonl") as gw:
        a = create(gw, {"metadata": {"worker": "3", "run": "r1"}}).json()
        b = create(gw, {"metadata": {"worker": "3"}}).json()
        other = create(gw, {"metadata": {"worker": "4", "run": "r1"}}).json()
        typed = create(gw, {"metadata": {"worker": 3}}).json()  # 3 is not "3"
        bare = create(gw).json()
        generation = Generation("x", [5], [-1.0], [0], [1, 2], finish_reason="stop")
        session = gw.state.sessions.get(a["session_id"])
        assert gw.run(gw.state.sessions.record(session, model=gw.model, generation=generation))

        resp = post(gw, "/rl/sessions/discard", gw.admin, {"metadata": {"worker": "3"}})
        assert resp.status_code == 200, resp.text
        assert resp.json()["discarded"] == 2
        assert set(resp.json()["session_ids"]) == {a["session_id"], b["session_id"]}
        both = post(gw, "/gateway/rl/sessions/discard", gw.admin, {"metadata": {"worker": "4", "run": "r1"}})  # fmt: skip
        assert both.json() == {"discarded": 1, "session_ids": [other["session_id"]]}
        again = post(gw, "/rl/sessions/discard", gw.admin, {"metadata": {"worker": "3"}})
        assert again.json() == {"discarded": 0, "session_ids": []}

        listing = get(gw, "/rl/sessions", gw.admin).json()
        assert set(listing["open"]) == {typed["session_id"], bare["session_id"]}
        assert listing["discarded"] == 3 and listing["budget"]["rejected"] == 3
        for s in (a, b, other):
            error_of(get(gw, "/v1/models", s["api_key"]), 401)
            assert get(gw, f"/rl/sessions/{s['session_id']}", gw.admin).json()["sent"] is False
        sent = gw.log_dir / "trajectories.jsonl"  # a's recorded completion went nowhere
        assert not sent.exists() or sent.read_text() == ""

        bad_bodies: list[dict[str, Any]] = [
            {},
            {"metadata": {}},
            {"metadata": [1]},
            {"metadata": "w"},
        ]
        for bad in bad_bodies:
            err = error_of(post(gw, "/rl/sessions/discard", gw.admin, bad), 400)
            assert err["param"] == "metadata"
        error_of(post(gw, "/rl/sessions/discard", gw.key, {"metadata": {"worker": "5"}}), 403)
        error_of(post(gw, "/rl/sessions/discard", bare["api_key"], {"metadata": {"a": 1}}), 403)


def test_the_listing_counts_trajectories_waiting_for_a_full_queue(start_gateway: Any) -> None:
    """Back-pressure in numbers (``bench/soak.py`` samples it): an ``end`` whose trajectory the
    full queue has not acknowledged waits, and ``GET /rl/sessions`` counts it in ``delivering``."""
    generation = Generation("x", [5], [-1.0], [0], [1, 2], finish_reason="stop")
    with (
        ZmqTrajectorySource("tcp://127.0.0.1:*", queue_max_size=1) as source,
        start_gateway(sink="zmq", sink_options={"address": source.address}) as gw,
    ):
        first, second = (create(gw).json() for _ in range(2))
        for opened in (first, second):
            session = gw.state.sessions.get(opened["session_id"])
            assert gw.run(gw.state.sessions.record(session, model=gw.model, generation=generation))
        assert post(gw, f"/rl/sessions/{first['session_id']}/end", gw.admin).json()["sent"]
        assert get(gw, "/rl/sessions", gw.admin).json()["delivering"] == 0
        with ThreadPoolExecutor(1) as pool:  # the queue holds its 1: this end waits
            waiting = pool.submit(post, gw, f"/rl/sessions/{second['session_id']}/end", gw.admin)
            deadline = time.monotonic() + 10
            while get(gw, "/rl/sessions", gw.admin).json()["delivering"] != 1:
                assert time.monotonic() < deadline, "the second end never waited for the queue"
                time.sleep(0.02)
            assert not waiting.done()
            assert source.get(timeout=10) is not None  # room again: the trainer took one
            assert waiting.result(timeout=30).json()["sent"] is True
        assert get(gw, "/rl/sessions", gw.admin).json()["delivering"] == 0
        assert [t.session_id for t in (source.get(timeout=10),)] == [second["session_id"]]


# --- sampling defaults ---------------------------------------------------------------------------


class RecordingProxy:
    """Forwards everything to the real engine and keeps the ``sampling_params`` of each
    ``/generate``: what the gateway really asked the engine for."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.sampling: list[dict[str, Any]] = []

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path == "/generate":
            self.sampling.append(json.loads(body)["sampling_params"])
        async with (
            ClientSession() as client,
            client.request(
                request.method,
                self.target + request.path_qs,
                data=body or None,
                headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
            ) as upstream,
        ):
            response = web.StreamResponse(
                status=upstream.status,
                headers={"Content-Type": upstream.headers.get("Content-Type", "application/json")},
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app


@contextmanager
def gateway_behind(proxy_url: str, route: dict[str, Any], log_dir: Path) -> Iterator[str]:
    config = RouterConfig.model_validate({"model_routing": {"policy_model": route}})
    state = build_state(config, [proxy_url], gateway_key=KEY, admin_token=None, log_dir=log_dir)
    http = ServerThread(build_app(state), "127.0.0.1", 0).start()
    try:
        yield http.url
    finally:
        http.stop()


def test_router_sampling_defaults_reach_the_engine(
    engine: tuple[str, InferenceServer], tmp_path: Path
) -> None:
    proxy = RecordingProxy(engine[0])
    proxy_http = ServerThread(proxy.app(), "127.0.0.1", 0).start()
    route = {"model_id": "areal-tiny", "temperature": 0.3, "top_p": 0.7, "max_tokens": 5}
    try:
        with gateway_behind(proxy_http.url, route, tmp_path) as url:
            oai = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
            ant = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
            hi: Any = [{"role": "user", "content": "hi"}]
            oai.chat.completions.create(model="areal-tiny", messages=hi)
            for _ in oai.chat.completions.create(model="areal-tiny", messages=hi, stream=True):
                pass
            oai.responses.create(model="areal-tiny", input="hi")
            ant.messages.create(model="areal-tiny", max_tokens=100, messages=hi)
            with ant.messages.stream(model="areal-tiny", max_tokens=100, messages=hi) as stream:
                stream.until_done()
            # The client's own values win; max_tokens is still capped by the route.
            oai.chat.completions.create(
                model="areal-tiny", messages=hi, temperature=1.0, top_p=0.9, max_tokens=50
            )
            oai.responses.create(
                model="areal-tiny", input="hi", temperature=0.0, max_output_tokens=2
            )
            # (this SDK version has no temperature argument; the wire field is still honoured)
            ant.messages.create(
                model="areal-tiny", max_tokens=3, messages=hi, extra_body={"temperature": 0.9}
            )
    finally:
        proxy_http.stop()

    def knobs(params: dict[str, Any]) -> tuple[Any, Any, Any]:
        return params["max_new_tokens"], params.get("temperature"), params.get("top_p")

    assert [knobs(p) for p in proxy.sampling] == [
        (5, 0.3, 0.7),  # OpenAI chat
        (5, 0.3, 0.7),  # OpenAI chat, streamed
        (5, 0.3, 0.7),  # Responses
        (5, 0.3, 0.7),  # Anthropic
        (5, 0.3, 0.7),  # Anthropic, streamed
        (5, 1.0, 0.9),
        (2, 0.0, 0.7),
        (3, 0.9, 0.7),
    ]


def test_version_route_gives_stale_drops_their_slots_back(start_gateway: Any) -> None:
    budget = StalenessBudget(trigger_batch_size=1, staleness_threshold=0)
    with start_gateway(budget=budget) as gw:
        opened = create(gw).json()
        session = gw.state.sessions.get(opened["session_id"])
        generation = Generation("x", [5, 6], [-1.0, -2.0], [0, 0], [1, 2], finish_reason="stop")
        assert gw.run(gw.state.sessions.record(session, model=gw.model, generation=generation))
        ended = post(gw, f"/rl/sessions/{opened['session_id']}/end", gw.admin, {"reward": 1.0})
        assert ended.status_code == 200
        assert get(gw, "/rl/version", gw.admin).json()["capacity"] == 0  # 1 accepted: full
        # The trainer dropped that episode as stale: its slot comes back, and only once.
        snap = post(gw, "/rl/version", gw.admin, {"version": 0, "dropped": 1}).json()
        assert (snap["accepted"], snap["capacity"]) == (0, 1)
        assert (
            post(gw, "/rl/version", gw.admin, {"version": 0, "dropped": 1}).json()["capacity"] == 1
        )
        for bad in (-1, "2", True):
            answer = post(gw, "/rl/version", gw.admin, {"version": 0, "dropped": bad})
            assert error_of(answer, 400)["param"] == "dropped"
            answer = post(gw, "/rl/version", gw.admin, {"version": 0, "consumed": bad})
            assert error_of(answer, 400)["param"] == "consumed"
