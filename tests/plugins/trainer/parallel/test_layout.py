"""MeshLayout's pieces in one process: the token-balanced split, padding that changes nothing,
and the DTensor-aware gradient clipping against torch's own."""

from __future__ import annotations

import copy

import pytest
import torch

from areal.plugins.trainer.packing import pack
from areal.plugins.trainer.parallel.layout import clip_grad_norm, pad_pack, split_by_tokens
from areal.plugins.trainer.step import token_logprobs
from support import dist_worker as worker

build_model, build_samples = worker.build_model, worker.build_samples


def test_split_by_tokens_balances_and_keeps_order() -> None:
    shares = split_by_tokens([10, 3, 8, 2, 7], 2)
    assert shares == [[0, 3, 4], [1, 2]] or shares == [[0, 1, 3], [2, 4]]
    assert sorted(i for s in shares for i in s) == [0, 1, 2, 3, 4]
    loads = [sum([10, 3, 8, 2, 7][i] for i in s) for s in shares]
    assert max(loads) - min(loads) <= 3
    assert split_by_tokens([5], 3) == [[0], [], []]


@pytest.mark.parametrize("multiple", [2, 3, 4])
def test_padding_changes_no_real_token(multiple: int) -> None:
    torch.manual_seed(0)
    model = build_model()
    samples, _ = build_samples(model, n=3)
    (batch,) = pack(samples)
    padded = pad_pack(batch, multiple)
    assert padded.n_tokens % multiple == 0
    assert padded.n_samples == batch.n_samples + (padded.n_tokens > batch.n_tokens)
    assert not padded.loss_mask[batch.n_tokens :].any()
    with torch.no_grad():
        plain, extra = token_logprobs(model, batch), token_logprobs(model, padded)
    torch.testing.assert_close(extra[: batch.n_tokens], plain)
    empty = pad_pack(None, multiple)
    assert empty.n_tokens == multiple and not empty.loss_mask.any()


def test_clip_grad_norm_matches_torch_on_plain_tensors() -> None:
    model = build_model()
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 4000, (1, 12))
    for m in (model, twin):
        (m(ids).logsumexp(-1).sum() * 10).backward()
    ours = clip_grad_norm(list(model.parameters()), 0.5)
    theirs = float(torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5))
    assert ours == pytest.approx(theirs, rel=1e-6)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad)
