"""The seed article's entry point:
``python -m areal.train --config configs/agent_async_train.yaml --agent-config agent_config.py
--output-dir ./checkpoints/run_001`` (the same run as ``areal train``)."""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal.core.config import ConfigError
from areal.core.run_config import RunConfig, load_run_config
from areal.host.parent_death import watch_parent

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # areal train's log lines

# AGENT_CONFIG keys that become run config keys. ``model_base_url`` names the gateway the agent
# calls (the seed article's ``http://localhost:9000/gateway/v1``): the run attaches to it. The
# agent's api_key and model_name are its own settings, which the rollout worker overrides for
# every episode (the episode's key, the policy's model id).
AGENT_CONFIG_KEYS = {
    "model_base_url": "agent.gateway_url",
    "max_turns": "agent.max_turns",
    "entrypoint": "agent.entrypoint",
    "framework": "agent.framework",
    "episode_timeout_s": "agent.episode_timeout_s",
}


def agent_config_overrides(path: str | Path) -> list[str]:
    """``--set`` overrides from an ``agent_config.py`` that defines ``AGENT_CONFIG``."""
    try:
        namespace = runpy.run_path(str(path))
    except FileNotFoundError:
        raise ConfigError(f"--agent-config: {path} does not exist") from None
    agent: Any = namespace.get("AGENT_CONFIG")
    if not isinstance(agent, dict):
        raise ConfigError(f"--agent-config: {path} must define AGENT_CONFIG = {{...}}")
    return [f"{AGENT_CONFIG_KEYS[k]}={agent[k]}" for k in AGENT_CONFIG_KEYS if k in agent]


def load(config: str, overrides: Sequence[str] = (), agent_config: str | None = None) -> RunConfig:
    extra = agent_config_overrides(agent_config) if agent_config else []
    return load_run_config(config, [*extra, *overrides])


def default_output_dir(config_path: str) -> Path:
    """``runs/<config name>``; a file named ``config.yaml`` is named by its folder, so
    ``examples/openai_math/config.yaml`` runs in ``runs/examples/openai_math`` (beside the model
    its config builds there) and two examples never share a directory."""
    path = Path(config_path)
    if path.stem != "config" or path.parent == Path("."):
        return Path("runs") / path.stem
    folder = path.parent
    return Path("runs") / (folder.name if folder.is_absolute() or ".." in folder.parts else folder)


def with_log_dir(config: RunConfig, output_dir: str | Path) -> RunConfig:
    """``config`` with ``logging.log_dir`` written out: as the file or a ``--set`` gave it, else
    ``<output_dir>/logs``.

    Why the logs follow the output directory: the shipped configs used to name
    ``runs/<config>/logs``, so ``-o DIR`` moved the checkpoints but not the logs, and a second
    run of one config wrote into the first one's train.log. Written out here, once per run, so
    the resolved YAML (``--dry-run``, ``run/resolved.yaml`` that torchrun's ranks and Slurm's job
    read) says where they go; ``areal monitor DIR`` and ``--resume`` (same ``-o``) find them.
    """
    logs = config.logging
    if logs.log_dir:
        return config
    placed = logs.model_copy(update={"log_dir": str(logs.directory(output_dir))})
    return config.model_copy(update={"logging": placed})


def run(
    config: RunConfig, output_dir: Path, *, resume: bool = False, torchrun: Sequence[str] = ()
) -> int:
    """Train; one clear line and exit code 1 when the run fails, 130 on a second Ctrl-C.

    With ``async.train_workers > 1`` the first call starts the trainer's ranks under torchrun
    (``torchrun``: extra flags for it, e.g. ``--nnodes``), which run this again: rank 0 runs the
    whole run, the other ranks follow it. A Hub id in ``model.path`` is resolved here, once,
    before anything starts: every rank and engine reads the same local snapshot.
    """
    from areal.core.model_source import ModelSourceError, resolve_models

    config = with_log_dir(config, output_dir)  # every part (and resolved.yaml) sees one log dir
    try:
        config = resolve_models(config)
    except ModelSourceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    submitted = submit_to_launcher(config, output_dir, resume)
    if submitted is not None:
        return submitted
    if config.async_.train_workers > 1:
        from areal.run import launch

        if not launch.launched():
            return launch.launch(config, output_dir, resume=resume, extra=torchrun)
        # torchrun forks the ranks: each dies with it (and rank 0's processes with rank 0).
        watch_parent()
        if launch.rank() != 0:
            follow(config, output_dir)
            return 0
    from areal.run.runner import RunError, train

    try:
        summary = train(config, output_dir, resume=resume)
    except RunError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    print(
        f"done: {summary.steps} steps, version {summary.version}, "
        f"{summary.seconds:.0f}s; checkpoint {summary.checkpoint}",
        file=sys.stderr,
    )
    footprint = summary.footprint()
    if footprint:
        print(f"footprint: {footprint}", file=sys.stderr)
    return 0


def submit_to_launcher(config: RunConfig, output_dir: Path, resume: bool) -> int | None:
    """Outside its cluster, a launcher with a ``submit`` runs the trainer there (its exit code);
    ``None``: the run goes on in this process (``local``, or already inside the cluster)."""
    from areal.core.launcher import LAUNCHED_BY_ENV, LauncherSpec, launcher_for
    from areal.core.plugins import registry

    name = config.launcher.name
    try:
        launcher_for(config)  # the options, checked before anything starts
    except (ValueError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    spec: LauncherSpec = registry("launchers").get(name, key="launcher.name")
    if not spec.submit or os.environ.get(LAUNCHED_BY_ENV) == name:
        return None
    from areal.run.launch import write_resolved
    from areal.run.processes import trainer_placement

    resolved = write_resolved(config, output_dir)
    return spec.run_submit(config, output_dir, resolved, resume, trainer_placement(config))


def follow(config: RunConfig, output_dir: Path) -> None:
    """A follower rank: the training engine's ``follow`` is its whole life (rank 0 drives)."""
    from areal.core.plugins import registry
    from areal.core.train_engine import EngineSetup

    spec = registry("engines").get(config.train.engine, key="train.engine")
    spec.load_follow()(EngineSetup.from_config(config, output_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m areal.train", description=__doc__)
    parser.add_argument("--config", required=True, help="run config YAML")
    parser.add_argument("--agent-config", help="agent_config.py defining AGENT_CONFIG")
    parser.add_argument("--output-dir", help="checkpoints and run files (default runs/<config>)")
    parser.add_argument("--set", action="append", default=[], help="override: key=value")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    parser.add_argument(
        "--torchrun",
        default="",
        help="extra torchrun flags when async.train_workers > 1 (on node K of 2: "
        "'--nnodes 2 --node-rank K --rdzv-endpoint NODE0:29500')",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format=LOG_FORMAT)
    try:
        config = load(args.config, args.set, args.agent_config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.output_dir) if args.output_dir else default_output_dir(args.config)
    from areal.run.model_scale import scale_warnings

    for warning in scale_warnings(config):
        print(f"warning: {warning}", file=sys.stderr)
    return run(config, out, resume=args.resume, torchrun=shlex.split(args.torchrun))


if __name__ == "__main__":
    sys.exit(main())
