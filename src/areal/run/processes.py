"""The processes of one run, as supervised children: inference engines, the gateway, rollout workers.

Each builder returns a :class:`~areal.run.supervisor.Child` whose command is rebuilt at every
(re)start, so a restarted process picks up the run's state at that moment (the weight version
the gateway's staleness clock starts from, a worker's progress). Secrets (the admin token, the
gateway key) travel in the children's environment only, never in files or command lines.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from areal.core.launcher import Placement
from areal.core.plugins import registry
from areal.core.run_config import RunConfig
from areal.gateway.training_flags import TrainingFlags
from areal.host.on_node import NODE_HOST
from areal.host.process import pick_free_port
from areal.run.gateway_client import GatewayAdmin
from areal.run.rollout_worker import WorkerSpec
from areal.run.supervisor import Child

__all__ = [
    "engine_child",
    "episodes_at_once",
    "gateway_child",
    "gateway_training_flags",
    "listen_host",
    "router_config",
    "run_sampling",
    "worker_child",
]

ENGINE_READY_TIMEOUT = 300.0


def engine_child(
    config: RunConfig,
    index: int,
    *,
    model_dir: Callable[[], str],
    version: Callable[[], int],
    log_dir: Path,
    threads: int,
    after_start: Callable[[Child], Awaitable[None]] | None = None,
    before_restart: Callable[[Child], Awaitable[None]] | None = None,
) -> Child:
    """Inference engine ``index`` on a port of its own, on loopback or, with ``launcher.listen:
    node``, on its node's address (:func:`listen_host`). A restart keeps the port unless another
    process took it meanwhile: then the engine moves to another, and ``after_start`` (the
    runner's catch-up) moves it in the weight sync and the gateway."""
    listen = FreePort(listen_host(config))
    backend = registry("inference_backends").get(config.inference.backend)
    launcher = backend.load_launcher()
    total_concurrency = episodes_at_once(config)
    inference = config.inference
    python = inference.engine_python()

    def command() -> list[str]:
        # The backend-neutral options (areal.core.specs.ENGINE_OPTIONS); the launcher maps them.
        options: dict[str, Any] = {
            "model_path": model_dir(),
            "host": listen.host,
            "port": listen.port,
            "max_running_requests": max(64, total_concurrency),
            "weight_version": str(version()),
            "seed": config.train.seed + index,
            "log_level": "warning",
            "tp_size": inference.tp_size,
        }
        optional = {
            "max_total_tokens": inference.max_total_tokens,
            "mem_fraction_static": inference.mem_fraction_static,
            "python_executable": python,
            "extra_args": list(inference.engine_args) or None,
        }
        options.update({key: value for key, value in optional.items() if value is not None})
        return list(launcher(options))

    return Child(
        name=f"engine{index}",
        command=command,
        log_path=log_dir / f"engine{index}.log",
        env={
            **server_env(backend.env),
            "OMP_NUM_THREADS": str(len(config.inference.cpu_affinity or []) or threads),
        },
        url=listen.url,
        new_port=listen.pick_again,
        moves_when_taken=True,
        start_timeout=ENGINE_READY_TIMEOUT,
        after_start=after_start,
        before_restart=before_restart,
        cpus=cpu_set(config.inference.cpu_affinity),
        placement=engine_placement(config, index),
    )


@dataclasses.dataclass
class FreePort:
    """Where a server child listens: a port picked free, picked again (:meth:`pick_again`) when
    another process bound it before the child did (``Child.new_port``)."""

    host: str
    port: int = 0  # 0: picked now

    def __post_init__(self) -> None:
        if not self.port:
            self.pick_again()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def pick_again(self) -> str:
        self.port = pick_free_port()
        return self.url


def listen_host(config: RunConfig) -> str:
    """Where a server of the run listens: loopback, or its node's address, which the child
    learns on its node and the supervisor from the child (:mod:`areal.host.on_node`)."""
    return NODE_HOST if config.launcher.listen == "node" else "127.0.0.1"


def cpu_set(affinity: list[int] | None) -> set[int] | None:
    """A config's ``cpu_affinity`` as a child's CPU mask (None: the runner's, inherited)."""
    return set(affinity) if affinity else None


def _agent_beside_pinned_engines(config: RunConfig) -> bool:
    agent, train, inference = config.agent, config.train, config.inference
    return not agent.cpu_affinity and bool(train.cpu_affinity) and bool(inference.cpu_affinity)


def agent_cpus(config: RunConfig) -> set[int] | None:
    """Where the gateway and the rollout workers run: ``agent.cpu_affinity``; unset, with the
    trainer and the engines pinned, the engines' cores: the trainer's step is on the critical
    path of every async step, and the agent beside it cost it ~15 % of its speed, while the
    engines keep up with it beside the agent (docs/benchmarks.md, "Sync vs async RL");
    otherwise the runner's mask, inherited."""
    if _agent_beside_pinned_engines(config):
        return set(config.inference.cpu_affinity or ())
    return cpu_set(config.agent.cpu_affinity)


def engine_placement(config: RunConfig, index: int) -> Placement:
    """Engine ``index`` needs ``tp_size`` GPUs when its backend serves on GPUs and there are any."""
    from areal.run.machine import backend_uses_gpu, gpu_count

    on_gpu = backend_uses_gpu(config.inference.backend) and gpu_count() > 0
    return Placement(f"engine{index}", "engine", gpus=config.inference.tp_size if on_gpu else 0)


def trainer_placement(config: RunConfig) -> Placement:
    """The trainer (rank 0 and, under torchrun on its node, the other ranks): a GPU per rank on
    a GPU run."""
    from areal.run.machine import gpu_count

    device = config.train.device
    on_gpu = device == "cuda" or (device == "auto" and gpu_count() > 0)
    workers = config.async_.train_workers
    return Placement("trainer", "trainer", cpus=1.0, gpus=workers if on_gpu else 0)


def server_env(wanted: dict[str, str]) -> dict[str, str]:
    """A backend's environment for its server: a value the user set wins, except a path list
    (``PYTHONPATH``), which gets the backend's entries in front of the user's."""
    env = {}
    for key, value in wanted.items():
        have = os.environ.get(key)
        if key == "PYTHONPATH" and have:
            env[key] = os.pathsep.join([value, have])
        elif have is None:
            env[key] = value
    return env


def run_sampling(config: RunConfig) -> dict[str, Any]:
    """The run's sampling for the policy's route: authoritative unless ``sampling.honor_client``."""
    return {
        "temperature": config.sampling.temperature,
        "top_p": config.sampling.top_p,
        "max_tokens": config.sampling.max_new_tokens,
        "override_client_sampling": not config.sampling.honor_client,
    }


def router_config(config: RunConfig, out: Path) -> Path:
    """The gateway's router config: the run's ``agent.gateway_config`` (or none) with the run's
    sampling settings for the policy (authoritative unless ``sampling.honor_client``). ``${ENV}`` placeholders are written back
    unsubstituted, so no key the user keeps in the environment lands in this file."""
    data: dict[str, Any] = {}
    if config.agent.gateway_config:
        data = yaml.safe_load(Path(config.agent.gateway_config).read_text()) or {}
    routing = data.setdefault("model_routing", {})
    policy = routing.setdefault("policy_model", {"model_id": "policy"})
    policy.update(run_sampling(config))
    path = out / "router.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    path.chmod(0o600)  # it may hold a literal upstream key copied from the user's file
    return path


def gateway_child(
    config: RunConfig,
    *,
    router: Path,
    engine_urls: Callable[[], list[str]],
    queue_address: str,
    version: Callable[[], int],
    log_dir: Path,
    admin_token: str,
    gateway_key: str,
    after_start: Callable[[Child], Awaitable[None]] | None = None,
    consumed: Callable[[], tuple[int, int]] = lambda: (0, 0),
    journal: Path | None = None,
) -> tuple[Child, GatewayAdmin]:
    """The gateway: finished episodes to the trainer's queue, admission by the staleness budget;
    and the client of its admin API. ``consumed``: the trainer's (received, dropped) episodes,
    asked at every (re)start, so the budget starts where the run is; ``journal``: the episode
    journal's file. On ``agent.online.port`` when set: online agents know it, so it never moves."""
    fixed = config.agent.online.port if config.agent.online.enabled else None
    listen = FreePort(listen_host(config), fixed or 0)

    def command() -> list[str]:
        cmd = [sys.executable, "-m", "areal.gateway.server", "--config", str(router)]
        cmd += ["--host", listen.host, "--port", str(listen.port)] + (
            [] if listen.host == "127.0.0.1" else ["--allow-remote"]
        )
        cmd += ["--log-dir", str(log_dir), "--log-level", "warning"]
        cmd += ["--engine-backend", config.inference.backend]
        received, dropped = consumed()
        flags = gateway_training_flags(
            config, queue_address, version(), consumed=received, dropped=dropped, journal=journal
        )
        cmd += flags.to_argv()
        for url in engine_urls():
            cmd += ["--engine", url]
        return cmd

    admin = GatewayAdmin(listen.url, admin_token)

    async def started(child: Child) -> None:
        admin.url = child.url or admin.url  # the node's address, once the gateway said it
        if after_start is not None:
            await after_start(child)

    child = Child(
        name="gateway",
        command=command,
        log_path=log_dir / "gateway.out",
        env={"AREAL_ADMIN_TOKEN": admin_token, "AREAL_GATEWAY_KEY": gateway_key},
        url=listen.url,
        new_port=None if fixed else listen.pick_again,
        start_timeout=120.0,
        after_start=started,
        stage=1,
        placement=Placement("gateway", "gateway"),
        cpus=agent_cpus(config),
        nice=config.agent.nice,
    )
    return child, admin


def gateway_training_flags(
    config: RunConfig,
    queue_address: str,
    version: int,
    *,
    consumed: int = 0,
    dropped: int = 0,
    journal: Path | None = None,
) -> TrainingFlags:
    """The run's gateway flags: its queue, its staleness budget (from ``version`` and the
    trainer's ``consumed`` / ``dropped`` episodes on: a restarted gateway starts where the run
    is), its reward discount, its episode journal, and its online agents (``agent.online``)."""
    run, online = config.async_, config.agent.online
    trigger = trigger_batch(config)
    flags = TrainingFlags(
        sink="zmq",
        sink_address=queue_address,
        staleness_threshold=run.staleness_threshold,
        trigger_batch_size=trigger,
        max_concurrent=episodes_at_once(config),
        start_version=version,
        start_consumed=consumed,
        start_dropped=dropped,
        episode_journal=str(journal) if journal is not None else None,
        discount=config.algorithm.discount,
    )
    if not online.enabled:
        return flags
    return dataclasses.replace(
        flags,
        online=True,
        online_idle_timeout=online.idle_timeout_s,
        online_reward_wait=online.reward_wait_s,
        online_grouping=online.grouping,
        online_group_window=online.group_window_s,
        online_group_size=online.group_size or trigger,  # a default group fills one batch
    )


def trigger_batch(config: RunConfig) -> int:
    """The episodes a step takes: in sync mode a "trigger" is a whole global batch (and the
    bound is 0, AsyncConfig)."""
    run = config.async_
    return run.trigger_batch_size if run.enabled else config.train.global_batch_size


def episodes_at_once(config: RunConfig) -> int:
    """The most episodes open at once: each rollout worker's ``agent.concurrency``, and as many
    again for online conversations (``agent.online``), which the staleness budget admits too."""
    agents = config.async_.rollout_workers + int(config.agent.online.enabled)
    return agents * config.agent.concurrency


def worker_child(
    config: RunConfig,
    index: int,
    *,
    gateway_url: Callable[[], str],
    model_id: str,
    run_dir: Path,
    log_dir: Path,
    admin_token: str,
    start: int,
    skip: list[list[int]],
    gateway_key: str | None = None,
    before_restart: Callable[[Child], Awaitable[None]] | None = None,
) -> Child:
    """Rollout worker ``index``: its spec file (no secrets, written at every start with where
    the gateway is then), its progress file, its log."""
    reward, reward_options = reward_plugin(config)
    spec = WorkerSpec(
        gateway_url="",
        agent=config.agent.entrypoint,
        framework=config.agent.framework,
        dataset=config.dataset.model_dump(),
        worker=index,
        workers=config.async_.rollout_workers,
        group_size=config.algorithm.group_size,
        concurrency=config.agent.concurrency,
        episode_timeout_s=config.agent.episode_timeout_s,
        max_turns=config.agent.max_turns,
        model=model_id,
        progress_path=str(run_dir / f"rollout{index}.progress.json"),
        reward=reward,
        reward_options=reward_options,
        start=start,
        skip=skip,
        gateway_log=str(log_dir / "gateway.out"),
    )
    spec_path = run_dir / f"rollout{index}.json"

    def command() -> list[str]:
        dataclasses.replace(spec, gateway_url=gateway_url()).save(spec_path)
        return [sys.executable, "-m", "areal.run.rollout_worker", str(spec_path)]

    return Child(
        name=f"rollout{index}",
        command=command,
        log_path=log_dir / f"rollout{index}.log",
        env={
            "AREAL_ADMIN_TOKEN": admin_token,
            "OMP_NUM_THREADS": "1",
            # Plain calls (a judge's or reward model's) need the gateway's key.
            **({"AREAL_GATEWAY_KEY": gateway_key} if gateway_key else {}),
        },
        max_restarts=5,
        before_restart=before_restart,
        stage=2,
        placement=Placement(f"rollout{index}", "rollout"),
        cpus=agent_cpus(config),
        nice=config.agent.nice,
    )


def reward_plugin(config: RunConfig) -> tuple[str | None, dict[str, Any]]:
    """How a worker scores an agent's text answer: ``rule`` is ``exact_match`` against the task's
    ``answer``; ``judge`` / ``reward_model`` ask the router's model of that name through the
    gateway; ``agent``: the agent gives (or posts) its reward itself; any other name is a
    registered reward plugin."""
    source = config.agent.reward_source
    if source == "agent":
        return None, {}
    if source == "rule":
        return "exact_match", {}
    if source in ("judge", "reward_model"):
        from areal.gateway.router_config import RouterConfig

        routing = RouterConfig.load(config.agent.gateway_config or "").model_routing
        route = routing.judge_model if source == "judge" else routing.reward_model
        if route is None:
            raise ValueError(
                f"agent.reward_source: {source} needs model_routing.{source.removesuffix('_model')}"
                f"_model in {config.agent.gateway_config}"
            )
        return source, {"model": route.model_id}
    return source, {}
