"""``areal doctor``: what on this machine, or in a run config, will break a run or quietly make it
slow, each finding with one line of why and the fix.

A run that fails an hour in (a port taken, a CLI missing) or one that "works" but is no faster
than sync (staleness 0, a tiny queue) costs more than a few seconds of checks up front. torch and
transformers are imported only when the command runs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import typer

from areal.cli.doctor_async import async_checks
from areal.cli.doctor_checks import (
    DEFAULT_PORTS,
    Check,
    Status,
    check_backends,
    check_chat_template,
    check_claude_code,
    check_openclaw,
    check_port,
    check_python,
    check_torch,
)
from areal.core.config import ConfigError, load_yaml
from areal.core.run_config import RunConfigError, apply_overrides, run_config_from_dict
from areal.run.machine import check_machine
from areal.run.model_scale import scale_warnings

_COLORS = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "bright_black"}


def doctor_command(
    config: Path | None = typer.Argument(
        None, help="Run config YAML to check as well (async settings, model, adapters)."
    ),
    overrides: list[str] = typer.Option(
        [], "--set", help="Override one config key, e.g. --set async.staleness_threshold=0."
    ),
    tokenizer: Path | None = typer.Option(
        None, "--tokenizer", help="Policy tokenizer directory (default: the config's model)."
    ),
    ports: list[int] = typer.Option(
        [], "--port", help="Another port that must be free (repeatable); taken = fail."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Check this machine (and a run config) for what breaks a run or defeats asynchrony.

    Example: [bold]areal doctor configs/agent_async_train.yaml --port 5555[/bold]

    Each line is ok, warn, fail or skip with why and the fix; exit 1 when any check fails.
    """
    data, config_checks = _load(config, overrides)
    framework = _get(data, "agent", "framework")
    checks = [
        check_python(),
        check_torch(),
        check_claude_code(required=framework == "claude_code"),
        check_openclaw(required=framework == "openclaw"),
    ]
    backend = (_get(data, "inference", "backend") or "embedded") if data is not None else None
    checks += check_backends(backend, _get(data, "inference", f"{backend}_python"))
    checks += [check_port(port, why, required=False) for port, why in DEFAULT_PORTS.items()]
    checks += [
        check_port(port, "asked for with --port", required=True)
        for port in dict.fromkeys(ports)
        if port not in DEFAULT_PORTS
    ]
    checks.append(check_chat_template(*_tokenizer(tokenizer, data)))
    findings = async_checks(data) if data is not None else []
    # A key the checklist explains (rollout_workers: 0) is reported once, in its words.
    explained = {c.name for c in findings if c.status != "ok"}
    checks += [c for c in config_checks if c.name not in explained] + findings
    _print(checks, as_json)
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)


def _load(config: Path | None, overrides: list[str]) -> tuple[dict[str, Any] | None, list[Check]]:
    """The parsed config (for the checks that read raw values) and the validation findings."""
    if config is None:
        return None, []
    name = f"config {config}"
    try:
        data = apply_overrides(load_yaml(config), overrides)
    except ConfigError as err:
        return None, [Check(name, "fail", str(err), "fix the file or the --set value")]
    try:
        run = run_config_from_dict(copy.deepcopy(data), source=str(config))
    except RunConfigError as err:
        return data, [_keyed(line, "fail") for line in err.errors]
    warnings = check_machine(run)
    checks = [_keyed(line, "warn") for line in warnings]
    if not warnings:
        checks.append(Check(name, "ok", "valid, and this machine can run it"))
    # Tiny-model learning rates on a real checkpoint: the run works and learns from noise.
    checks += [_keyed(line, "warn") for line in scale_warnings(run)]
    return data, checks


def _keyed(line: str, status: Status) -> Check:
    """``"key: why; fix"`` (as config validation words it) as a check named by its key."""
    key, sep, why = line.partition(": ")
    if not sep or " " in key:
        key, why = "config", line
    return Check(key, status, why)


def _get(data: dict[str, Any] | None, section: str, key: str) -> Any:
    part = (data or {}).get(section)
    return part.get(key) if isinstance(part, dict) else None


def _tokenizer(option: Path | None, data: dict[str, Any] | None) -> tuple[str | None, str]:
    """The policy tokenizer to check, and where that answer came from (a Hub id already in the
    Hugging Face cache is its snapshot; nothing is downloaded)."""
    from areal.core.model_source import cached_model

    if option is not None:
        return str(option), "--tokenizer"
    for key in ("tokenizer", "path"):
        value = _get(data, "model", key)
        if isinstance(value, str) and value:
            local = value if Path(value).exists() else cached_model(value)
            return local or value, f"model.{key}"
    return None, ""


def _print(checks: list[Check], as_json: bool) -> None:
    counts = {s: sum(c.status == s for c in checks) for s in _COLORS}
    if as_json:
        report = {
            "ok": counts["fail"] == 0,
            "counts": counts,
            "checks": [c.to_json() for c in checks],
        }
        typer.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    for check in checks:
        status = typer.style(f"{check.status:<4}", fg=_COLORS[check.status], bold=True)
        typer.echo(f"{status}  {check.name}: {check.why}")
        if check.fix and check.status != "ok":
            typer.echo(f"      fix: {check.fix}")
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    typer.echo(f"doctor: {summary}")
