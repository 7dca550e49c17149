"""Whole runs of areal for the tests: a small run config, what a run left behind (its audit trail,
its log), and ``areal train`` as a real process with faults injected into it by signal.

A fault names its target as the supervisor names the process (``AREAL_PROCESS`` in the child's
environment: ``gateway``, ``engine0``, ``rollout0``) or :data:`TRAINER` (``areal train`` itself),
and the step after which it strikes. Faults strike in order, each once its step is logged and the
previous target is back (the supervisor restarted it), so each fault is seen on its own.

``during_sync``: the target is stopped while the trainer waits at the start of a weight sync's
engine calls. The run is started with ``AREAL_TEST_STOP_AT=weight_sync.to_engines``
(:mod:`areal.host.faults`): before every sync's engine calls the trainer stops itself; the harness
sees it stopped, strikes the target if the fault is due, and lets the trainer go on. The sync's
calls that follow meet a stopped engine, every time: nothing here races the sync.

A rollout worker is struck while it certainly has an episode open at the gateway: struck at
another moment, all its session requests may be held in the gateway's long poll (the staleness
budget full), and a kill would cut no episode short. The run is started with
``AREAL_TEST_STOP_AT=rollout.episode_open@OUT/strike-rollout``: a worker stops itself right after
the gateway opened an episode for it, but only while that file exists. When the fault is due the
harness creates the file; once it sees the target stopped there it removes the file and strikes
(the episode is open, and nothing can end it from the stopped worker); another worker stopped
there is let go. A target that never stops there within ``ARMED_FOR_S`` fails the run, loudly.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from areal.core.episode_journal import EpisodeBooks, read_journal
from areal.core.run_config import RunConfig, run_config_from_dict
from areal.host.faults import STOP_ENV
from areal.host.process import KILLED_EXIT_S
from areal.run.accounting import JOURNAL_NAME
from support.wait import NeverHappened, eventually

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
TRAINER = "trainer"
PROCESS_ENV = "AREAL_PROCESS"
SYNC_POINT = "weight_sync.to_engines"  # the crash point a sync passes before its engine calls
EPISODE_POINT = "rollout.episode_open"  # the crash point a worker passes with an episode open
STRIKE_FILE = "strike-rollout"  # in the run's out folder: armed, the worker stops at EPISODE_POINT
STOPPED_FOR_S = 30.0  # a stopped target nobody killed by then is let go (SIGCONT): no hang
ARMED_FOR_S = 120.0  # a ceiling for a stopped machine: a worker opens episodes every step
FOLLOW_S = 0.05  # how often the harness looks at a run it follows (it wakes at once on exit)


# --- an in-process run's config and what a run leaves behind ------------------------------------


def make_config(tmp: Path, **sections: dict[str, Any]) -> RunConfig:
    """The tests' small run: the nano model, real engine, gateway, workers and queue, 3 steps
    of 4 episodes; ``sections`` update the sections they name."""
    data: dict[str, Any] = {
        "model": {"path": str(tmp / "model"), "dtype": "float32", "init_tiny": "nano"},
        "dataset": {"name": "tool_then_answer", "seed": 0},
        "train": {"global_batch_size": 4, "mini_batch_size": 4, "max_steps": 3},
        "algorithm": {"group_size": 2},
        "sampling": {"max_new_tokens": 8},
        "inference": {"max_total_tokens": 4096},
        "async": {"staleness_threshold": 1, "queue_max_size": 32, "trigger_batch_size": 4},
        "agent": {"reward_source": "agent", "concurrency": 4, "episode_timeout_s": 60},
        "logging": {"log_dir": str(tmp / "logs"), "save_interval": 100},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return run_config_from_dict(data)


def small(batch: int) -> tuple[str, ...]:
    """``--set`` overrides that shrink the quickstart for a test: no format warm start, the nano
    model, a step every ``batch`` episodes (one sample each), ``batch`` in flight. The rule and
    the processes are the quickstart's."""
    return (
        "warm_start.steps=0",
        "model.init_tiny=nano",
        f"async.trigger_batch_size={batch}",
        f"train.global_batch_size={batch}",
        f"train.mini_batch_size={batch}",
        f"agent.concurrency={batch}",
        "algorithm.group_size=4",
    )


BATCH = 32
SMALL = small(BATCH)


def trained(out: Path) -> list[dict[str, Any]]:
    """The run's audit trail: one record per trained trajectory."""
    return jsonl(out / "run" / "trained.jsonl")


def read_log(tmp: Path) -> list[str]:
    return (tmp / "logs" / "train.log").read_text().splitlines()


def jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_step(log: Path) -> int:
    """The newest ``[train] step=N`` a run logged to ``log`` (0 before its first)."""
    steps = re.findall(r"^\[train\] step=(\d+) ", log.read_text(), re.MULTILINE)
    return int(steps[-1]) if steps else 0


def in_thread(run: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``run()`` (an in-process ``train``) on a thread of its own; the list receives its
    result, or the exception it raised, for the test thread to check."""
    result: list[Any] = []

    def target() -> None:
        try:
            result.append(run())
        except BaseException as err:  # handed to the test thread
            result.append(err)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


# --- areal train with faults --------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    target: str  # a child's AREAL_PROCESS name, or TRAINER
    step: int  # strikes once this run has logged this many steps (a resumed run: since it began)
    sig: int = signal.SIGKILL
    during_sync: bool = False  # while the trainer waits at the next weight sync after ``step``


@dataclass
class Injected:
    """What one fault hit, and what became of it."""

    fault: Fault
    pid: int
    step: int  # the last step logged when it struck (as the events number steps)
    at: float  # seconds into the run
    pythonpath: str = ""  # the target's PYTHONPATH: which areal it ran
    url: str = ""  # where the target listened (http://127.0.0.1:PORT), if it did
    sync_version: int | None = None  # during_sync: the version whose sync it struck
    back_pid: int | None = None  # the target's new pid once the supervisor restarted it
    back_after: float | None = None  # seconds from the fault to the new pid
    released: bool = False  # a stopped target the run never killed: SIGCONT by the harness
    # Episodes the run's journal had ended without a trajectory when this fault struck (the
    # gateway writes each ``r`` line before it answers, so it is exact at that moment).
    discarded_before: int | None = None
    # TRAINER: every process areal train had started, and whether all were gone in time.
    children: dict[int, str] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    gone_after: float | None = None
    left: list[str] = field(default_factory=list)


@dataclass
class FaultRun:
    out: Path
    returncode: int | None
    seconds: float
    injected: list[Injected]
    events: list[dict[str, Any]]
    trained: list[dict[str, Any]]
    log: str  # areal train's own log (stderr), this run's part

    def all(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]

    def last(self, event: str) -> dict[str, Any]:
        return self.all(event)[-1]

    def stale_at(self, step: int) -> int:
        """Samples dropped as stale by the end of ``step`` (0 before the first)."""
        trains = [e for e in self.all("train") if e["step"] <= step]
        return int(trains[-1]["dropped_stale"]) if trains else 0


def command(out: Path, steps: int, overrides: tuple[str, ...], *, resume: bool) -> list[str]:
    cmd = [sys.executable, "-m", "areal", "train", str(QUICKSTART), "--output-dir", str(out)]
    for override in (
        f"train.max_steps={steps}",
        f"logging.log_dir={out / 'logs'}",
        f"model.path={out.parent / 'model'}",  # areal's tiny model, created once per folder
        "logging.save_interval=1000",
        *overrides,  # later values win
    ):
        cmd += ["--set", override]
    return [*cmd, "--resume"] if resume else cmd


def run(
    out: Path,
    *,
    steps: int,
    faults: Sequence[Fault] = (),
    overrides: tuple[str, ...] = (),
    resume: bool = False,
    src: Path | None = None,
    timeout: float = 600.0,
) -> FaultRun:
    """``areal train configs/quickstart.yaml`` for ``steps`` steps with ``faults`` (module
    docstring). ``src``: which areal to run (default: this checkout's)."""
    out.mkdir(parents=True, exist_ok=True)
    logs, log_path = out / "logs", out / "areal-train.log"
    env = {**os.environ, "PYTHONPATH": str(src or ROOT / "src")}
    strike = out / STRIKE_FILE
    strike.unlink(missing_ok=True)  # a resumed run's folder: armed by nobody yet
    stops = [SYNC_POINT] if any(f.during_sync for f in faults) else []
    if any(_at_episode(f) for f in faults):
        stops.append(f"{EPISODE_POINT}@{strike}")
    if stops:
        env[STOP_ENV] = ",".join(stops)
    started = time.monotonic()
    offset = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command(out, steps, overrides, resume=resume),
            env=env,
            cwd=out.parent,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    trainer = psutil.Process(proc.pid)
    pending, injected = list(faults), list[Injected]()
    first_step = _steps(logs / "train.log")  # a resumed run's log goes on from the first's
    code: int | None = None
    try:
        while time.monotonic() - started < timeout:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=FOLLOW_S)
                break
            _follow(trainer, injected, started)
            if any(_at_episode(f) for f in faults):
                _let_workers_go(
                    trainer, injected, pending[0] if pending and strike.exists() else None
                )
            held = _stopped(trainer)  # at a sync's stop point, waiting for us
            done = _steps(logs / "train.log")  # the step numbers of the events
            if pending and done - first_step >= pending[0].step and _settled(injected):
                hit = _inject(pending[0], proc, trainer, out, done, started, held=held)
                if hit is not None:
                    injected.append(hit)
                    pending.pop(0)
            if held:
                os.kill(proc.pid, signal.SIGCONT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        strike.unlink(missing_ok=True)
    return FaultRun(
        out,
        code,
        time.monotonic() - started,
        injected,
        jsonl(logs / "metrics.jsonl"),
        jsonl(out / "run" / "trained.jsonl"),
        log_path.read_bytes()[offset:].decode(errors="replace"),
    )


# --- finding and hitting processes ----------------------------------------------------------------


def child(trainer: psutil.Process, name: str) -> psutil.Process | None:
    """``areal train``'s child named ``name`` (its ``AREAL_PROCESS``; for an areal older than
    that name, the gateway and rollout workers by their command lines), if it runs."""
    legacy = "areal.gateway.server" if name == "gateway" else f"{name}.json"
    with contextlib.suppress(psutil.Error):
        for proc in trainer.children():
            with contextlib.suppress(psutil.Error):
                if proc.status() in _DEAD:
                    continue
                named = proc.environ().get(PROCESS_ENV)
                if named == name or (named is None and legacy in " ".join(proc.cmdline())):
                    return proc
    return None


_DEAD = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def gone(proc: psutil.Process) -> bool:
    """Exited (a zombie nobody reaped yet counts: it holds no port, file or core)."""
    try:
        return proc.status() in _DEAD
    except psutil.NoSuchProcess:
        return True


def _stopped(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def listening(proc: psutil.Process) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [
            c.laddr.port for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
        ]
    return []


def _inject(
    fault: Fault, proc: subprocess.Popen[bytes], trainer: psutil.Process, out: Path, step: int,
    started: float, *, held: bool,
) -> Injected | None:  # fmt: skip
    """Strike ``fault`` now if it can be; ``None``: not yet (asked again while the run goes on)."""
    if fault.target == TRAINER:
        return _kill_trainer(fault, proc, trainer, step, started)
    if fault.during_sync and not held:
        return None  # the trainer is not waiting at a sync
    target = child(trainer, fault.target)
    if _at_episode(fault) and not _held_with_episode(fault, target, out):
        return None  # not stopped with an episode open yet (the stop is armed now)
    if target is None:
        return None  # not (re)started yet
    ports = listening(target)
    hit = Injected(
        fault,
        target.pid,
        step,
        0.0,
        pythonpath=target.environ().get("PYTHONPATH", ""),
        url=f"http://127.0.0.1:{ports[0]}" if ports else "",
    )
    if fault.during_sync:
        # Versions reach the engines one at a time, in order, each sync's line logged before the
        # next sync starts: the one held now is the version after the last logged.
        hit.sync_version = _last_synced(out) + 1
        hit.step = hit.sync_version - 1
    hit.discarded_before = journal_discards(out)
    os.kill(target.pid, fault.sig)
    if _at_episode(fault) and fault.sig not in (signal.SIGKILL, signal.SIGSTOP):
        os.kill(target.pid, signal.SIGCONT)  # held at the point: let it take the signal
    hit.at = time.monotonic() - started
    return hit


def journal_discards(out: Path) -> int:
    """The episodes the run's journal says ended without a trajectory, now."""
    books = EpisodeBooks()
    read_journal(out / "run" / JOURNAL_NAME, books)
    return books.discarded


def _at_episode(fault: Fault) -> bool:
    """A fault struck at :data:`EPISODE_POINT`: a rollout worker's, outside a sync."""
    return fault.target.startswith("rollout") and not fault.during_sync


def _held_with_episode(fault: Fault, target: psutil.Process | None, out: Path) -> bool:
    """Whether ``target`` is stopped at :data:`EPISODE_POINT`, so the strike lands with an
    episode open. Arms the stop (creates the strike file) the first time it is asked; disarms it
    once the target is held. Raises once the target was not held within :data:`ARMED_FOR_S`."""
    strike = out / STRIKE_FILE
    if not strike.exists():
        strike.touch()
        return False
    if target is not None and _stopped(target):
        strike.unlink()
        return True
    armed_for = time.time() - strike.stat().st_mtime
    if armed_for > ARMED_FOR_S:
        log = out / "areal-train.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise NeverHappened(
            f"{fault.target} did not stop at {EPISODE_POINT} within {ARMED_FOR_S:.0f} s of the "
            f"strike being armed ({strike}): the fault never struck; areal train's log ends:\n"
            + tail
        )
    return False


def _let_workers_go(trainer: psutil.Process, injected: list[Injected], due: Fault | None) -> None:
    """SIGCONT every rollout worker stopped at :data:`EPISODE_POINT` but the one the due fault
    (``due``, while its stop is armed) waits for; a worker a SIGSTOP fault holds stays held."""
    held = {h.pid for h in injected if h.fault.sig == signal.SIGSTOP and not h.released}
    with contextlib.suppress(psutil.Error):
        for proc in trainer.children():
            with contextlib.suppress(psutil.Error):
                name = proc.environ().get(PROCESS_ENV) or ""
                if not name.startswith("rollout") or proc.pid in held or not _stopped(proc):
                    continue
                if due is None or name != due.target:
                    os.kill(proc.pid, signal.SIGCONT)


def _kill_trainer(
    fault: Fault, proc: subprocess.Popen[bytes], trainer: psutil.Process, step: int,
    started: float,
) -> Injected:  # fmt: skip
    """SIGKILL ``areal train``; then wait for every process it started to be gone, as long as
    the product waits for a SIGKILLed process (``KILLED_EXIT_S``)."""
    children = trainer.children(recursive=True)
    names = {}
    for p in children:
        with contextlib.suppress(psutil.Error):
            names[p.pid] = p.environ().get(PROCESS_ENV) or " ".join(p.cmdline()[:3])
    ports = sorted({port for p in children for port in listening(p)})
    os.kill(proc.pid, fault.sig)
    proc.wait()
    killed = time.monotonic()
    hit = Injected(fault, proc.pid, step, killed - started, children=names, ports=ports)
    with contextlib.suppress(NeverHappened):
        eventually(lambda: all(gone(p) for p in children), KILLED_EXIT_S, "areal train's children")
        hit.gone_after = time.monotonic() - killed
    hit.left = [f"{names.get(p.pid, '?')} (pid {p.pid})" for p in children if not gone(p)]
    return hit


def _follow(trainer: psutil.Process, injected: list[Injected], started: float) -> None:
    """Note the restart of each target; let go of a stopped target nobody killed (no hang)."""
    for hit in injected:
        if hit.fault.target == TRAINER or hit.back_pid is not None:
            continue
        now = child(trainer, hit.fault.target)
        if now is not None and now.pid != hit.pid:
            hit.back_pid, hit.back_after = now.pid, time.monotonic() - started - hit.at
        elif hit.fault.sig == signal.SIGSTOP and not hit.released:
            stopped_for = time.monotonic() - started - hit.at
            hit.released = stopped_for > STOPPED_FOR_S
            if hit.released:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(hit.pid, signal.SIGCONT)


def _settled(injected: list[Injected]) -> bool:
    """The last target is back (or let go), so the next fault is seen on its own."""
    if not injected:
        return True
    last = injected[-1]
    return last.fault.target == TRAINER or last.back_pid is not None or last.released


# --- reading the run back ----------------------------------------------------------------------

_SYNC_LINE = re.compile(r"^\[sync\] step=(\d+) ", re.MULTILINE)


def _last_synced(out: Path) -> int:
    """The newest version the train log says the engines serve (0 before the first sync). Its
    ``[sync]`` line is written once the engines serve it; step and version are one number, also
    across a resume."""
    log = out / "logs" / "train.log"
    versions = [int(v) for v in _SYNC_LINE.findall(log.read_text())] if log.exists() else []
    return max(versions, default=0)


def _steps(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(line.startswith("[train] step=") for line in log.read_text().splitlines())


def identity_breaks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``accounting`` events whose books do not balance exactly (or count an episode
    running that cannot be)."""
    broken = []
    for acc in (e for e in events if e["event"] == "accounting"):
        rest = sum(
            acc[f"episodes_{k}"] for k in ("trained", "dropped", "discarded", "queued", "running")
        )
        balanced = acc["episodes_sent"] == rest and acc["episodes_running"] >= 0
        if not balanced or not acc["episodes_discarded"] >= acc["episodes_lost"] >= 0:
            broken.append(acc)
    return broken


# --- the gateway SIGKILLed at a step (also ``tests/faults/gateway_kill.py``, by hand) -----------


@dataclass
class KilledRun:
    returncode: int
    seconds: float
    killed_at_step: int
    gateway_pythonpath: str  # the killed child's PYTHONPATH: which areal it ran
    events: list[dict[str, Any]] = field(default_factory=list)
    trained: list[dict[str, Any]] = field(default_factory=list)

    def last(self, event: str) -> dict[str, Any]:
        return [e for e in self.events if e["event"] == event][-1]

    def stale_at(self, step: int) -> int:
        """Samples dropped as stale by the end of ``step`` (0 before the first)."""
        trains = [e for e in self.events if e["event"] == "train" and e["step"] <= step]
        return int(trains[-1]["dropped_stale"]) if trains else 0


def run_and_kill(
    out: Path,
    *,
    steps: int,
    kill_at: int,
    src: Path | None = None,
    timeout: float = 600.0,
    overrides: tuple[str, ...] = (),
) -> KilledRun:
    """``areal train configs/quickstart.yaml`` for ``steps`` steps, the gateway killed once the
    run logged ``kill_at`` steps. ``src``: which areal to run (default: this checkout's);
    ``overrides``: more ``--set`` values."""
    done = run(
        out,
        steps=steps,
        faults=[Fault("gateway", kill_at)],
        overrides=overrides,
        src=src,
        timeout=timeout,
    )
    hit = done.injected[0] if done.injected else None
    return KilledRun(
        done.returncode if done.returncode is not None else -1,
        done.seconds,
        hit.step if hit else 0,
        hit.pythonpath if hit else "",
        done.events,
        done.trained,
    )


def summary(run: KilledRun, steps: int) -> dict[str, Any]:
    before = run.stale_at(run.killed_at_step)
    after = run.stale_at(steps) - before
    acc = run.last("accounting")
    return {
        "returncode": run.returncode,
        "seconds": round(run.seconds, 1),
        "killed_at_step": run.killed_at_step,
        "gateway_pythonpath": run.gateway_pythonpath,
        "stale_before": before,
        "stale_after": after,
        "received": run.last("train").get("received"),
        "accounting": {k: v for k, v in acc.items() if k.startswith("episodes_")},
        "restarts": acc.get("restarts"),
    }
