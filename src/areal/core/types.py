"""The records that flow from the gateway to the trainer: completions, samples, trajectories.

Token ids, behaviour log-probs and policy versions are kept exactly as the engine generated them,
never re-tokenized. Versions are integers (the engine's weight version strings end in a number).
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

_TRAILING_INT = re.compile(r"(\d+)$")


def version_number(version: str | int | None) -> int:
    """``"3"`` or ``"v3"`` -> 3; -1 when a version carries no number (e.g. SGLang's "default")."""
    if isinstance(version, int):
        return version
    match = _TRAILING_INT.search(version or "")
    return int(match.group(1)) if match else -1


@dataclass
class Completion:
    """One model call as generated: what the trainer will see of it."""

    completion_id: str
    session_id: str | None
    turn: int
    model: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str
    reward: float | None = None
    created: float = field(default_factory=time.time)
    # What the engine was asked to sample with (:func:`sampling_record`): the trainer recomputes
    # the policy under this temperature, so the log-probs it compares are of one distribution.
    sampling: dict[str, Any] = field(default_factory=dict)

    @property
    def temperature(self) -> float:
        """The temperature the trainer scales this turn's logits by (greedy and unknown: 1)."""
        return training_temperature(self.sampling)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


GRAMMAR_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")


def sampling_record(params: dict[str, Any]) -> dict[str, Any]:
    """The sampling parameters an engine used, from the SGLang ``sampling_params`` sent to it
    (absent keys at SGLang's defaults), as a completion records them."""
    return {
        "temperature": float(params.get("temperature", 1.0)),
        "top_p": float(params.get("top_p", 1.0)),
        "top_k": int(params.get("top_k", -1)),
        "min_p": float(params.get("min_p", 0.0)),
        "grammar": any(params.get(key) is not None for key in GRAMMAR_KEYS),
    }


def training_temperature(sampling: dict[str, Any]) -> float:
    """The temperature of the distribution a recorded log-prob belongs to: the sampling
    temperature, or 1 for greedy decoding (temperature 0 or top-k 1: the engine reports the
    plain log-softmax there)."""
    value = float(sampling.get("temperature", 1.0))
    return value if value > 0 and sampling.get("top_k", -1) != 1 else 1.0


@dataclass
class Sample:
    """One training sequence: turns whose prompts extend each other merged token for token.

    ``loss_mask`` is 1 on generated tokens; ``logprobs`` and ``versions`` are 0 and -1 elsewhere.
    ``temperature`` is the one its generated tokens were sampled at (turns sampled at different
    temperatures never merge into one sample): the trainer divides its logits by it.
    """

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    reward: float = 0.0
    completion_ids: list[str] = field(default_factory=list)
    temperature: float = 1.0

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if not len(self.loss_mask) == len(self.logprobs) == len(self.versions) == n:
            raise ValueError("a sample's ids, mask, logprobs and versions must have one length")
        if not self.temperature > 0:
            raise ValueError(f"a sample's temperature must be > 0, got {self.temperature}")

    @property
    def min_version(self) -> int:
        generated = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]
        return min(generated) if generated else -1


@dataclass
class Trajectory:
    """A finished episode: its samples and rewards, ready for the trajectory queue."""

    session_id: str
    samples: list[Sample]
    reward: float | None
    completions: int
    metadata: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    turns: list[Completion] = field(default_factory=list)  # the completions, as generated

    @property
    def is_tombstone(self) -> bool:
        """An episode the gateway discarded, announced so the trainer stops waiting for it as a
        member of its group: no samples, ``metadata["discarded"]``."""
        return not self.samples and bool(self.metadata.get("discarded"))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trajectory:
        samples = [Sample(**s) for s in data["samples"]]
        turns = [Completion(**c) for c in data.get("turns", [])]
        return cls(**{**data, "samples": samples, "turns": turns})
