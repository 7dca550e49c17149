"""``areal probe AGENT``: run one episode of an agent against a running gateway and explain it.

Example: ``AREAL_ADMIN_TOKEN=... areal probe examples/openai_math/agent.py:solve --gateway
http://127.0.0.1:9000``. Adapters and aiohttp are imported inside the command.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from areal.cli.errors import CLIError

MARKS = {"ok": "[green]ok[/green]  ", "warn": "[yellow]warn[/yellow]", "fail": "[red]fail[/red]"}


def probe_command(
    agent: str = typer.Argument(
        ...,
        help="module:attr, path/to/file.py:attr, or the name of a harness adapter.",
    ),
    gateway: str = typer.Option(
        "http://127.0.0.1:9000", "--gateway", "-g", help="The running gateway's URL."
    ),
    framework: str | None = typer.Option(
        None, "--framework", help="The adapter to use (default: chosen like areal.wrap does)."
    ),
    task: str | None = typer.Option(None, "--task", help="The task as a JSON object."),
    task_file: Path | None = typer.Option(
        None, "--task-file", help="A JSON (or one-line JSONL) file holding the task."
    ),
    option: list[str] = typer.Option(
        [], "--option", "-O", help="An adapter option key=value (the value is JSON if it parses)."
    ),
    agent_config: Path | None = typer.Option(
        None, "--agent-config", help="An agent_config.py defining AGENT_CONFIG."
    ),
    reward: str | None = typer.Option(
        None, "--reward", help="A reward plugin scoring an agent that returns its answer."
    ),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds the episode may run."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Run one episode of AGENT through a running gateway and explain it.

    Reports: base URL honoured, model asked for, calls, tool calls parsed, turns merged
    token-exactly or split (and where the prefix broke), reward.

    The session is ended discarded: probing a training run's gateway adds nothing to training.
    The admin token comes from AREAL_ADMIN_TOKEN. Exit code 1 when a check fails.

    Example: [bold]areal probe examples/openai_math/agent.py:solve -g http://127.0.0.1:9000[/bold]
    """
    from areal.run.probe import probe
    from areal.run.rollout import RolloutError

    admin = os.environ.get("AREAL_ADMIN_TOKEN")
    if not admin:
        raise CLIError(
            "AREAL_ADMIN_TOKEN is not set: the probe opens a session with the gateway's admin "
            "token (the one the gateway was started with)"
        )
    url = gateway.rstrip("/").removesuffix("/v1")
    options = _options(option, agent_config)
    wrapped = _wrap(agent, framework, options)
    the_task = _task(task, task_file)
    reward_fn = None
    if reward:
        from areal.core.rewards import build_reward

        reward_fn = build_reward(reward, {"gateway_url": url})
    try:
        report = asyncio.run(
            probe(
                wrapped.agent_fn,
                gateway_url=url,
                admin_token=admin,
                task=the_task,
                model=_policy_model(url, admin),
                reward_fn=reward_fn,
                timeout_s=timeout,
                session_fields=getattr(wrapped, "session_fields", None),
            )
        )
    except RolloutError as err:
        raise CLIError(str(err)) from None
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print(report, agent)
    if not report.ok():
        raise typer.Exit(1)


def _wrap(agent: str, framework: str | None, options: dict[str, Any]) -> Any:
    import areal
    from areal.adapters.base import AdapterError

    if ":" not in agent:  # a harness by name
        target: Any = agent
    else:
        target = _load(agent)
    try:
        return areal.wrap(target, framework=framework, **options)
    except (AdapterError, ValueError) as err:
        raise CLIError(str(err)) from None


def _load(ref: str) -> Any:
    """``module:attr`` or ``path/to/file.py:attr`` (the file's folder goes on sys.path)."""
    from areal.core.config import ConfigError
    from areal.core.tasks import load_object

    where, _, attr = ref.rpartition(":")
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise CLIError(f"{ref}: no file {where}")
        sys.path.insert(0, str(path.parent))
        ref = f"{path.stem}:{attr}"
    else:
        sys.path.insert(0, os.getcwd())
    try:
        return load_object(ref)
    except ConfigError as err:
        raise CLIError(str(err)) from None


def _options(pairs: list[str], agent_config: Path | None) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CLIError(f"--option {pair!r}: write key=value")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    if agent_config is not None:
        options["agent_config"] = str(agent_config)
    return options


def _task(task: str | None, task_file: Path | None) -> dict[str, Any] | None:
    if task is not None and task_file is not None:
        raise CLIError("give --task or --task-file, not both")
    text = task if task is not None else task_file.read_text() if task_file else None
    if text is None:
        return None
    try:
        value = json.loads(text.strip().splitlines()[0] if task_file else text)
    except (json.JSONDecodeError, IndexError) as err:
        raise CLIError(f"the task is not a JSON object: {err}") from None
    if not isinstance(value, dict):
        raise CLIError("the task must be a JSON object")
    return value


def _policy_model(url: str, admin: str) -> str:
    """The policy's model id, from ``GET /v1/models`` (its first entry)."""
    import urllib.error
    import urllib.request

    from areal.run.reachability import describe_unreachable

    request = urllib.request.Request(
        f"{url}/v1/models", headers={"Authorization": f"Bearer {admin}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        raise CLIError(
            f"the gateway at {url} answered GET /v1/models with HTTP {err.code}"
        ) from None
    except (urllib.error.URLError, OSError) as err:
        raise CLIError(f"cannot reach the gateway at {url}: {describe_unreachable(url)}") from err
    return str(data["data"][0]["id"])


def _print(report: Any, agent: str) -> None:
    console = Console(highlight=False, soft_wrap=True)
    console.print(
        f"[bold]probe[/bold] {escape(agent)} -> {escape(report.gateway)} "
        f"(session {report.session_id or '-'}, {report.seconds:.1f}s)"
    )
    for check in report.checks():
        console.print(f"  {MARKS[check.status]} {check.name:<11} {escape(check.detail)}")
    for turn in report.turns:
        tools = f", tools: {', '.join(turn['tool_calls'])}" if turn["tool_calls"] else ""
        console.print(
            f"    turn {turn['turn']}: {turn['prompt_tokens']} prompt + {turn['output_tokens']} "
            f"output tokens, {turn['finish_reason']}, {turn['join']} (sample {turn['sample']})"
            f"{tools}"
        )
