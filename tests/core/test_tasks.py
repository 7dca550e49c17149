"""Task sets and task streams: the registry hook, ``load_object``'s errors, and the stream's
epochs, shuffles and ids over a JSONL file and over a named task set."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from areal.core.config import ConfigError
from areal.core.hookspecs import hookimpl
from areal.core.plugins import make_plugin_manager, registry
from areal.core.registry import RegistryError
from areal.core.tasks import TaskSet, TaskStream, load_object, task_set


def write_tasks(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def three_tasks(tmp_path: Path) -> str:
    return write_tasks(
        tmp_path / "tasks.jsonl",
        [
            json.dumps({"task_id": "first", "q": 0}),
            "",  # a blank line is skipped, but still counts as a line
            json.dumps({"q": 1}),
            json.dumps({"q": 2}),
        ],
    )


# --- TaskStream over a file ----------------------------------------------------------------------


def test_file_order_repeats_each_epoch_with_line_numbers_as_ids(three_tasks: str) -> None:
    stream = TaskStream(path=three_tasks, name=None, shuffle=False)
    got = [stream[i] for i in range(7)]
    assert [t["q"] for t in got] == [0, 1, 2, 0, 1, 2, 0]
    assert [t["task_id"] for t in got[:3]] == ["first", 3, 4]  # 1-based lines; line 2 is blank
    assert [t["task_index"] for t in got] == list(range(7))
    assert stream.epoch_size == 3


def test_each_epoch_is_the_permutation_of_random_seed_plus_epoch(tmp_path: Path) -> None:
    path = write_tasks(tmp_path / "t.jsonl", [json.dumps({"q": q}) for q in range(10)])
    stream = TaskStream(path=path, name=None, shuffle=True, seed=5)
    for epoch in range(3):
        expected = list(range(10))
        random.Random(5 + epoch).shuffle(expected)
        assert [stream[epoch * 10 + i]["q"] for i in range(10)] == expected
    first, second = ([stream[e * 10 + i]["q"] for i in range(10)] for e in (0, 1))
    assert first != second  # a fresh order each epoch, every task once per epoch
    again = TaskStream(path=path, name=None, shuffle=True, seed=5)
    assert [again[i] for i in (17, 3, 25)] == [stream[i] for i in (17, 3, 25)]  # any order


def test_iteration_is_endless_and_can_start_anywhere(three_tasks: str) -> None:
    stream = TaskStream(path=three_tasks, name=None, shuffle=False)
    tasks = stream.iter_from(5)
    assert [next(tasks)["task_index"] for _ in range(3)] == [5, 6, 7]
    assert next(iter(stream))["task_index"] == 0


def test_changing_a_returned_task_does_not_change_the_stream(three_tasks: str) -> None:
    stream = TaskStream(path=three_tasks, name=None, shuffle=False)
    stream[0]["q"] = "changed"
    assert stream[0]["q"] == 0


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["{nope"], r"t\.jsonl:1: not valid JSON"),
        (["{}", "[1, 2]"], r"t\.jsonl:2: a task must be a JSON object"),
        (["", "  "], "holds no tasks"),
    ],
)
def test_bad_files_name_the_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write_tasks(tmp_path / "t.jsonl", lines)
    with pytest.raises(ConfigError, match=message):
        TaskStream(path=path, name=None)


def test_a_stream_needs_exactly_one_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        TaskStream(path=None, name=None)
    with pytest.raises(ConfigError, match="exactly one"):
        TaskStream(path="x.jsonl", name="tool_then_answer")
    with pytest.raises(ConfigError, match="does not exist"):
        TaskStream(path=str(tmp_path / "missing.jsonl"), name=None)


# --- task sets -----------------------------------------------------------------------------------


def test_a_named_stream_asks_the_task_set() -> None:
    stream = TaskStream(path=None, name="tool_then_answer", seed=3)
    assert stream[41] == {**task_set("tool_then_answer").task(41, 3), "task_index": 41}
    assert stream.epoch_size is None


def test_an_unknown_task_set_lists_the_registered_ones() -> None:
    with pytest.raises(RegistryError, match=r"unknown task set 'nope'.*tool_then_answer"):
        task_set("nope")


def counting_task(index: int, seed: int) -> dict[str, int]:
    return {"task_id": index, "n": index + seed}


class CountingPlugin:
    @hookimpl
    def areal_register_task_sets(self, register):  # type: ignore[no-untyped-def]
        register("counting", TaskSet("counting", "n = index + seed", counting_task, "m:agent"))


def test_plugins_register_task_sets_through_the_hook() -> None:
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(CountingPlugin(), name="areal-counting")
    found = registry("task_sets", pm)
    assert {"counting", "tool_then_answer"} <= set(found.names())
    assert found.get("counting").task(2, 5) == {"task_id": 2, "n": 7}
    assert found.owners["tool_then_answer"] == "areal.plugins.tasks.register"
    pm.register(CountingPlugin(), name="areal-counting-again")
    with pytest.raises(RegistryError, match="areal-counting and by areal-counting-again"):
        registry("task_sets", pm)


# --- load_object ---------------------------------------------------------------------------------


def test_load_object_finds_modules_and_dotted_attributes() -> None:
    assert load_object("json:dumps") is json.dumps
    assert load_object("areal.core.tasks:TaskStream.iter_from") is TaskStream.iter_from
    agent = load_object(task_set("tool_then_answer").agent)
    assert callable(agent) and agent.__name__ == "agent"


@pytest.mark.parametrize("ref", ["json.dumps", "json:", ":dumps", ""])
def test_load_object_refuses_bad_syntax(ref: str) -> None:
    with pytest.raises(ConfigError, match=r"is not a 'package\.module:attribute' reference"):
        load_object(ref)


def test_load_object_says_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="no module named 'areal_nowhere'"):
        load_object("areal_nowhere.agents:agent")
    with pytest.raises(ConfigError, match=r"no module named 'areal\.core\.nowhere'"):
        load_object("areal.core.nowhere:agent")
    with pytest.raises(ConfigError, match="json has no attribute 'dumbs'"):
        load_object("json:dumbs")
    with pytest.raises(ConfigError, match=r"areal.core.tasks.TaskStream has no attribute 'nope'"):
        load_object("areal.core.tasks:TaskStream.nope")
    # A module that exists but fails on its own import is not reported as missing.
    (tmp_path / "areal_broken_agent.py").write_text("import areal_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "areal_broken_agent", raising=False)
    with pytest.raises(ConfigError, match="importing areal_broken_agent failed"):
        load_object("areal_broken_agent:agent")


# --- task files: Parquet and saved `datasets` datasets, through a column mapping ------------------

ROWS = [{"problem": "1 + 1?", "solution": "2"}, {"problem": "2 + 2?", "solution": "4"}]
COLUMNS = {"question": "problem", "answer": "solution"}


def test_a_parquet_file_is_read_through_its_column_mapping(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "tasks.parquet")
    stream = TaskStream(
        path=str(tmp_path / "tasks.parquet"), name=None, shuffle=False, columns=COLUMNS
    )
    assert stream[1] == {
        **ROWS[1],
        "task_id": 2,
        "question": "2 + 2?",
        "answer": "4",
        "task_index": 1,
    }


@pytest.mark.parametrize("as_dict", [False, True], ids=["dataset", "dataset-dict"])
def test_a_saved_datasets_dataset_is_read(tmp_path: Path, as_dict: bool) -> None:
    import datasets

    saved = datasets.Dataset.from_list(ROWS)
    (datasets.DatasetDict({"train": saved}) if as_dict else saved).save_to_disk(tmp_path / "d")
    stream = TaskStream(path=str(tmp_path / "d"), name=None, shuffle=False, columns=COLUMNS)
    assert [stream[i]["question"] for i in range(3)] == ["1 + 1?", "2 + 2?", "1 + 1?"]


def test_a_mapped_column_the_file_lacks_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in ROWS))
    with pytest.raises(
        ConfigError, match=r"dataset.columns.answer: .* has no column 'answer_text'"
    ):
        TaskStream(path=str(path), name=None, columns={"answer": "answer_text"})


def test_a_directory_that_is_no_saved_dataset_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no saved `datasets` dataset"):
        TaskStream(path=str(tmp_path), name=None)
