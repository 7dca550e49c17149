"""The run config: the seed article's keys as written, plus what a real run needs.

One YAML file (``${ENV}`` substituted, ``--set a.b.c=value`` overrides applied) validated in
three steps, so every mistake is reported with the key that holds it and how to fix it:

1. the schema (:class:`RunConfig`): unknown keys, wrong types, out-of-range values;
2. consistency between keys (:meth:`RunConfig.problems`): batch sizes, parallel sizes against
   ``async.train_workers``, the queue against the trigger batch;
3. names against the plugin registries (:func:`unknown_names`, the keys of :data:`NAME_KEYS`):
   ``train.engine``, ``agent.framework``, ``algorithm.loss``, ``inference.backend``... The
   registries are the only lists of names: built-ins register theirs like any plugin.

What this machine cannot provide (GPUs, files, environment variables) is a separate question,
answered by :func:`check_machine` as warnings: a config written for an 8-GPU cluster is still a
valid config on a laptop. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from areal.core.config import ConfigError, key_path, load_yaml

# Advantage estimators share the loss registry under this prefix ("advantage/grpo").
ADVANTAGE_PREFIX = "advantage/"
# Reward sources that are not reward plugins: ``rule`` scores the answer with the registered
# ``exact_match``; ``agent``: the agent gives (or posts) its reward itself.
REWARD_MODES: tuple[str, ...] = ("rule", "agent")


def _registered(what: str, kind: str) -> str:
    """A name field's description: the names come from a registry, never from a list here."""
    return (
        f"{what}: a name registered with areal_register_{kind} (`areal plug info PLUGIN` lists "
        "what each plugin registers)."
    )


class RunConfigError(ConfigError):
    """A run config that cannot be used; ``errors`` holds one ``key: why and fix`` per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = [" ".join(line.strip() for line in e.splitlines()) for e in errors]
        errors = self.errors
        super().__init__(f"{source}: " + "; ".join(errors) if source else "; ".join(errors))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# --- the seed article's sections --------------------------------------------------------------


# The pipeline schedules (areal.plugins.trainer.parallel.pipeline.SCHEDULES; named here so that
# reading a config never imports torch).
PipelineSchedule = Literal["1F1B", "GPipe", "Interleaved1F1B", "ZeroBubble"]
SINGLE_STAGE_SCHEDULES = ("1F1B", "GPipe")
TrainDtype = Literal["float32", "bfloat16", "float16"]


class ParallelismConfig(_Section):
    """Parallel sizes of the trainer, torchtitan style.

    The trainer has ``dp × tp × pp × cp`` ranks, which must equal ``async.train_workers``.
    Expert parallelism adds no ranks: experts are sharded over a group of the ``dp × cp`` ranks,
    so ``ep`` must divide ``dp × cp``.
    """

    dp: int = Field(default=1, ge=1, description="Data parallel (FSDP) degree.")
    tp: int = Field(default=1, ge=1, description="Tensor parallel degree.")
    pp: int = Field(default=1, ge=1, description="Pipeline parallel degree (stages).")
    cp: int = Field(default=1, ge=1, description="Context parallel degree.")
    ep: int = Field(default=1, ge=1, description="Expert parallel degree (MoE); divides dp × cp.")
    dp_replicate: int = Field(
        default=1,
        ge=1,
        description="HSDP: replicas of the dp ranks (dp = dp_replicate × FSDP shards); divides dp.",
    )
    pipeline_schedule: PipelineSchedule = Field(
        default="1F1B",
        description="With pp > 1: 1F1B or GPipe (one stage per rank), Interleaved1F1B or "
        "ZeroBubble (pipeline_stages_per_rank stages per rank).",
    )
    pipeline_stages_per_rank: int = Field(
        default=1, ge=1, description="With pp > 1: pipeline stages each rank holds."
    )

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


class TrainConfig(_Section):
    """The trainer. ``global_batch_size`` counts episodes (trajectories, as the staleness budget
    does); ``mini_batch_size`` counts samples (one per episode, or per unmerged turn)."""

    engine: str = Field(default="fsdp", description=_registered("Training engine", "engines"))
    device: Literal["auto", "cuda", "cpu"] = Field(
        default="auto",
        description="Where trainer ranks run; auto: one GPU per rank if any, else CPU.",
    )
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    global_batch_size: int = Field(
        default=64, ge=1, description="Episodes per step in sync mode; the unit of a full batch."
    )
    mini_batch_size: int = Field(
        default=16, ge=1, description="Samples per optimizer update; divides global_batch_size."
    )
    learning_rate: float = Field(default=1e-6, gt=0, description="AdamW learning rate.")
    max_steps: int = Field(default=100, ge=1, description="Trainer steps (weight versions) to run.")
    max_grad_norm: float | None = Field(
        default=1.0, gt=0, description="Gradient clipping norm per optimizer step (null: off)."
    )
    seed: int = Field(default=0, description="Seed of the trainer (and of the engines' sampling).")
    cpu_affinity: list[int] | None = Field(
        default=None, description="CPU cores the trainer process runs on (default: any)."
    )
    # The sharded trainer's options (async.train_workers > 1), as torchtitan's.
    activation_checkpointing: bool = Field(
        default=False,
        description="Recompute each decoder layer in backward: one layer's activations held, "
        "not all (sharded trainer).",
    )
    compile: bool = Field(
        default=False, description="torch.compile each decoder layer (sharded trainer)."
    )
    param_dtype: TrainDtype = Field(
        default="float32",
        description="FSDP2 mixed precision: the dtype layers compute in (the sharded weights stay "
        "in model.dtype; bfloat16 on GPUs; sharded trainer).",
    )
    reduce_dtype: TrainDtype = Field(
        default="float32",
        description="FSDP2 mixed precision: the dtype gradients are reduced in (sharded trainer).",
    )


class AsyncConfig(_Section):
    """Rollout/training overlap. ``enabled: false`` is sync mode: the same code with the
    staleness bound forced to 0, so every sample is generated by the current weights."""

    enabled: bool = Field(
        default=True, description="Overlap rollout and training (false: sync mode)."
    )
    rollout_workers: int = Field(
        default=1, ge=0, description="Processes running agent episodes (0: agent.online only)."
    )
    train_workers: int = Field(default=1, ge=1, description="Trainer ranks; equals dp×tp×pp×cp.")
    staleness_threshold: int = Field(
        default=2, ge=0, description="Max versions a sample may lag the trainer (0 in sync mode)."
    )
    queue_max_size: int = Field(
        default=1024, ge=1, description="Trajectories the queue holds before producers wait."
    )
    trigger_batch_size: int = Field(
        default=16,
        ge=1,
        description="Episodes (trajectories, in whole groups) that trigger an async train step.",
    )
    overlap_sync: bool = Field(
        default=True,
        description="Async mode: the engines load a step's weights while the next step trains "
        "(only saving them holds the trainer); false: every step waits for the engines too.",
    )
    group_wait_s: float = Field(
        default=10.0,
        gt=0,
        description="How long incomplete groups may hold back a step that enough episodes are "
        "buffered for; then they train as they are (counted in groups_split).",
    )

    @model_validator(mode="after")
    def _sync_means_no_staleness(self) -> AsyncConfig:
        if not self.enabled:
            self.staleness_threshold = 0
        return self


class OnlineConfig(_Section):
    """Agents deployed elsewhere calling the run's gateway with ``AREAL_GATEWAY_KEY``: their
    conversations are trained on once rated (the gateway's ``--online``, docs/gateway.md)."""

    enabled: bool = Field(default=False, description="Train on online agents' conversations.")
    port: int | None = Field(
        default=None, ge=1, le=65535, description="The gateway's port (default: a free one)."
    )
    idle_timeout_s: float = Field(default=300.0, gt=0, description="A conversation's idle end.")
    reward_wait_s: float = Field(default=600.0, ge=0, description="Then its wait for a reward.")
    grouping: Literal["pool", "prompt", "none"] = Field(
        default="pool", description="The group of a conversation that names none."
    )
    group_window_s: float = Field(default=300.0, gt=0, description="A default group's window.")
    group_size: int | None = Field(
        default=None, ge=1, description="A default group's size (default: one trigger batch)."
    )


class AgentConfig(_Section):
    """The agent side: how episodes are run and rewarded."""

    gateway_config: str | None = Field(
        default=None, description="Router config (api_gateway + model_routing) for the gateway."
    )
    gateway_url: str | None = Field(
        default=None,
        description="A gateway that runs on its own (e.g. http://localhost:9000/gateway/v1): the "
        "run attaches to it (AREAL_ADMIN_TOKEN: its admin token) and leaves it running; "
        "default: the run starts its own.",
    )
    framework: str = Field(
        default="openai_sdk",
        description=_registered("Adapter for the agent's client library, or a harness", "adapters"),
    )
    max_turns: int = Field(default=8, ge=1, description="Model calls per episode at most.")
    reward_source: str = Field(
        default="rule",
        description="How answers are scored: rule (compared with the task's answer), agent (the "
        "agent gives its reward), or " + _registered("a reward plugin", "rewards"),
    )
    episode_timeout_s: float = Field(
        default=300.0, gt=0, description="An episode running longer is recorded as failed."
    )
    entrypoint: str | None = Field(
        default=None,
        description="The agent as module:attr (an AgentFn); default: the task set's own agent.",
    )
    concurrency: int = Field(
        default=16, ge=1, description="Episodes in flight per rollout worker (or agent.online)."
    )
    cpu_affinity: list[int] | None = Field(
        default=None,
        description="CPU cores the gateway and the rollout workers run on. Default: with both "
        "train.cpu_affinity and inference.cpu_affinity set, the engines' cores (the trainer's "
        "core stays its own); otherwise the runner's.",
    )
    online: OnlineConfig = Field(default_factory=OnlineConfig)
    nice: int = Field(
        default=0,
        ge=0,
        le=19,
        description="Added to the gateway's and the rollout workers' niceness, "
        "e.g. 5 to let the processes they share cores with take a core first.",
    )

    @field_validator("gateway_url")
    @classmethod
    def _gateway_root(cls, url: str | None) -> str | None:
        return None if url is None else gateway_root(url)


def gateway_root(url: str) -> str:
    """A gateway's own URL from any URL its clients use: without the ``/gateway/v1`` or ``/v1``
    an agent's base URL ends with."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"must be an http(s) URL such as http://localhost:9000, got {url!r}")
    root = url.rstrip("/")
    for suffix in ("/gateway/v1", "/v1", "/gateway"):
        if root.endswith(suffix):
            return root.removesuffix(suffix)
    return root


class LoggingConfig(_Section):
    """Where train.log, metrics.jsonl and TensorBoard events go, and how often. ``log_dir``
    unset: ``<output dir>/logs``, so ``-o DIR`` moves the logs too (:meth:`directory`)."""

    log_dir: str | None = Field(
        default=None,
        description="Directory of train.log, metrics.jsonl, events; default: <output dir>/logs.",
    )
    log_interval: int = Field(default=1, ge=1, description="Steps between [train] log lines.")
    save_interval: int = Field(default=50, ge=1, description="Steps between checkpoints.")
    keep_checkpoints: int = Field(default=2, ge=1, description="Checkpoints kept on disk.")
    metric_sinks: list[str] | None = Field(
        default=None,
        description=_registered("Metric sinks, each", "metric_sinks")
        + " Default: the run's logs, the live monitor's events, and TensorBoard when installed.",
    )

    def directory(self, output_dir: str | Path) -> Path:
        """Where this run's logs go: ``log_dir`` as given, else ``<output_dir>/logs``."""
        return Path(self.log_dir) if self.log_dir else Path(output_dir) / "logs"


# --- what a real run needs ---------------------------------------------------------------------


class ModelConfig(_Section):
    """The policy checkpoint (Hugging Face layout: a local directory or a Hub id)."""

    path: str = Field(description="Checkpoint directory or Hugging Face Hub id.")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Parameter dtype of the trainer and the engines."
    )
    tokenizer: str | None = Field(default=None, description="Tokenizer path; default: model.path.")
    init_tiny: Literal["nano", "tiny", "small"] | None = Field(
        default=None,
        description="Create areal's tiny model of this size at model.path when it is missing.",
    )


class WarmStartConfig(_Section):
    """A supervised warm start on the task set's format demonstrations, before RL (cached)."""

    steps: int = Field(default=0, ge=0, description="SFT steps; 0 turns the warm start off.")
    learning_rate: float = Field(default=1e-3, gt=0, description="AdamW learning rate of the SFT.")
    batch_size: int = Field(default=16, ge=1, description="Demonstrations per SFT step.")


class DatasetConfig(_Section):
    """The tasks episodes start from: a file (``path``) or a built-in task set (``name``)."""

    path: str | None = Field(
        default=None,
        description="A task file: JSONL (one task per line), Parquet, or a directory a "
        "`datasets` dataset was saved to.",
    )
    name: str | None = Field(
        default=None, description=_registered("A task set, instead of path", "task_sets")
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="The task set's options, e.g. reasoning_gym's tasks, size, seed "
        "(docs/tasks.md names each set's).",
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="A task file's columns by the field they fill, e.g. {question: problem, "
        "answer: solution}.",
    )
    split: str = Field(default="train", description="Split of the dataset to read.")
    shuffle: bool = Field(default=True, description="Shuffle tasks each pass.")
    seed: int = Field(default=0, description="Seed of the shuffle (and of the run).")
    success_reward: float | None = Field(
        default=None,
        description="An episode whose reward reaches this solved its task; [train] then shows "
        "the step's success rate (default: the task set's own rule, none for a file).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        if (self.path is None) == (self.name is None):
            raise ValueError(
                "give exactly one of dataset.path (a tasks file) and dataset.name "
                "(a built-in task set)"
            )
        return self


class AlgorithmConfig(_Section):
    """The loss and the advantage estimator (docs/training.md, "Losses and advantages")."""

    loss: str = Field(default="decoupled_ppo", description=_registered("Loss", "losses"))
    loss_options: dict[str, Any] = Field(
        default_factory=dict,
        description="The loss's own options by name (docs/training.md lists each built-in's); "
        "checked against the loss's signature when the trainer starts.",
    )
    advantage: str = Field(
        default="grpo",
        description="Advantage estimator: a loss registered as "
        f"{ADVANTAGE_PREFIX}NAME, given as NAME (`areal plug info PLUGIN` lists them).",
    )
    advantage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="The estimator's own options (grpo: normalize_std, eps; gae: gamma and lam, "
        "per token, default 1; turn, gigpo: docs/credit.md).",
    )
    advantage_norm: Literal["none", "batch"] = Field(
        default="none",
        description="batch: advantages normalised to mean 0, std 1 over the step's valid tokens.",
    )
    group_size: int = Field(
        default=8, ge=1, description="Samples per task; GRPO/RLOO compare within a group."
    )
    eps_clip: float = Field(
        default=0.2, gt=0, description="PPO clip: ratio kept in [1-eps, 1+eps_high] (PPO losses)."
    )
    eps_clip_high: float | None = Field(
        default=None, gt=0, description="Upper clip (clip-higher); default: eps_clip."
    )
    behavior_weight_cap: float | None = Field(
        default=None,
        ge=1,
        description="Cap of π_prox/π_behav; tokens above it are masked out (decoupled losses).",
    )
    prox_logp: Literal["recompute", "loglinear", "loglinear_every_minibatch"] = Field(
        default="recompute",
        description="π_prox: recomputed with the pre-update weights; loglinear: AReaL's "
        "approximation from the token versions, exact on a step's first minibatch; "
        "loglinear_every_minibatch: the approximation there too, as AReaL 1.0.4.",
    )
    discount: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Per-turn discount of later rewards: turn k's return is "
        "G_k = r_k + discount·G_{k+1}; never per token (docs/credit.md).",
    )
    kl_coef: float = Field(default=0.0, ge=0, description="KL-to-reference penalty in the reward.")

    @model_validator(mode="before")
    @classmethod
    def _gae_options_moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "gae_lambda" in data:
            raise ValueError(
                "algorithm.gae_lambda was removed: GAE's per-token λ and γ are "
                "algorithm.advantage_options.lam and .gamma (default 1), no longer shared with "
                "algorithm.discount, which discounts per turn"
            )
        return data


class SamplingConfig(_Section):
    """How the policy samples during rollouts."""

    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(default=512, ge=1, description="Tokens per model call at most.")
    honor_client: bool = Field(
        default=False,
        description="Let an agent's own temperature/top_p/top_k/min_p apply (by default the "
        "run's values replace them, logged, so a group's episodes are sampled alike).",
    )


# Flags the run sets on every engine itself: the address it polls and the checkpoint it syncs.
_RUN_OWNED_ENGINE_FLAGS = {"--host", "--port", "--model", "--model-path"}


class InferenceConfig(_Section):
    """The inference servers the gateway routes policy calls to."""

    backend: str = Field(
        default="embedded", description=_registered("Inference server", "inference_backends")
    )
    engines: int = Field(
        default=1, ge=1, description="Inference servers; with a GPU backend, one GPU each."
    )
    max_total_tokens: int | None = Field(
        default=None, ge=1, description="KV-cache capacity in tokens; default: the backend's."
    )
    mem_fraction_static: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="sglang, vllm: GPU memory fraction for weights and KV cache.",
    )
    tp_size: int = Field(
        default=1, ge=1, description="sglang, vllm: GPUs each engine shards the model over."
    )
    vllm_python: str | None = Field(
        default=None,
        description="vllm: the Python that has vLLM installed (default: the venv `make setup` "
        "makes at .venv/vllm, else this interpreter).",
    )
    sglang_python: str | None = Field(
        default=None,
        description="sglang: the Python that has SGLang installed (default: this interpreter).",
    )
    engine_args: list[str] = Field(
        default_factory=list,
        description="Flags of the engine server's own (vLLM's, SGLang's, `areal serve "
        "inference`'s), appended to its command line as given, e.g. [--enable-prefix-caching].",
    )
    cpu_affinity: list[int] | None = Field(
        default=None, description="CPU cores the engine processes run on (default: any)."
    )
    pause_mode: Literal["retract", "in_place"] = Field(
        default="retract",
        description="Weight updates: retract in-flight generations (re-prefilled on the new "
        "weights: exact) or keep their KV cache (in_place: faster, keys/values of the old "
        "weights).",
    )
    weight_sync: Literal["disk", "collective"] = Field(
        default="disk",
        description="How new weights reach the engines: safetensors on a shared disk, or a "
        "collective broadcast (gloo to the embedded engine, NCCL to SGLang and vLLM).",
    )
    weight_sync_bucket_mb: int = Field(
        default=64, ge=1, description="collective: the most MB broadcast per bucket."
    )
    weight_sync_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="The weight sync's watchdog: seconds an engine may take to answer each call "
        "of a sync (pause, update, continue; join) before it counts as stalled; a stalled engine "
        "the run started is killed and restarted like one that died (default: 60 s for pause "
        "and continue, 300 s for an update).",
    )

    @field_validator("engine_args")
    @classmethod
    def _engine_args_leave_the_address_to_the_run(cls, args: list[str]) -> list[str]:
        for arg in args:
            flag = arg.split("=", 1)[0]
            if flag in _RUN_OWNED_ENGINE_FLAGS:
                raise ValueError(
                    f"{flag} is chosen by the run (it must know where each engine listens and "
                    "what it serves); drop it from inference.engine_args"
                )
        return args

    def engine_python(self) -> str | None:
        """The interpreter the config names for its backend's server (``None``: the default)."""
        return {"vllm": self.vllm_python, "sglang": self.sglang_python}.get(self.backend)


# --- the whole run -----------------------------------------------------------------------------


class LauncherConfig(_Section):
    """Where the run's processes run: this machine, a Ray cluster, a Slurm allocation."""

    name: str = Field(default="local", description=_registered("Launcher", "launchers"))
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="The launcher's own options (ray: address, resources per role; slurm: "
        "partition, nodes, time, ...); docs/scale-out.md lists them.",
    )
    listen: Literal["loopback", "node"] = Field(
        default="loopback",
        description="Where the engines, the gateway and the trainer's queue listen: loopback "
        "(127.0.0.1: every process of the run on one host) or node (the address of the node "
        "each one runs on, which the others learn as it starts: a run across machines; put the "
        "nodes on a private network). node needs a launcher that places processes (ray, slurm).",
    )


class RunConfig(_Section):
    """One training run. Load files with :func:`load_run_config`, which names keys in errors."""

    model: ModelConfig
    dataset: DatasetConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")
    agent: AgentConfig = Field(default_factory=AgentConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    launcher: LauncherConfig = Field(default_factory=LauncherConfig)

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        problems = self.problems()
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def problems(self) -> list[str]:
        """Values that contradict each other, each as ``key: why; fix``."""
        train, run, algo, par = self.train, self.async_, self.algorithm, self.train.parallelism
        found = []
        if train.global_batch_size % train.mini_batch_size:
            found.append(
                f"train.mini_batch_size: {train.mini_batch_size} does not divide "
                f"train.global_batch_size {train.global_batch_size}; use a divisor such as "
                f"{_largest_divisor(train.global_batch_size, train.mini_batch_size)}"
            )
        if run.trigger_batch_size > run.queue_max_size:
            found.append(
                f"async.trigger_batch_size: {run.trigger_batch_size} is more than "
                f"async.queue_max_size {run.queue_max_size}, so a step could never trigger; "
                f"raise queue_max_size to at least {run.trigger_batch_size}"
            )
        if not run.enabled and train.global_batch_size > run.queue_max_size:
            found.append(
                f"async.queue_max_size: {run.queue_max_size} cannot hold one sync batch of "
                f"train.global_batch_size {train.global_batch_size}; raise it to at least "
                f"{train.global_batch_size}"
            )
        if run.rollout_workers == 0 and not self.agent.online.enabled:
            found.append(
                "async.rollout_workers: 0 runs no agent, and agent.online.enabled is false, so "
                "no episode would ever reach the trainer; set async.rollout_workers: 1 or more, "
                "or agent.online.enabled: true to train on the conversations of agents that call "
                "the run's gateway with AREAL_GATEWAY_KEY"
            )
        if self.agent.gateway_url and self.agent.online.port is not None:
            found.append(
                "agent.online.port: the port of the run's own gateway, but agent.gateway_url "
                "names one that runs on its own (its port is its own); drop agent.online.port"
            )
        if par.world_size != run.train_workers:
            found.append(
                f"train.parallelism: dp {par.dp} × tp {par.tp} × pp {par.pp} × cp {par.cp} = "
                f"{par.world_size} ranks but async.train_workers is {run.train_workers}: set "
                f"async.train_workers={par.world_size} or make the product {run.train_workers}"
            )
        trainer_nodes = self.launcher.options.get("trainer_nodes", 1)
        if isinstance(trainer_nodes, int) and trainer_nodes > 1 and self.launcher.listen != "node":
            found.append(
                f"launcher.options.trainer_nodes: {trainer_nodes} nodes put the trainer's rank 0 "
                "(and the queue and weight group it serves) on any of them; set "
                "launcher.listen: node so the engines and the gateway reach it there"
            )
        if self.launcher.listen == "node" and self.launcher.name == "local":
            found.append(
                "launcher.listen: node spreads the run over machines, but launcher.name is local "
                "(every process on this one); pick a launcher that places processes (ray, slurm) "
                "or keep listen: loopback"
            )
        if par.pipeline_schedule in SINGLE_STAGE_SCHEDULES and par.pipeline_stages_per_rank > 1:
            found.append(
                f"train.parallelism.pipeline_stages_per_rank: {par.pipeline_schedule} runs one "
                f"stage per rank, not {par.pipeline_stages_per_rank}; use pipeline_schedule "
                "Interleaved1F1B or ZeroBubble, or 1 stage per rank"
            )
        sharded_only = {
            "activation_checkpointing": train.activation_checkpointing,
            "compile": train.compile,
            "param_dtype": train.param_dtype != "float32",
            "reduce_dtype": train.reduce_dtype != "float32",
        }
        if run.train_workers == 1 and any(sharded_only.values()):
            key = next(k for k, on in sharded_only.items() if on)
            found.append(
                f"train.{key}: applies to the sharded trainer, which runs with "
                "async.train_workers > 1 (and train.parallelism to match); with one worker "
                "leave it at its default"
            )
        if par.dp % par.dp_replicate:
            found.append(
                f"train.parallelism.dp_replicate: {par.dp_replicate} does not divide dp = "
                f"{par.dp} (HSDP shards within a replica group of dp / dp_replicate ranks); use a "
                "divisor of dp"
            )
        # Experts shard over the FSDP ranks of one replica (ParallelDims: dp_shard × cp).
        shard_cp = par.dp // par.dp_replicate * par.cp
        if shard_cp % par.ep:
            what = "dp×cp" if par.dp_replicate == 1 else "(dp / dp_replicate)×cp"
            found.append(
                f"train.parallelism.ep: {par.ep} does not divide {what} = {shard_cp} "
                f"(experts are sharded over data/context-parallel ranks); use a divisor of {what}"
            )
        if algo.advantage in ("grpo", "rloo", "turn", "gigpo"):  # estimators that compare a group
            if algo.advantage == "rloo" and algo.group_size < 2:
                found.append(
                    "algorithm.group_size: rloo needs at least 2 samples per task "
                    "(each is compared with the others); set group_size >= 2"
                )
            for key, size in (
                ("train.global_batch_size", train.global_batch_size),
                ("async.trigger_batch_size", run.trigger_batch_size),
            ):
                if size % algo.group_size:
                    found.append(
                        f"{key}: {size} is not a multiple of algorithm.group_size "
                        f"{algo.group_size} ({algo.advantage} trains whole groups); use a "
                        f"multiple of {algo.group_size}"
                    )
        if self.inference.max_total_tokens is not None and (
            self.sampling.max_new_tokens > self.inference.max_total_tokens
        ):
            found.append(
                f"sampling.max_new_tokens: {self.sampling.max_new_tokens} exceeds "
                f"inference.max_total_tokens {self.inference.max_total_tokens}; lower it or "
                "raise the engine's capacity"
            )
        if self.warm_start.steps and not self.dataset.name:
            found.append(
                "warm_start.steps: the warm start learns from a built-in task set's "
                "demonstrations; set dataset.name, or warm_start.steps: 0"
            )
        if self.agent.reward_source in ("reward_model", "judge") and not self.agent.gateway_config:
            found.append(
                f"agent.gateway_config: reward_source {self.agent.reward_source!r} calls the "
                f"router's {self.agent.reward_source.removesuffix('_model')}_model; set "
                "gateway_config to a router config whose model_routing has it"
            )
        return found

    def to_yaml(self) -> str:
        """The resolved config as YAML, keys in schema order (``areal config show``)."""
        return yaml.safe_dump(
            self.model_dump(mode="json", by_alias=True), sort_keys=False, allow_unicode=True
        )


def _largest_divisor(n: int, below: int) -> int:
    return max(d for d in range(1, min(n, below) + 1) if n % d == 0)


# --- loading -----------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.parallelism.dp=4"`` -> ``(["train", "parallelism", "dp"], 4)``; the value is
    YAML, so ``true``, ``1e-5``, ``[1, 2]`` and ``null`` mean what they mean in the file."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(p.strip() for p in parts):
        raise ConfigError(f"--set {text!r}: write key=value, e.g. --set train.max_steps=10")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return [p.strip() for p in parts], value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set each ``key=value`` in the nested mapping (in place), creating sections as needed."""
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(f"--set {text!r}: {where} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return data


def run_config_from_dict(
    data: dict[str, Any], *, source: str = "", check_names: bool = True
) -> RunConfig:
    """Validate a parsed config; raises :class:`RunConfigError` listing every problem.

    A missing ``model`` / ``dataset`` is one problem naming both and the embedded defaults; the
    rest of the file is checked with those defaults in their place, so its other problems show
    in the same report instead of after the first fix.
    """
    missing = [key for key in EMBEDDED_DEFAULTS if data.get(key) is None]
    if missing:
        errors = [missing_sections(missing)]
        try:
            run_config_from_dict(
                {**data, **{key: EMBEDDED_DEFAULTS[key] for key in missing}},
                source=source,
                check_names=check_names,
            )
        except RunConfigError as err:
            errors.extend(err.errors)
        raise RunConfigError(source, errors) from None
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as err:
        raise RunConfigError(source, describe_run_errors(err)) from None
    if check_names:
        unknown = unknown_names(config)
        if unknown:
            raise RunConfigError(source, unknown)
    return config


# configs/quickstart.yaml's policy and tasks (areal's tiny model, the calculator task set), built
# in so a run config without its own can be tried on a CPU with these as --set overrides.
EMBEDDED_DEFAULTS: dict[str, dict[str, str]] = {
    "model": {"path": "runs/quickstart/model", "init_tiny": "tiny"},
    "dataset": {"name": "calculator"},
}
QUICKSTART_COMMAND = "areal train configs/quickstart.yaml"


def missing_sections(missing: Sequence[str]) -> str:
    """One line for absent ``model`` / ``dataset`` sections: what to give, or the --sets that
    borrow the quickstart's embedded defaults."""
    give = {
        "model": "model.path (a checkpoint directory or Hub id)",
        "dataset": "dataset.path (a tasks JSONL) or dataset.name (a built-in task set)",
    }
    sets = " ".join(
        f"--set {key}.{name}={value}"
        for key in missing
        for name, value in EMBEDDED_DEFAULTS[key].items()
    )
    return (
        f"{' and '.join(missing)}: missing; give {' and '.join(give[k] for k in missing)}, or "
        f"take the embedded defaults of `{QUICKSTART_COMMAND}`: {sets}"
    )


def load_run_config(
    path: str | Path, overrides: Sequence[str] = (), *, check_names: bool = True
) -> RunConfig:
    """Read a run config file, substitute ``${ENV}``, apply ``--set`` overrides, validate."""
    data = apply_overrides(load_yaml(path), overrides)
    return run_config_from_dict(data, source=str(path), check_names=check_names)


def describe_run_errors(err: ValidationError) -> list[str]:
    """One ``key: why and fix`` line per pydantic error (unknown keys get the known ones)."""
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        key = key_path(e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: {_unknown_key_hint(loc)}")
        elif e["type"] == "value_error":
            why = str(e.get("ctx", {}).get("error", e["msg"]))
            lines.extend(why.splitlines() if not loc else [f"{key}: {why}"])
        elif e["type"] == "missing":
            lines.append(f"{key}: missing; this key is required")
        else:
            lines.append(f"{key}: {e['msg']} (got {_shown(e['input'])})")
    return lines


def _shown(value: Any, limit: int = 80) -> str:
    """A value as the error shows it: its repr, cut short (a pasted blob is no help there)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unknown_key_hint(loc: list[str]) -> str:
    """ "unknown key; did you mean dp? known keys: dp, tp, pp, cp, ep"."""
    section: type[BaseModel] | None = RunConfig
    for part in loc[:-1]:
        field = _fields(section).get(part) if section else None
        annotation = field.annotation if field else None
        section = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
    known = list(_fields(section)) if section else []
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"unknown key; {hint}known keys: {', '.join(known)}"


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    return {(f.alias or name): f for name, f in model.model_fields.items()}


# --- names from the plugin registries ---------------------------------------------------------


@dataclass(frozen=True)
class NameKey:
    """A config key whose value names something a plugin registers (``train.engine``)."""

    key: str  # dotted, as in the file
    kind: str  # the registry (a key of areal.core.plugins.REGISTRY_HOOKS)
    prefix: str = ""  # the family within the registry ("advantage/"), given without it
    modes: tuple[str, ...] = ()  # accepted values that are not plugins (reward_source: rule)

    def value(self, config: RunConfig) -> Any:
        node: Any = config
        for part in self.key.split("."):
            node = getattr(node, "async_" if part == "async" else part)
        return node


# Every key of a run config that names registered things; the plugin surface meta-test
# (tests/core/test_plugin_surface.py) checks each accepts every registered name.
NAME_KEYS: tuple[NameKey, ...] = (
    NameKey("train.engine", "engines"),
    NameKey("agent.framework", "adapters"),
    NameKey("agent.reward_source", "rewards", modes=REWARD_MODES),
    NameKey("algorithm.loss", "losses"),
    NameKey("algorithm.advantage", "losses", prefix=ADVANTAGE_PREFIX),
    NameKey("inference.backend", "inference_backends"),
    NameKey("launcher.name", "launchers"),
    NameKey("dataset.name", "task_sets"),
    NameKey("logging.metric_sinks", "metric_sinks"),
)


def known_names(kind: str, *, prefix: str = "", modes: Sequence[str] = ()) -> list[str]:
    """The names registered under ``kind`` by the loaded plugins (plus ``modes``).

    With ``prefix``, only registered names starting with it count, without the prefix; without,
    names holding ``/`` are left out (they belong to a prefixed family).
    """
    from areal.core.plugins import registry

    found = set(modes)
    for name in registry(kind).names():
        if prefix and name.startswith(prefix):
            found.add(name.removeprefix(prefix))
        elif not prefix and "/" not in name:
            found.add(name)
    return sorted(found)


def unknown_names(config: RunConfig) -> list[str]:
    """Names that no loaded plugin registers, each with the names that exist."""
    problems = []
    for name_key in NAME_KEYS:
        value = name_key.value(config)
        if value is None:
            continue
        known = known_names(name_key.kind, prefix=name_key.prefix, modes=name_key.modes)
        for name in value if isinstance(value, list) else [value]:
            if name not in known:
                problems.append(
                    f"{name_key.key}: unknown name {name!r}; known: {', '.join(known) or 'none'}"
                )
    return problems
