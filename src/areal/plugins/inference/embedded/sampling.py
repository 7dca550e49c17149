"""Batched sampling, and the log-probs reported with each sampled token.

Temperature scales the logits; top-k, top-p and min-p remove tokens and renormalise; grammar masks
(applied before this) remove tokens too. Tokens are drawn from that final distribution.

The log-prob reported for a drawn token is that of the temperature-scaled softmax over the *whole*
vocabulary (:func:`reported_logprobs`), as SGLang reports it by default: the policy a trainer can
recompute from the weights and the temperature alone. Truncation and grammars decide which token
is drawn, not the probability the policy gave it, so a fresh sample's behaviour log-prob equals
the trainer's recomputed one (docs/training.md, "The trained policy is the sampling policy").
Greedy rows (temperature 0) report the plain log-softmax, since a point mass carries no
information.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingTensors:
    """Per-row sampling parameters of one decode step, as tensors of shape [B]."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor  # 0 = off
    min_p: torch.Tensor

    @classmethod
    def build(
        cls, temperature: list[float], top_p: list[float], top_k: list[int], min_p: list[float]
    ) -> SamplingTensors:
        # temperature 0, or top_k 1 at any temperature: argmax, reported with the plain log-softmax
        greedy = [t <= 0.0 or k == 1 for t, k in zip(temperature, top_k)]
        return cls(
            temperature=torch.tensor([1.0 if g else t for g, t in zip(greedy, temperature)]),
            top_p=torch.tensor([1.0 if g else p for g, p in zip(greedy, top_p)]),
            top_k=torch.tensor(
                [1 if g else max(k, 0) for g, k in zip(greedy, top_k)], dtype=torch.long
            ),
            min_p=torch.tensor([0.0 if g else m for g, m in zip(greedy, min_p)]),
        )

    def truncates(self, vocab_size: int) -> bool:
        """Does any row lose tokens to top-k, top-p or min-p?"""
        k = bool(((self.top_k > 1) & (self.top_k < vocab_size)).any())
        return k or bool((self.top_p < 1.0).any()) or bool((self.min_p > 0).any())


def reported_logprobs(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """Log-probs [B, V] of the temperature-scaled softmax, nothing removed (module docstring)."""
    return torch.log_softmax(logits / params.temperature[:, None], dim=-1)


def final_logprobs(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """Log-probs [B, V] of the distribution to sample from (filtered entries are -inf).

    Greedy rows (top_k == 1 set by :meth:`SamplingTensors.build`) keep the unfiltered log-softmax.
    """
    greedy = params.top_k == 1
    scaled = logits / params.temperature[:, None]
    needs_k = bool(((params.top_k > 1) & (params.top_k < logits.shape[-1])).any())
    needs_p = bool((params.top_p < 1.0).any())
    if needs_k or needs_p:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
        if needs_k:
            rank = torch.arange(logits.shape[-1])[None, :]
            k = torch.where(params.top_k > 1, params.top_k, logits.shape[-1])
            remove |= rank >= k[:, None]
        if needs_p:
            probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
            before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better tokens
            remove |= before > params.top_p[:, None]
        remove[:, 0] = False
        remove &= ~greedy[:, None]
        scaled = scaled.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    if bool((params.min_p > 0).any()):
        probs = torch.softmax(scaled, dim=-1)
        floor = params.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        scaled = scaled.masked_fill(probs < floor, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def sample(
    logprobs: torch.Tensor, greedy: torch.Tensor, generators: list[torch.Generator | None]
) -> torch.Tensor:
    """Draw one token per row from ``exp(logprobs)``; greedy rows take the argmax.

    Inverse-CDF sampling: one uniform number per row against the row's cumulative distribution
    (in float64, so large vocabularies keep their tail). It costs ~0.08 ms at batch 16 where
    ``torch.multinomial`` or an exponential race cost ~1.3 ms. Rows with their own generator (a
    request ``sampling_seed``) draw their number from it, so a seed reproduces the same tokens
    whatever else shares the batch. Tokens removed by filtering have zero width and never win.
    """
    best = torch.argmax(logprobs, dim=-1)
    if bool(greedy.all()):
        return best
    cdf = torch.cumsum(logprobs.exp().double(), dim=-1)
    uniform = torch.rand(logprobs.shape[0], 1, dtype=torch.float64)
    for row, generator in enumerate(generators):
        if generator is not None:
            uniform[row] = torch.rand(1, dtype=torch.float64, generator=generator)
    drawn = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(1)
    return torch.where(greedy, best, drawn.clamp_(max=logprobs.shape[-1] - 1))
