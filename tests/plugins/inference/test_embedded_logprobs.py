"""Returned log-probs are those of the temperature-scaled softmax over the whole vocabulary (what
the trainer recomputes, and SGLang's default), while the tokens are drawn from the truncated
distribution: checked against a teacher-forced forward pass of the same weights (full sequence, no
KV cache), within 1e-4 in fp32."""

from __future__ import annotations

from typing import Any

import pytest
import torch

PROMPT = [11, 402, 77, 1500, 9, 333, 2048, 12]


def teacher_forced(
    model: Any, prompt: list[int], output: list[int], temperature: float, top_k: int, top_p: float
) -> tuple[list[float], list[bool]]:
    """Per output token: log softmax(logits / T) of it, and whether top-k/top-p kept it."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output]))[0, len(prompt) - 1 : -1].float()
    logits = logits / temperature
    logprobs, kept = [], []
    for row, token in zip(logits, output):
        keep = torch.ones_like(row, dtype=torch.bool)
        order = torch.argsort(row, descending=True)
        if top_k > 0:
            keep[order[top_k:]] = False
        if top_p < 1.0:
            probs = torch.softmax(row.masked_fill(~keep, float("-inf")), dim=-1)
            mass = 0.0
            for i in order.tolist():
                if mass >= top_p:  # tokens only reached after the nucleus is full are cut
                    keep[i] = False
                mass += float(probs[i])
        logprobs.append(float(torch.log_softmax(row, -1)[token]))
        kept.append(bool(keep[token]))
    return logprobs, kept


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.3, 20, 1.0), (1.0, -1, 0.9), (0.8, 50, 0.95)],
)
def test_logprobs_match_teacher_forcing(
    server: Any, reference_model: Any, temperature: float, top_k: int, top_p: float
) -> None:
    out = server.generate(
        input_ids=PROMPT,
        sampling_params={
            "max_new_tokens": 24,
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "ignore_eos": True,
            "sampling_seed": 7,
        },
        return_logprob=True,
    )
    triples = out["meta_info"]["output_token_logprobs"]
    assert [t[1] for t in triples] == out["output_ids"]
    assert all(t[2] is None for t in triples)
    expected, kept = teacher_forced(
        reference_model, PROMPT, out["output_ids"], temperature, max(top_k, 0), top_p
    )
    torch.testing.assert_close(
        torch.tensor([t[0] for t in triples]), torch.tensor(expected), atol=1e-4, rtol=0
    )
    assert all(kept), "a token outside top-k / top-p was drawn"


def test_a_grammar_chooses_tokens_but_not_their_reported_logprob(
    server: Any, reference_model: Any
) -> None:
    """Grammar-constrained tokens carry the unconstrained log-prob too: the trainer, which knows
    nothing of the grammar, recomputes the same number."""
    out = server.generate(
        input_ids=PROMPT,
        sampling_params={
            "max_new_tokens": 12,
            "temperature": 0.9,
            "regex": "(yes|no)[0-9]{3}",
            "sampling_seed": 3,
        },
        return_logprob=True,
    )
    ids = out["output_ids"]
    expected, _ = teacher_forced(reference_model, PROMPT, ids, 0.9, 0, 1.0)
    got = [t[0] for t in out["meta_info"]["output_token_logprobs"]]
    assert out["text"][:2] in ("ye", "no")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-4, rtol=0)


def test_greedy_reports_plain_log_softmax(server: Any, reference_model: Any) -> None:
    out = server.generate(
        input_ids=PROMPT,
        sampling_params={"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True},
        return_logprob=True,
    )
    ids = out["output_ids"]
    with torch.no_grad():
        logits = reference_model(torch.tensor([PROMPT + ids]))[0, len(PROMPT) - 1 : -1]
    assert ids == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)]
    got = torch.tensor([t[0] for t in out["meta_info"]["output_token_logprobs"]])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_prompt_logprobs_and_top_logprobs(server: Any, reference_model: Any) -> None:
    out = server.generate(
        input_ids=PROMPT,
        sampling_params={"max_new_tokens": 4, "temperature": 1.0, "ignore_eos": True},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
    )
    meta = out["meta_info"]
    with torch.no_grad():
        logp = torch.log_softmax(reference_model(torch.tensor([PROMPT]))[0], -1)
    prompt_lp = meta["input_token_logprobs"]
    assert prompt_lp[0] == [None, PROMPT[0], None]
    expected = [float(logp[i, PROMPT[i + 1]]) for i in range(len(PROMPT) - 1)]
    torch.testing.assert_close(
        torch.tensor([t[0] for t in prompt_lp[1:]]), torch.tensor(expected), atol=1e-4, rtol=0
    )
    top = meta["output_top_logprobs"]
    assert len(top) == 4 and all(len(row) == 3 for row in top)
    for row, chosen in zip(top, meta["output_token_logprobs"]):
        values = [v for v, _, _ in row]
        assert values == sorted(values, reverse=True)
        assert chosen[0] <= values[0] + 1e-6
