"""Completions of one episode -> training samples, as pure functions.

An agent's calls usually replay the whole conversation: turn 2's prompt is turn 1's prompt, its
output, then the new messages. When that holds token for token, both turns become one sequence
(the earlier output is trained in place, the new messages are context with loss mask 0), which
saves recomputing the shared prefix. When it does not hold (the agent rewrote or dropped history,
or the chat template renders past turns differently) the turn starts a new sample of the episode.

Rewards, per turn: each completion may carry its own (per-turn) reward ``r_k``; the episode
reward ``R`` is added to the last turn's. Turn ``k`` is credited with its discounted return,
``G_last = r_last + R`` and ``G_k = r_k + discount * G_{k+1}``: one discount, per turn (a turn is
a model call), whether the turns merged into one sample or not. Each sample records which of its
generated tokens belong to which turn and that turn's return (:class:`~areal.core.types.TurnSpan`),
so a reward for turn 1 credits turn 1's tokens and, discounted, no later ones; the sample's
``reward`` is the return of its first turn. With only an episode reward, the ``k``-th turn from
the end gets ``R * discount**k``. How estimators use the returns: docs/credit.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from areal.core.types import (
    SAMPLE_DTYPES,
    Completion,
    Sample,
    Trajectory,
    TurnSpan,
    as_token_array,
)

PROMPT_LOGPROB = 0.0
PROMPT_VERSION = -1


def extends(prefix: Sequence[int], ids: Sequence[int]) -> bool:
    """Does ``ids`` start with all of ``prefix``?"""
    return len(ids) >= len(prefix) and list(ids[: len(prefix)]) == list(prefix)


def _check(completion: Completion) -> None:
    n = len(completion.output_ids)
    if not len(completion.output_logprobs) == len(completion.output_versions) == n:
        raise ValueError(
            f"completion {completion.completion_id}: {n} output ids but "
            f"{len(completion.output_logprobs)} logprobs and "
            f"{len(completion.output_versions)} versions"
        )


@dataclass
class _Draft:
    """A sample being merged: its ids as a list (for the prefix test) and each field's pieces as
    arrays, joined once at the end. The prompt's mask, log-probs and versions are constants, so
    only ids and the engine's outputs are ever converted from lists."""

    ids: list[int]
    temperature: float
    pieces: dict[str, list[Any]] = field(default_factory=lambda: {n: [] for n in SAMPLE_DTYPES})
    completion_ids: list[str] = field(default_factory=list)
    spans: list[TurnSpan] = field(default_factory=list)  # returns 0 until assign_rewards

    def add(self, completion: Completion, turn: int) -> None:
        """The completion's new context (its prompt beyond the sample so far), then its output,
        which is turn ``turn`` of the episode."""
        context = completion.prompt_ids[len(self.ids) :]
        n, m = len(context), len(completion.output_ids)
        where = f"completion {completion.completion_id}"
        mask, logprobs, versions = (SAMPLE_DTYPES[k] for k in ("loss_mask", "logprobs", "versions"))
        self._add(where, context, np.zeros(n, mask), np.full(n, PROMPT_LOGPROB, logprobs),
                  np.full(n, PROMPT_VERSION, versions))  # fmt: skip
        start = len(self.ids)
        self._add(where, completion.output_ids, np.ones(m, mask), completion.output_logprobs,
                  completion.output_versions)  # fmt: skip
        self.completion_ids.append(completion.completion_id)
        self.spans.append(TurnSpan(turn, start, start + m, 0.0))

    def _add(self, where: str, ids: Sequence[int], *columns: Any) -> None:
        self.ids += ids
        for name, values in zip(SAMPLE_DTYPES, (ids, *columns), strict=True):
            self.pieces[name].append(
                as_token_array(values, SAMPLE_DTYPES[name], f"{where}'s {name}")
            )

    def sample(self) -> Sample:
        ids, mask, logprobs, versions = (np.concatenate(self.pieces[n]) for n in SAMPLE_DTYPES)
        return Sample(
            ids, mask, logprobs, versions, 0.0, self.completion_ids, self.temperature, self.spans
        )


def joins(ids: Sequence[int], temperature: float, completion: Completion) -> bool:
    """Does ``completion`` continue the sample so far (its tokens ``ids``, sampled at
    ``temperature``)? Its prompt must extend them token for token, and it must have been sampled
    at the same temperature: one sample is trained under one temperature."""
    return completion.temperature == temperature and extends(ids, completion.prompt_ids)


def merge_completions(completions: Sequence[Completion]) -> list[Sample]:
    """Samples from completions in turn order, merging each turn into the previous sample when its
    prompt extends that sample's tokens (the previous prompt and output) exactly.

    Each sample's turn spans number the turns 0, 1, ... in that order across the episode.
    Rewards and returns are left at 0; :func:`assign_rewards` sets them.
    """
    drafts: list[_Draft] = []
    for turn, completion in enumerate(sorted(completions, key=lambda c: c.turn)):
        _check(completion)
        if not drafts or not joins(drafts[-1].ids, drafts[-1].temperature, completion):
            drafts.append(_Draft([], completion.temperature))
        drafts[-1].add(completion, turn)
    return [draft.sample() for draft in drafts]


@dataclass(frozen=True)
class TurnJoin:
    """How one turn joined the episode's samples: ``start`` (the first), ``merged`` (its prompt
    extends the sample so far token for token) or ``split`` (a new sample; ``diverged_at`` is the
    first index where its prompt differs from the sample's tokens)."""

    turn: int
    how: str
    sample: int
    diverged_at: int | None = None


def join_report(completions: Sequence[Completion]) -> list[TurnJoin]:
    """:func:`merge_completions`' decisions, turn by turn, with where each split's prefix broke
    (a split at a temperature change breaks nowhere in the tokens: ``diverged_at`` is then
    the length of the sample so far)."""
    report: list[TurnJoin] = []
    current: list[int] = []
    temperature = 1.0
    n_samples = 0
    for completion in sorted(completions, key=lambda c: c.turn):
        prompt = list(completion.prompt_ids)
        if not report:
            how, at = "start", None
        elif joins(current, temperature, completion):
            how, at = "merged", None
        else:
            how, at = "split", first_difference(current, prompt)
        n_samples += how != "merged"
        current = prompt + list(completion.output_ids)  # a merged sample's tokens, too
        temperature = completion.temperature
        report.append(TurnJoin(completion.turn, how, n_samples - 1, at))
    return report


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter length when one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def discounted_returns(
    turn_rewards: Sequence[float], episode_reward: float | None, discount: float
) -> list[float]:
    """Per-turn returns: ``G_last = r_last + R``, ``G_k = r_k + discount * G_{k+1}``."""
    returns = [0.0] * len(turn_rewards)
    following = episode_reward or 0.0
    for i in range(len(turn_rewards) - 1, -1, -1):
        returns[i] = turn_rewards[i] + following
        following = discount * returns[i]
    return returns


def assign_rewards(
    samples: list[Sample],
    completions: Sequence[Completion],
    episode_reward: float | None,
    discount: float = 1.0,
) -> None:
    """Credit each turn span with its turn's discounted return and set each sample's reward to
    its first turn's (see the module docstring). ``completions`` in turn order, as merged."""
    returns = discounted_returns([c.reward or 0.0 for c in completions], episode_reward, discount)
    for sample in samples:
        sample.turns = [replace(span, ret=returns[span.turn]) for span in sample.turns]
        sample.reward = sample.turns[0].ret if sample.turns else 0.0


def build_trajectory(
    session_id: str,
    completions: Sequence[Completion],
    *,
    episode_reward: float | None,
    discount: float = 1.0,
    metadata: dict[str, Any] | None = None,
) -> Trajectory:
    """The finished episode as the trainer will receive it."""
    if not (0.0 <= discount <= 1.0) or math.isnan(discount):
        raise ValueError(f"the reward discount must be within [0, 1], got {discount}")
    ordered = sorted(completions, key=lambda c: c.turn)
    samples = merge_completions(ordered)
    assign_rewards(samples, ordered, episode_reward, discount)
    return Trajectory(
        session_id=session_id,
        samples=samples,
        reward=episode_reward,
        completions=len(ordered),
        metadata=dict(metadata or {}),
        turns=list(ordered),
    )
