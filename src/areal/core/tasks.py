"""Where episodes come from: named task sets (registered by plugins) and task files.

A run reads its dataset as an endless, indexed stream (:class:`TaskStream`): task ``i`` is the same
task every time it is asked for, so a resumed run that restarts at its saved position replays
nothing and skips nothing. A built-in task set generates its tasks from ``(index, seed)``; a file is
read once and walked epoch by epoch, each epoch in its own seeded order.

A :class:`TaskSet` also names the agent written for it (as ``"module:attr"``, imported only when a
run needs it) and may give format demonstrations for a supervised warm start. A task set that takes
options (``dataset.options``: which generator, how many items...) builds its configured self with
``configure(options)``.

A task file is JSONL, Parquet, or a ``datasets`` dataset saved with ``save_to_disk`` (a
directory); ``dataset.columns`` renames its columns to the fields the agent and the reward read
(``{"question": "problem", "answer": "solution"}``: the task's ``question`` is the row's
``problem``).
"""

from __future__ import annotations

import importlib
import itertools
import json
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.core.config import ConfigError


@dataclass(frozen=True)
class TaskSet:
    """A built-in dataset: tasks, the agent that plays them, and optional format demonstrations.

    ``task(index, seed)`` is deterministic and returns a dict holding ``task_id`` plus whatever the
    agent and its reward need. ``demonstration(index, seed)`` returns ``{"messages": [...], "tools":
    [...]}``, an OpenAI-shaped conversation including the assistant turns, that shows the format of
    a good episode without its content (so a warm start teaches the format, and RL the task).
    """

    name: str
    description: str
    task: Callable[[int, int], dict[str, Any]]
    agent: str  # "module:attr" of the AgentFn (areal.run.rollout) written for these tasks
    demonstration: Callable[[int, int], dict[str, Any]] | None = None
    # An episode whose reward reaches this solved its task: the run reports the success rate,
    # which says more than the mean of a reward with partial credit.
    success_reward: float | None = None
    # ``configure(options)`` -> the task set as ``dataset.options`` asks (None: it takes none).
    # It raises ConfigError naming the ``dataset.options.<key>`` that is wrong.
    configure: Callable[[Mapping[str, Any]], TaskSet] | None = None


def configured(found: TaskSet, options: Mapping[str, Any] | None) -> TaskSet:
    """``found`` as ``dataset.options`` asks; options for a task set that takes none are an error,
    never silently ignored."""
    if not options:
        return found
    if found.configure is None:
        raise ConfigError(
            f"dataset.options: task set {found.name!r} takes no options "
            f"(given: {', '.join(sorted(options))}); remove dataset.options"
        )
    return found.configure(options)


def check_option_names(name: str, options: Mapping[str, Any], known: Iterable[str]) -> None:
    """A ConfigError naming the first of ``options`` task set ``name`` does not take."""
    known = list(known)
    for key in options:
        if key not in known:
            raise ConfigError(
                f"dataset.options.{key}: {name} has no such option (it takes: {', '.join(known)})"
            )


def task_set(name: str) -> TaskSet:
    """The task set registered as ``name``; an unknown name lists the registered ones."""
    from areal.core.plugins import registry

    found: TaskSet = registry("task_sets").get(name, key="dataset.name")
    return found


def load_object(ref: str) -> Any:
    """``"pkg.module:attr"`` (``attr`` may be dotted) -> the object, or a :class:`ConfigError`
    that says which part is wrong."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{ref!r} is not a 'package.module:attribute' reference")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigError(
                f"{ref!r}: no module named {missing!r} (is it installed, and on sys.path?)"
            ) from None
        raise ConfigError(f"{ref!r}: importing {module_name} failed: {err}") from err
    for depth, part in enumerate(attr.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            owner = ".".join([module_name, *attr.split(".")[:depth]])
            raise ConfigError(f"{ref!r}: {owner} has no attribute {part!r}") from None
    return obj


class TaskStream:
    """The run's dataset as an endless stream: ``stream[i]`` is task ``i``, with ``task_index: i``.

    Exactly one of ``path`` (a task file: JSONL, Parquet or a saved ``datasets`` dataset) and
    ``name`` (a registered task set, configured by ``options``) is given. Over a file with ``n`` tasks, index ``i`` is in epoch ``e = i // n``; the
    epoch's order is a permutation drawn by ``random.Random(seed + e)`` when ``shuffle`` (else file
    order), so every epoch visits every task once. A task without ``task_id`` gets its line number
    (1-based, as an editor shows it). Over a task set, ``i`` maps to ``task(i, seed)``.
    """

    def __init__(
        self,
        *,
        path: str | None,
        name: str | None,
        shuffle: bool = True,
        seed: int = 0,
        options: Mapping[str, Any] | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> None:
        if (path is None) == (name is None):
            raise ConfigError("a task stream reads exactly one of a tasks file and a task set")
        self.shuffle = shuffle
        self.seed = seed
        self.tasks: list[dict[str, Any]] | None = None
        self.task_set: TaskSet | None = None
        if path is not None:
            self.tasks = read_tasks(path, columns=columns)
        else:
            assert name is not None
            self.task_set = configured(task_set(name), options)
        self._order: tuple[int, list[int]] | None = None  # (epoch, permutation), the last one used

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < 0:
            raise IndexError(f"a task stream has no negative indices, got {index}")
        if self.task_set is not None:
            task = dict(self.task_set.task(index, self.seed))
        else:
            assert self.tasks is not None
            epoch, offset = divmod(index, len(self.tasks))
            task = dict(self.tasks[self._permutation(epoch)[offset]])
        task["task_index"] = index
        return task

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.iter_from(0)

    def iter_from(self, start: int) -> Iterator[dict[str, Any]]:
        """Tasks ``start, start + 1, ...`` without end (a resumed run starts at its saved index)."""
        return (self[index] for index in itertools.count(start))

    @property
    def epoch_size(self) -> int | None:
        """Tasks per pass over a file; None for a task set (it never repeats)."""
        return len(self.tasks) if self.tasks is not None else None

    def _permutation(self, epoch: int) -> list[int]:
        if self._order is None or self._order[0] != epoch:
            assert self.tasks is not None
            order = list(range(len(self.tasks)))
            if self.shuffle:
                random.Random(self.seed + epoch).shuffle(order)
            self._order = (epoch, order)
        return self._order[1]


def read_tasks(
    path: str | Path, *, columns: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The task objects of a task file: JSONL (blank lines skipped, anything else an object),
    Parquet (``.parquet``, read with pyarrow), or a directory a ``datasets`` dataset was saved to.
    ``columns`` maps a task field to the file's column holding it; a mapped column the file lacks
    is an error naming both."""
    file = Path(path)
    if file.is_dir():
        tasks = _read_saved_dataset(file)
    elif not file.is_file():
        raise ConfigError(f"dataset.path: {file} does not exist")
    elif file.suffix == ".parquet":
        tasks = _read_parquet(file)
    else:
        tasks = _read_jsonl(file)
    if not tasks:
        raise ConfigError(f"dataset.path: {file} holds no tasks")
    if columns:
        tasks = [_renamed(task, columns, file) for task in tasks]
    return tasks


def _read_jsonl(file: Path) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{file}:{number}: not valid JSON ({err.msg})") from None
        if not isinstance(task, dict):
            raise ConfigError(f"{file}:{number}: a task must be a JSON object")
        task.setdefault("task_id", number)
        tasks.append(task)
    return tasks


def _read_parquet(file: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            f"dataset.path: {file} is Parquet, which needs pyarrow: pip install pyarrow"
        ) from None
    rows: list[dict[str, Any]] = pq.read_table(file).to_pylist()
    return [{"task_id": number, **row} for number, row in enumerate(rows, start=1)]


def _read_saved_dataset(directory: Path) -> list[dict[str, Any]]:
    """A ``Dataset.save_to_disk`` directory (one split), or a ``DatasetDict``'s (its ``train``)."""
    if (
        not (directory / "dataset_info.json").is_file()
        and not (directory / "dataset_dict.json").is_file()
    ):
        raise ConfigError(
            f"dataset.path: {directory} is a directory but no saved `datasets` dataset "
            "(no dataset_info.json or dataset_dict.json); give a .jsonl or .parquet file, or a "
            "directory written by Dataset.save_to_disk"
        )
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"dataset.path: {directory} is a saved `datasets` dataset: pip install datasets"
        ) from None
    loaded = datasets.load_from_disk(str(directory))
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise ConfigError(
                f"dataset.path: {directory} holds splits {sorted(loaded)} and no 'train'; "
                "point dataset.path at one split's directory"
            )
        loaded = loaded["train"]
    return [{"task_id": number, **row} for number, row in enumerate(loaded, start=1)]


def _renamed(task: dict[str, Any], columns: Mapping[str, str], file: Path) -> dict[str, Any]:
    renamed = dict(task)
    for field, column in columns.items():
        if column not in task:
            raise ConfigError(
                f"dataset.columns.{field}: {file} has no column {column!r} "
                f"(its columns: {', '.join(sorted(task))})"
            )
        renamed[field] = task[column]
    return renamed
