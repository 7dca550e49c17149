"""areal's losses, aggregation modes and advantage estimators against verl 0.9.1's own
``core_algos``, run from the installed package.

Every call goes to the reference venv in one batch (``conftest.py``), on random float64 ``[B, T]``
rows with masked positions (verl's layout); the same inputs packed into ``[N]`` with
``cu_seqlens`` (areal's trainer layout) must give the same loss. Values and gradients with respect
to log π_θ agree to 1e-6.

How a verl option reads in areal (docs/training.md, "Losses"):

- ``vanilla`` always applies the dual clip (``clip_ratio_c`` 3.0): areal's ``ppo`` with
  ``c_clip: 3.0`` (areal's default has no dual clip, as AReaL's);
- ``gspo`` is ``importance_sampling_level: sequence``; ``sapo`` always aggregates by
  ``seq-mean-token-mean``, whatever ``loss_agg_mode`` says: areal's ``sapo`` with that mode;
- ``cispo`` clips both sides by default: areal's ``eps_clip_low`` set (areal's default leaves the
  lower side open, as MiniMax-M1);
- verl's ``rollout_is_weights`` multiply the per-token loss as areal's behaviour weight does:
  areal's decoupled loss, uncapped, is ``vanilla`` anchored at π_prox with those weights
  e^(log π_prox − log π_behav);
- a group of one sample: verl's GRPO gives r / (1 + ε) (r without the std), its RLOO r; areal's
  ``single_sample: reward``. areal's default, ``zero``, gives it 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from areal.plugins.losses.advantages import (
    gae_advantages,
    grpo_token_advantages,
    rloo_token_advantages,
)
from areal.plugins.losses.cispo import cispo_loss
from areal.plugins.losses.cov import clip_cov_loss, kl_cov_loss
from areal.plugins.losses.ppo import decoupled_ppo_loss, ppo_loss
from areal.plugins.losses.sapo import sapo_loss
from areal.plugins.losses.tokens import AGG_MODES, aggregate
from references.common import LENGTHS, RunReference, actor_config, random_inputs
from references.common import VERL_ALGOS as ALGOS

TOL = 1e-6

Tensors = dict[str, torch.Tensor]
LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


def packed(rows: Tensors, packs: Tensors) -> Tensors:
    """``random_inputs`` keeps the packed tensors beside the rows: both layouts of one batch."""
    return {**packs, **{f"rows_{k}": v for k, v in rows.items()}}


def ours(fn: LossFn, x: Tensors, *, rows: bool, seed: int | None = None, **kw: Any) -> Any:
    """Our loss and its gradient on the rows (verl's layout) or the packed sequences."""
    p = "rows_" if rows else ""
    logp = x[f"{p}logprobs"].clone().requires_grad_()
    if seed is not None:
        torch.manual_seed(seed)
    loss, _ = fn(
        logprobs=logp,
        proximal_logprobs=x[f"{p}proximal_logprobs"],
        behavior_logprobs=kw.pop("behavior_logprobs", x[f"{p}behavior_logprobs"]),
        advantages=x[f"{p}advantages"],
        loss_mask=x[f"{p}loss_mask"],
        cu_seqlens=None if rows else x["cu_seqlens"],
        **kw,
    )
    loss.backward()
    assert logp.grad is not None
    return loss.detach(), logp.grad


def verl_call(
    mode: str, x: Tensors, old: str, config: dict[str, Any], agg: str, **extra: Any
) -> dict[str, Any]:
    return {
        "fn": f"{ALGOS}:compute_policy_loss_{mode}",
        "kwargs": {
            "old_log_prob": x[f"rows_{old}"],
            "log_prob": x["rows_logprobs"],
            "advantages": x["rows_advantages"],
            "response_mask": x["rows_loss_mask"].to(torch.float64),
            "loss_agg_mode": agg,
            "config": config,
            **extra,
        },
        "grad": ["log_prob"],
    }


def rows_to_packed(grid: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` rows back to the packed ``[N]`` layout (row i's first ``LENGTHS[i]``)."""
    return torch.cat([grid[i, :n] for i, n in enumerate(LENGTHS)])


# --- policy losses ------------------------------------------------------------------------------

# (case id, verl loss mode, anchor verl's ratio uses, verl config, our loss, our options)
PolicyCase = tuple[str, str, str, dict[str, Any], LossFn, dict[str, Any]]
POLICY: list[PolicyCase] = [
    ("vanilla", "vanilla", "behavior_logprobs", actor_config(clip=0.1),
     ppo_loss, {"eps_clip": 0.1, "c_clip": 3.0}),
    ("vanilla-clip-higher-dual-1.5", "vanilla", "behavior_logprobs",
     actor_config(clip=0.1, clip_ratio_high=0.15, clip_ratio_c=1.5),
     ppo_loss, {"eps_clip": 0.1, "eps_clip_high": 0.15, "c_clip": 1.5}),
    ("gspo", "gspo", "behavior_logprobs", actor_config(clip=0.05),
     ppo_loss, {"eps_clip": 0.05, "importance_sampling_level": "sequence"}),
    ("cispo", "cispo", "proximal_logprobs", actor_config(clip=0.1, clip_ratio_high=0.3),
     cispo_loss, {"eps_clip_low": 0.1, "eps_clip_high": 0.3, "behavior_weight_action": "disabled"}),
    ("kl_cov", "kl_cov", "proximal_logprobs",
     actor_config(policy_loss={"loss_mode": "kl_cov", "kl_cov_ratio": 0.1}),
     kl_cov_loss, {"kl_cov_ratio": 0.1, "behavior_weight_action": "disabled"}),
    ("kl_cov-coef", "kl_cov", "proximal_logprobs",
     actor_config(policy_loss={"loss_mode": "kl_cov", "kl_cov_ratio": 0.25, "ppo_kl_coef": 0.7}),
     kl_cov_loss, {"kl_cov_ratio": 0.25, "ppo_kl_coef": 0.7, "behavior_weight_action": "disabled"}),
]  # fmt: skip

# verl's sapo aggregates by seq-mean-token-mean whatever the mode: one case per mode is its own.
SAPO_CASES: list[PolicyCase] = [
    ("sapo", "sapo", "proximal_logprobs", actor_config(),
     sapo_loss, {"behavior_weight_action": "disabled", "loss_agg_mode": "seq-mean-token-mean"}),
    ("sapo-taus", "sapo", "proximal_logprobs", actor_config(tau_pos=2.0, tau_neg=3.0),
     sapo_loss, {"tau_pos": 2.0, "tau_neg": 3.0, "behavior_weight_action": "disabled",
                 "loss_agg_mode": "seq-mean-token-mean"}),
]  # fmt: skip

# clip_cov detaches a random subset drawn by torch.randperm: both draw after one manual_seed.
CLIP_COV: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("clip_cov", {"loss_mode": "clip_cov", "clip_cov_ratio": 0.3, "clip_cov_lb": 0.1},
     {"clip_cov_ratio": 0.3, "clip_cov_lb": 0.1}),
    ("clip_cov-bounds", {"loss_mode": "clip_cov", "clip_cov_ratio": 0.5, "clip_cov_lb": -1.0,
                         "clip_cov_ub": 0.5},
     {"clip_cov_ratio": 0.5, "clip_cov_lb": -1.0, "clip_cov_ub": 0.5}),
]  # fmt: skip

Case = tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor], dict[str, Any]]


def policy_cases() -> dict[str, Case]:
    """Case id → (ours on rows, ours packed, verl's call), for every loss × aggregation mode."""
    cases: dict[str, Case] = {}
    for seed in (0, 1):
        x = packed(random_inputs(seed, padded=True), random_inputs(seed))
        # Packed inputs have no row width: the sum-norm mode gets verl's default, the rows' T.
        width = {"loss_scale_factor": float(x["rows_loss_mask"].shape[-1])}
        for agg in AGG_MODES:
            norm = width if agg == "seq-mean-token-sum-norm" else {}
            for cid, mode, old, config, fn, options in POLICY:
                opts = {**options, "loss_agg_mode": agg, **norm}
                cases[f"{cid}-{agg}-{seed}"] = (
                    ours(fn, x, rows=True, **opts),
                    ours(fn, x, rows=False, **opts),
                    verl_call(mode, x, old, config, agg),
                )
            for cid, loss_cfg, options in CLIP_COV:
                opts = {"eps_clip": 0.1, "behavior_weight_action": "disabled",
                        "loss_agg_mode": agg, **options, **norm}  # fmt: skip
                call = verl_call("clip_cov", x, "proximal_logprobs",
                                 actor_config(policy_loss=loss_cfg, clip=0.1), agg)  # fmt: skip
                call["seed"] = 100 + seed
                cases[f"{cid}-{agg}-{seed}"] = (
                    ours(clip_cov_loss, x, rows=True, seed=100 + seed, **opts),
                    ours(clip_cov_loss, x, rows=False, seed=100 + seed, **opts),
                    call,
                )
        for cid, mode, old, config, fn, options in SAPO_CASES:
            cases[f"{cid}-{seed}"] = (
                ours(fn, x, rows=True, **options),
                ours(fn, x, rows=False, **options),
                verl_call(mode, x, old, config, "token-mean"),
            )
        # The decoupled loss: verl's vanilla anchored at π_prox, with the behaviour weights as
        # its rollout_is_weights (areal's default: every token its own uncapped weight).
        weights = torch.exp(x["rows_proximal_logprobs"] - x["rows_behavior_logprobs"])
        call = verl_call("vanilla", x, "proximal_logprobs", actor_config(clip=0.2),
                         "token-mean", rollout_is_weights=weights)  # fmt: skip
        cases[f"decoupled-rollout-is-weights-{seed}"] = (
            ours(decoupled_ppo_loss, x, rows=True, c_clip=3.0),
            ours(decoupled_ppo_loss, x, rows=False, c_clip=3.0),
            call,
        )
    return cases


CASES = policy_cases()


@pytest.fixture(scope="module")
def verl_results(run_reference: RunReference) -> dict[str, dict[str, Any]]:
    """Every verl call of the module, in one reference process."""
    calls = [call for _, _, call in CASES.values()]
    calls += [call for _, call in AGG_CALLS.values()]
    calls += [call for _, call in ADVANTAGE_CALLS.values()]
    answers = iter(run_reference(calls))
    results = {case: next(answers) for case in CASES}
    results.update({case: next(answers) for case in AGG_CALLS})
    results.update({case: next(answers) for case in ADVANTAGE_CALLS})
    return results


@pytest.mark.parametrize("case", list(CASES))
def test_policy_loss_equals_verls(case: str, verl_results: dict[str, Any]) -> None:
    (row_loss, row_grad), (pack_loss, pack_grad), _ = CASES[case]
    ref = verl_results[case]
    ref_loss, ref_grad = float(ref["out"][0]), ref["grads"]["log_prob"]
    assert row_loss.item() == pytest.approx(ref_loss, abs=TOL, rel=TOL)
    assert pack_loss.item() == pytest.approx(ref_loss, abs=TOL, rel=TOL)
    torch.testing.assert_close(row_grad, ref_grad, atol=TOL, rtol=TOL)
    torch.testing.assert_close(pack_grad, rows_to_packed(ref_grad), atol=TOL, rtol=TOL)


def test_the_random_subsets_are_not_trivial(verl_results: dict[str, Any]) -> None:
    """clip_cov detached some tokens and kl_cov penalised some, so the seeds are really
    compared (verl reports the detached share as ``pg_clipfrac``)."""
    for seed in (0, 1):
        for cid, _, _ in CLIP_COV:
            assert verl_results[f"{cid}-token-mean-{seed}"]["out"][1]["actor/pg_clipfrac"] > 0


# --- aggregation modes on their own -------------------------------------------------------------


def agg_calls() -> dict[str, tuple[tuple[torch.Tensor, torch.Tensor], dict[str, Any]]]:
    x = random_inputs(5)
    rows = random_inputs(5, padded=True)
    cases = {}
    for agg in AGG_MODES:
        for scale in (None, 11.0):
            if scale is not None and agg != "seq-mean-token-sum-norm":
                continue
            width = float(rows["loss_mask"].shape[-1])
            values = x["advantages"].clone().requires_grad_()
            loss = aggregate(
                torch.where(x["loss_mask"], values, 0.0),
                x["loss_mask"],
                mode=agg,
                cu_seqlens=x["cu_seqlens"],
                scale_factor=scale if scale is not None or agg != AGG_MODES[3] else width,
            )
            loss.backward()
            assert values.grad is not None
            cases[f"{agg}-{scale}"] = (
                (loss.detach(), values.grad),
                {
                    "fn": f"{ALGOS}:agg_loss",
                    "kwargs": {
                        "loss_mat": rows["advantages"],
                        "loss_mask": rows["loss_mask"].to(torch.float64),
                        "loss_agg_mode": agg,
                        "loss_scale_factor": scale,
                    },
                    "grad": ["loss_mat"],
                },
            )
    return cases


AGG_CALLS = agg_calls()


@pytest.mark.parametrize("case", list(AGG_CALLS))
def test_aggregation_equals_verls_agg_loss(case: str, verl_results: dict[str, Any]) -> None:
    (loss, grad), _ = AGG_CALLS[case]
    ref = verl_results[case]
    assert loss.item() == pytest.approx(float(ref["out"]), abs=TOL, rel=TOL)
    torch.testing.assert_close(grad, rows_to_packed(ref["grads"]["loss_mat"]), atol=TOL, rtol=TOL)


# --- advantage estimators -----------------------------------------------------------------------

# Groups of 3, 1, 4 and 1 samples: two of one sample each.
GROUPS = [0, 0, 0, 1, 2, 2, 2, 2, 3]


def advantage_inputs() -> Tensors:
    g = torch.Generator().manual_seed(7)
    n, width = len(GROUPS), 6
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return {
        "rewards": torch.randn(n, generator=g, dtype=torch.float64),
        "values": torch.randn(n, width, generator=g, dtype=torch.float64),
        "token_rewards": torch.randn(n, width, generator=g, dtype=torch.float64),
        "mask": mask,
        "group_ids": torch.tensor(GROUPS),
    }


def advantage_calls() -> dict[str, tuple[torch.Tensor, dict[str, Any]]]:
    """Ours with ``single_sample: reward`` (verl's rule) and verl's call, per estimator."""
    a = advantage_inputs()
    # verl reads the sequence reward as the sum of the token rewards: put it on the last token.
    last = a["mask"].sum(-1) - 1
    on_last = torch.zeros(a["mask"].shape, dtype=torch.float64)
    on_last[torch.arange(len(GROUPS)), last] = a["rewards"]
    common = {"token_level_rewards": on_last, "response_mask": a["mask"].to(torch.float64),
              "index": GROUPS}  # fmt: skip
    ours_kw = {"rewards": a["rewards"], "group_ids": a["group_ids"], "loss_mask": a["mask"]}
    cases: dict[str, tuple[torch.Tensor, dict[str, Any]]] = {}
    for norm in (True, False):
        for eps in (1e-6, 0.5):
            cases[f"grpo-std-{norm}-eps-{eps}"] = (
                grpo_token_advantages(**ours_kw, eps=eps, normalize_std=norm,
                                      single_sample="reward"),
                {"fn": f"{ALGOS}:compute_grpo_outcome_advantage",
                 "kwargs": {**common, "epsilon": eps, "norm_adv_by_std_in_grpo": norm}},
            )  # fmt: skip
    cases["rloo"] = (
        rloo_token_advantages(**ours_kw, single_sample="reward"),
        {"fn": f"{ALGOS}:compute_rloo_outcome_advantage", "kwargs": common},
    )
    for gamma, lam in ((1.0, 1.0), (0.9, 0.8)):
        # verl returns the whitened advantages and the returns A + V: the raw GAE is returns − V.
        cases[f"gae-{gamma}-{lam}"] = (
            gae_advantages(a["token_rewards"], a["values"], a["mask"], gamma, lam),
            {"fn": f"{ALGOS}:compute_gae_advantage_return",
             "kwargs": {"token_level_rewards": a["token_rewards"], "values": a["values"],
                        "response_mask": a["mask"].to(torch.float64), "gamma": gamma,
                        "lam": lam}},
        )  # fmt: skip
    return cases


ADVANTAGE_CALLS = advantage_calls()


@pytest.mark.parametrize("case", list(ADVANTAGE_CALLS))
def test_advantages_equal_verls(case: str, verl_results: dict[str, Any]) -> None:
    mine, _ = ADVANTAGE_CALLS[case]
    a = advantage_inputs()
    mask = a["mask"]
    out = verl_results[case]["out"]
    ref = out[1] - a["values"] if case.startswith("gae") else out[0]
    torch.testing.assert_close(mine[mask], ref[mask].to(torch.float64), atol=TOL, rtol=TOL)


def test_default_single_sample_is_zero_where_verl_keeps_the_reward(
    verl_results: dict[str, Any],
) -> None:
    """areal's default (``single_sample: zero``) equals verl on every group of two or more and
    gives a lone sample 0 (it has no baseline to be compared with), where verl gives r / (1 + ε)."""
    a = advantage_inputs()
    mask = a["mask"]
    alone = torch.tensor([GROUPS.count(g) == 1 for g in GROUPS])
    for case, fn, kw in (
        ("grpo-std-True-eps-1e-06", grpo_token_advantages, {}),
        ("rloo", rloo_token_advantages, {}),
    ):
        mine = fn(rewards=a["rewards"], group_ids=a["group_ids"], loss_mask=mask, **kw)
        ref = verl_results[case]["out"][0].to(torch.float64)
        shared = mask & ~alone[:, None]
        torch.testing.assert_close(mine[shared], ref[shared], atol=TOL, rtol=TOL)
        assert (mine[mask & alone[:, None]] == 0).all()
        assert (ref[mask & alone[:, None]] != 0).all()
