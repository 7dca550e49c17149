"""Sequence packing: the layout of a hand-written pack, and packed attention equal to running each
sample alone (no padding, no leak across samples)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from areal.core.types import Sample
from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.hf_io import load_model
from areal.plugins.models.tiny import init_tiny
from areal.plugins.trainer.packed_attention import block_causal_mask
from areal.plugins.trainer.packing import pack
from areal.plugins.trainer.step import token_logprobs

A = Sample(
    input_ids=[5, 6, 7], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.25], versions=[-1, 3, 4]
)
B = Sample(input_ids=[8, 9], loss_mask=[0, 1], logprobs=[0.0, -1.0], versions=[-1, 2])


def test_pack_concatenates_and_aligns_every_tensor_to_the_predicting_position() -> None:
    (p,) = pack([A, B])
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert p.positions.tolist() == [[0, 1, 2, 0, 1]]
    assert p.cu_seqlens.tolist() == [0, 3, 5]
    # position t predicts token t+1 of the same sample; a sample's last position predicts nothing
    assert p.target_ids.tolist() == [6, 7, 0, 9, 0]
    assert p.loss_mask.tolist() == [True, True, False, True, False]
    assert p.behavior_logprobs.tolist() == [-0.5, -0.25, 0.0, -1.0, 0.0]
    assert p.versions.tolist() == [3, 4, -1, 2, -1]
    assert p.sample_index.tolist() == [0, 0, 0, 1, 1]
    assert (p.n_tokens, p.n_samples) == (5, 2)


def test_pack_splits_in_order_when_max_tokens_is_exceeded() -> None:
    assert len(pack([A, B], max_tokens=5)) == 1
    first, second = pack([A, B, B], max_tokens=4)
    assert first.sample_index.tolist() == [0, 0, 0]
    assert second.sample_index.tolist() == [1, 1, 2, 2]
    # a sample longer than the cap is kept whole, alone
    (alone, rest) = pack([A, B], max_tokens=2)
    assert alone.n_tokens == 3 and rest.sample_index.tolist() == [1, 1]
    with pytest.raises(ValueError, match="max_tokens"):
        pack([A], max_tokens=0)


def test_block_causal_mask_by_hand() -> None:
    mask = block_causal_mask(torch.tensor([0, 2, 3]))
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 1]]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> DecoderForCausalLM:
    torch.set_num_threads(1)
    path = Path(init_tiny(tmp_path_factory.mktemp("nano"), size="nano", seed=0)["path"])
    return load_model(path, dtype=torch.float32)


def _sample(ids: list[int]) -> Sample:
    n = len(ids)
    return Sample(input_ids=ids, loss_mask=[1] * n, logprobs=[0.0] * n, versions=[0] * n)


def _alone(model: DecoderForCausalLM, ids: list[int]) -> torch.Tensor:
    """Log-probs of each next token with the model's default causal attention, one sequence."""
    logits = model(torch.tensor([ids]))[0]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


SEQS = [[11, 300, 42, 7, 99, 1000, 5], [17, 18], [400, 401, 402, 403, 404]]


@torch.no_grad()
def test_packed_logprobs_equal_each_sequence_run_alone(model: DecoderForCausalLM) -> None:
    (p,) = pack([_sample(s) for s in SEQS])
    packed = token_logprobs(model, p)
    assert packed.dtype == torch.float32 and packed.shape == (p.n_tokens,)
    for i, ids in enumerate(SEQS):
        start, end = int(p.cu_seqlens[i]), int(p.cu_seqlens[i + 1])
        torch.testing.assert_close(packed[start : end - 1], _alone(model, ids), atol=1e-5, rtol=0)


@torch.no_grad()
def test_no_attention_leaks_between_packed_sequences(model: DecoderForCausalLM) -> None:
    (before,) = pack([_sample(s) for s in SEQS])
    changed = [SEQS[0], [3000, 2500, 12, 13, 14, 15], SEQS[2]]  # the middle one replaced
    (after,) = pack([_sample(s) for s in changed])
    lp_before, lp_after = token_logprobs(model, before), token_logprobs(model, after)
    torch.testing.assert_close(lp_before[:6], lp_after[:6], atol=1e-6, rtol=0)  # first sequence
    torch.testing.assert_close(lp_before[-5:-1], lp_after[-5:-1], atol=1e-6, rtol=0)  # last one


def test_packed_attention_equals_the_block_diagonal_mask() -> None:
    from areal.plugins.models.attention import masked_attention
    from areal.plugins.trainer.packed_attention import PackedCausalAttention

    torch.manual_seed(0)
    cu = torch.tensor([0, 3, 4, 9])
    q = torch.randn(1, 9, 4, 8)
    k, v = torch.randn(1, 9, 2, 8), torch.randn(1, 9, 2, 8)  # grouped-query heads
    packed = PackedCausalAttention(cu).attend(0, q, k, v)
    reference = masked_attention(q, k, v, block_causal_mask(cu))
    torch.testing.assert_close(packed, reference, rtol=1e-5, atol=1e-6)
