"""``train_step`` itself against the references: a minibatch run as several packs is verl's loss
over the whole minibatch, and ``prox_logp: loglinear_every_minibatch`` is AReaL's π_prox.

The nano model takes one step on four samples of one minibatch, with behaviour log-probs moved off
its own so ratios clip. A recording loss keeps what each pack's call was given and the gradient
that reached its log π_θ; put back together as the minibatch's ``[B, T]`` rows, those inputs go
to verl 0.9.1's ``compute_policy_loss_vanilla`` (its ``agg_loss`` inside) and the step's ``loss``
and gradients must equal verl's, for every ``loss_agg_mode`` and however the minibatch is packed
(a pack's weight is its share of the minibatch's valid tokens, or of its sequences). The proximal
log-probs the loss got on the step's first minibatch go to AReaL 1.0.4's
``compute_prox_logp_approximations``.

The model computes in float32, so the loss and its inputs carry float32 rounding (~1e-7
relative); verl and AReaL get the same float32 values as float64, and 1e-6 holds.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from areal.core.hookspecs import hookimpl
from areal.core.plugins import make_plugin_manager, registry
from areal.core.registry import Registry
from areal.core.types import Sample
from areal.plugins.losses.ppo import ppo_loss
from areal.plugins.losses.tokens import AGG_MODES
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.hf_io import load_model
from areal.plugins.models.tiny import init_tiny
from areal.plugins.trainer.packing import pack
from areal.plugins.trainer.step import token_logprobs, train_step
from references.common import VERL_ALGOS, RunReference, actor_config

TOL = 1e-6
PROMPTS = [[10, 20, 30], [40, 50], [60, 70, 80], [90, 11]]
ANSWERS = [[101, 102, 103, 104], [201, 202, 203], [301, 302, 303, 304, 305], [401, 402]]
GROUP_IDS = [0, 0, 1, 1]
REWARDS = [1.0, 0.0, 0.0, 1.0]
VERSIONS = [0, 1, 2, 0]  # for the trainer at version 2: v − 2, v − 1 and its own
CURRENT = 2
# Behaviour log-prob = the model's + these, by token: ratios inside the clip, outside it on both
# sides, and beyond verl's dual clip (e^1.2 > 3).
OFFSETS = (0.0, 0.3, -0.25, 1.2, 0.05)
# Samples of 7, 5, 8 and 6 tokens (4, 3, 5, 2 valid): whole, one pack each, and packs of three
# and one sample, whose shares of the valid tokens (12/14, 2/14) are not their shares of the
# sequences (3/4, 1/4).
PACKINGS = {"one-pack": None, "a-pack-each": 9, "uneven-packs": 20}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> DecoderForCausalLM:
    torch.set_num_threads(1)
    return load_model(Path(init_tiny(tmp_path_factory.mktemp("nano"), size="nano", seed=0)["path"]))


def samples_of(model: DecoderForCausalLM) -> list[Sample]:
    """The four samples, their behaviour log-probs the model's own moved by ``OFFSETS``."""
    samples = []
    for i, (prompt, answer) in enumerate(zip(PROMPTS, ANSWERS, strict=True)):
        ids = prompt + answer
        mask = [0] * len(prompt) + [1] * len(answer)
        versions = [-1] * len(prompt) + [VERSIONS[i]] * len(answer)
        sample = Sample(ids, mask, [0.0] * len(ids), versions)
        sample.reward = REWARDS[i]
        samples.append(sample)
    (p,) = pack(samples)
    with torch.no_grad():
        own = token_logprobs(model, p)
    for i, s in enumerate(samples):
        a, b = int(p.cu_seqlens[i]), int(p.cu_seqlens[i + 1])
        # Token t's log-prob is predicted at packed position t − 1 (docs/training.md).
        moved = [v + OFFSETS[(i + t) % len(OFFSETS)] for t, v in enumerate(own[a : b - 1].tolist())]
        s.logprobs = [0.0] + [v if m else 0.0 for v, m in zip(moved, s.loss_mask[1:], strict=True)]
    return samples


def recording(calls: list[dict[str, Any]]) -> Registry[Any]:
    """The built-ins plus ``recorder``: plain PPO that keeps each step call's inputs and the
    gradient that reaches its log π_θ (the four-token probe's leaf is not kept)."""

    class Recorder:
        @hookimpl
        def areal_register_losses(self, register: Any) -> None:
            def recorder(*, logprobs: torch.Tensor, **kw: Any) -> Any:
                if logprobs.grad_fn is not None:
                    call = {"logprobs": logprobs.detach().clone(), **kw}
                    calls.append(call)
                    logprobs.register_hook(lambda grad: call.__setitem__("grad", grad.clone()))
                return ppo_loss(logprobs=logprobs, **kw)

            register("recorder", recorder)

    pm = make_plugin_manager(load_entry_points=False)
    pm.register(Recorder(), name="recorder")
    return registry("losses", pm)


def rows(calls: list[dict[str, Any]], name: str) -> torch.Tensor:
    """Input ``name`` of every pack's call as the minibatch's ``[B, T]`` rows, float64 (0 or
    False past a sequence's end; padding samples hold no valid token and are left out)."""
    seqs = []
    for call in calls:
        cu = call["cu_seqlens"].tolist()
        for a, b in itertools.pairwise(cu):
            if call["loss_mask"][a:b].any():
                seqs.append(call[name][a:b])
    grid = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)
    return grid if grid.dtype == torch.bool else grid.to(torch.float64)


def width(samples: list[Sample]) -> int:
    """The rows' T: the longest sample (verl's default ``loss_scale_factor``)."""
    return max(len(s.input_ids) for s in samples)


def aggregation_cases(model: DecoderForCausalLM) -> dict[str, tuple[dict[str, Any], Any]]:
    """Case id → (the step's loss, its gradient rows and verl's call), per mode and packing."""
    cases = {}
    for agg in AGG_MODES:
        for packing, max_tokens in PACKINGS.items():
            calls: list[dict[str, Any]] = []
            step_model = copy.deepcopy(model)
            samples = samples_of(step_model)
            options: dict[str, Any] = {"c_clip": 3.0, "loss_agg_mode": agg}
            if agg == "seq-mean-token-sum-norm":
                options["loss_scale_factor"] = float(width(samples))
            stats = train_step(
                step_model,
                torch.optim.SGD(step_model.parameters(), lr=0.0),
                samples,
                mini_batch_size=len(samples),
                group_ids=GROUP_IDS,
                current_version=CURRENT,
                loss="recorder",
                loss_options=options,
                max_tokens=max_tokens,
                losses=recording(calls),
            )
            assert len(calls) == {None: 1, 9: 4, 20: 2}[max_tokens]
            ours = {
                "loss": stats["loss"],
                "grad": rows(calls, "grad"),
                "mask": rows(calls, "loss_mask"),
            }
            call = {
                "fn": f"{VERL_ALGOS}:compute_policy_loss_vanilla",
                "kwargs": {
                    "old_log_prob": rows(calls, "behavior_logprobs"),
                    "log_prob": rows(calls, "logprobs"),
                    "advantages": rows(calls, "advantages"),
                    "response_mask": ours["mask"].to(torch.float64),
                    "loss_agg_mode": agg,
                    "config": actor_config(clip=0.2),
                },
                "grad": ["log_prob"],
            }
            cases[f"{agg}-{packing}"] = (ours, call)
    return cases


@pytest.fixture(scope="module")
def aggregation(model: DecoderForCausalLM) -> dict[str, tuple[dict[str, Any], Any]]:
    return aggregation_cases(model)


def prox_case(model: DecoderForCausalLM, prox_logp: str) -> tuple[dict[str, Any], Any]:
    """The step's first (only) minibatch under ``prox_logp``: the loss's inputs, and AReaL's call
    on the same behaviour and current log-probs, versions and v_θ = trainer version + 1."""
    calls: list[dict[str, Any]] = []
    step_model = copy.deepcopy(model)
    samples = samples_of(step_model)
    train_step(
        step_model,
        torch.optim.SGD(step_model.parameters(), lr=0.0),
        samples,
        mini_batch_size=len(samples),
        group_ids=GROUP_IDS,
        current_version=CURRENT,
        loss="recorder",
        prox_logp=prox_logp,
        losses=recording(calls),
    )
    (call,) = calls
    (p,) = pack(samples)
    call["versions"] = p.versions
    return call, {
        "fn": "areal.trainer.ppo.actor:compute_prox_logp_approximations",
        "kwargs": {
            "old_logp": call["behavior_logprobs"].to(torch.float64),
            "logprobs": call["logprobs"].to(torch.float64),
            "versions": p.versions,
            "current_version": CURRENT + 1,
            "method": "loglinear",
        },
    }


@pytest.fixture(scope="module")
def prox(model: DecoderForCausalLM) -> dict[str, tuple[dict[str, Any], Any]]:
    return {m: prox_case(model, m) for m in ("loglinear", "loglinear_every_minibatch")}


@pytest.fixture(scope="module")
def results(
    run_reference: RunReference,
    aggregation: dict[str, tuple[dict[str, Any], Any]],
    prox: dict[str, tuple[dict[str, Any], Any]],
) -> dict[str, dict[str, Any]]:
    """Every reference call of the module, in one reference process."""
    calls = {case: call for case, (_, call) in aggregation.items()}
    calls.update({f"prox-{m}": call for m, (_, call) in prox.items()})
    return dict(zip(calls, run_reference(list(calls.values())), strict=True))


@pytest.mark.parametrize("packing", list(PACKINGS))
@pytest.mark.parametrize("agg", AGG_MODES)
def test_a_minibatch_in_packs_is_verls_loss_over_the_whole_minibatch(
    agg: str,
    packing: str,
    aggregation: dict[str, tuple[dict[str, Any], Any]],
    results: dict[str, dict[str, Any]],
) -> None:
    ours, _ = aggregation[f"{agg}-{packing}"]
    ref = results[f"{agg}-{packing}"]
    mask = ours["mask"]
    assert ours["loss"] == pytest.approx(float(ref["out"][0]), abs=TOL, rel=TOL)
    torch.testing.assert_close(
        ours["grad"][mask], ref["grads"]["log_prob"][mask], atol=TOL, rtol=TOL
    )
    assert 0 < ref["out"][1]["actor/pg_clipfrac"] < 1  # the clip is really exercised


def test_loglinear_every_minibatch_is_areals_proximal_logprobs_on_the_first_minibatch(
    prox: dict[str, tuple[dict[str, Any], Any]], results: dict[str, dict[str, Any]]
) -> None:
    """On the first minibatch, where π_θ = π_prox, ``loglinear_every_minibatch`` gives the loss
    AReaL's approximation; the default ``loglinear`` gives π_θ's own log-probs on the generated
    tokens instead, which differ from AReaL's on the tokens older than v_θ − 1."""
    for method in ("loglinear_every_minibatch", "loglinear"):
        call, _ = prox[method]
        theirs = results[f"prox-{method}"]["out"]["loglinear"]
        mine, mask = call["proximal_logprobs"].to(torch.float64), call["loss_mask"]
        stale = mask & (call["versions"] < CURRENT)
        assert stale.any()
        if method == "loglinear_every_minibatch":
            torch.testing.assert_close(mine[mask], theirs[mask], atol=TOL, rtol=TOL)
        else:
            exact = call["logprobs"].to(torch.float64)
            torch.testing.assert_close(mine[mask], exact[mask], atol=0.0, rtol=0.0)
            moved = stale & (call["behavior_logprobs"] != call["logprobs"])  # a non-zero offset
            assert (mine - theirs)[moved].abs().min() > 1e-3
