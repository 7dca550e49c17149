"""One confined process per BFCL episode: it holds the item's stateful tool instances, runs the
model's calls in them and runs BFCL's state checker at the end.

BFCL executes a call by ``eval`` of its Python text, so this runs in a child, never in the rollout
worker. The agent builds every text it sends from an offered function's name and JSON literals
(:func:`areal.plugins.tasks.bfcl_data.call_string`), so no model output reaches ``eval`` as code;
the confinement is the second wall, for whatever BFCL's tool classes do:

- no network: a new network namespace (``unshare -n``; only a loopback that is down);
- run as ``nobody`` (when areal runs as root; ``setpriv``), so the kernel refuses writes to
  anything but the scratch directory and world-writable places;
- an audit hook (:func:`confine`) refuses sockets, new processes, ``ctypes`` and any file write
  outside the scratch directory; rlimits: no child processes, bounded memory, CPU time and file
  size;
- a fresh scratch directory as its working directory and home, removed after the episode; an
  environment with nothing of the parent's in it; ``python -I`` (no PYTHONPATH, no user site).

The strongest of these that the machine allows is probed once per process (:func:`isolation`);
an audit hook alone (no namespace) is logged as a warning.

The wire: one JSON object per line each way, on the child's stdin and stdout. The child runs as
a script (``python -I bfcl_sandbox.py``) and imports only the standard library and ``bfcl_eval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

NOBODY = 65534
REQUEST_TIMEOUT_S = 120.0  # a ceiling for a stopped machine; a BFCL call takes milliseconds
PROBE_TIMEOUT_S = 60.0
LINE_LIMIT = 64 * 1024**2  # long-context tool results are long
LIVE_MODEL = "areal_live"  # BFCL names its instances after a model; the checker adds "_eval"
MULTI_TURN_CLASSES = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)
# The child's limits: (resource name, value). NPROC 0: it may not start a process (or a thread).
RLIMITS = (
    ("RLIMIT_NPROC", 0),
    ("RLIMIT_CORE", 0),
    ("RLIMIT_CPU", 600),
    ("RLIMIT_FSIZE", 16 * 1024**2),
    ("RLIMIT_AS", 4 * 1024**3),
)


class SandboxError(RuntimeError):
    """The sandbox process failed (it died, hung, or answered nonsense)."""


@dataclass(frozen=True)
class Verdict:
    """BFCL's multi-turn checker's answer."""

    valid: bool
    error_type: str = ""
    error_message: str = ""


@dataclass(frozen=True)
class Isolation:
    """How sandboxes are confined on this machine: a command prefix and who owns the scratch."""

    name: str  # "netns+nobody", "userns+netns" or "audit-hook"
    prefix: tuple[str, ...]
    uid: int | None  # chown the scratch directory to this user (the child runs as it)


_isolation: Isolation | None = None


async def isolation() -> Isolation:
    """The strongest confinement that starts a working sandbox here, probed once per process."""
    global _isolation
    if _isolation is None:
        _isolation = await _probe()
    return _isolation


def _candidates() -> list[Isolation]:
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    found: list[Isolation] = []
    if unshare and setpriv and os.geteuid() == 0:
        drop = (f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs")
        found.append(Isolation("netns+nobody", (unshare, "-n", "--", setpriv, *drop, "--"), NOBODY))
    if unshare:
        found.append(Isolation("userns+netns", (unshare, "-r", "-n", "--"), None))
    return found


async def _probe() -> Isolation:
    for candidate in _candidates():
        scratch = _scratch(candidate)
        try:
            proc = await asyncio.create_subprocess_exec(
                *candidate.prefix,
                *_python(),
                "-c",
                "import bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
                cwd=scratch,
                env=_environment(scratch),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            log.info("bfcl sandbox: %s does not start here (%s)", candidate.name, exc)
            continue
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if proc.returncode == 0:
            log.info("bfcl sandbox: confined by %s", candidate.name)
            return candidate
        log.info("bfcl sandbox: %s fails here: %s", candidate.name, err.decode()[-300:].strip())
    log.warning(
        "bfcl sandbox: no network namespace available (unshare); the tools' process is confined "
        "by an audit hook and rlimits only"
    )
    return Isolation("audit-hook", (), None)


def _python() -> tuple[str, ...]:
    # -I: no PYTHONPATH, no user site, not the script's directory; -B: no .pyc written.
    return (sys.executable, "-I", "-B")


def _scratch(how: Isolation) -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="areal-bfcl-"))
    if how.uid is not None:
        os.chown(scratch, how.uid, how.uid)
    return scratch


def _environment(scratch: Path) -> dict[str, str]:
    """Nothing of the parent's environment (keys, tokens, proxies) reaches the child."""
    home = str(scratch)
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "BFCL_PROJECT_ROOT": home,  # anything bfcl_eval writes goes to the scratch directory
    }


class Sandbox:
    """The host side: ``async with await Sandbox.open(entry) as box: await box.execute([...])``."""

    def __init__(
        self, proc: asyncio.subprocess.Process, scratch: Path, how: Isolation, stderr: IO[bytes]
    ) -> None:
        self.proc = proc
        self.scratch = scratch
        self.isolation = how
        self._stderr = stderr

    @classmethod
    async def open(cls, entry: dict[str, Any]) -> Sandbox:
        """A sandbox holding ``entry``'s tools in their initial state (``entry``: a BFCL item's
        ``id``, ``initial_config`` and ``involved_classes``)."""
        how = await isolation()
        scratch = _scratch(how)
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the sandbox's; closed by close()
        try:
            proc = await asyncio.create_subprocess_exec(
                *how.prefix,
                *_python(),
                str(Path(__file__).resolve()),
                str(scratch),
                cwd=scratch,
                env=_environment(scratch),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                limit=LINE_LIMIT,
                # Out of the worker's process group: a run that stops kills the group, and the
                # child, seeing its stdin close, removes its scratch directory and exits.
                start_new_session=True,
            )
        except BaseException:
            stderr.close()
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        box = cls(proc, scratch, how, stderr)
        try:
            fields = ("id", "initial_config", "involved_classes")
            await box.request({"op": "start", "entry": {k: entry[k] for k in fields}})
        except BaseException:
            await box.close()
            raise
        return box

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def execute(self, calls: list[str]) -> list[str]:
        """Run calls (BFCL's Python text) on the episode's tools, in order; one result each
        (an error is a result: ``Error during execution: ...``, as BFCL gives it to models)."""
        results: list[str] = (await self.request({"op": "execute", "calls": calls}))["results"]
        return results

    async def check(
        self, model_calls: list[list[list[str]]], ground_truth: list[list[str]]
    ) -> Verdict:
        """BFCL's ``multi_turn_checker`` on the calls the model made (per turn, per step), against
        the ground truth, both replayed from the initial state in this process."""
        answer = await self.request(
            {"op": "check", "model_calls": model_calls, "ground_truth": ground_truth}
        )
        return Verdict(
            bool(answer["valid"]), answer.get("error_type", ""), answer.get("error_message", "")
        )

    async def request(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(body).encode() + b"\n")
            await self.proc.stdin.drain()
            line = await asyncio.wait_for(self.proc.stdout.readline(), REQUEST_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            raise SandboxError(
                f"the BFCL sandbox did not answer {body['op']!r}: {exc!r}{self._tail()}"
            ) from exc
        if not line:
            raise SandboxError(f"the BFCL sandbox exited during {body['op']!r}{self._tail()}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise SandboxError(f"the BFCL sandbox failed {body['op']!r}: {answer['error']}")
        return answer

    async def close(self) -> None:
        """Kill the process (it holds nothing worth a goodbye) and remove its scratch directory."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        self._stderr.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _tail(self) -> str:
        self._stderr.seek(0)
        text = self._stderr.read()[-2000:].decode(errors="replace").strip()
        return f"; its stderr: {text}" if text else ""


# --- the child ------------------------------------------------------------------------------------

# Audit events refused outright: the network, new processes, foreign code.
FORBIDDEN = (
    "socket.",
    "subprocess.",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "pty.",
    "ctypes.",
    "_posixsubprocess",
    "webbrowser.",
)
# Audit events that change the file system: every path they name must be in the scratch dir.
CHANGES = frozenset(
    {
        "os.remove",
        "os.rename",
        "os.mkdir",
        "os.rmdir",
        "os.chmod",
        "os.chown",
        "os.link",
        "os.symlink",
        "os.truncate",
        "os.utime",
        "shutil.rmtree",
        "shutil.copyfile",
        "shutil.copymode",
        "shutil.copystat",
        "shutil.move",
    }
)


def confine(scratch: str) -> None:
    """Limits and an audit hook on this process: see the module's docstring. An audit hook cannot
    be removed once added."""
    import resource

    for name, value in RLIMITS:
        _soft, hard = resource.getrlimit(getattr(resource, name))
        limit = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(getattr(resource, name), (limit, limit))
    root = os.path.realpath(scratch)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def inside(path: Any) -> bool:
        if isinstance(path, int):  # an open descriptor: nothing new is reached
            return True
        if not isinstance(path, (str, bytes, os.PathLike)):
            return True
        real = os.path.realpath(os.fsdecode(path))
        return real == root or real.startswith(root + os.sep)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(FORBIDDEN):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            writes = (
                any(c in mode for c in "wax+")
                if isinstance(mode, str)
                else bool(flags & write_flags)
            )
            if writes and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} is not allowed (only {root})")
        elif event in CHANGES and not all(inside(a) for a in args if not isinstance(a, int)):
            raise PermissionError(f"sandbox: {event} outside {root} is not allowed")

    sys.addaudithook(hook)


class _Child:
    """The child's state: the item, and BFCL's instances (held in BFCL's module globals)."""

    def __init__(self) -> None:
        self.entry: dict[str, Any] = {}

    def start(self, body: dict[str, Any]) -> dict[str, Any]:
        self.entry = body["entry"]
        self.execute({"calls": []})  # creates the instances from initial_config
        return {"ok": True}

    def execute(self, body: dict[str, Any]) -> dict[str, Any]:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
            execute_multi_turn_func_call,
        )

        results, _ = execute_multi_turn_func_call(
            func_call_list=body["calls"],
            initial_config=self.entry["initial_config"],
            involved_classes=self.entry["involved_classes"],
            model_name=LIVE_MODEL,
            test_entry_id=self.entry["id"],
            long_context=_long_context(self.entry["id"]),
            is_evaL_run=False,
        )
        return {"results": [str(r) for r in results]}

    def check(self, body: dict[str, Any]) -> dict[str, Any]:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

        category = self.entry["id"].rsplit("_", 1)[0]
        try:
            verdict = multi_turn_checker(
                body["model_calls"], body["ground_truth"], self.entry, category, LIVE_MODEL
            )
        except Exception as exc:  # BFCL asserts that both sides built the same instances
            return {
                "valid": False,
                "error_type": "multi_turn:checker_error",
                "error_message": repr(exc),
            }
        return {
            "valid": bool(verdict["valid"]),
            "error_type": str(verdict.get("error_type", "")),
            "error_message": str(verdict.get("error_message", "")),
        }


def _long_context(bfcl_id: str) -> bool:
    category = bfcl_id.rsplit("_", 1)[0]  # as BFCL decides it
    return "long_context" in category or "composite" in category


def _serve(scratch: str) -> None:
    import importlib

    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what the tools print goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    # Everything the tools need is imported before the hook, which refuses ctypes (loaded by
    # some of those imports) from then on.
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker  # noqa: F401

    for name in MULTI_TURN_CLASSES:
        importlib.import_module(CLASS_FILE_PATH_MAPPING[name])
    confine(scratch)
    child = _Child()
    for line in sys.stdin:
        body = json.loads(line)
        try:
            if body["op"] not in ("start", "execute", "check"):
                raise ValueError(f"unknown op {body['op']!r}")
            answer = getattr(child, body["op"])(body)
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        protocol.write(json.dumps(answer) + "\n")
        protocol.flush()
    # The parent closed the pipe: done, or killed before it could clean up (a run that stops
    # with episodes in flight); the scratch directory goes either way.
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    _serve(sys.argv[1])
