"""Run checkpoints: everything ``areal train --resume`` needs to go on as if never stopped.

One checkpoint is a directory ``{output_dir}/checkpoints/step-000120/``:

- what the training engine writes (:meth:`~areal.core.train_engine.TrainEngine.save`): for the
  built-in ``fsdp`` engine ``model/``, the policy in Hugging Face layout (config, safetensors, and
  the tokenizer files of the model the run started from), loadable by itself by transformers or
  ``areal serve inference``, and ``optimizer.pt`` (one trainer rank) or ``dcp/`` (the model and
  optimizer sharded by ``torch.distributed.checkpoint``, several ranks);
- ``buffered.jsonl``: the trajectories the trainer had received but not trained (one JSON object
  a line), so a resumed run trains them instead of losing them;
- ``state.json``: the step, the weight version, the trainer loop's counters, and the data position
  (which task indices reached the trainer), written last.

It is written to a hidden temporary directory and renamed into place, so a crash while saving
leaves the previous checkpoints untouched and never a half-written one under a real name;
:func:`latest_checkpoint` only considers directories with a ``state.json``.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.core.types import Trajectory

__all__ = [
    "Checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "ranges_to_set",
    "save_checkpoint",
    "set_to_ranges",
]

CHECKPOINTS = "checkpoints"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass
class Checkpoint:
    """A loaded checkpoint (the model weights stay on disk under ``model_dir``)."""

    path: Path
    step: int
    state: dict[str, Any]
    pending: list[Trajectory]

    @property
    def model_dir(self) -> Path:
        return self.path / "model"


def save_checkpoint(
    output_dir: str | Path,
    *,
    step: int,
    write_engine: Callable[[Path], None],
    state: dict[str, Any],
    pending: Iterable[Trajectory],
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` atomically and delete all but the newest ``keep``.

    ``write_engine(tmp_dir)`` writes the training engine's part (model and optimizer) before the
    run's own files; ``state.json`` comes last.
    """
    root = Path(output_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_engine(tmp)
    with open(tmp / "buffered.jsonl", "w", encoding="utf-8") as f:
        for trajectory in pending:
            f.write(json.dumps(trajectory.to_json()) + "\n")
    (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in _checkpoints(root)[:-keep]:
        shutil.rmtree(old[1], ignore_errors=True)
    return final


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``output_dir``, or ``None``."""
    found = _checkpoints(Path(output_dir) / CHECKPOINTS)
    return found[-1][1] if found else None


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint's state and buffered trajectories (weights and optimizer stay on disk)."""
    path = Path(path)
    state = json.loads((path / "state.json").read_text())
    pending = []
    with open(path / "buffered.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                pending.append(Trajectory.from_json(json.loads(line)))
    return Checkpoint(path=path, step=int(state["step"]), state=state, pending=pending)


def set_to_ranges(values: Iterable[int]) -> list[list[int]]:
    """``{0, 1, 2, 5}`` -> ``[[0, 3], [5, 6]]``: half-open ranges, so a long run's data position
    stays small in ``state.json``."""
    ranges: list[list[int]] = []
    for v in sorted(set(values)):
        if ranges and ranges[-1][1] == v:
            ranges[-1][1] = v + 1
        else:
            ranges.append([v, v + 1])
    return ranges


def ranges_to_set(ranges: Iterable[Iterable[int]]) -> set[int]:
    out: set[int] = set()
    for start, end in ranges:
        out.update(range(start, end))
    return out


def _checkpoints(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    return sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / "state.json").is_file()
    )
