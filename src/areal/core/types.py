"""The records that flow from the gateway to the trainer: completions, samples, trajectories.

Token ids, behaviour log-probs and policy versions are kept exactly as the engine generated them,
never re-tokenized. Versions are integers (the engine's weight version strings end in a number).

A :class:`Completion` keeps Python lists (it is what the engine's JSON answer held). A
:class:`Sample` keeps numpy arrays in the queue's wire types (int32 ids and versions, uint8 mask,
float32 log-probs): it is built once per episode on the gateway and then travels to the trainer's
batch without a per-token Python object on the way. Turning 8k numbers from a list into an
array, or back, costs 0.2-0.4 ms of CPU on the 2-core test machine, where the same bytes cross
ZeroMQ in 0.08 ms.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

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


# Each array field of a Sample and its dtype (also the queue's wire dtype, little-endian).
SAMPLE_DTYPES: dict[str, np.dtype[Any]] = {
    "input_ids": np.dtype("<i4"),
    "loss_mask": np.dtype("u1"),
    "logprobs": np.dtype("<f4"),
    "versions": np.dtype("<i4"),
}


# What a token field accepts: an array, or a sequence of numbers (converted once).
TokenValues = Sequence[int] | Sequence[float] | npt.NDArray[Any]


def as_token_array(values: TokenValues, dtype: np.dtype[Any], what: str) -> Any:
    """``values`` as a flat, contiguous array of ``dtype``, without a copy when it already is one.

    A value the dtype cannot hold (an id beyond int32, a mask of 2, a version of -2**40) is a
    ``ValueError`` naming the field, never a silent wrap-around.
    """
    if (
        isinstance(values, np.ndarray)
        and values.dtype == dtype
        and values.ndim == 1
        and values.flags.c_contiguous
    ):
        return values
    try:
        wide = np.asarray(values, dtype=np.float64 if dtype.kind == "f" else np.int64)
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"{what} cannot be held as {dtype.name}: {err}") from err
    if wide.ndim != 1:
        raise ValueError(f"{what} must be flat, got shape {wide.shape}")
    if dtype.kind in "iu" and wide.size:
        info = np.iinfo(dtype)
        low, high = int(wide.min()), int(wide.max())
        if low < info.min or high > info.max:
            raise ValueError(f"{what} has values in [{low}, {high}], outside {dtype.name}")
    return wide.astype(dtype)


@dataclass(frozen=True)
class TurnSpan:
    """One turn's generated tokens in a sample, ``[start, end)``, and the return they are
    credited with: ``ret`` is the discounted return from that turn on, ``G_k = r_k + γ·G_{k+1}``
    (:mod:`areal.core.trajectory`). ``turn`` is the turn's index in its episode (0-based, the
    same in every sample of the episode), so an estimator can compare turn ``k`` across the
    episodes of a group (docs/credit.md)."""

    turn: int
    start: int
    end: int
    ret: float

    @classmethod
    def of(cls, value: TurnSpan | Sequence[Any]) -> TurnSpan:
        """A span from itself or from ``[turn, start, end, ret]`` (JSON, the queue's header)."""
        if isinstance(value, TurnSpan):
            return value
        turn, start, end, ret = value
        return cls(int(turn), int(start), int(end), float(ret))


def check_turn_spans(spans: Sequence[TurnSpan], length: int) -> None:
    """Spans inside the sample, in order and apart, turns increasing: ``ValueError`` otherwise."""
    at, last_turn = 0, -1
    for span in spans:
        if not (at <= span.start <= span.end <= length) or span.turn <= last_turn:
            raise ValueError(
                f"a sample's turn spans must be ordered, disjoint and inside its {length} tokens "
                f"with increasing turns; got {span} after token {at}, turn {last_turn}"
            )
        if not math.isfinite(span.ret):
            raise ValueError(f"a turn's return must be finite, got {span.ret}")
        at, last_turn = span.end, span.turn


@dataclass(init=False, eq=False)
class Sample:
    """One training sequence: turns whose prompts extend each other merged token for token.

    ``loss_mask`` is 1 on generated tokens; ``logprobs`` and ``versions`` are 0 and -1 elsewhere.
    ``temperature`` is the one its generated tokens were sampled at (turns sampled at different
    temperatures never merge into one sample): the trainer divides its logits by it.

    The four token fields are 1-D numpy arrays of :data:`SAMPLE_DTYPES` (lists given to the
    constructor are converted once); arrays decoded from the queue are read-only views of the
    received bytes. Assigning a list to one later converts it too.

    ``reward`` is the return of the sample's first turn. ``turns`` says which generated tokens
    belong to which turn of the episode and the return each turn is credited with, so a reward
    posted for turn k credits turn k's tokens even when the turns merged into one sample. A
    sample without spans (built by hand, or by an older peer) is one turn worth ``reward``.
    """

    input_ids: npt.NDArray[np.int32]
    loss_mask: npt.NDArray[np.uint8]
    logprobs: npt.NDArray[np.float32]
    versions: npt.NDArray[np.int32]
    reward: float = 0.0
    completion_ids: list[str] = field(default_factory=list)
    temperature: float = 1.0
    turns: list[TurnSpan] = field(default_factory=list)

    def __init__(
        self,
        input_ids: TokenValues,
        loss_mask: TokenValues,
        logprobs: TokenValues,
        versions: TokenValues,
        reward: float = 0.0,
        completion_ids: list[str] | None = None,
        temperature: float = 1.0,
        turns: Sequence[TurnSpan | Sequence[Any]] | None = None,
    ) -> None:
        self.input_ids = input_ids  # type: ignore[assignment]  # __setattr__ makes it an array
        self.loss_mask = loss_mask  # type: ignore[assignment]
        self.logprobs = logprobs  # type: ignore[assignment]
        self.versions = versions  # type: ignore[assignment]
        self.reward = reward
        self.completion_ids = [] if completion_ids is None else completion_ids
        self.temperature = temperature
        self.turns = [TurnSpan.of(t) for t in turns or ()]
        self.__post_init__()

    @classmethod
    def of_wire_arrays(
        cls,
        arrays: Sequence[Any],
        reward: float = 0.0,
        completion_ids: list[str] | None = None,
        temperature: float = 1.0,
        turns: list[TurnSpan] | None = None,
    ) -> Sample:
        """A sample over the four token arrays in field order, which already have
        :data:`SAMPLE_DTYPES` and are flat and contiguous (the queue's decoded views): the
        constructor's conversion checks are skipped, the length and temperature checks are not."""
        sample = object.__new__(cls)
        for name, values in zip(SAMPLE_DTYPES, arrays, strict=True):
            object.__setattr__(sample, name, values)
        object.__setattr__(sample, "reward", reward)
        object.__setattr__(
            sample, "completion_ids", [] if completion_ids is None else completion_ids
        )
        object.__setattr__(sample, "temperature", temperature)
        object.__setattr__(sample, "turns", [] if turns is None else turns)
        sample.__post_init__()
        return sample

    def __setattr__(self, name: str, value: Any) -> None:
        """Every assignment to a token field (the constructor's too) keeps it an array of its
        dtype, so a caller's list never reaches the packing or the queue as a list."""
        dtype = SAMPLE_DTYPES.get(name)
        if dtype is not None:
            value = as_token_array(value, dtype, f"a sample's {name}")
        object.__setattr__(self, name, value)

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if not len(self.loss_mask) == len(self.logprobs) == len(self.versions) == n:
            raise ValueError("a sample's ids, mask, logprobs and versions must have one length")
        if not self.temperature > 0:
            raise ValueError(f"a sample's temperature must be > 0, got {self.temperature}")
        check_turn_spans(self.turns, n)

    def __eq__(self, other: object) -> bool:
        """Equal fields, the arrays element for element (a dataclass's ``==`` cannot compare
        arrays)."""
        if not isinstance(other, Sample):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name))
            if f.name in SAMPLE_DTYPES
            else getattr(self, f.name) == getattr(other, f.name)
            for f in fields(self)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like any dataclass with eq

    @property
    def generated_versions(self) -> npt.NDArray[np.int32]:
        """The policy version of each generated (loss-masked) token, in order."""
        return self.versions[self.loss_mask != 0]

    @property
    def min_version(self) -> int:
        generated = self.generated_versions
        return int(generated.min()) if generated.size else -1

    @property
    def generated_tokens(self) -> int:
        return int(np.count_nonzero(self.loss_mask))

    def token_returns(self) -> npt.NDArray[np.float32]:
        """Per token, the return its turn is credited with (0 off the generated tokens); without
        spans, ``reward`` on every generated token."""
        mask = self.loss_mask != 0
        if not self.turns:
            return np.where(mask, np.float32(self.reward), np.float32(0.0)).astype(np.float32)
        out = np.zeros(len(self.input_ids), np.float32)
        for span in self.turns:
            out[span.start : span.end] = span.ret
        return np.where(mask, out, np.float32(0.0)).astype(np.float32)

    def token_turns(self) -> npt.NDArray[np.int32]:
        """Per token, the episode turn it belongs to (-1 off the generated tokens); without
        spans, turn 0 on every generated token."""
        out = np.full(len(self.input_ids), -1, np.int32)
        if not self.turns:
            out[self.loss_mask != 0] = 0
            return out
        for span in self.turns:
            out[span.start : span.end] = span.turn
        out[self.loss_mask == 0] = -1
        return out

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types (lists for the arrays)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in SAMPLE_DTYPES:
            out[name] = out[name].tolist()
        out["completion_ids"] = list(self.completion_ids)
        out["turns"] = [[t.turn, t.start, t.end, t.ret] for t in self.turns]
        return out


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
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["samples"] = [s.to_json() for s in self.samples]
        out["turns"] = [t.to_json() for t in self.turns]
        out["metadata"] = dict(self.metadata)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trajectory:
        samples = [Sample(**s) for s in data["samples"]]
        turns = [Completion(**c) for c in data.get("turns", [])]
        return cls(**{**data, "samples": samples, "turns": turns})
