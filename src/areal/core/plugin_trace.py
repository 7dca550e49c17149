"""``AREAL_TRACE_PLUGINS=1``: every hook call on stderr, to see which plugin answered what.

One line per call, written when the call returns:

    areal-trace areal_register_losses(register=<function ...>) by areal.plugins.losses.register, fancy-loss -> [None, None] 0.1 ms

Arguments and results are shown by ``repr``, cut at :data:`MAX_REPR` characters and with
anything shaped like a key removed (a hook may be handed a config that holds one). Tracing
costs nothing when off: the monitoring is installed only when the variable is set, and hot
paths never go through pluggy anyway (hooks fill registries at start-up).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

import pluggy

from areal.host.redact import redact

ENV = "AREAL_TRACE_PLUGINS"
MAX_REPR = 200


def trace_requested() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no")


def trace_hook_calls(pm: pluggy.PluginManager, out: TextIO | None = None) -> None:
    """Write one line per hook call of ``pm`` to ``out`` (stderr by default)."""
    calls = threading.local()  # a stack of start times per thread: hook calls nest

    def before(hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        calls.__dict__.setdefault("started", []).append(time.perf_counter())

    def after(
        outcome: Any, hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> None:
        started = calls.__dict__.get("started") or [time.perf_counter()]
        by = [impl.plugin_name for impl in reversed(impls)]
        try:
            result = _shown(outcome.get_result())
        except BaseException as exc:
            result = _raised(exc)
        write_call(hook_name, by, kwargs, result, started.pop(), out)

    pm.add_hookcall_monitoring(before, after)


def traced_call(
    hook_name: str, plugin: str, kwargs: dict[str, Any], call: Callable[[], Any]
) -> Any:
    """Run one hook implementation called by hand (the registries call each plugin's
    implementation directly, to give each its own ``register``) and trace it like pluggy's."""
    started = time.perf_counter()
    try:
        result = call()
    except BaseException as exc:
        write_call(hook_name, [plugin], kwargs, _raised(exc), started)
        raise
    write_call(hook_name, [plugin], kwargs, _shown(result), started)
    return result


def write_call(
    hook_name: str,
    by: list[str],
    kwargs: Mapping[str, Any],
    result: str,
    started: float,
    out: TextIO | None = None,
) -> None:
    took_ms = (time.perf_counter() - started) * 1000
    args = ", ".join(f"{name}={_shown(value)}" for name, value in kwargs.items())
    stream = out or sys.stderr
    plugins = ", ".join(by) or "no plugin"
    stream.write(f"areal-trace {hook_name}({args}) by {plugins} -> {result} {took_ms:.1f} ms\n")
    stream.flush()


def _raised(exc: BaseException) -> str:
    return f"raised {type(exc).__name__}: {_shown(str(exc))}"


def _shown(value: Any) -> str:
    text = redact(repr(value))
    return text if len(text) <= MAX_REPR else text[: MAX_REPR - 3] + "..."
