"""areal's losses against AReaL 1.0.4's own functions, run from the installed package.

``ppo_actor_loss_fn`` (with every ``rejection_sampling`` option and GSPO), ``sapo_loss_fn``,
``compute_prox_logp_approximations`` (log-linear π_prox) and ``masked_normalization`` (the batch
advantage norm) are called in the reference venv (``conftest.py``) on random float64 packed inputs
with masked positions holding garbage; the loss values, the gradients with respect to log π_θ and
the rule's masked fraction must equal ours to 1e-6.

How an AReaL option reads in areal (docs/training.md, "Behaviour-weight rule"):

- ``rejection_sampling: null`` (AReaL's default) is ``behavior_weight_action: disabled``;
- areal's default (every token weighted by its own uncapped π_prox/π_behav) is AReaL's
  ``rejection_sampling`` with ``upper: inf``;
- AReaL's metrics ``kl_k1``, ``kl_k2``, ``kl_k3`` are areal's values of the same names (areal's
  ``k1`` and ``k3`` estimate the other direction: tests/plugins/losses/test_behavior_weight.py);
- AReaL's GSPO (``importance_sampling_level: sequence``) averages each sequence's advantages:
  areal's ``sequence_mean_adv``; areal's ``sequence`` keeps per-token advantages (verl's ``gspo``)
  and equals AReaL's wherever a sequence has one advantage.

AReaL computes the behaviour log-ratio in float32 (``.float()``), so its weights carry ~1e-7
relative rounding; 1e-6 holds.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from areal.plugins.losses.advantages import normalize_batch_advantages
from areal.plugins.losses.ppo import decoupled_ppo_loss, loglinear_proximal_logprobs
from areal.plugins.losses.sapo import sapo_loss
from references.common import RunReference, random_inputs

TOL = 1e-6
PPO = "areal.utils.functional:ppo_actor_loss_fn"
SAPO_FN = "areal.utils.functional:sapo_loss_fn"
RS = "areal.api.cli_args:RejectionSamplingConfig"

# (case id, AReaL's rejection_sampling kwargs or None, our behavior_weight_* options)
RULES: list[tuple[str, dict[str, Any] | None, dict[str, Any]]] = [
    ("areal-default-no-weight", None, {"action": "disabled"}),
    ("areal-default-uncapped", {"upper": float("inf")}, {}),
    ("token-mask-ratio", {"upper": 1.2, "lower": 0.7}, {"cap": 1.2, "floor": 0.7}),
    ("token-clamp-ratio", {"upper": 1.2, "lower": 0.7, "action": "clamp"},
     {"cap": 1.2, "floor": 0.7, "action": "clamp"}),
    ("sequence-mask-ratio-mean", {"upper": 1.1, "level": "sequence"},
     {"cap": 1.1, "level": "sequence"}),
    ("sequence-clamp-ratio", {"upper": 1.4, "lower": 0.85, "level": "sequence", "action": "clamp"},
     {"cap": 1.4, "floor": 0.85, "level": "sequence", "action": "clamp"}),
    ("sequence-mask-ratio-sum", {"upper": 1.2, "level": "sequence", "agg": "sum"},
     {"cap": 1.2, "level": "sequence", "agg": "sum"}),
    ("sequence-mask-ratio-max", {"upper": 1.4, "level": "sequence", "agg": "max"},
     {"cap": 1.4, "level": "sequence", "agg": "max"}),
    ("token-mask-kl_k1", {"upper": 0.2, "lower": -0.3, "metric": "kl_k1"},
     {"cap": 0.2, "floor": -0.3, "metric": "kl_k1"}),
    ("token-mask-kl_k2", {"upper": 0.03, "metric": "kl_k2"}, {"cap": 0.03, "metric": "kl_k2"}),
    ("token-mask-kl_k3", {"upper": 0.03, "metric": "kl_k3"}, {"cap": 0.03, "metric": "kl_k3"}),
    ("sequence-mask-kl_k3-mean", {"upper": 0.06, "metric": "kl_k3", "level": "sequence"},
     {"cap": 0.06, "metric": "kl_k3", "level": "sequence"}),
    ("sequence-mask-kl_k3-sum", {"upper": 0.1, "metric": "kl_k3", "level": "sequence",
                                 "agg": "sum"},
     {"cap": 0.1, "metric": "kl_k3", "level": "sequence", "agg": "sum"}),
    ("sequence-mask-kl_k2-max", {"upper": 0.1, "metric": "kl_k2", "level": "sequence",
                                 "agg": "max"},
     {"cap": 0.1, "metric": "kl_k2", "level": "sequence", "agg": "max"}),
]  # fmt: skip
BOUNDED = {rid for rid, rs, _ in RULES if rs is not None and rs["upper"] != float("inf")}

# (case id, the clip options both take, AReaL's importance_sampling_level, ours, advantages)
CLIPS: list[tuple[str, dict[str, Any], str, str, str]] = [
    ("clip", {"eps_clip": 0.1}, "token", "token", "advantages"),
    ("clip-higher", {"eps_clip": 0.1, "eps_clip_high": 0.15}, "token", "token", "advantages"),
    ("dual-clip", {"eps_clip": 0.05, "c_clip": 1.5}, "token", "token", "advantages"),
    ("gspo-token-advantages", {"eps_clip": 0.05}, "sequence", "sequence_mean_adv", "advantages"),
    ("gspo-sequence-advantages", {"eps_clip": 0.05}, "sequence", "sequence",
     "sequence_advantages"),
]  # fmt: skip


def ours_ppo(x: dict[str, torch.Tensor], adv: str, **options: Any) -> dict[str, Any]:
    logp = x["logprobs"].clone().requires_grad_()
    loss, stats = decoupled_ppo_loss(
        logprobs=logp,
        proximal_logprobs=x["proximal_logprobs"],
        behavior_logprobs=x["behavior_logprobs"],
        advantages=x[adv],
        loss_mask=x["loss_mask"],
        cu_seqlens=x["cu_seqlens"],
        **options,
    )
    loss.backward()
    assert logp.grad is not None
    return {"loss": loss.detach(), "grad": logp.grad, "stats": stats}


def areal_ppo(x: dict[str, torch.Tensor], adv: str, **kwargs: Any) -> dict[str, Any]:
    return {
        "fn": PPO,
        "kwargs": {
            "logprobs": x["logprobs"],
            "proximal_logprobs": x["proximal_logprobs"],
            "old_logprobs": x["behavior_logprobs"],
            "advantages": x[adv],
            "loss_mask": x["loss_mask"],
            "cu_seqlens": x["cu_seqlens"],
            **kwargs,
        },
        "grad": ["logprobs"],
    }


def rule_options(rule: dict[str, Any]) -> dict[str, Any]:
    return {f"behavior_weight_{k}": v for k, v in rule.items()}


def build_cases() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Case id → (our result, the reference call): every rule with the plain clip, every clip
    and GSPO form without a rule and with a token mask."""
    cases: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for seed in (0, 1):
        x = random_inputs(seed)
        for rid, rs, rule in RULES:
            config = None if rs is None else {"__build__": RS, "kwargs": rs}
            cases[f"{rid}-{seed}"] = (
                ours_ppo(x, "advantages", eps_clip=0.1, **rule_options(rule)),
                areal_ppo(x, "advantages", eps_clip=0.1, rejection_sampling=config),
            )
        for cid, clip, level_ref, level, adv in CLIPS:
            theirs = {**clip}
            if "eps_clip_high" in theirs:
                theirs["eps_clip_higher"] = theirs.pop("eps_clip_high")
            # With per-token behaviour weights areal's `sequence` weighs each token's gradient by
            # its own weight, AReaL's by the sequence's mean weight: only `sequence_mean_adv`
            # is AReaL's there (ratio.py).
            rules = (RULES[0], RULES[2]) if level != "sequence" else (RULES[0],)
            for rid, rs, rule in rules:
                config = None if rs is None else {"__build__": RS, "kwargs": rs}
                cases[f"{cid}-{rid}-{seed}"] = (
                    ours_ppo(x, adv, importance_sampling_level=level, **clip, **rule_options(rule)),
                    areal_ppo(x, adv, importance_sampling_level=level_ref,
                              rejection_sampling=config, **theirs),
                )  # fmt: skip
    return cases


CASES = build_cases()


@pytest.mark.parametrize("case", list(CASES))
def test_ppo_actor_loss_equals_areals(case: str, areal_results: dict[str, Any]) -> None:
    ours, _ = CASES[case]
    ref = areal_results[case]
    loss, stats = ref["out"]
    assert ours["loss"].item() == pytest.approx(float(loss), abs=TOL, rel=TOL)
    torch.testing.assert_close(ours["grad"], ref["grads"]["logprobs"], atol=TOL, rtol=TOL)
    if "filtered_fraction" in stats:
        assert ours["stats"]["cap_masked_fraction"] == pytest.approx(stats["filtered_fraction"])
    rule_id = case.rsplit("-", 1)[0]
    if rule_id in BOUNDED:  # the case really bounds something, and not everything
        assert 0.0 < ours["stats"]["cap_masked_fraction"] < 1.0, case


# --- SAPO: AReaL anchors at old_logprobs and has no behaviour weight --------------------------

SAPO_CASES = [
    ("token", "token", "advantages", {}),
    ("token-taus", "token", "advantages", {"tau_pos": 2.0, "tau_neg": 3.0}),
    ("sequence-mean-adv", "sequence_mean_adv", "advantages", {}),
    ("sequence", "sequence", "sequence_advantages", {}),
]


def sapo_pair(seed: int, level: str, adv: str, taus: dict[str, float]) -> tuple[Any, Any]:
    x = random_inputs(seed)
    # π_θ farther from π_prox than the PPO inputs, so the gates leave their linear range.
    logp = (x["proximal_logprobs"] + 3.0 * (x["logprobs"] - x["proximal_logprobs"])).clone()
    logp.requires_grad_()
    tau = {"tau_pos": 1.0, "tau_neg": 1.05, **taus}
    loss, _ = sapo_loss(
        logprobs=logp,
        proximal_logprobs=x["proximal_logprobs"],
        behavior_logprobs=x["proximal_logprobs"],
        advantages=x[adv],
        loss_mask=x["loss_mask"],
        cu_seqlens=x["cu_seqlens"],
        importance_sampling_level=level,
        **tau,
    )
    loss.backward()
    call = {
        "fn": SAPO_FN,
        "kwargs": {
            "logprobs": logp.detach(),
            "old_logprobs": x["proximal_logprobs"],
            "advantages": x[adv],
            "loss_mask": x["loss_mask"],
            "cu_seqlens": x["cu_seqlens"],
            "importance_sampling_level": "token" if level == "token" else "sequence",
            **tau,
        },
        "grad": ["logprobs"],
    }
    return (loss.detach(), logp.grad), call


SAPO = {
    f"{cid}-{seed}": sapo_pair(seed, level, adv, taus)
    for cid, level, adv, taus in SAPO_CASES
    for seed in (0, 1)
}


@pytest.mark.parametrize("case", list(SAPO))
def test_sapo_equals_areals(case: str, areal_results: dict[str, Any]) -> None:
    (loss, grad), _ = SAPO[case]
    ref = areal_results[case]
    assert loss.item() == pytest.approx(float(ref["out"][0]), abs=TOL, rel=TOL)
    torch.testing.assert_close(grad, ref["grads"]["logprobs"], atol=TOL, rtol=TOL)


# --- the log-linear π_prox and the batch advantage norm ---------------------------------------

PROX = "areal.trainer.ppo.actor:compute_prox_logp_approximations"


def prox_call(x: dict[str, torch.Tensor], logprobs: torch.Tensor, versions: torch.Tensor,
              current: int) -> dict[str, Any]:  # fmt: skip
    return {
        "fn": PROX,
        "kwargs": {"old_logp": x["behavior_logprobs"], "logprobs": logprobs, "versions": versions,
                   "current_version": current, "method": "loglinear"},
    }  # fmt: skip


def prox_cases() -> dict[str, tuple[torch.Tensor, dict[str, Any]]]:
    """Same formula, same arguments: AReaL's ``current_version`` is our v_θ. Versions span prompt
    tokens (−1), stale ones, the proximal version, v_θ and a version ahead of it.

    The ``first-minibatch`` cases are a step's first minibatch, where no optimizer step has run
    and π_θ = π_prox: AReaL applies the formula there too, as ours does with
    ``weights_moved=True`` (``prox_logp: loglinear_every_minibatch``; through ``train_step``:
    test_train_step.py)."""
    x = random_inputs(2)
    g = torch.Generator().manual_seed(3)
    versions = torch.randint(-1, 8, x["logprobs"].shape, generator=g)
    cases = {}
    for current in (3, 5, 7):
        for name, logprobs in (
            ("later", x["logprobs"]),
            ("first-minibatch", x["proximal_logprobs"]),
        ):
            mine = loglinear_proximal_logprobs(
                behavior_logprobs=x["behavior_logprobs"],
                logprobs=logprobs,
                versions=versions,
                current_version=current,
                weights_moved=True,
            )
            cases[f"loglinear-{name}-{current}"] = (mine, prox_call(x, logprobs, versions, current))
    return cases


PROX_CASES = prox_cases()


@pytest.mark.parametrize("case", list(PROX_CASES))
def test_loglinear_proximal_logprobs_equal_areals(case: str, areal_results: dict[str, Any]) -> None:
    mine, _ = PROX_CASES[case]
    torch.testing.assert_close(mine, areal_results[case]["out"]["loglinear"], atol=TOL, rtol=TOL)


def test_first_minibatch_takes_the_exact_proximal_logprobs(areal_results: dict[str, Any]) -> None:
    """On a step's first minibatch π_θ = π_prox, so the trainer (``weights_moved=False``) takes
    π_θ's log-probs as π_prox exactly for every generated token. AReaL's formula instead puts a
    token older than v_θ − 1 part of the way back to π_behav there: the measured difference is
    the approximation error the exact value removes (docs/training.md, "prox_logp")."""
    x = random_inputs(2)
    versions = torch.randint(-1, 8, x["logprobs"].shape, generator=torch.Generator().manual_seed(3))
    for current in (3, 5, 7):
        exact = loglinear_proximal_logprobs(
            behavior_logprobs=x["behavior_logprobs"],
            logprobs=x["proximal_logprobs"],
            versions=versions,
            current_version=current,
            weights_moved=False,
        )
        generated = versions >= 0
        torch.testing.assert_close(exact[generated], x["proximal_logprobs"][generated])
        torch.testing.assert_close(exact[~generated], x["behavior_logprobs"][~generated])
        theirs = areal_results[f"loglinear-first-minibatch-{current}"]["out"]["loglinear"]
        # Both keep π_behav on prompt tokens; on a generated token AReaL's stays part of the way
        # (1 − α, α < 1) at π_behav, where π_prox is known exactly.
        torch.testing.assert_close(exact[~generated], theirs[~generated], atol=TOL, rtol=TOL)
        apart = x["proximal_logprobs"] != x["behavior_logprobs"]
        assert generated.any() and (exact - theirs)[generated & apart].abs().min() > 1e-6


def norm_case() -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``advantage_norm: batch`` is AReaL's ``masked_normalization`` over the batch's valid tokens
    with the population std and eps 1e-5 (AReaL returns float32)."""
    x = random_inputs(4, padded=True)
    adv = 3.0 * x["advantages"] + 0.5
    call = {
        "fn": "areal.utils.functional:masked_normalization",
        "kwargs": {"x": adv, "mask": x["loss_mask"], "unbiased": False, "eps": 1e-5,
                   "all_reduce": False},
    }  # fmt: skip
    return normalize_batch_advantages(adv, x["loss_mask"]), x["loss_mask"], call


NORM = norm_case()


def test_batch_advantage_norm_equals_areals_masked_normalization(
    areal_results: dict[str, Any],
) -> None:
    ours, mask, _ = NORM
    ref = areal_results["masked_normalization"]["out"]
    torch.testing.assert_close(ours[mask], ref[mask].to(torch.float64), atol=TOL, rtol=TOL)


@pytest.fixture(scope="module")
def areal_results(run_reference: RunReference) -> dict[str, dict[str, Any]]:
    """Every AReaL call of the module, in one reference process (importing AReaL takes seconds)."""
    calls = {case: call for case, (_, call) in CASES.items()}
    calls.update({case: call for case, (_, call) in SAPO.items()})
    calls.update({case: call for case, (_, call) in PROX_CASES.items()})
    calls["masked_normalization"] = NORM[2]
    return dict(zip(calls, run_reference(list(calls.values())), strict=True))
