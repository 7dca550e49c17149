"""``areal train`` attached to a gateway that runs on its own (the seed article's two steps):
the run takes the gateway's trainer seat, its engine registers there, an engine someone else
attaches mid-run takes traffic and gets the run's weights, the run's own engine is killed and
comes back, and at the end the run leaves the gateway serving. Real gateway process, real run,
real engines on 127.0.0.1.

The run has no step budget it could reach first: the test ends it through ``train``'s ``stop``
event once everything it checks has happened, so the run outlasts its engine's restart on any
machine."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from areal.host.process import pick_free_port, start_on_free_port, with_port
from areal.run.runner import RunError, RunSummary, train
from support import eventually
from support.processes import children
from support.runs import identity_breaks, in_thread, jsonl, last_step, make_config, trained

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "attached-admin-token-0123456789"
GATEWAY_KEY = "attached-gateway-key-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
NEVER = 10**9  # train.max_steps: the run ends when the test sets its stop event

pytestmark = pytest.mark.serial


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The article's first step: a gateway on its own, with no engine."""
    monkeypatch.setenv("AREAL_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("AREAL_GATEWAY_KEY", GATEWAY_KEY)
    command = [sys.executable, "-m", "areal.gateway.server", "--config"]
    command += [str(ROOT / "configs" / "router.yaml")]
    command += ["--log-dir", str(tmp_path / "gateway-logs")]
    with start_on_free_port(
        with_port(command),
        log_path=tmp_path / "gateway.out",
        timeout=120,
        name="gateway",
    ) as proc:
        assert proc.url is not None
        yield proc.url


def admin_get(url: str, path: str) -> Any:
    answer = httpx.get(url + path, headers=ADMIN, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def urls(gateway: str) -> list[str]:
    return [e["url"] for e in admin_get(gateway, "/rl/engines")["engines"]]


def served(gateway: str, url: str) -> int:
    """Episodes the gateway routed to the engine at ``url``."""
    return next(
        e["served"] for e in admin_get(gateway, "/rl/engines")["engines"] if e["url"] == url
    )


@pytest.mark.slow
def test_a_run_attaches_to_a_running_gateway_and_engines_come_and_go(
    tmp_path: Path, gateway: str, serve_embedded: Callable[..., Any]
) -> None:
    config = make_config(
        tmp_path,
        train={"max_steps": NEVER},
        agent={"gateway_url": gateway + "/gateway/v1"},
    )
    log = tmp_path / "logs" / "train.log"
    stop = threading.Event()
    thread, result = in_thread(lambda: train(config, tmp_path / "out", stop=stop))
    with contextlib.ExitStack() as stack:
        try:
            eventually(lambda: last_step(log) >= 1, 120, "step 1 in train.log")
            seat = admin_get(gateway, "/rl/trainer")["trainer"]
            assert seat is not None and not seat["lapsed"]
            # One policy, one trainer: a second run is refused while this one holds the seat.
            second = httpx.post(
                gateway + "/rl/trainer",
                json={"trainer_id": "another-run", "sink": "none"},
                headers=ADMIN,
                timeout=30,
            )
            assert second.status_code == 409, second.text
            assert second.json()["error"]["code"] == "trainer_attached"
            assert seat["trainer_id"] in second.json()["error"]["message"]
            # Someone adds an engine to the running run: it loads the newest weights first.
            extra = stack.enter_context(serve_embedded(str(tmp_path / "model")))
            attached = httpx.post(
                gateway + "/rl/engines", json={"url": extra}, headers=ADMIN, timeout=120
            )
            assert attached.status_code == 201, attached.text
            assert int(attached.json()["weight_version"]) >= 1
            # The run's own engine dies; the supervisor restarts it and it registers again.
            (engine,) = children("serve inference")
            own = next(e["url"] for e in admin_get(gateway, "/rl/engines")["engines"] if e["owner"])
            engine.send_signal(signal.SIGKILL)
            eventually(lambda: own not in urls(gateway), 60, "the dead engine to be taken out")
            eventually(lambda: own in urls(gateway), 120, "the restarted engine to register again")
            assert thread.is_alive(), "the run ended before its engine came back"
            # The run trains on with its engine back, and the extra engine has taken traffic.
            back_at = last_step(log)
            eventually(lambda: last_step(log) > back_at, 120, f"a step after step {back_at}")
            eventually(lambda: served(gateway, extra) > 0, 120, "the extra engine to serve")
            asked_at = last_step(log)
        finally:
            stop.set()  # the run ends after its current step, with its final checkpoint
            thread.join(timeout=300)
        assert result, "the run did not finish"
        summary = result[0]
        assert isinstance(summary, RunSummary), summary
        assert summary.stopped_by == "requested", summary.stopped_by
        assert asked_at <= summary.steps == len(summary.history) < NEVER
        assert summary.restarts.get("engine0") == 1

        # The extra engine served episodes and was kept on the run's newest weights.
        engines = admin_get(gateway, "/rl/engines")["engines"]
        assert [e["url"] for e in engines] == [extra]  # the run's engine left with the run
        assert engines[0]["served"] > 0
        info = httpx.get(extra + "/model_info", timeout=30).json()
        assert int(info["weight_version"]) >= summary.version - 1

    # The books balance at every step, the engine's lost calls included; nothing was trained
    # twice.
    events = [e for e in jsonl(tmp_path / "logs" / "metrics.jsonl") if "event" in e]
    assert identity_breaks(events) == []
    acc = [e for e in events if e["event"] == "accounting"][-1]
    ids = [r["session_id"] for r in trained(tmp_path / "out")]
    assert len(ids) == len(set(ids)) == acc["episodes_trained"]
    # The gateway serves on, with no trainer.
    assert admin_get(gateway, "/rl/trainer")["trainer"] is None
    assert httpx.get(gateway + "/health", timeout=10).status_code == 200


def test_a_run_naming_no_running_gateway_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{pick_free_port()}"
    config = make_config(tmp_path, agent={"gateway_url": url + "/gateway/v1"})
    monkeypatch.delenv("AREAL_ADMIN_TOKEN", raising=False)
    with pytest.raises(RunError, match="AREAL_ADMIN_TOKEN"):
        train(config, tmp_path / "out")
    monkeypatch.setenv("AREAL_ADMIN_TOKEN", ADMIN_TOKEN)
    with pytest.raises(RunError, match=f"no gateway answers at {url}"):
        train(config, tmp_path / "out")
