"""Run checkpoints: everything ``areal train --resume`` needs to go on as if never stopped.

One checkpoint is a directory ``{output_dir}/checkpoints/step-000120/``:

- what the training engine writes (:meth:`~areal.core.train_engine.TrainEngine.save`): for the
  built-in ``fsdp`` engine ``model/``, the policy in Hugging Face layout (config, safetensors, and
  the tokenizer files of the model the run started from), loadable by itself by transformers or
  ``areal serve inference``, and ``optimizer.pt`` (one trainer rank) or ``dcp/`` (the model and
  optimizer sharded by ``torch.distributed.checkpoint``, several ranks);
- ``buffered.jsonl``: the trajectories the trainer had received but not trained (one JSON object
  a line), so a resumed run trains them instead of losing them;
- ``state.json``: the step, the weight version, the trainer loop's counters, the data position
  (which task indices reached the trainer), and the size of every other file of the checkpoint;
  written last.

**Crash safety.** A save never touches a complete checkpoint before its successor is complete.
It writes into a hidden ``.step-000120.tmp/`` beside the others (the same file system), fsyncs
every file and directory, and only then renames it to ``step-000120`` (the commit); older
checkpoints beyond ``logging.keep_checkpoints`` are deleted after the commit, each renamed to a
hidden ``.trash`` name first so that a half-deleted one never carries a real name. Re-saving a
step that exists (the final save after draining the queue) moves the old one aside to
``.step-000120.old`` for the instant of the rename. The points between these phases are
:data:`SAVE_PHASES`; a process killed at any of them (or anywhere between) leaves the newest
complete checkpoint loadable, and the next writer (:func:`recover_checkpoints`, at a run's start
and before each save) removes what the interrupted save left, with one log line.

A checkpoint is *complete* when its ``state.json`` reads and every file it lists has the listed
size; :func:`latest_checkpoint` returns the newest complete one and says in one line why it skips
any other. A save that fails (a full disk: :class:`CheckpointError`, one line naming the path)
removes its partial files and keeps the last good checkpoint.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.core.types import Trajectory
from areal.host.faults import crash_point

log = logging.getLogger("areal.train")

__all__ = [
    "SAVE_PHASES",
    "Checkpoint",
    "CheckpointError",
    "latest_checkpoint",
    "load_checkpoint",
    "ranges_to_set",
    "recover_checkpoints",
    "save_checkpoint",
    "set_to_ranges",
]

CHECKPOINTS = "checkpoints"
STATE = "state.json"
BUFFERED = "buffered.jsonl"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_HIDDEN = re.compile(r"^\.(step-\d+)\.(tmp|old|trash)$")

# The crash points of one save, in order (areal.host.faults). The engine's own points come
# between "started" and "engine_written" (the fsdp engine: "engine.model_written"); "moved_aside"
# only when the step is saved again, "pruning" once per checkpoint deleted by the retention.
SAVE_PHASES: tuple[str, ...] = (
    "checkpoint.started",  # the hidden directory exists, empty
    "checkpoint.engine_written",  # the engine's model and optimizer are in it
    "checkpoint.buffered_written",  # buffered.jsonl
    "checkpoint.state_written",  # state.json, the completeness marker, not yet synced
    "checkpoint.synced",  # every file and directory fsynced
    "checkpoint.moved_aside",  # the same step's older checkpoint renamed to .step-N.old
    "checkpoint.committed",  # renamed to step-N, the directory fsynced
    "checkpoint.pruning",  # an old checkpoint renamed to .step-N.trash, not yet deleted
)


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the message is one line naming where and why (the
    partial files are gone and the last good checkpoint is untouched). ``no_space``: the disk or
    the quota was full."""

    def __init__(self, message: str, *, no_space: bool = False) -> None:
        super().__init__(message)
        self.no_space = no_space


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
    """Write checkpoint ``step`` crash-safely (module docstring), then delete all but the newest
    ``keep``; :class:`CheckpointError` when the file system refuses (a full disk).

    ``write_engine(tmp_dir)`` writes the training engine's part (model and optimizer) before the
    run's own files; ``state.json`` comes last.
    """
    root = Path(output_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    recover_checkpoints(output_dir)
    final = root / f"step-{step:06d}"
    tmp, aside = root / f".{final.name}.tmp", root / f".{final.name}.old"
    moved = False
    try:
        tmp.mkdir()
        crash_point("checkpoint.started")
        write_engine(tmp)
        crash_point("checkpoint.engine_written")
        with open(tmp / BUFFERED, "w", encoding="utf-8") as f:
            for trajectory in pending:
                f.write(json.dumps(trajectory.to_json()) + "\n")
        crash_point("checkpoint.buffered_written")
        files = _sizes(tmp)
        record = {**state, "step": step, "files": files}
        (tmp / STATE).write_text(json.dumps(record, indent=2) + "\n")
        crash_point("checkpoint.state_written")
        _fsync_tree(tmp)
        crash_point("checkpoint.synced")
        if final.exists():
            final.rename(aside)
            moved = True
            crash_point("checkpoint.moved_aside")
        tmp.rename(final)
        _fsync_dir(root)
        crash_point("checkpoint.committed")
    except BaseException as exc:
        full = _no_space(exc, root)  # before the partial files go and free the space
        shutil.rmtree(tmp, ignore_errors=True)
        if moved and not final.exists():
            aside.rename(final)
        if full or isinstance(exc, OSError):
            raise CheckpointError(_failure(final, exc, full), no_space=full) from exc
        raise
    shutil.rmtree(aside, ignore_errors=True)
    _prune(root, keep, final)
    return final


def recover_checkpoints(output_dir: str | Path) -> list[str]:
    """Clean up after an interrupted save: remove hidden ``.tmp``/``.trash`` directories, and put
    back a ``.old`` one whose step has no checkpoint (a kill between moving it aside and the
    commit); one log line says what was done. Only a writer calls this (a run at its start, each
    save), never a reader: another process's save in progress looks the same."""
    root = Path(output_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    done: list[str] = []
    for path in sorted(root.iterdir()):
        m = _HIDDEN.match(path.name)
        if m is None:
            continue
        final = root / m.group(1)
        if m.group(2) == "old" and not final.exists() and _incomplete(path) is None:
            path.rename(final)
            done.append(f"restored {final.name} from {path.name}")
        else:
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {path.name}")
    if done:
        log.warning("checkpoints: an earlier save was interrupted; %s", ", ".join(done))
    return done


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``output_dir``, or ``None``; each incomplete one
    newer than it is skipped with a log line saying why (never deleted: not areal's own)."""
    root = Path(output_dir) / CHECKPOINTS
    for _, path in reversed(_step_dirs(root)):
        why = _incomplete(path)
        if why is None:
            return path
        log.warning("checkpoints: skipping %s, it is incomplete (%s)", path, why)
    return None


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint's state and buffered trajectories (weights and optimizer stay on disk)."""
    path = Path(path)
    state = json.loads((path / STATE).read_text())
    pending = []
    with open(path / BUFFERED, encoding="utf-8") as f:
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


# --- the parts of a save ------------------------------------------------------------------------


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))


def _incomplete(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint, or ``None`` when it is. Checkpoints written
    before ``state.json`` listed the files count as complete when it reads."""
    try:
        state = json.loads((path / STATE).read_text())
    except FileNotFoundError:
        return f"no {STATE}"
    except (OSError, ValueError) as exc:
        return f"{STATE} does not read: {exc}"
    if not isinstance(state, dict) or "step" not in state:
        return f"{STATE} has no step"
    if not (path / BUFFERED).is_file():
        return f"no {BUFFERED}"
    for name, size in (state.get("files") or {}).items():
        try:
            actual = (path / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual != size:
            return f"{name} has {actual} of {size} bytes"
    return None


def _sizes(directory: Path) -> dict[str, int]:
    """Every file under ``directory`` (relative, POSIX) with its size."""
    return {
        p.relative_to(directory).as_posix(): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _fsync_tree(directory: Path) -> None:
    """Every file and directory under ``directory`` to stable storage, so the commit's rename
    can never reach the disk ahead of the data it names."""
    for dirpath, _, filenames in os.walk(directory):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # a platform that cannot open directories (Windows)
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):  # file systems without directory fsync
            raise
    finally:
        os.close(fd)


def _prune(root: Path, keep: int, newest: Path) -> None:
    """All but the newest ``keep`` complete checkpoints (``newest``, just committed, always
    stays). A failure here only logs: the new checkpoint is committed."""
    older = [p for _, p in _step_dirs(root) if p != newest and _incomplete(p) is None]
    for old in older[: max(0, len(older) - (keep - 1))]:
        trash = root / f".{old.name}.trash"
        try:
            old.rename(trash)
        except OSError as exc:
            log.warning("checkpoints: could not delete %s: %s", old, exc)
            continue
        crash_point("checkpoint.pruning")
        shutil.rmtree(trash, ignore_errors=True)


def _no_space(exc: BaseException, root: Path) -> bool:
    """Whether ``exc`` means the disk (or the quota) is full: said by an ``OSError`` in its chain
    or its message, or, for writers that lose the reason (``torch.save`` to a path raises a bare
    ``RuntimeError``), by the file system having no room left."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        e = e.__cause__ or e.__context__
    if not isinstance(exc, RuntimeError):
        return False
    try:
        fs = os.statvfs(root)
    except (OSError, AttributeError):
        return False
    free = fs.f_bfree if os.geteuid() == 0 else fs.f_bavail
    return free * fs.f_frsize < 1 << 20


def _failure(final: Path, exc: BaseException, full: bool) -> str:
    if full:
        reason = f"no space left on device in {final.parent}"
    elif isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        reason = f"{exc.strerror.lower()}{where}"
    else:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    found = latest_checkpoint(final.parent.parent)
    kept = f"the last good checkpoint {found} is kept" if found else "no earlier checkpoint"
    return f"checkpoint {final.name} not saved: {reason}; {kept}"
