"""``masked_attention`` against attention written out by hand: softmax(q·kᵀ/√d + mask)·v with
each query head reading its KV head (query head h, KV head h // group), including the
one-query-per-row path a decode step takes under grouped-query attention."""

from __future__ import annotations

import math

import pytest
import torch

from areal.plugins.models.attention import masked_attention


def _by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, S, Hq, D], k/v [B, L, Hkv, D], mask [B, 1, S, L] -> [B, S, Hq, D], in float64."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bshd,blhd->bhsl", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhsl,blhd->bshd", scores.softmax(-1), v)


@pytest.mark.parametrize(
    ("queries", "q_heads", "kv_heads"),
    [(1, 8, 4), (1, 6, 2), (1, 4, 4), (3, 8, 4)],
    ids=["decode-gqa", "decode-gqa-3", "decode-mha", "prefill-gqa"],
)
def test_masked_attention_matches_attention_by_hand(
    queries: int, q_heads: int, kv_heads: int
) -> None:
    gen = torch.Generator().manual_seed(0)
    batch, keys, dim = 5, 11, 16
    q = torch.randn(batch, queries, q_heads, dim, generator=gen, requires_grad=True)
    k = torch.randn(batch, keys, kv_heads, dim, generator=gen)
    v = torch.randn(batch, keys, kv_heads, dim, generator=gen)
    lengths = torch.tensor([11, 7, 3, 9, 1])  # rows padded to the longest, as a decode bucket
    mask = (torch.arange(keys)[None, :] < lengths[:, None])[:, None, None, :]
    mask = mask.expand(batch, 1, queries, keys)

    out = masked_attention(q, k, v, mask)

    assert out.shape == (batch, queries, q_heads, dim)
    torch.testing.assert_close(out.double(), _by_hand(q, k, v, mask), rtol=1e-5, atol=1e-5)
    # the warm-start trainer backpropagates through it
    out.sum().backward()
    expected = torch.autograd.grad(_by_hand(q, k, v, mask).sum(), q)[0]
    assert q.grad is not None
    torch.testing.assert_close(q.grad, expected, rtol=1e-5, atol=1e-5)
