"""What ``areal doctor`` looks at on this machine: Python, torch, SGLang, the agent CLIs, ports,
the policy's chat template. Each check returns a :class:`Check`; none raises.

torch and transformers are imported inside the checks that need them, so ``areal --help`` stays
light; a missing package is a finding, not a crash.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["ok", "warn", "fail", "skip"]

GATEWAY_PORT = 9000  # `areal serve gateway` and the seed's `python -m areal.gateway.server`
ENGINE_PORT = 30000  # `areal serve inference` and SGLang's own default
DEFAULT_PORTS: dict[int, str] = {
    GATEWAY_PORT: "the gateway's default port",
    ENGINE_PORT: "the inference engine's default port",
}


@dataclass
class Check:
    """One finding: what was checked, how it went, why, and what to do about it."""

    name: str
    status: Status
    why: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_python() -> Check:
    """Which interpreter runs areal: the one whose packages every other check sees."""
    version = platform.python_version()
    return Check(
        "python", "ok", f"Python {version} ({sys.executable})", details={"version": version}
    )


def check_torch() -> Check:
    """torch's version and what it can drive: CUDA devices and NCCL, when this build has them."""
    from areal.run.machine import gpu_count

    try:
        import torch
    except ImportError as err:
        return Check(
            "torch", "fail", f"torch cannot be imported: {err}", "pip install 'torch>=2.6'"
        )
    details: dict[str, Any] = {"version": torch.__version__, "cuda": None, "nccl": None}
    gpus = gpu_count()
    if not torch.cuda.is_available():
        if gpus:
            return Check(
                "torch",
                "warn",
                f"torch {torch.__version__} cannot use the {gpus} GPU(s) of this machine "
                "(a CPU build, or a driver it does not support)",
                "install a CUDA build of torch that matches the driver (see pytorch.org)",
                details,
            )
        return Check("torch", "ok", f"torch {torch.__version__}, CPU only", details=details)
    details["cuda"] = torch.version.cuda
    details["devices"] = torch.cuda.device_count()
    nccl = ""
    try:
        raw = torch.cuda.nccl.version()
        details["nccl"] = ".".join(map(str, raw)) if isinstance(raw, tuple) else str(raw)
        nccl = f", NCCL {details['nccl']}"
    except (AttributeError, RuntimeError):
        pass
    names = sorted({torch.cuda.get_device_name(i) for i in range(details["devices"])})
    return Check(
        "torch",
        "ok",
        f"torch {torch.__version__}, CUDA {details['cuda']}{nccl}, "
        f"{details['devices']} GPU(s): {', '.join(names)}",
        details=details,
    )


def check_backends(selected: str | None, python: str | None = None) -> list[Check]:
    """Every registered inference backend: can this machine run it, and if not, why. Each is
    asked in a subprocess of the interpreter that would run it (``python`` for the config's own
    backend); only the config's backend can fail the doctor."""
    from areal.core.plugins import registry

    backends = registry("inference_backends")
    checks = []
    for name in backends.names():
        spec = backends.get(name)
        reason = spec.why_not_runnable(python if name == selected else None)
        label = f"backend {name}"
        if reason is None:
            checks.append(Check(label, "ok", f"can run here ({spec.description})"))
        elif name == selected:
            checks.append(Check(label, "fail", f"the config's backend cannot run: {reason}"))
        else:
            checks.append(Check(label, "skip", f"cannot run here: {reason}"))
    return checks


def check_claude_code(required: bool) -> Check:
    """The ``claude`` CLI, found exactly as the claude_code adapter finds it."""
    from areal.adapters.claude_code import INSTALL_HINT, ClaudeCodeError, find_binary

    try:
        path = find_binary(None)
    except ClaudeCodeError:
        return _missing_cli("claude code CLI", "claude_code", required, INSTALL_HINT)
    return Check("claude code CLI", "ok", path, details={"path": path})


def check_openclaw(required: bool) -> Check:
    """The ``openclaw`` CLI and the Node it runs on, found as the openclaw adapter finds them."""
    from areal.adapters.openclaw import INSTALL_HINT, OpenClawError, find_node_dir, find_openclaw

    try:
        path = find_openclaw(None)
        node = find_node_dir(None, path)
    except OpenClawError:
        return _missing_cli("openclaw CLI", "openclaw", required, INSTALL_HINT)
    runs_on = f"Node in {node}" if node else "the node on PATH"
    return Check("openclaw CLI", "ok", f"{path} ({runs_on})", details={"path": path, "node": node})


def _missing_cli(name: str, framework: str, required: bool, hint: str) -> Check:
    if required:
        return Check(
            name, "fail", f"not found, and the config uses agent.framework: {framework}", hint
        )
    return Check(name, "warn", f"not found (needed only for agent.framework: {framework})", hint)


def check_port(port: int, purpose: str, *, required: bool) -> Check:
    """Free, or who holds it: a pid and command line the user can act on."""
    from areal.host.ports import port_holders

    holders = port_holders(port)
    name = f"port {port}"
    if not holders:
        return Check(name, "ok", f"free ({purpose})", details={"port": port, "holders": []})
    pids = [h.pid for h in holders if h.pid is not None]
    kill = f"stop it (kill {' '.join(map(str, pids))}) or " if pids else "free it or "
    return Check(
        name,
        "fail" if required else "warn",
        f"taken ({purpose}) by " + "; ".join(h.describe() for h in holders),
        f"{kill}start the server with --port on another port",
        details={"port": port, "holders": [asdict(h) for h in holders]},
    )


def check_chat_template(tokenizer_dir: str | None, source: str) -> Check:
    """Render, extend by one assistant + user turn, render again: do the earlier tokens stay?"""
    name = "chat template"
    if tokenizer_dir is None:
        return Check(
            name,
            "skip",
            "no policy tokenizer to check",
            "pass --tokenizer DIR, or a run config whose model.path exists locally",
        )
    if not Path(tokenizer_dir).exists():
        return Check(
            name,
            "skip",
            f"{source} {tokenizer_dir} is not a local directory",
            "download the model, or pass --tokenizer DIR",
        )
    from areal.tools.template_check import check_prefix_stability

    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        report = check_prefix_stability(tokenizer)
    except Exception as err:  # a broken template or tokenizer is the finding itself
        return Check(
            name,
            "fail",
            f"cannot render a conversation with {tokenizer_dir}: {type(err).__name__}: {err}",
            "fix the tokenizer's chat_template (tokenizer_config.json or chat_template.jinja)",
        )
    details = {"tokenizer": tokenizer_dir, **asdict(report)}
    if report.stable:
        return Check(
            name,
            "ok",
            f"prefix-stable: one more assistant+user turn keeps all {report.earlier_tokens} "
            f"earlier tokens ({tokenizer_dir})",
            details=details,
        )
    return Check(
        name,
        "warn",
        f"not prefix-stable ({tokenizer_dir}): one more assistant+user turn changes token "
        f"{report.break_index} of {report.earlier_tokens}: after {report.shared_text!r} it was "
        f"{report.earlier_text!r}, now {report.later_text!r}; multi-turn episodes cannot merge "
        "into one sequence, every turn trains as its own sample",
        "use a chat template that renders earlier turns unchanged (e.g. keep earlier "
        "reasoning instead of stripping it)",
        details,
    )
