"""Children that die with their parent, whatever kills it.

SIGTERM and Ctrl-C stop a run's processes in order, but a SIGKILL, the OOM killer or a crash
runs no code in the parent at all: a SIGKILLed ``areal train`` left its engine, gateway and
rollout worker running (all three alive 25 s later, still alive while the resumed run trained).
So the child itself watches its parent, set up between fork and the child's program:

- **Linux**: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, set by this file run as a tiny wrapper
  (:func:`guarded`) that then ``exec``-s the real command, so the pid, the command line and the
  process group stay the child's own. The kernel SIGKILLs the child the moment its parent dies,
  even a child that is stopped (SIGSTOP) or hung, and the setting survives the ``exec`` of any
  program (SGLang, vLLM, ours). After ``prctl`` the wrapper checks that its parent is still the one
  that started it, so a parent that died between the fork and the ``prctl`` is caught too.

  The caveat: to the kernel the "parent" is the *thread* that forked. A child started from a
  short-lived thread is SIGKILLed when that thread ends, however healthy the parent process is.
  areal starts its servers from the thread that runs the run's event loop (the supervisor's
  ``start_all`` and restarts; ``ServerProcess.start`` in the main thread elsewhere), which lives
  as long as they should; never start one from a thread pool (``asyncio.to_thread``).
- **Elsewhere** (macOS, the BSDs), or with ``--watch``: the wrapper stays, runs the command as its
  own child in the same process group, and watches its parent: ``getppid()`` changes when the
  parent dies and the orphan is adopted (by init or a subreaper), and then the wrapper SIGKILLs the
  whole group. Polled every :data:`POLL_S` (a watched pipe would tell as soon, and needs an fd
  carried through every ``exec``; the parent's pid needs nothing).

Processes areal does not fork itself (torchrun's ranks, forked by torchrun) call
:func:`watch_parent`, the same watch as a daemon thread. With ``PDEATHSIG`` the kernel kills the
group leader only: a server's own forks are its business, and the engines handle theirs (SGLang's
scheduler and detokenizer set ``PR_SET_PDEATHSIG`` themselves, vLLM's workers watch a death pipe;
the embedded engine, the gateway and the rollout worker fork nothing).

This file runs by path with ``python -I -S`` (no site, no ``sys.path`` from the environment): it
imports the standard library only, so the wrapper costs one bare interpreter start (~30 ms).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["POLL_S", "guarded", "pdeathsig_available", "watch_parent"]

POLL_S = 0.2  # how often a watcher asks for its parent
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_FLAG = "--watch"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def pdeathsig_available() -> bool:
    return sys.platform.startswith("linux")


def guarded(command: Sequence[str], *, watch: bool = False) -> list[str]:
    """``command`` behind the wrapper: it dies with this process (the calling thread: see the
    module docstring). ``watch``: the portable watcher even where ``PDEATHSIG`` exists."""
    wrapper = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(os.getpid())]
    if watch or not pdeathsig_available():
        wrapper.append(WATCH_FLAG)
    return [*wrapper, "--", *command]


def watch_parent(*, poll_s: float = POLL_S) -> threading.Thread:
    """This process SIGKILLs itself when its parent dies (a daemon thread polls ``getppid``):
    for processes started by code that is not areal's, such as torchrun's ranks."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="areal-parent-watch", daemon=True)
    thread.start()
    return thread


# --- the wrapper (this file run as a script) -----------------------------------------------------


def _set_pdeathsig() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _cannot_run(command: list[str], err: OSError) -> int:
    print(f"error: cannot run {command[0]}: {err.strerror}", file=sys.stderr, flush=True)
    return 127


def _exec_with_pdeathsig(parent: int, command: list[str]) -> int:
    _set_pdeathsig()
    if os.getppid() != parent:  # the parent died before prctl took effect
        return 1
    try:
        os.execvp(command[0], command)
    except OSError as err:
        return _cannot_run(command, err)
    return 127  # not reached: exec replaced this process


def _run_watched(parent: int, command: list[str]) -> int:
    """The command as this wrapper's child; the group SIGKILLed when ``parent`` dies. Signals
    meant for the command reach it through the group (``killpg``); the wrapper only waits, and
    ends as the command ended."""
    for sig in FORWARDED:
        # Caught, not ignored: an ignored signal would stay ignored in the command after exec.
        signal.signal(sig, lambda *_: None)
    try:
        child = subprocess.Popen(command)
    except OSError as err:
        return _cannot_run(command, err)
    while child.poll() is None:
        if os.getppid() != parent:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        time.sleep(POLL_S)
    code = child.returncode
    if code < 0:  # died by a signal: so does the wrapper, for whoever waits for it
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def main(argv: list[str]) -> int:
    """``parent_death.py PARENT_PID [--watch] -- COMMAND...``"""
    split = argv.index("--") if "--" in argv else len(argv)
    head, command = argv[:split], argv[split + 1 :]
    if not head or not command:
        print("usage: parent_death.py PARENT_PID [--watch] -- COMMAND...", file=sys.stderr)
        return 2
    parent = int(head[0])
    if WATCH_FLAG in head or not pdeathsig_available():
        return _run_watched(parent, command)
    return _exec_with_pdeathsig(parent, command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
