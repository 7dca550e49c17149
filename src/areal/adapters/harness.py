"""What every harness adapter shares (Claude Code, OpenClaw, Codex, a Vercel AI SDK script): the
options of an episode (its time limit, environment and workspace, how its result is scored), one
way to build them from ``areal.wrap``'s keywords, where an unknown name is an error that lists the
known ones, and the constructor every CLI harness takes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from areal.adapters.base import Adapter

Options = TypeVar("Options", bound="HarnessOptions")


@dataclass(frozen=True)
class HarnessOptions:
    """The fields every harness has; each adapter's options class adds its own."""

    name: ClassVar[str] = "harness"  # the adapter's name, for messages

    timeout_s: float = 600.0  # per episode; then the process group is killed
    env: Mapping[str, str] = field(default_factory=dict)  # added last, overrides the adapter's
    prompt_key: str = "prompt"  # the task's field holding the prompt
    workspace: str | None = None  # a template directory copied into each episode's workspace
    reward_command: str | Sequence[str] | None = None  # run in the workspace; exit 0 → 1.0
    reward: str | None = None  # a registered reward plugin scoring the final text
    reward_options: Mapping[str, Any] = field(default_factory=dict)
    reward_timeout_s: float = 300.0
    answer: bool = True  # without a reward: return the final text (False: None)
    work_root: str | None = None  # where episode directories are made (default: the temp dir)
    keep_workdir: bool = False  # leave each episode's directory behind (debugging)

    @classmethod
    def from_mapping(cls: type[Options], options: Mapping[str, Any]) -> Options:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"unknown {cls.name} option(s) {unknown}; known: {', '.join(sorted(known))}"
            )
        return cls(**options)

    @classmethod
    def build(
        cls: type[Options],
        options: Options | Mapping[str, Any] | None,
        overrides: Mapping[str, Any],
    ) -> Options:
        """``options`` (an instance or a mapping) with ``overrides`` on top, checked."""
        if isinstance(options, HarnessOptions):
            options = {f.name: getattr(options, f.name) for f in fields(options)}
        config = cls.from_mapping({**(options or {}), **overrides})
        if config.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {config.timeout_s}")
        return config


class HarnessAdapter(Adapter):
    """A CLI harness run once per episode: ``Adapter(options)``, ``Adapter(**options)`` or, as
    ``areal.wrap`` calls a registered factory, ``Adapter("<framework>", **options)``."""

    harness = True  # the agent itself: a run needs no entrypoint for it
    options_class: ClassVar[type[HarnessOptions]] = HarnessOptions
    config: Any  # an ``options_class``; subclasses say which

    def __init__(
        self,
        agent: str | HarnessOptions | Mapping[str, Any] | None = None,
        options: HarnessOptions | Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        if not isinstance(agent, str | None):  # Adapter(options)
            options, agent = agent, None
        super().__init__(agent or self.framework, **overrides)
        self.config = self.options_class.build(options, overrides)
