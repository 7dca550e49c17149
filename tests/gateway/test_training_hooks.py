"""The gateway's side of a training run, against real gateways and the real engine on 127.0.0.1:
the training flags of both front ends (a real server process feeding a real ZeroMQ trajectory
queue), the trainer's version clock and seat, the idle-session reaper (a smoke test; its rule is
proved on a fake clock in ``test_reaper_rounds.py``), discarding by metadata, and the router's
sampling defaults reaching the engine."""

from __future__ import annotations

import argparse
import asyncio
import http.client
import logging
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import httpx
import openai
import pytest
import typer.main

from areal.cli.serve_cmd import app as serve_app
from areal.core.staleness import StalenessBudget
from areal.gateway.policy import Generation
from areal.gateway.server import add_training_arguments
from areal.gateway.trainer_seat import TrainerSeat
from areal.host.http_server import ServerThread
from areal.host.process import start_on_free_port
from areal.plugins.inference.embedded.server import InferenceServer
from areal.plugins.queues.zmq_queue import ZmqTrajectorySource
from support import eventually
from support.clock import FakeClock
from support.gateway import EngineRecorder, running_gateway

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


@pytest.mark.serial  # a real gateway server process
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
            "--online-grouping",
            "--online-group-window",
            "--online-group-size",
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


@pytest.mark.serial  # a wall-clock smoke test: the fake-clock proof is test_reaper_rounds.py
def test_a_real_gateway_that_stood_still_hears_the_call_that_waited_and_reaps_the_silent(
    start_gateway: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The idle-session reaper on a real gateway and event loop. The session's last activity is
    the moment the gateway's loop stands still; the loop stays still for twice the idle timeout
    and until a call with the session's key is waiting in its socket. The reaper notices the
    stall and counts it as one round (a quarter of the timeout) of silence, so the call is heard
    (200) when the loop resumes. Then the client is silent: the reaper ends the session as
    expired, a whole timeout after that call at the earliest, and its budget slot comes back."""
    caplog.set_level(logging.INFO, logger="areal.gateway")
    timeout = 1.0
    budget = StalenessBudget(max_concurrent=1)
    with start_gateway(budget=budget, session_idle_timeout=timeout) as gw:
        alive = create(gw).json()
        error_of(create(gw), 429)  # it holds the only slot
        session = gw.state.sessions.get(alive["session_id"])
        stood_still, call_waits = threading.Event(), threading.Event()

        async def stand_still() -> None:  # on the gateway's loop, which it blocks
            session.touch()
            stood_still.set()
            time.sleep(2 * timeout)
            call_waits.wait(60)

        assert gw.http is not None and gw.http.loop is not None
        still = asyncio.run_coroutine_threadsafe(stand_still(), gw.http.loop)
        eventually(stood_still.is_set, 30, "the gateway's loop to stand still")
        host, port = urlsplit(gw.url).hostname, urlsplit(gw.url).port
        call = http.client.HTTPConnection(host or "", port, timeout=60)
        call.request("GET", "/v1/models", headers={"Authorization": f"Bearer {alive['api_key']}"})
        sent_at = time.time()  # the call is in the gateway's socket, waiting
        call_waits.set()
        still.result(timeout=60)
        answer = call.getresponse()
        call.close()
        assert answer.status == 200, caplog.text  # heard: the stall was nobody's silence
        eventually(
            lambda: "the idle-session reaper woke" in caplog.text, 30, "the reaper to see the stall"
        )

        def reaped() -> dict[str, Any]:
            got: dict[str, Any] = get(gw, f"/rl/sessions/{alive['session_id']}", gw.admin).json()
            assert got["status"] == "ended", got
            return got

        ended = eventually(reaped, 30, "the reaper to end the silent session")
        assert ended["expired"] is True and ended["sent"] is False
        assert ended["ended"] - sent_at >= timeout  # not before a whole timeout after the call
        error_of(get(gw, "/v1/models", alive["api_key"]), 401)
        listing = get(gw, "/rl/sessions", gw.admin).json()  # (admin calls are no activity)
        assert (listing["expired"], listing["idle_timeout"]) == (1, timeout)
        assert (listing["budget"]["rejected"], listing["budget"]["running"]) == (1, 0)
        assert create(gw).status_code == 200  # the slot came back


def test_the_trainer_seat_lapses_a_lease_after_the_last_announce() -> None:
    clock = FakeClock()
    seat = TrainerSeat("run-1", lease_s=30.0, clock=clock)
    clock.advance(30.0)
    assert not seat.lapsed()  # a whole lease since the announce: still held
    clock.advance(0.25)
    assert seat.lapsed() and seat.describe()["lapsed"] is True
    seat.renew()
    assert not seat.lapsed() and seat.describe()["last_heard_s"] == 0.0
    clock.advance(29.5)
    assert not seat.lapsed() and seat.describe()["last_heard_s"] == 29.5
    clock.advance(1.0)
    assert seat.describe() == {
        "trainer_id": "run-1",
        "since": seat.since,
        "last_heard_s": 30.5,
        "lease_s": 30.0,
        "lapsed": True,
    }


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
            eventually(
                lambda: get(gw, "/rl/sessions", gw.admin).json()["delivering"] == 1,
                30,
                "the second end to wait for the queue",
            )
            assert not waiting.done()
            assert source.get(timeout=10) is not None  # room again: the trainer took one
            assert waiting.result(timeout=30).json()["sent"] is True
        assert get(gw, "/rl/sessions", gw.admin).json()["delivering"] == 0
        assert [t.session_id for t in (source.get(timeout=10),)] == [second["session_id"]]


# --- sampling defaults ---------------------------------------------------------------------------


def test_router_sampling_defaults_reach_the_engine(
    engine: tuple[str, InferenceServer], tmp_path: Path
) -> None:
    proxy = EngineRecorder(engine[0])  # what the gateway really asked the engine for
    proxy_http = ServerThread(proxy.app(), "127.0.0.1", 0).start()
    route = {"model_id": "areal-tiny", "temperature": 0.3, "top_p": 0.7, "max_tokens": 5}
    config = {"model_routing": {"policy_model": route}}
    try:
        with running_gateway(proxy_http.url, engine[1], tmp_path, config, admin_token=None) as gw:
            oai = openai.OpenAI(base_url=gw.v1, api_key=gw.key, max_retries=0)
            ant = anthropic.Anthropic(base_url=gw.url, api_key=gw.key, max_retries=0)
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

    assert [knobs(body["sampling_params"]) for body in proxy.generate_bodies] == [
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
