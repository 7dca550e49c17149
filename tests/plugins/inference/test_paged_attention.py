"""The engine's attention over its KV pool computes what the model computes on each sequence alone
without any cache: the packed prefill (sequences end to end in one row, no padding) for fresh
sequences of equal and of different lengths and for one that continues a cache, and the padded
decode step whose rows attend in buckets of similar length, in the batch's own order."""

from __future__ import annotations

import random

import pytest
import torch

from areal.plugins.inference.embedded import decode_kernel
from areal.plugins.inference.embedded.kv_pool import TokenKVPool
from areal.plugins.inference.embedded.paged_attention import build_packed_step, build_step
from areal.plugins.models.tiny import Qwen3ForCausalLM, tiny_config
from support.engines import alone, prefilled


def _model() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(tiny_config("nano")).eval()
    model.init_weights(generator=torch.Generator().manual_seed(0))
    return model


def test_packed_prefill_matches_each_sequence_alone() -> None:
    model = _model()
    pool = TokenKVPool(model.config, 512)
    rng = random.Random(1)
    # a GRPO group's equal prompts, then two of other lengths, then one continuing its cache
    lengths = [9, 9, 9, 4, 17, 6]
    seqs = [[rng.randrange(1, 4096) for _ in range(n)] for n in lengths]
    cached = [rng.randrange(1, 4096) for _ in range(11)]
    slots = [pool.alloc(40) for _ in range(len(seqs) + 1)]
    assert all(s is not None for s in slots)
    with torch.inference_mode():
        # the last sequence's first 11 tokens go into the cache by an ordinary padded step
        ids, positions, attention = build_step(pool, [slots[-1]], [0], [cached])  # type: ignore[list-item]
        model.hidden_states(ids, positions, attention)
        new = [rng.randrange(1, 4096) for _ in range(5)]
        ids, positions, packed, spans = build_packed_step(
            pool,
            slots,  # type: ignore[arg-type]
            [0] * len(seqs) + [len(cached)],
            [*seqs, new],
        )
        hidden = model.hidden_states(ids, positions, packed)[0]
    assert ids.shape == (1, sum(lengths) + len(new))  # no padding
    # one attention call for the group's three equal prompts, one for each other sequence
    assert [(run.count, run.length) for run in packed.runs] == [
        (3, 9),
        (1, 4),
        (1, 17),
        (1, 6),
        (1, 5),
    ]
    for (start, end), tokens in zip(spans[:-1], seqs):
        torch.testing.assert_close(hidden[start:end], alone(model, tokens), atol=2e-5, rtol=0)
    start, end = spans[-1]
    torch.testing.assert_close(
        hidden[start:end], alone(model, cached + new)[len(cached) :], atol=2e-5, rtol=0
    )


def test_packed_prefill_writes_the_same_cache_as_a_padded_step() -> None:
    model = _model()
    lengths = [3, 12, 7]
    rng = random.Random(2)
    seqs = [[rng.randrange(1, 4096) for _ in range(n)] for n in lengths]
    pools = []
    for build in ("padded", "packed"):
        pool = TokenKVPool(model.config, 128)
        slots = [pool.alloc(20) for _ in seqs]
        with torch.inference_mode():
            if build == "padded":
                ids, positions, attention = build_step(pool, slots, [0, 0, 0], seqs)  # type: ignore[arg-type]
                model.hidden_states(ids, positions, attention)
            else:
                ids, positions, packed, _ = build_packed_step(pool, slots, [0, 0, 0], seqs)  # type: ignore[arg-type]
                model.hidden_states(ids, positions, packed)
        pools.append((pool, slots))
    (padded_pool, padded_slots), (packed_pool, packed_slots) = pools
    for a, b, n in zip(padded_slots, packed_slots, lengths):
        assert a is not None and b is not None
        for packed_layer, padded_layer in zip(
            (*packed_pool.k, *packed_pool.v), (*padded_pool.k, *padded_pool.v), strict=True
        ):
            torch.testing.assert_close(packed_layer[b[:n]], padded_layer[a[:n]], atol=2e-5, rtol=0)


@pytest.mark.parametrize("kernel", [False, True], ids=["aten", "kernel"])
def test_decode_rows_of_very_different_lengths(kernel: bool) -> None:
    """With ATen's attention, rows attend in buckets, each padded only to its own longest; in the
    C++ decode kernel (decode_kernel.py) all in one call a layer, each row reading only its own
    slots. Either way each row gets what the model gives its sequence alone."""
    assert decode_kernel.load().loaded or not kernel
    model = _model()
    pool = TokenKVPool(model.config, 1024)
    cached = [30, 5, 12, 3, 29, 4, 28]
    seqs, slots = prefilled(model, pool, cached)
    with torch.inference_mode():
        last = [[s[-1]] for s in seqs]
        ids, positions, attention = build_step(pool, slots, cached, last, kernel=kernel)  # type: ignore[arg-type]
        hidden = model.hidden_states(ids, positions, attention)
    assert attention.kernel == kernel
    buckets = [(b.rows.tolist(), b.span) for b in attention.buckets]
    if kernel:
        assert buckets == [(list(range(7)), 31)]
    else:  # long rows, the 12-token one, short rows
        assert buckets == [([0, 4, 6], 31), ([2], 13), ([1, 3, 5], 6)]
    for row, seq in enumerate(seqs):
        torch.testing.assert_close(hidden[row, 0], alone(model, seq)[-1], atol=2e-5, rtol=0)
