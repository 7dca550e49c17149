"""An engine attached mid-run under ``inference.weight_sync: collective`` serves every version the
run publishes after it joined, and nothing before: it starts as SGLang and vLLM do (labelled
``"default"``, not a run version), the run's gateway holds it, the trainer's next publish
re-forms the weight group with it, and from then on it loads each new version in turn. No token
with an unreadable version is trained. A real ``areal train`` run (its engine, gateway and
rollout worker are processes) in a thread of the test; the late engine is the embedded server in
this process, so every weight load and every answer it gives is seen as it happens.

The run has no step budget it could reach first: the test ends it through ``train``'s ``stop``
event once the late engine has served and seen two more versions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from areal.run.runner import RunSummary, train
from support import eventually
from support.engines import running_server
from support.http import bearer
from support.processes import children
from support.runs import identity_breaks, in_thread, jsonl, last_step, make_config, trained

NEVER = 10**9  # train.max_steps: the run ends when the test sets its stop event
STEP_S = 180.0  # a ceiling for one step of the nano run on a loaded machine

pytestmark = [pytest.mark.serial, pytest.mark.slow]


class Watched:
    """What the in-process engine does: each version it loads, and the version labels of the
    tokens of every answer it finishes (``meta_info.weight_versions``)."""

    def __init__(self, engine: Any) -> None:
        self.loaded: list[str] = []
        self.served: list[set[str]] = []
        load, submit = engine.load_weights, engine.submit

        def load_weights(tensors: Any, version: str | None) -> str:
            loaded: str = load(tensors, version)
            self.loaded.append(loaded)
            return loaded

        def submit_watched(req: Any, emit: Callable[[dict[str, Any], bool], None]) -> None:
            def tee(payload: dict[str, Any], final: bool) -> None:
                if final:
                    spans = payload["meta_info"]["weight_versions"]
                    self.served.append({span["version"] for span in spans})
                emit(payload, final)

            submit(req, tee)

        engine.load_weights, engine.submit = load_weights, submit_watched


def the_gateway() -> tuple[str, dict[str, str]]:
    """The run's own gateway (a supervised process): its URL and admin headers."""
    (gateway,) = children("areal.gateway.server")
    cmdline = gateway.cmdline()
    port = cmdline[cmdline.index("--port") + 1]
    token = psutil.Process(gateway.pid).environ()["AREAL_ADMIN_TOKEN"]
    return f"http://127.0.0.1:{port}", bearer(token)


def test_an_engine_attached_mid_run_joins_the_collective_sync_and_serves_every_new_version(
    tmp_path: Path,
) -> None:
    config = make_config(
        tmp_path, train={"max_steps": NEVER}, inference={"weight_sync": "collective"}
    )
    log = tmp_path / "logs" / "train.log"
    stop = threading.Event()
    thread, result = in_thread(lambda: train(config, tmp_path / "out", stop=stop))
    try:
        eventually(lambda: last_step(log) >= 1, STEP_S, "step 1 in train.log")
        url, admin = the_gateway()

        def engine_entry(engine_url: str) -> dict[str, Any]:
            answer = httpx.get(url + "/rl/engines", headers=admin, timeout=30).json()
            return next(e for e in answer["engines"] if e["url"] == engine_url)

        with running_server(str(tmp_path / "model"), weight_version="default") as late:
            watched = Watched(late.server.engine)
            attached = httpx.post(
                url + "/rl/engines", json={"url": late.url}, headers=admin, timeout=60
            )
            assert attached.status_code == 201, attached.text
            # Not a run version: held, no call goes there until the trainer's next publish.
            assert attached.json()["held"] and attached.json()["weight_version"] == "default"
            eventually(lambda: watched.loaded, STEP_S, "the next publish to reach the late engine")
            joined = int(watched.loaded[0])
            eventually(lambda: not engine_entry(late.url)["held"], STEP_S, "the engine let in")
            eventually(lambda: engine_entry(late.url)["served"] > 0, STEP_S, "it served a call")
            eventually(lambda: len(watched.loaded) >= 3, 2 * STEP_S, "two more versions loaded")
            stop.set()  # the run ends after its current step, publishing it to both engines
            thread.join(timeout=300)
            assert result, "the run did not finish"
            summary = result[0]
            assert isinstance(summary, RunSummary), summary
            assert summary.stopped_by == "requested"

            # Every version from the one it joined at to the run's last, each once, in order;
            # its /model_info says the run's last.
            assert watched.loaded == [str(v) for v in range(joined, summary.version + 1)]
            info = late.http.get("/model_info").json()
            assert info["weight_version"] == str(summary.version)
            # Every token it served was labelled with a version it had loaded: a run version.
            assert watched.served
            assert set().union(*watched.served) <= set(watched.loaded)
    finally:
        stop.set()
        thread.join(timeout=300)

    # No unreadable token was trained, and the books balance at every step.
    events = [e for e in jsonl(tmp_path / "logs" / "metrics.jsonl") if "event" in e]
    steps = [e for e in events if e["event"] == "train"]
    assert steps and all(e["dropped_unversioned"] == 0 for e in steps)
    assert identity_breaks(events) == []
    ids = [r["session_id"] for r in trained(tmp_path / "out")]
    assert len(ids) == len(set(ids))
