"""Codex as an agent: one ``codex exec <task prompt>`` per episode, talking only to the gateway's
Responses API with the episode's session key.

Each episode gets a fresh directory holding an isolated ``HOME`` and ``CODEX_HOME`` (so no login,
config, history or plugin of the machine is read) and a workspace prepared from a template
directory and the task's ``files``. The generated ``config.toml`` names the gateway as the only
model provider (``wire_api = "responses"``, the key read from an environment variable, so it is
never written to disk or put on the command line) and the policy as the model, and turns off what
would leave the host: update checks, analytics, feedback, OpenTelemetry exporters (the default
metrics exporter posts to ``ab.chatgpt.com``) and the plugin sync (``github.com``,
``chatgpt.com``). Everything else is Codex's default, tools included: the gateway offers the
policy Codex's function tools and leaves out its hosted ones (``web_search``, the
``multi_agent_v1`` namespace). Codex's own retries are off, since a retried call would be
recorded as a second turn.

The episode's result is Codex's last agent message (``--json`` events), scored like the Claude
Code adapter's: a shell command in the final workspace, a registered reward plugin, or the text
for the rollout worker's reward function. A turn the policy could not finish (its reply cut by
the output cap, or its conversation grown past the policy's context) is a finished episode with
an empty answer; any other failure (a first prompt the context cannot hold included) raises
:class:`CodexError` with the tail of stderr, the key redacted.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from areal.adapters.claude_code import (
    INHERITED_ENV,
    HarnessError,
    HarnessTimeout,
    episode_dirs,
    redacted_tail,
    run_group,
    score,
    task_prompt,
)
from areal.adapters.harness import HarnessAdapter, HarnessOptions
from areal.adapters.openclaw import deep_merge
from areal.core.episode import Episode

CACHE = Path(".cache") / "codex" / "node_modules"
INSTALL_HINT = (
    "install it with `make setup` (npm install --prefix .cache/codex @openai/codex), or "
    "`npm install -g @openai/codex`, or set the adapter's `binary` option"
)
KEY_ENV = "AREAL_SESSION_KEY"  # the provider's env_key: Codex sends it as a bearer token
SANDBOXES = ("read-only", "workspace-write", "danger-full-access")
# What Codex would otherwise reach on its own (measured with strace on 0.169.1: DNS lookups of
# ab.chatgpt.com, chatgpt.com, github.com and api.github.com, none with these set).
PHONE_HOME_OFF: dict[str, Any] = {
    "check_for_update_on_startup": False,
    "analytics": {"enabled": False},
    "feedback": {"enabled": False},
    "otel": {"exporter": "none", "trace_exporter": "none", "metrics_exporter": "none"},
    "features": {"plugins": False},
}
# Turn endings that are the policy's doing, not a failure of the run: its reply cut by the output
# cap, or (once it has done something) the conversation grown past its context.
CUT_REPLY = "Incomplete response returned, reason: max_output_tokens"
FULL_CONTEXT = "ran out of room in the model's context window"


class CodexError(HarnessError):
    """A Codex episode failed (binary missing, non-zero exit, API error, unreadable output)."""


class CodexTimeout(CodexError, HarnessTimeout):
    """Codex ran past ``timeout_s``; its whole process group was killed."""


@dataclass(frozen=True)
class CodexOptions(HarnessOptions):
    """How each episode's ``codex exec`` runs. ``config`` is deep-merged into the generated
    ``config.toml`` (e.g. ``{"features": {"goals": False}}``); ``instructions`` replaces Codex's
    base instructions (``model_instructions_file``), the largest part of its prompt."""

    binary: str | None = None  # path or name on PATH; default: `codex` on PATH, else .cache/codex
    sandbox: str = "workspace-write"  # where the policy's shell commands may write
    provider: str = "areal"
    instructions: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    extra_args: Sequence[str] = ()

    name: ClassVar[str] = "codex"


class CodexAdapter(HarnessAdapter):
    """An :data:`~areal.run.rollout.AgentFn` running ``codex exec`` once per episode:
    ``CodexAdapter(options)``, ``CodexAdapter(**options)`` or ``CodexAdapter("codex", **options)``
    (as ``areal.wrap`` calls a registered factory)."""

    framework = "codex"
    options_class = CodexOptions
    config: CodexOptions

    def __init__(
        self,
        agent: str | CodexOptions | Mapping[str, Any] | None = "codex",
        options: CodexOptions | Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(agent, options, **overrides)
        config = self.config
        if config.sandbox not in SANDBOXES:
            raise ValueError(
                f"sandbox must be one of {', '.join(SANDBOXES)}, got {config.sandbox!r}"
            )

    async def agent_fn(self, episode: Episode) -> float | str | None:
        """Run one episode: prepare its directory, run the CLI, score, clean up."""
        opts = self.config
        binary = find_codex(opts.binary)
        prompt = task_prompt(episode.task, opts.prompt_key, "Codex", CodexError)
        with episode_dirs(opts, episode.task, "areal-codex-") as (root, home, work):
            codex_home = home / ".codex"
            codex_home.mkdir()
            config = self.codex_config(episode)
            if opts.instructions is not None:
                instructions = codex_home / "instructions.md"
                instructions.write_text(opts.instructions)
                config["model_instructions_file"] = str(instructions)
            (codex_home / "config.toml").write_text(toml_text(config))
            argv = [binary, "exec", *self.args(), "--", prompt]
            env = self.env(episode, home, root)
            out, err, code = await run_group(
                argv, cwd=work, env=env, timeout_s=opts.timeout_s, errors=(CodexError, CodexTimeout)
            )
            text = parse_events(out, err, code, secret=episode.api_key)
            keyless = {k: v for k, v in env.items() if k != KEY_ENV}
            return await score(episode, text, work, keyless, opts)

    def args(self) -> list[str]:
        """The ``codex exec`` flags before the prompt."""
        args = ["--json", "--skip-git-repo-check", "--sandbox", self.config.sandbox]
        return args + list(self.config.extra_args)

    def codex_config(self, episode: Episode) -> dict[str, Any]:
        """The run's ``config.toml``: the gateway as the only provider, the policy as the model,
        nothing that phones home; Codex's defaults otherwise, then the ``config`` option."""
        opts = self.config
        provider = {
            "name": opts.provider,
            "base_url": episode.base_url,
            "env_key": KEY_ENV,
            "wire_api": "responses",
            "request_max_retries": 0,
            "stream_max_retries": 0,
        }
        config = {
            "model": episode.model,
            "model_provider": opts.provider,
            **PHONE_HOME_OFF,
            "model_providers": {opts.provider: provider},
        }
        return deep_merge(config, opts.config)

    def env(self, episode: Episode, home: Path, root: Path) -> dict[str, str]:
        """The CLI's whole environment: nothing of the parent's but ``INHERITED_ENV``."""
        env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env |= {
            "HOME": str(home),
            "CODEX_HOME": str(home / ".codex"),
            "TMPDIR": str(root),
            KEY_ENV: episode.api_key,
            "NO_PROXY": "*",  # the gateway is reached directly, never through a proxy
        }
        return env | dict(self.config.env)


def find_codex(binary: str | None) -> str:
    """The ``codex`` executable: ``binary`` (a path or a name on PATH), else ``codex`` on PATH,
    else the project's ``.cache/codex`` install (``make setup``)."""
    if binary:
        found = shutil.which(binary)
        if found is None:
            raise CodexError(f"the Codex CLI {binary!r} was not found: {INSTALL_HINT}")
        return os.path.abspath(found)  # the CLI runs in the workspace: a relative path would break
    found = shutil.which("codex")
    if found:
        return os.path.abspath(found)
    for base in (Path.cwd(), *Path(__file__).resolve().parents):
        cached = base / CACHE / ".bin" / "codex"
        if cached.is_file() and os.access(cached, os.X_OK):
            return str(cached)
    raise CodexError(f"the Codex CLI `codex` is not on PATH: {INSTALL_HINT}")


def parse_events(stdout: str, stderr: str, code: int, *, secret: str) -> str:
    """The turn's last agent message from ``codex exec --json`` events.

    ``turn.completed`` with exit 0 is an answer; a ``turn.failed`` the policy caused (its reply
    cut by the output cap; its context filled after it did something) is a finished episode with
    an empty answer; a first prompt too long for the policy, any other failure, a non-zero exit
    or output without a turn's end raises :class:`CodexError`. Codex's non-fatal notices
    (``item.completed`` items of type ``error``) are not failures.
    """
    events = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    items = [
        e["item"]
        for e in events
        if e.get("type") == "item.completed" and isinstance(e.get("item"), dict)
    ]
    messages = [i.get("text") for i in items if i.get("type") == "agent_message"]
    ends = [e for e in events if e.get("type") in ("turn.completed", "turn.failed")]
    end = ends[-1] if ends else None
    if end is not None and end["type"] == "turn.failed":
        error = end.get("error") or {}
        message = str(error.get("message", error)) if isinstance(error, dict) else str(error)
        worked = any(i.get("type") != "error" for i in items)
        if CUT_REPLY in message or (FULL_CONTEXT in message and worked):
            return ""
        if FULL_CONTEXT in message:
            raise CodexError(
                "Codex's first prompt does not fit the policy's context: serve a policy with a "
                "longer context, or shrink the prompt (the `instructions` option; `config` "
                "features such as goals, multi_agent, skills)"
            )
        raise CodexError(
            f"codex exited with code {code}, the turn failed: {redacted_tail(message, secret, 800)}"
            f"; stderr tail: {_tail(stderr, secret)!r}"
        )
    if end is None or code:
        what = f"exited with code {code}" if code else "printed no turn.completed event"
        raise CodexError(
            f"codex {what}; stdout: {redacted_tail(stdout, secret, 500)!r}; "
            f"stderr tail: {_tail(stderr, secret)!r}"
        )
    return messages[-1] if messages and isinstance(messages[-1], str) else ""


def _tail(stderr: str, secret: str) -> str:
    """The stderr tail without Codex's start-up notices (helper binaries, stdin)."""
    noise = ("could not create PATH aliases", "Reading additional input from stdin")
    lines = [line for line in stderr.splitlines() if not any(n in line for n in noise)]
    return redacted_tail("\n".join(lines), secret, 1500)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_text(config: Mapping[str, Any]) -> str:
    """``config`` as TOML: scalars and lists first, then one ``[table]`` per nested mapping.

    Strings, integers and booleans are written as JSON writes them, which TOML reads the same (a
    basic string's escapes are JSON's, DEL aside); lists hold scalars only.
    """
    lines: list[str] = []
    _table(config, [], lines)
    return "\n".join(lines) + "\n"


def _table(table: Mapping[str, Any], path: list[str], lines: list[str]) -> None:
    nested = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    plain = {k: v for k, v in table.items() if not isinstance(v, Mapping) and v is not None}
    if path and (plain or not nested):
        lines.append(f"[{'.'.join(_key(p) for p in path)}]")
    for key, value in plain.items():
        lines.append(f"{_key(key)} = {_value(value, [*path, key])}")
    for key, value in nested.items():
        _table(value, [*path, key], lines)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _value(value: Any, path: list[str]) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v, path) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return json.dumps(value)
    raise TypeError(f"config {'.'.join(path)}: cannot write a {type(value).__name__} as TOML")
