"""Run ``areal train`` as a real process, inject faults into it by signal, and read back what the
run recorded: its events, its audit trail of trained samples, its own log. Shared by the fault
tests (loaded by path: the test folders are not packages) and by ``gateway_kill.py``.

A fault names its target as the supervisor names the process (``AREAL_PROCESS`` in the child's
environment: ``gateway``, ``engine0``, ``rollout0``) or :data:`TRAINER` (``areal train`` itself),
and the step after which it strikes. Faults strike in order, each once its step is logged and the
previous target is back (the supervisor restarted it), so each fault is seen on its own.
``during_sync``: at the start of the next weight sync (the disk sync's save phase: the moment its
``weights/.vN.tmp`` appears, caught with inotify), so the sync's calls to the engine that follow
meet a stopped process. A rollout worker is struck only while it has an episode open at the
gateway: with all its session requests held in the gateway's long poll (the staleness budget
full), a kill would cut no episode short, and those requests open nothing once it is dead.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
TRAINER = "trainer"
PROCESS_ENV = "AREAL_PROCESS"
BATCH = 32
# The quickstart, made small enough for a test: no format warm start, the nano model, a step
# every 32 episodes (one sample each), 32 in flight. The rule and the processes are the same.
SMALL = (
    "warm_start.steps=0",
    "model.init_tiny=nano",
    f"async.trigger_batch_size={BATCH}",
    f"train.global_batch_size={BATCH}",
    f"train.mini_batch_size={BATCH}",
    f"agent.concurrency={BATCH}",
    "algorithm.group_size=4",
)
STOPPED_FOR_S = 30.0  # a stopped process nobody killed by then is let go (SIGCONT): no hang


@dataclass(frozen=True)
class Fault:
    target: str  # a child's AREAL_PROCESS name, or TRAINER
    step: int  # strikes once this run has logged this many steps (a resumed run: since it began)
    sig: int = signal.SIGKILL
    during_sync: bool = False  # at the start of the next weight sync after ``step``
    sync_timeout_s: float = 5.0  # during_sync: the run's weight-sync watchdog (see _stop_in_sync)


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
    tries: int = 0  # during_sync: syncs tried until one was caught before it had answered
    back_pid: int | None = None  # the target's new pid once the supervisor restarted it
    back_after: float | None = None  # seconds from the fault to the new pid
    released: bool = False  # a stopped target the run never killed: SIGCONT by the helper
    # TRAINER: every process areal train had started, and the seconds until all were gone.
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

    def accounting_at(self, step: int) -> dict[str, Any]:
        return [e for e in self.all("accounting") if e["step"] <= step][-1]


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
    pending, injected = list(faults), []
    first_step = _steps(logs / "train.log")  # a resumed run's log goes on from the first's
    try:
        while proc.poll() is None and time.monotonic() - started < timeout:
            _follow(trainer, injected, started)
            done = _steps(logs / "train.log")  # the step numbers of the events
            if pending and done - first_step >= pending[0].step and _settled(injected):
                hit = _inject(pending[0], proc, trainer, out, done, started)
                if hit is not None:
                    injected.append(hit)
                    pending.pop(0)
            time.sleep(0.05)
        code = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return FaultRun(
        out,
        code,
        time.monotonic() - started,
        injected,
        _jsonl(logs / "metrics.jsonl"),
        _jsonl(out / "run" / "trained.jsonl"),
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


def listening(proc: psutil.Process) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [
            c.laddr.port for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
        ]
    return []


def _inject(
    fault: Fault, proc: subprocess.Popen[bytes], trainer: psutil.Process, out: Path, step: int,
    started: float,
) -> Injected | None:  # fmt: skip
    if fault.target == TRAINER:
        return _kill_trainer(fault, proc, trainer, step, started)
    target = child(trainer, fault.target)
    if target is None:
        return None  # not (re)started yet: try again
    if fault.target.startswith("rollout") and not _has_open_episode(trainer, fault.target):
        return None  # nothing to cut short yet: try again
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
        if not _stop_in_sync(hit, out, proc):
            return None  # the run ended first
    else:
        os.kill(target.pid, fault.sig)
    hit.at = time.monotonic() - started
    return hit


def _has_open_episode(trainer: psutil.Process, worker: str) -> bool:
    """Whether the run's gateway has an open session of rollout worker ``worker`` (by the
    ``worker`` metadata the run opens them with), asked on its session API with the admin token
    the run gave it."""
    gateway = child(trainer, "gateway")
    if gateway is None:
        return False
    with contextlib.suppress(psutil.Error):
        token = gateway.environ().get("AREAL_ADMIN_TOKEN", "")
        ports = listening(gateway)
    if not token or not ports:
        return False
    base, index = f"http://127.0.0.1:{ports[0]}/rl/sessions", worker.removeprefix("rollout")
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(headers=headers, timeout=5) as http:
            for session_id in http.get(base).json()["open"]:
                answer = http.get(f"{base}/{session_id}")
                if answer.status_code == 200 and answer.json()["metadata"].get("worker") == index:
                    return True
    except (httpx.HTTPError, KeyError, ValueError):
        pass
    return False


SYNC_TRIES = 8


def _stop_in_sync(hit: Injected, out: Path, proc: subprocess.Popen[bytes]) -> bool:
    """Signal the target as a weight sync begins (its save phase), so the sync's engine calls
    meet a stopped process. A sync of the nano model takes ~20 ms, and on a loaded machine the
    signal may come after it answered: then that sync's step is logged well before a watchdog
    could have fired (within ``0.6 * sync_timeout_s``), so the target is let go (SIGCONT), and
    the next sync is tried."""
    for tries in range(1, SYNC_TRIES + 1):
        version = _next_sync(out / "weights", proc)
        if version is None:
            return False
        os.kill(hit.pid, hit.fault.sig)
        deadline = time.monotonic() + 0.6 * hit.fault.sync_timeout_s
        while time.monotonic() < deadline and not _logged(out, version):
            time.sleep(0.02)
        if not _logged(out, version):  # the sync waits on it: caught
            hit.sync_version, hit.tries, hit.step = version, tries, version - 1
            return True
        os.kill(hit.pid, signal.SIGCONT)  # too late: that sync was through; the next one
    return False


def _kill_trainer(
    fault: Fault, proc: subprocess.Popen[bytes], trainer: psutil.Process, step: int,
    started: float,
) -> Injected:  # fmt: skip
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
    deadline = killed + 10.0
    while time.monotonic() < deadline and not all(gone(p) for p in children):
        time.sleep(0.02)
    if all(gone(p) for p in children):
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


# --- the start of a weight sync, by inotify ----------------------------------------------------

IN_CREATE, IN_MOVED_TO = 0x100, 0x80


def _next_sync(weights: Path, proc: subprocess.Popen[bytes], wait_s: float = 60.0) -> int | None:
    """Block until the next ``weights/.vN.tmp`` appears (a sync's save began); its ``N``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    try:
        if libc.inotify_add_watch(fd, str(weights).encode(), IN_CREATE | IN_MOVED_TO) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {weights}")
        deadline = time.monotonic() + wait_s
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            data = os.read(fd, 65536)
            offset = 0
            while offset < len(data):
                _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16 : offset + 16 + size].rstrip(b"\0").decode()
                offset += 16 + size
                if name.startswith(".v") and name.endswith(".tmp"):
                    return int(name[2:-4])
        return None
    finally:
        os.close(fd)


# --- reading the run back ----------------------------------------------------------------------


def _logged(out: Path, version: int) -> bool:
    """The weight sync of ``version`` is in the train log: its ``[sync]`` line is written once
    the engines serve it (an async step's ``[train]`` line comes earlier: the engines load beside
    the next step). Step and version are one number, also across a resume."""
    log = out / "logs" / "train.log"
    return log.exists() and f"[sync] step={version} " in log.read_text()


def _steps(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(line.startswith("[train] step=") for line in log.read_text().splitlines())


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
