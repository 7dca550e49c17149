"""Unit tests of the embedded engine's sampler: the log-probs it reports are those of the
distribution it draws from, filters renormalise as SGLang's do, and seeded rows are reproducible.

Expected distributions are written out by hand (or with plain ``math``) on tiny vocabularies, so a
regression in the tensor code cannot hide behind the same tensor code in the oracle.
"""

from __future__ import annotations

import math

import pytest
import torch

from areal.plugins.inference.embedded.sampling import SamplingTensors, final_logprobs, sample

NEG_INF = float("-inf")


def _logs(probs: list[float]) -> torch.Tensor:
    """A logits row whose softmax is exactly ``probs`` (zero-probability entries become -inf)."""
    return torch.tensor([math.log(p) if p > 0 else NEG_INF for p in probs])


def _expected(probs: list[float | None]) -> torch.Tensor:
    """Renormalise the kept entries (``None`` = filtered out) and take logs: the oracle."""
    total = sum(p for p in probs if p is not None)
    return torch.tensor([NEG_INF if p is None else math.log(p / total) for p in probs])


def _params(
    temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0, rows: int = 1
) -> SamplingTensors:
    return SamplingTensors.build(
        [temperature] * rows, [top_p] * rows, [top_k] * rows, [min_p] * rows
    )


def _assert_logprobs(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal within 1e-5, with -inf exactly where the oracle filtered."""
    assert torch.equal(torch.isinf(got), torch.isinf(expected)), (got, expected)
    finite = ~torch.isinf(expected)
    torch.testing.assert_close(got[finite], expected[finite], atol=1e-5, rtol=0)


# --- SamplingTensors.build ---------------------------------------------------------------------


def test_build_turns_greedy_rows_into_top_k_one_and_disables_their_filters() -> None:
    params = SamplingTensors.build(
        temperature=[0.0, 0.7, 1.0], top_p=[0.5, 0.9, 1.0], top_k=[20, -1, 5], min_p=[0.3, 0.1, 0.0]
    )
    assert params.temperature.tolist() == pytest.approx([1.0, 0.7, 1.0])
    assert params.top_p.tolist() == pytest.approx([1.0, 0.9, 1.0])
    assert params.top_k.tolist() == [1, 0, 5]  # greedy -> 1; -1 (off) -> 0
    assert params.top_k.dtype == torch.long
    assert params.min_p.tolist() == pytest.approx([0.0, 0.1, 0.0])


# --- final_logprobs ------------------------------------------------------------------------------


def test_temperature_scales_logits_before_the_softmax() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    for temperature in (0.5, 1.0, 2.0):
        scaled = [x / temperature for x in logits[0].tolist()]
        norm = math.log(sum(math.exp(x) for x in scaled))
        expected = torch.tensor([[x - norm for x in scaled]])
        got = final_logprobs(logits, _params(temperature=temperature))
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_top_k_keeps_the_k_best_and_renormalises() -> None:
    # Shuffled on purpose, so the filter has to map sorted positions back to token ids.
    probs = [0.15, 0.5, 0.05, 0.3]
    got = final_logprobs(_logs(probs)[None], _params(top_k=2))[0]
    _assert_logprobs(got, _expected([None, 0.5, None, 0.3]))  # 0.625 / 0.375


def test_top_k_after_temperature() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    got = final_logprobs(logits, _params(temperature=2.0, top_k=2))[0]
    # logits / 2 = [0, .5, 1, 1.5]; keep the two best and renormalise: softmax([1.0, 1.5]).
    low, high = math.exp(1.0), math.exp(1.5)
    _assert_logprobs(got, _expected([None, None, low / (low + high), high / (low + high)]))


def test_top_k_at_or_above_the_vocabulary_filters_nothing() -> None:
    probs = [0.15, 0.5, 0.05, 0.3]
    for k in (4, 10):
        _assert_logprobs(final_logprobs(_logs(probs)[None], _params(top_k=k))[0], _expected(probs))


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        # mass of strictly better tokens: 0.5 -> 0, 0.3 -> 0.5, 0.15 -> 0.8, 0.05 -> 0.95
        (0.4, [None, 0.5, None, None]),  # the best token is always kept
        (0.75, [None, 0.5, None, 0.3]),
        (0.85, [0.15, 0.5, None, 0.3]),
        (0.99, [0.15, 0.5, 0.05, 0.3]),
    ],
)
def test_top_p_keeps_the_smallest_nucleus_and_renormalises(
    top_p: float, kept: list[float | None]
) -> None:
    probs = [0.15, 0.5, 0.05, 0.3]
    got = final_logprobs(_logs(probs)[None], _params(top_p=top_p))[0]
    _assert_logprobs(got, _expected(kept))


def test_top_p_keeps_a_token_whose_better_mass_equals_top_p() -> None:
    """SGLang cuts where the better mass is strictly above top_p. Eight equal logits give exact
    probabilities of 1/8, so the better mass before the third token is exactly 0.25."""
    got = final_logprobs(torch.zeros(1, 8), _params(top_p=0.25))[0]
    kept = got[~torch.isinf(got)]
    assert len(kept) == 3
    torch.testing.assert_close(kept, torch.full((3,), math.log(1 / 3)), atol=1e-6, rtol=0)


def test_top_p_applies_to_the_top_k_distribution() -> None:
    """SGLang's order: top-k first, then top-p on the renormalised survivors."""
    probs = [0.15, 0.5, 0.05, 0.3]
    # Alone, top_p 0.82 keeps three tokens (0.15 has 0.8 of better mass before it) ...
    alone = final_logprobs(_logs(probs)[None], _params(top_p=0.82))[0]
    _assert_logprobs(alone, _expected([0.15, 0.5, None, 0.3]))
    # ... after top_k 3 the better mass before 0.15 is 0.8 / 0.95 = 0.842 > 0.82: it goes too.
    both = final_logprobs(_logs(probs)[None], _params(top_p=0.82, top_k=3))[0]
    _assert_logprobs(both, _expected([None, 0.5, None, 0.3]))


@pytest.mark.parametrize(
    ("min_p", "kept"),
    [
        # floor = min_p * 0.5 (the best probability)
        (0.05, [0.15, 0.5, 0.05, 0.3]),  # floor 0.025: all stay
        (0.25, [0.15, 0.5, None, 0.3]),  # floor 0.125
        (0.35, [None, 0.5, None, 0.3]),  # floor 0.175
        (1.0, [None, 0.5, None, None]),  # floor 0.5: only the best
    ],
)
def test_min_p_drops_tokens_below_a_fraction_of_the_best(
    min_p: float, kept: list[float | None]
) -> None:
    probs = [0.15, 0.5, 0.05, 0.3]
    got = final_logprobs(_logs(probs)[None], _params(min_p=min_p))[0]
    _assert_logprobs(got, _expected(kept))


def test_rows_keep_their_own_filters_in_one_batch() -> None:
    probs = [0.15, 0.5, 0.05, 0.3]
    logits = _logs(probs)[None].repeat(5, 1)
    params = SamplingTensors.build(
        temperature=[1.0, 1.0, 1.0, 1.0, 0.0],
        top_p=[1.0, 0.75, 1.0, 1.0, 0.75],
        top_k=[-1, -1, 3, -1, 2],
        min_p=[0.0, 0.0, 0.0, 0.35, 0.35],
    )
    got = final_logprobs(logits, params)
    _assert_logprobs(got[0], _expected(probs))
    _assert_logprobs(got[1], _expected([None, 0.5, None, 0.3]))
    _assert_logprobs(got[2], _expected([0.15, 0.5, None, 0.3]))
    _assert_logprobs(got[3], _expected([None, 0.5, None, 0.3]))
    _assert_logprobs(got[4], _expected(probs))  # greedy: its filters are ignored


def test_greedy_rows_get_the_plain_log_softmax() -> None:
    """Temperature 0 means argmax; the reported log-prob is the model's own, unscaled, unfiltered."""
    logits = torch.tensor([[0.3, -1.2, 2.5, 0.0, 1.1]])
    params = SamplingTensors.build(temperature=[0.0], top_p=[0.5], top_k=[2], min_p=[0.5])
    got = final_logprobs(logits, params)
    norm = math.log(sum(math.exp(x) for x in logits[0].tolist()))
    expected = torch.tensor([[x - norm for x in logits[0].tolist()]])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_incoming_minus_inf_stays_filtered() -> None:
    """A grammar mask (-inf logits) survives every filter and temperature."""
    logits = torch.tensor([[2.0, NEG_INF, 1.0, NEG_INF, 0.5]])
    got = final_logprobs(logits, _params(temperature=0.7, top_p=0.99, min_p=0.01))[0]
    assert torch.isinf(got[1]) and torch.isinf(got[3])
    assert math.isclose(float(got.exp().sum()), 1.0, rel_tol=1e-6)


# --- sample ----------------------------------------------------------------------------------------


def _binomial_check(counts: torch.Tensor, probs: torch.Tensor, n: int) -> None:
    """Each count within 5 binomial standard deviations of ``n * p``."""
    for token, (count, p) in enumerate(zip(counts.tolist(), probs.tolist())):
        std = math.sqrt(n * p * (1 - p))
        assert abs(count - n * p) <= 5 * std + 1e-9, (token, count, n * p, std)


def test_sample_frequencies_match_the_distribution() -> None:
    torch.manual_seed(1234)
    n = 40_000
    probs = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    logprobs = probs.log()[None].repeat(n, 1)
    drawn = sample(logprobs, torch.zeros(n, dtype=torch.bool), [None] * n)
    counts = torch.bincount(drawn, minlength=5)
    assert int(counts.sum()) == n
    _binomial_check(counts, probs, n)


def test_sample_after_filtering_never_draws_a_filtered_token() -> None:
    torch.manual_seed(99)
    n = 40_000
    # Filtered entries first, in the middle and last: none may ever be drawn.
    probs = [0.0, 0.4, 0.0, 0.3, 0.2, 0.0, 0.1, 0.0]
    logits = _logs([p if p > 0 else 1e-3 for p in probs])[None].repeat(n, 1)
    logits[:, [i for i, p in enumerate(probs) if p == 0]] = NEG_INF
    logprobs = final_logprobs(logits, _params(top_p=0.85, rows=n))
    # top_p 0.85 also drops the 0.1 token (better mass before it: 0.9).
    kept = torch.tensor([0.0, 0.4, 0.0, 0.3, 0.2, 0.0, 0.0, 0.0]) / 0.9
    torch.testing.assert_close(logprobs[0].exp(), kept, atol=1e-6, rtol=0)
    drawn = sample(logprobs, torch.zeros(n, dtype=torch.bool), [None] * n)
    counts = torch.bincount(drawn, minlength=8)
    assert counts[kept == 0].sum() == 0, counts
    _binomial_check(counts, kept, n)


def test_sample_respects_top_k_on_a_large_vocabulary() -> None:
    torch.manual_seed(7)
    rows, vocab = 2_000, 1_000
    logits = torch.randn(rows, vocab)
    logprobs = final_logprobs(logits, _params(top_k=5, rows=rows))
    drawn = sample(logprobs, torch.zeros(rows, dtype=torch.bool), [None] * rows)
    top5 = logits.topk(5, dim=-1).indices
    assert bool((top5 == drawn[:, None]).any(dim=-1).all())


def test_greedy_rows_take_the_argmax() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    params = SamplingTensors.build(
        temperature=[0.0, 1.0, 0.0, 1.0, 0.0, 0.0],
        top_p=[1.0] * 6,
        top_k=[-1] * 6,
        min_p=[0.0] * 6,
    )
    greedy = params.top_k == 1
    argmax = logits.argmax(-1)
    for _ in range(20):  # sampled rows vary, greedy rows never do
        drawn = sample(final_logprobs(logits, params), greedy, [None] * 6)
        assert torch.equal(drawn[greedy], argmax[greedy])
    all_greedy = sample(torch.log_softmax(logits, -1), torch.ones(6, dtype=torch.bool), [None] * 6)
    assert torch.equal(all_greedy, argmax)


def _seeded_run(
    steps: list[torch.Tensor], seed: int, neighbours: int, position: int, global_seed: int
) -> list[int]:
    """Sample ``len(steps)`` tokens for one seeded row placed among ``neighbours`` unseeded rows."""
    torch.manual_seed(global_seed)
    generator = torch.Generator().manual_seed(seed)
    rows = neighbours + 1
    tokens = []
    for step in steps:
        logprobs = step[None].repeat(rows, 1)
        generators: list[torch.Generator | None] = [None] * rows
        generators[position] = generator
        drawn = sample(logprobs, torch.zeros(rows, dtype=torch.bool), generators)
        tokens.append(int(drawn[position]))
    return tokens


def test_a_seeded_row_reproduces_its_tokens_whatever_shares_the_batch() -> None:
    torch.manual_seed(5)
    steps = [torch.log_softmax(torch.randn(64) * 0.3, -1) for _ in range(40)]
    alone = _seeded_run(steps, seed=42, neighbours=0, position=0, global_seed=1)
    crowded = _seeded_run(steps, seed=42, neighbours=7, position=3, global_seed=2)
    last = _seeded_run(steps, seed=42, neighbours=3, position=3, global_seed=3)
    assert alone == crowded == last
    other_seed = _seeded_run(steps, seed=43, neighbours=0, position=0, global_seed=1)
    assert other_seed != alone


def test_top_k_one_is_greedy_at_any_temperature() -> None:
    """top_k=1 samples the argmax and, like temperature 0, reports the plain log-softmax."""
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    params = SamplingTensors.build([0.5], [1.0], [1], [0.0])
    got = final_logprobs(logits, params)
    torch.testing.assert_close(got, torch.log_softmax(logits, dim=-1))
    assert sample(got, params.top_k == 1, [None]).tolist() == [0]
