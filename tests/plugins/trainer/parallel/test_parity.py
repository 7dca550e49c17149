"""One RL train step under dp (FSDP2), tp, cp, ep, pp and their combinations (dp×tp, dp×cp,
tp×cp, dp×ep, dp×cp×ep, dp×pp, tp×pp, cp×pp, dp×pp×ep, pp with the KL-to-reference penalty),
HSDP, activation checkpointing and four pipeline schedules, on real gloo ranks, against the same
step in one process: loss and updated parameters agree to 1e-5. The dense layouts train the nano Qwen3 (tied embeddings), the ``moe_``
ones its Qwen3-MoE twin, the ``untied_`` ones (pipelines) the nano with an untied LM head.
The ``_t07`` twins of the tp, cp and pp layouts (``worker.SAMPLED_LAYOUTS``) train on samples the
model drew itself at temperatures 0.7, 0.5 and 1.0 (mixed in each minibatch) with top-p 0.9:
they also agree on every trained token's log-prob, so the division of each position's logits by
its own temperature (loss-parallel under TP, carried between stages under PP, on sequence shards
under CP) is the single process's.
The dp2 step also runs as two torchrun "nodes" on loopback (one rank each, areal's own torchrun
command with multi-node flags, static and c10d rendezvous): the path of several machines.

The optimizer is SGD so that parameters differ exactly by lr × the gradients' difference: Adam's
first steps divide each gradient element by its own size, which turns fp32 rounding differences
of near-zero gradients into differences of the learning rate's order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from areal.plugins.trainer.step import SingleProcess, aligned_loss_mask, train_step
from areal.run.launch import torchrun_command
from support import dist_worker as worker

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # multi-rank launches (conftest.py)


@pytest.fixture(scope="module")
def references() -> dict[str, dict[str, Any]]:
    """The single-process step of each model kind (dense, moe, untied), of the untied one
    with the KL-to-reference penalty (``untied_kl``), and of the dense and untied ones on their
    own samples (``_t07``, with the log-probs of the trained tokens before the step)."""
    torch.set_num_threads(1)
    out = {}
    sampled = ("dense" + worker.SAMPLED, "untied" + worker.SAMPLED)
    for key in ("dense", "moe", "untied", "untied_kl", *sampled):
        kind = worker.model_kind(key)
        model = worker.model_for(key)
        samples, groups = worker.samples_for(key, model)
        optimizer = torch.optim.SGD(model.parameters(), lr=worker.LR)
        reference = worker.reference_model(kind) if key.endswith("_kl") else None
        logprobs = worker.step_logprobs(model, samples, SingleProcess()) if key in sampled else None
        stats = train_step(
            model,
            optimizer,
            samples,
            group_ids=groups,
            reference=reference,
            **worker.step_args(key),
        )
        params = worker.full_parameters(model)
        out[key] = {"stats": stats, "params": params, "logprobs": logprobs, "samples": samples}
    return out


@pytest.mark.parametrize("kind", ["dense", "untied"])
def test_sampled_steps_train_the_distribution_that_sampled(
    references: dict[str, dict[str, Any]], kind: str
) -> None:
    """The premise of the ``_t07`` layouts, in one process: the trainer's log-probs are the
    behaviour log-probs the tokens were drawn with (each sample at its own temperature), the
    tokens are likely ones (top-p of a spread distribution, not uniform noise), and the
    temperature moves the log-probs far beyond the parity tolerance, so a layout that skipped
    or misplaced the division would fail its parity test."""
    reference = references[kind + worker.SAMPLED]
    samples, logprobs = reference["samples"], reference["logprobs"]
    mask = aligned_loss_mask(samples)
    behaviour = torch.zeros_like(logprobs)
    for i, s in enumerate(samples):
        behaviour[i, : len(s.input_ids) - 1] = torch.from_numpy(s.logprobs[1:]).double()
    torch.testing.assert_close(logprobs[mask], behaviour[mask], atol=1e-5, rtol=0)
    assert abs(reference["stats"]["behave_approx_kl"]) < 1e-6
    # Every minibatch of four mixes two temperatures.
    batch = worker.STEP_ARGS["mini_batch_size"]
    for start in range(0, len(samples), batch):
        assert len({s.temperature for s in samples[start : start + batch]}) == 2
    assert 0.7 in {s.temperature for s in samples}
    # Likely tokens: far above the uniform log(1/4096) = -8.3 on average.
    assert float(behaviour[mask].mean()) > -3.0
    at_one = [dataclasses.replace(s, temperature=1.0) for s in samples]
    untempered = worker.step_logprobs(
        worker.model_for(kind + worker.SAMPLED), at_one, SingleProcess()
    )
    assert float((untempered - logprobs)[mask].abs().median()) > 0.1  # ~0.4: 10^4 × the tolerance


@pytest.mark.parametrize(
    ("world", "layout"),
    [(world, name) for world, layouts in worker.LAYOUTS.items() for name in layouts],
)
def test_step_matches_single_process(
    launch: Callable[[int], Path],
    references: dict[str, dict[str, Any]],
    world: int,
    layout: str,
) -> None:
    check_step(torch.load(launch(world) / f"{layout}.pt"), references, layout)


def check_step(got: dict[str, Any], references: dict[str, dict[str, Any]], layout: str) -> None:
    """``got`` (rank 0's file of one layout) is the single-process step of the layout's model."""
    kind = worker.model_kind(layout)
    reference = references[worker.reference_key(layout)]
    ref = reference["stats"]
    # The KL to the reference model: summed over every sample's tokens once, whatever the layout
    # (a pipeline's first stage has no log-probs to add); 0 without the penalty.
    assert got["stats"]["kl_ref"] == pytest.approx(ref["kl_ref"], abs=1e-6)
    assert (ref["kl_ref"] != 0) == layout.endswith("_kl")
    assert got["stats"]["n_valid_tokens"] == ref["n_valid_tokens"]
    assert got["stats"]["n_tokens"] == ref["n_tokens"]
    assert got["stats"]["n_minibatches"] == ref["n_minibatches"] == 2
    assert got["stats"]["loss"] == pytest.approx(ref["loss"], abs=1e-5)
    assert got["stats"]["clip_fraction"] == pytest.approx(ref["clip_fraction"], abs=1e-6)
    # A mean over trained tokens of log π_prox − log π_behav: within the log-probs' 1e-5 below.
    assert got["stats"]["behave_approx_kl"] == pytest.approx(ref["behave_approx_kl"], abs=1e-5)
    assert got["stats"]["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    assert got["params"].keys() == reference["params"].keys()
    for name, expected in reference["params"].items():
        torch.testing.assert_close(got["params"][name], expected, atol=1e-5, rtol=0, msg=name)
    # The log-prob of every trained token before the step (the ``_t07`` layouts write them).
    assert (got.get("logprobs") is None) == (reference["logprobs"] is None)
    if reference["logprobs"] is not None:
        torch.testing.assert_close(got["logprobs"], reference["logprobs"], atol=1e-5, rtol=0)
    # With TP the LM head is sharded along the vocabulary and its log-probs are loss-parallel.
    assert got["vocab_sharded"] == ("tp2" in layout)
    # The step did move the weights (the comparison is not between two untouched models).
    moe = kind == "moe"
    name = "model.layers.0.mlp.experts.up_proj" if moe else "model.layers.0.mlp.up_proj.weight"
    before = worker.build_model(kind=kind).state_dict()[name]
    assert (got["params"][name] - before).abs().max() > 1e-3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node_command(node_args: list[str], out: Path) -> list[str]:
    """areal's own torchrun command for 2 ranks with a user's multi-node flags, running the
    worker's ``dp2`` instead of ``areal.run.train``."""
    command = torchrun_command(2, out / "resolved.yaml", out, resume=False, extra=node_args)
    launcher = command[: command.index("areal.run.train")]  # up to "-m areal.run.train"'s "-m"
    return [*launcher, worker.MODULE, "torchrun", "dp2", str(out)]


def _run_nodes(commands: list[list[str]], outs: list[Path], timeout: float = 600) -> None:
    """Start every node's torchrun at once (as on separate machines) and wait for all; a node
    that fails or hangs fails the test with every node's log (``timeout`` bounds a hang, several
    times a launch on a busy machine). Nothing outlives the call."""
    env = worker.env()
    procs: list[subprocess.Popen[bytes]] = []
    codes: list[int | None] = []
    try:
        for command, out in zip(commands, outs, strict=True):
            out.mkdir(parents=True)
            with (out / "torchrun.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        command,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + timeout
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            codes.append(proc.returncode)
    finally:
        for proc in procs:  # torchrun and its rank: the launcher's whole session
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if codes != [0] * len(procs):
        logs = "\n".join(
            f"--- node {i} (exit {code}) ---\n{(out / 'torchrun.log').read_text()[-3000:]}"
            for i, (code, out) in enumerate(zip(codes, outs, strict=True))
        )
        pytest.fail(f"a node failed or hung (None: killed after {timeout} s):\n{logs}")


@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_two_nodes_on_loopback_match_the_single_process_step(
    references: dict[str, dict[str, Any]], tmp_path: Path, rendezvous: str
) -> None:
    """Two torchrun launchers of one rank each, joined only through the rendezvous endpoint as
    two machines would be, train dp2 like one process. ``static`` (torchrun's default) makes
    ``--node-rank`` the node's rank, so node 0 runs rank 0; ``c10d`` ignores ``--node-rank`` and
    numbers the nodes itself, so either may run rank 0."""
    endpoint = ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}"]
    if rendezvous == "static":
        node_args = [[*endpoint, "--node-rank", str(node)] for node in (0, 1)]
    else:
        c10d = ["--rdzv-backend", "c10d", "--rdzv-id", f"loopback-{tmp_path.name}"]
        node_args = [[*endpoint, *c10d]] * 2
    outs = [tmp_path / f"node{node}" for node in (0, 1)]
    _run_nodes([_node_command(args, out) for args, out in zip(node_args, outs, strict=True)], outs)

    placements = [[json.loads(f.read_text()) for f in out.glob("env-rank*.json")] for out in outs]
    assert [len(ranks) for ranks in placements] == [1, 1], placements  # one rank per node
    node_ranks = []
    for (placement,) in placements:
        assert placement["WORLD_SIZE"] == 2 and placement["LOCAL_WORLD_SIZE"] == 1, placement
        assert placement["LOCAL_RANK"] == 0 and placement["RANK"] == placement["GROUP_RANK"]
        node_ranks.append(placement["GROUP_RANK"])
    assert node_ranks == [0, 1] if rendezvous == "static" else sorted(node_ranks) == [0, 1]
    rank0 = outs[node_ranks.index(0)]
    assert not (outs[node_ranks.index(1)] / "dp2.pt").exists()  # only rank 0 writes the step
    check_step(torch.load(rank0 / "dp2.pt"), references, "dp2")
