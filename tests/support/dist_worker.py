"""One multi-process launch that runs the RL step under several layouts; the tests import its
models, samples and layouts from here (``support.dist_worker``) and start it as a module.

``python -m support.dist_worker WORLD OUT_DIR`` (:func:`command`, under :func:`env`) spawns WORLD gloo ranks on CPU; for each layout of that
world size it builds a fresh mesh and model, runs the real ``train_step`` and writes the loss,
statistics and the updated full parameters to ``OUT_DIR/<layout>.pt`` (rank 0). With WORLD = 4 it
also saves a DCP checkpoint in one layout, resumes it in another and exports HF safetensors from
the sharded model. Torch imports cost seconds per process, so one launch does everything of its
world size; the tests compare the files with the single-process step computed in the test.
Layouts whose name ends in :data:`SAMPLED` train on samples the model drew itself at T = 0.7 (and
its neighbours) with top-p, and also write their log-probs before the step (:func:`step_logprobs`).

``python -m support.dist_worker torchrun LAYOUT OUT_DIR`` is one rank that torchrun started (``env://``):
it runs LAYOUT alone and also writes ``OUT_DIR/env-rank<RANK>.json``, where torchrun put it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from areal.core.types import Sample
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.qwen3 import Qwen3ForCausalLM
from areal.plugins.models.qwen3_moe import Qwen3MoeForCausalLM
from areal.plugins.models.tiny import tiny_config
from areal.plugins.trainer.packing import pack
from areal.plugins.trainer.step import token_logprobs

# name -> ParallelDims sizes (+ "ac": activation checkpointing). The model by the name's prefix:
# the nano Qwen3 (tied embeddings), "moe_" its Qwen3-MoE twin, "untied_" it with an untied LM head.
MODULE = "support.dist_worker"  # run as a module: its folder on sys.path would shadow stdlib names
TESTS = Path(__file__).resolve().parents[1]  # the folder that holds ``support``


def command(*args: str) -> list[str]:
    """This worker's command line: ``args`` are its own (``WORLD OUT_DIR``, or ``torchrun ...``)."""
    return [sys.executable, "-m", MODULE, *args]


def env() -> dict[str, str]:
    """The environment to start it under: ``support`` importable, one thread per rank (the
    ranks share the machine's cores), no warnings in the logs the tests read."""
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


LAYOUTS: dict[int, dict[str, dict[str, int]]] = {
    2: {
        "dp2": {"dp": 2},
        "tp2": {"tp": 2},
        "cp2": {"cp": 2},
        "moe_dp2": {"dp": 2},
        "moe_dp2_ep2": {"dp": 2, "ep": 2},
        "untied_pp2": {"pp": 2},
        "untied_pp2_zero_bubble": {"pp": 2},
        "untied_pp2_kl": {"pp": 2},
        "pp2": {"pp": 2},
    },
    4: {
        "dp4": {"dp": 4},
        "dp2_tp2": {"dp": 2, "tp": 2},
        "hsdp2x2": {"dp": 4, "dp_replicate": 2},
        "dp2_tp2_ac": {"dp": 2, "tp": 2, "ac": 1},
        "dp2_cp2": {"dp": 2, "cp": 2},
        "tp2_cp2": {"tp": 2, "cp": 2},
        "moe_dp4_ep2": {"dp": 4, "ep": 2},
        "moe_dp2_cp2_ep4": {"dp": 2, "cp": 2, "ep": 4, "ac": 1},
        "untied_dp2_pp2": {"dp": 2, "pp": 2},
        "untied_dp2_pp2_interleaved": {"dp": 2, "pp": 2},
        "untied_tp2_pp2": {"tp": 2, "pp": 2},
        "untied_cp2_pp2": {"cp": 2, "pp": 2},
        "moe_dp2_pp2_ep2": {"dp": 2, "pp": 2, "ep": 2},
        "dp2_pp2": {"dp": 2, "pp": 2},
        "tp2_pp2": {"tp": 2, "pp": 2},
    },
}
# Layouts that also run as ``<name>_t07``: the same mesh, trained on samples the model drew itself
# (:func:`sampled_samples`), so the trainer's division of the logits by each position's temperature
# is checked where each layout handles it: loss-parallel on vocabulary shards (tp), on sequence
# shards (cp), carried between stages in the loss mask (pp, also two stages per rank), on a dp
# rank's share of the samples, and tp × cp, tp × pp, cp × pp. (A layout left
# out adds nothing to the temperature's path: dp2_tp2 is tp2 with dp2_cp2's split, the untied
# pipelines divide as the tied ones do.)
SAMPLED = "_t07"
SAMPLED_LAYOUTS = {
    2: ("tp2", "cp2", "pp2"),
    4: ("dp2_cp2", "tp2_cp2", "tp2_pp2", "untied_cp2_pp2", "untied_dp2_pp2_interleaved"),
}
for _world, _names in SAMPLED_LAYOUTS.items():
    LAYOUTS[_world].update({name + SAMPLED: LAYOUTS[_world][name] for name in _names})
# layouts run with another pipeline schedule than 1F1B (a SAMPLED one: as its base layout)
SCHEDULES = {  # name -> (schedule, stages per rank)
    "untied_pp2_zero_bubble": ("ZeroBubble", 2),
    "untied_dp2_pp2_interleaved": ("Interleaved1F1B", 2),
}
STEP_ARGS: dict[str, Any] = {
    "mini_batch_size": 4,
    "current_version": 3,
    "max_tokens": 40,
    "max_grad_norm": 1.0,
    "behavior_weight_cap": 5.0,
}
LR = 0.5
# Layouts whose name ends in ``_kl`` also lower the rewards by the KL to a reference model (a
# second model, ``KL_REFERENCE_SEED``'s weights, parallelized the same way).
KL_ARGS: dict[str, Any] = {"kl_coef": 0.5}
KL_REFERENCE_SEED = 1


# Sampling of the SAMPLED layouts: each group of two samples at one temperature, so every
# minibatch of four mixes two (each position's logits are divided by its own), top-p as an engine
# truncates. The final norm's weight is raised so the logits spread as a trained model's do
# (standard deviation ~1.6 tied, ~3 untied, against 0.16 at init): the nucleus is a few to a few
# hundred of the 4096 tokens and the temperature moves every log-prob, where the near-uniform
# distribution at init would make the samples uniform noise and the division nearly a no-op.
SAMPLING_TEMPERATURES = (0.7, 0.5, 0.7, 1.0)  # of groups 0, 1, 2, 3
TOP_P = 0.9
LOGIT_SCALE = {"dense": 10.0, "untied": 20.0}


def step_args(layout: str) -> dict[str, Any]:
    """The train step's arguments for ``layout`` (the KL coefficient for a ``_kl`` one)."""
    return {**STEP_ARGS, **(KL_ARGS if layout.endswith("_kl") else {})}


def base_layout(layout: str) -> str:
    """``layout`` less the :data:`SAMPLED` suffix: the name its mesh and schedule are under."""
    return layout.removesuffix(SAMPLED)


def reference_key(layout: str) -> str:
    """The single-process step a layout must equal: its model kind, ``_kl`` for the
    KL-to-reference penalty, :data:`SAMPLED` for the self-drawn samples."""
    kl = "_kl" if base_layout(layout).endswith("_kl") else ""
    return model_kind(layout) + kl + (SAMPLED if layout.endswith(SAMPLED) else "")


def model_for(layout: str) -> DecoderForCausalLM:
    """The model ``layout`` (or a :func:`reference_key`) trains: :func:`build_model` of its
    kind, with the logits spread by :data:`LOGIT_SCALE` for a :data:`SAMPLED` one."""
    kind = model_kind(layout)
    model = build_model(kind=kind)
    if layout.endswith(SAMPLED):
        with torch.no_grad():
            model.model.norm.weight.fill_(LOGIT_SCALE[kind])
    return model


def samples_for(layout: str, model: DecoderForCausalLM) -> tuple[list[Sample], list[int]]:
    """The step's samples and group ids of ``layout``, whose model ``model`` is
    (:func:`model_for`): its own draws for a :data:`SAMPLED` one (:func:`sampled_samples`; a
    forward per token, so drawn once per process and model kind and copied), else
    :func:`build_samples`."""
    if layout.endswith(SAMPLED):
        samples, groups = _drawn(reference_key(layout), model)
        return copy.deepcopy(samples), list(groups)
    return build_samples(model)


_DRAWN: dict[str, tuple[list[Sample], list[int]]] = {}


def _drawn(key: str, model: DecoderForCausalLM) -> tuple[list[Sample], list[int]]:
    if key not in _DRAWN:
        _DRAWN[key] = sampled_samples(model)
    return _DRAWN[key]


def reference_model(kind: str) -> DecoderForCausalLM:
    """The KL reference of a ``_kl`` layout: another model of the same kind, frozen."""
    return build_model(seed=KL_REFERENCE_SEED, kind=kind).eval().requires_grad_(False)


def model_kind(layout: str) -> str:
    """``dense``, ``moe`` or ``untied``: which model a layout name trains."""
    prefix = layout.partition("_")[0]
    return prefix if prefix in ("moe", "untied") else "dense"


def build_model(seed: int = 0, kind: str = "dense") -> DecoderForCausalLM:
    """The nano Qwen3 (tied embeddings, q/k norms), the same weights in every process; ``moe``:
    its Qwen3-MoE twin (4 experts, top 2, untied LM head); ``untied``: an untied LM head."""
    torch.manual_seed(seed)
    config = tiny_config("nano")
    if kind == "untied":  # 4 layers: room for 2 stages on each of 2 ranks
        config = dataclasses.replace(config, tie_word_embeddings=False, num_hidden_layers=4)
    if kind == "moe":
        config = dataclasses.replace(
            config,
            model_type="qwen3_moe",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=48,
            norm_topk_prob=True,
            tie_word_embeddings=False,
        )
        model: DecoderForCausalLM = Qwen3MoeForCausalLM(config)
    else:
        model = Qwen3ForCausalLM(config)
    model.init_weights(generator=torch.Generator().manual_seed(seed))
    return model


def build_samples(model: DecoderForCausalLM, n: int = 8) -> tuple[list[Sample], list[int]]:
    """``n`` samples of 5..22 tokens in groups of two, off-policy: the behaviour log-probs are
    the model's own plus noise, and tokens carry versions 1..3."""
    gen = torch.Generator().manual_seed(1)
    samples = []
    for _ in range(n):
        prompt = int(torch.randint(2, 8, (1,), generator=gen))
        answer = int(torch.randint(3, 15, (1,), generator=gen))
        ids = torch.randint(10, 4000, (prompt + answer,), generator=gen).tolist()
        versions = [-1] * prompt + torch.randint(1, 4, (answer,), generator=gen).tolist()
        s = Sample(ids, [0] * prompt + [1] * answer, [0.0] * len(ids), versions)
        s.reward = float(torch.rand((), generator=gen))
        samples.append(s)
    (p,) = pack(samples)
    with torch.no_grad():
        lp = token_logprobs(model, p)
    noise = 0.1 * torch.randn(lp.shape, generator=gen)
    for i, s in enumerate(samples):
        start, end = int(p.cu_seqlens[i]), int(p.cu_seqlens[i + 1])
        values = (lp + noise)[start : end - 1].tolist()
        s.logprobs = [0.0] + [v if m else 0.0 for v, m in zip(values, s.loss_mask[1:], strict=True)]
    return samples, [i // 2 for i in range(n)]


def sampled_samples(model: DecoderForCausalLM, n: int = 8) -> tuple[list[Sample], list[int]]:
    """``n`` samples in groups of two: a random prompt of 2..7 tokens, then 3..14 tokens drawn
    from ``model`` one at a time (a full forward per token, no cache) at the group's
    :data:`SAMPLING_TEMPERATURES` with top-p :data:`TOP_P`. Each token's behaviour log-prob is
    log softmax(logits / T) over the whole vocabulary, the distribution the trainer recomputes
    (docs/training.md); top-p only chose the token. Tokens carry versions 1..3."""
    gen = torch.Generator().manual_seed(2)
    samples = []
    for i in range(n):
        temperature = SAMPLING_TEMPERATURES[(i // 2) % len(SAMPLING_TEMPERATURES)]
        prompt = int(torch.randint(2, 8, (1,), generator=gen))
        answer = int(torch.randint(3, 15, (1,), generator=gen))
        ids = torch.randint(10, 4000, (prompt,), generator=gen).tolist()
        logprobs = [0.0] * prompt
        for _ in range(answer):
            token, logprob = _draw(model, ids, temperature, gen)
            ids.append(token)
            logprobs.append(logprob)
        versions = [-1] * prompt + torch.randint(1, 4, (answer,), generator=gen).tolist()
        s = Sample(ids, [0] * prompt + [1] * answer, logprobs, versions, temperature=temperature)
        s.reward = float(torch.rand((), generator=gen))
        samples.append(s)
    return samples, [i // 2 for i in range(n)]


def _draw(
    model: DecoderForCausalLM, ids: list[int], temperature: float, gen: torch.Generator
) -> tuple[int, float]:
    """The next token after ``ids``, drawn from the top-p nucleus of softmax(logits / T) (the
    most likely tokens until their mass reaches :data:`TOP_P`), and its full-vocabulary
    log-prob."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, -1].float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    probs, order = logprobs.exp().sort(descending=True)
    nucleus = order[(probs.cumsum(0) - probs) < TOP_P]  # the mass before each token
    weights = logprobs[nucleus].exp()
    token = int(nucleus[torch.multinomial(weights / weights.sum(), 1, generator=gen)])
    return token, float(logprobs[token])


def step_logprobs(model: DecoderForCausalLM, samples: list[Sample], layout: Any) -> torch.Tensor:
    """``[len(samples), longest]`` float64: the log-prob of each trained token under ``model``
    (column t: token t + 1, as :func:`~areal.plugins.trainer.step.aligned_loss_mask`; 0
    elsewhere), computed by ``layout`` on the packs the step runs and summed over its ranks (a
    collective under a mesh): every position once, whatever rank or stage computed it."""
    mini_batch, max_tokens = STEP_ARGS["mini_batch_size"], STEP_ARGS["max_tokens"]
    width = max(len(s.input_ids) for s in samples)
    out = torch.zeros(len(samples), width, dtype=torch.float64)
    adds = layout.holds_logprobs(model)  # a pipeline's other stages get placeholders
    with torch.no_grad():
        for start in range(0, len(samples), mini_batch):
            packs = layout.packs(samples[start : start + mini_batch], start, max_tokens)
            for p, logprobs in zip(packs, layout.logprobs(model, packs), strict=True):
                if adds:
                    at = (p.sample_index[p.loss_mask], p.positions[0][p.loss_mask])
                    out.index_put_(at, logprobs[p.loss_mask].double(), accumulate=True)
    return layout.all_reduce(out)


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a plain full tensor, by its checkpoint name (a collective: every
    rank's, pipeline stages merged)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    full = {k: v.detach().clone() for k, v in state.items()}
    if dist.is_initialized():  # pipeline stages hold different parameters: merge them all
        full = merge_ranks(full)
    return full


def merge_ranks(local: dict[str, Any]) -> dict[str, Any]:
    """Every rank's ``local`` merged into one dict on every rank (a collective), as the dicts of
    an ``all_gather_object`` merged in rank order: where several ranks hold a name, the last
    one's value. Only the names cross the wire from every rank; each value comes once, from that
    last holder, not once per rank (outside pipelines every rank holds every full tensor, and
    pickling them world-size times over was a good part of the 4-rank launch)."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    names: list[Any] = [None] * world
    dist.all_gather_object(names, list(local))
    holder = {name: r for r, held in enumerate(names) for name in held}  # the last rank wins
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, {k: v for k, v in local.items() if holder[k] == rank})
    values = {k: v for part in parts for k, v in part.items()}
    order = dict.fromkeys(name for held in names for name in held)  # first seen, rank order
    return {name: values[name] for name in order}


def _run_layout(name: str, spec: dict[str, int], out: Path) -> None:
    import torch.distributed as dist

    from areal.plugins.trainer.parallel.parallel_dims import ParallelDims
    from areal.plugins.trainer.parallel.parallelize import ParallelizeOptions, parallelize
    from areal.plugins.trainer.parallel.pipeline import make_layout
    from areal.plugins.trainer.step import train_step

    sizes = {k: v for k, v in spec.items() if k != "ac"}
    dims = ParallelDims(world_size=dist.get_world_size(), **sizes)
    mesh = dims.build_mesh()
    model = model_for(name)
    samples, groups = samples_for(name, model)
    schedule, per_rank = SCHEDULES.get(base_layout(name), ("1F1B", 1))
    options = ParallelizeOptions(
        activation_checkpointing=bool(spec.get("ac")),
        pipeline_schedule=schedule,
        pipeline_stages_per_rank=per_rank,
    )
    parallelize(model, mesh, options)
    reference = None
    if name.endswith("_kl"):  # parallelized before it is frozen, as the trainer's reference is
        reference = parallelize(build_model(seed=KL_REFERENCE_SEED, kind=model_kind(name)), mesh)
        reference.eval().requires_grad_(False)
    # Loss-parallel: with TP the LM head's output stays sharded along the vocabulary.
    weight = getattr(model.lm_head, "weight", None)
    names = getattr(getattr(weight, "device_mesh", None), "mesh_dim_names", None) or ()
    flag = torch.tensor(float("tp" in names and weight.placements[names.index("tp")].is_shard(0)))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the head lives on the last pipeline stage
    sharded_logits = bool(flag)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    layout = make_layout(mesh)
    logprobs = step_logprobs(model, samples, layout) if name.endswith(SAMPLED) else None
    start = time.perf_counter()
    stats = train_step(
        model,
        optimizer,
        samples,
        group_ids=groups,
        layout=layout,
        reference=reference,
        **step_args(name),
    )
    seconds = time.perf_counter() - start
    params = full_parameters(model)
    if dist.get_rank() == 0:
        result = {"stats": stats, "params": params, "seconds": seconds, "logprobs": logprobs}
        torch.save({**result, "vocab_sharded": sharded_logits}, out / f"{name}.pt")


def _mesh(sizes: dict[str, int]) -> Any:
    import torch.distributed as dist

    from areal.plugins.trainer.parallel.parallel_dims import ParallelDims

    return ParallelDims(world_size=dist.get_world_size(), **sizes).build_mesh()


def _full_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state by parameter name, full tensors, every rank's (stages merged)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    state = get_optimizer_state_dict(model, optimizer, options=options)["state"]
    return merge_ranks(dict(state))


# case (its model kind by the name's prefix) -> (layout saved in, layout resumed in): DCP must
# reshard between them. The dense model ties its LM head: under pp its two copies live on two
# stages, saved under one name, so a tied pipeline's checkpoint resumes without one (and the
# pp=2 rank group in test_ranks.py resumes one with one).
CHECKPOINT_CASES: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    "dense": ({"dp": 2, "tp": 2}, {"dp": 4}),
    "moe": ({"dp": 4, "ep": 2}, {"dp": 2, "cp": 2, "ep": 4}),
    "untied": ({"dp": 2, "pp": 2}, {"tp": 2, "pp": 2}),
    "tied_out_of_pp": ({"tp": 2, "pp": 2}, {"dp": 4}),
}


def _groups(optimizer: torch.optim.Optimizer) -> list[Any]:
    """Every rank's optimizer hyperparameters (its groups less their parameters), in rank order."""
    import torch.distributed as dist

    mine = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def _run_checkpoints(out: Path) -> None:
    """For each case: a step in one layout, DCP save, resume in another layout; rank 0 writes
    both views. The dense model resumed in dp4 is also exported to HF and loaded back into a
    dp2×tp2 model."""
    import torch.distributed as dist

    from areal.plugins.trainer.parallel.checkpoint import (
        export_hf,
        load_distributed,
        load_hf,
        save_distributed,
    )
    from areal.plugins.trainer.parallel.parallelize import parallelize
    from areal.plugins.trainer.parallel.pipeline import make_layout
    from areal.plugins.trainer.step import train_step

    rank0 = dist.get_rank() == 0
    for case, (save_in, resume_in) in CHECKPOINT_CASES.items():
        kind = model_kind(case)
        mesh = _mesh(save_in)
        model = build_model(seed=0, kind=kind)
        samples, groups = build_samples(model)
        parallelize(model, mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        layout = make_layout(mesh)
        train_step(model, optimizer, samples, group_ids=groups, layout=layout, **STEP_ARGS)
        save_distributed(out / f"dcp-{case}", model, optimizer, step=7)
        saved = {"params": full_parameters(model), "optim": _full_optimizer(model, optimizer)}

        mesh = _mesh(resume_in)
        model = parallelize(build_model(seed=5, kind=kind), mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        step = load_distributed(out / f"dcp-{case}", model, optimizer)
        resumed = {
            "params": full_parameters(model),
            "optim": _full_optimizer(model, optimizer),
            "groups": _groups(optimizer),
        }
        if rank0:
            torch.save({"saved": saved, "resumed": resumed, "step": step}, out / f"ckpt-{case}.pt")
        if case == "dense":
            export_hf(model, out / "hf")

    model = parallelize(build_model(seed=9), _mesh({"dp": 2, "tp": 2}))
    load_hf(model, out / "hf")
    loaded = full_parameters(model)
    if rank0:
        torch.save({"params": loaded}, out / "hf_loaded.pt")


MESH_LAYOUTS = {  # name -> ParallelDims keywords, for the 4-rank launch
    "dp2_tp2": {"dp": 2, "tp": 2},
    "dp2_cp2": {"dp": 2, "cp": 2},
    "hsdp2x2_ep2": {"dp": 4, "dp_replicate": 2, "ep": 2},
    "dp2_cp2_ep2": {"dp": 2, "cp": 2, "ep": 2},
}
MESH_NAMES = ("dp", "tp", "cp", "dp_shard_cp", "dp_cp", "ep")


def _record_meshes(out: Path) -> None:
    """The ranks of each named sub-mesh this rank belongs to, per layout, gathered on rank 0."""
    import torch.distributed as dist

    from areal.plugins.trainer.parallel.parallel_dims import ParallelDims

    seen: dict[str, dict[str, list[int]]] = {}
    for name, kwargs in MESH_LAYOUTS.items():
        mesh = ParallelDims(world_size=dist.get_world_size(), **kwargs).build_mesh()
        groups = {k: mesh[k].mesh.flatten().tolist() for k in MESH_NAMES if k != "ep"}
        if mesh.sparse is not None:
            groups["ep"] = mesh["ep"].mesh.flatten().tolist()
        groups["fsdp"] = mesh.fsdp.mesh.flatten().tolist()
        groups["expert_fsdp"] = mesh.expert_fsdp.mesh.flatten().tolist()
        seen[name] = groups
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, seen)
    if dist.get_rank() == 0:
        (out / "meshes.json").write_text(json.dumps(gathered))


def _rank_main(rank: int, world: int, port: int, out: Path) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    errors: dict[str, str] = {}
    try:
        jobs: list[tuple[str, Any]] = [
            (name, functools.partial(_run_layout, name, spec, out))
            for name, spec in LAYOUTS[world].items()
        ]
        if world == 4:
            jobs.append(("checkpoints", functools.partial(_run_checkpoints, out)))
            jobs.append(("meshes", functools.partial(_record_meshes, out)))
        for name, job in jobs:
            try:
                job()
            except Exception:  # reported to the test, which fails with it
                errors[name] = traceback.format_exc()
                raise
    finally:
        if errors:
            (out / f"error-rank{rank}.json").write_text(json.dumps(errors))
        dist.destroy_process_group()


def main(world: int, out: Path) -> None:
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_main, args=(world, port, out), nprocs=world, join=True)


# torchrun's placement of a rank: its global and node-local rank, and the node's (GROUP_RANK)
TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def torchrun_main(layout: str, out: Path) -> None:
    """One rank of a launch that torchrun set up (maybe over several nodes): run ``layout`` and
    record torchrun's placement, so a test can see which node ran which rank."""
    import torch.distributed as dist

    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        placement = {key: int(os.environ[key]) for key in TORCHRUN_KEYS}
        (out / f"env-rank{rank}.json").write_text(json.dumps(placement))
        _run_layout(layout, LAYOUTS[dist.get_world_size()][layout], out)
    except Exception:
        (out / f"error-rank{rank}.json").write_text(json.dumps({layout: traceback.format_exc()}))
        raise
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "torchrun":
        torchrun_main(sys.argv[2], Path(sys.argv[3]))
    else:
        main(int(sys.argv[1]), Path(sys.argv[2]))
