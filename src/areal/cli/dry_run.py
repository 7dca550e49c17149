"""``areal train --dry-run``: what a run would start, where, and on what, without starting it.

Ports are chosen free when the run starts (so two runs never collide), on 127.0.0.1 or on the
node each server lands on (``launcher.listen``), which the plan says instead of guessing numbers; devices come from the config and a torch-free look at the
machine (:func:`areal.core.run_config.gpu_count`).
"""

from __future__ import annotations

from pathlib import Path

from areal.core.launcher import Placement
from areal.core.run_config import RunConfig
from areal.host.footprint import human_bytes
from areal.run.machine import backend_uses_gpu, gpu_count
from areal.run.model_scale import DTYPE_BYTES, model_scale
from areal.run.processes import agent_cpus

LOOPBACK_PORT = "127.0.0.1:<free port at start>"
NODE_PORT = "<its node's address>:<free port at start>"


def plan_lines(config: RunConfig, output_dir: Path) -> list[str]:
    """One line per process (and one for the output), each starting with ``# ``."""
    inference, run, train, agent = config.inference, config.async_, config.train, config.agent
    free_port = NODE_PORT if config.launcher.listen == "node" else LOOPBACK_PORT
    gpus = gpu_count()
    engine_device = "cuda" if backend_uses_gpu(inference.backend) and gpus else "cpu"
    cores = _cores(inference.cpu_affinity)
    lines = [
        f"engine{i}    {inference.backend} on {free_port}, {engine_device}{cores}, "
        f"{inference.max_total_tokens} KV tokens"
        for i in range(inference.engines)
    ]
    sink = f"trajectories to the trainer's ZeroMQ queue (tcp://{free_port})"
    mode = (
        f"async, staleness_threshold {run.staleness_threshold}"
        if run.enabled
        else "sync (staleness 0)"
    )
    agent_cores = _cores(sorted(agent_cpus(config) or ()))
    if config.agent.nice:
        agent_cores += f" (nice {config.agent.nice})"
    lines.append(f"gateway    {free_port}, {sink}, {mode}{agent_cores}")
    framework = agent.framework + (f" {agent.entrypoint}" if agent.entrypoint else "")
    source = config.dataset.path or f"task set {config.dataset.name}"
    lines += [
        f"rollout{i}   {framework} on {source}, {agent.concurrency} episodes at once{agent_cores}"
        for i in range(run.rollout_workers)
    ]
    device = train.device if train.device != "auto" else ("cuda" if gpus else "cpu")
    layout = train.parallelism
    lines.append(
        f"trainer    {run.train_workers} rank(s) (dp {layout.dp} tp {layout.tp} pp {layout.pp} "
        f"cp {layout.cp} ep {layout.ep}), {_engine(train.engine)} on {device}"
        f"{_cores(train.cpu_affinity)}; "
        f"{gpus} GPU(s) visible"
    )
    if run.train_workers > 1:
        from areal.run.launch import torchrun_command

        command = torchrun_command(
            run.train_workers, output_dir / "run" / "resolved.yaml", output_dir, resume=False
        )
        # command[:3] is ``python -m torch.distributed.run``: torchrun by its usual name.
        lines.append(f"           torchrun {' '.join(command[3:])} (rank 0 runs the rest)")
    logging = config.logging
    lines.append(
        f"output     {output_dir} (checkpoint every {logging.save_interval} steps, keep "
        f"{logging.keep_checkpoints}{_checkpoint_estimate(config)}); logs "
        f"{logging.directory(output_dir)}"
    )
    lines += placement_lines(config)
    return ["# plan (nothing is started):", *[f"#   {line}" for line in lines]]


def placement_lines(config: RunConfig) -> list[str]:
    """Where the launcher puts each process (``local``: all on this machine, said once)."""
    from areal.core.launcher import launcher_for
    from areal.run.processes import engine_placement, trainer_placement

    launcher = launcher_for(config)
    if launcher.name == "local":
        return ["launcher   local: every process on this machine"]
    placements = [engine_placement(config, i) for i in range(config.inference.engines)]
    placements.append(Placement("gateway", "gateway"))
    placements += [
        Placement(f"rollout{i}", "rollout") for i in range(config.async_.rollout_workers)
    ]
    placements.append(trainer_placement(config))
    listen = (
        "the servers listen on their node's address (launcher.listen: node)"
        if config.launcher.listen == "node"
        else "the servers listen on 127.0.0.1: every node on one host (launcher.listen: loopback)"
    )
    return [
        f"launcher   {launcher.name}:",
        *[f"  {p.name:<9}-> {launcher.describe(p)}" for p in placements],
        f"  {listen}",
    ]


def _checkpoint_estimate(config: RunConfig) -> str:
    """``; each ≈ 1.5 GiB (...)``: the policy's weights and AdamW's two moments, all in
    ``model.dtype`` (what the ``fsdp`` engine saves); empty when the size is unknown (a model
    ``init_tiny`` has yet to make, a Hub id not in the cache)."""
    scale = model_scale(config)
    if scale is None:
        return ""
    each = scale.params * DTYPE_BYTES[config.model.dtype] * 3
    return (
        f"; each ≈ {human_bytes(each)}: {scale.params / 1e6:.1f}M parameters and AdamW's 2 "
        f"moments in {config.model.dtype}"
    )


def _engine(name: str) -> str:
    """``archon (alias of fsdp)``: the plan says which engine an alias runs."""
    from areal.core.plugins import registry

    target = registry("engines").aliases().get(name)
    return f"{name} (alias of {target})" if target else name


def _cores(affinity: list[int] | None) -> str:
    return f" (cores {','.join(map(str, affinity))})" if affinity else ""


def launch_script(config: RunConfig, output_dir: Path) -> str | None:
    """What the launcher would submit, when it submits a script (Slurm's sbatch script)."""
    from areal.core.launcher import launcher_for

    script = getattr(launcher_for(config), "script", None)
    return script(output_dir) if callable(script) else None
