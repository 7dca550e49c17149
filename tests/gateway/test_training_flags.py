"""``TrainingFlags.to_argv`` is the inverse of both front ends' parsing: what it writes,
``python -m areal.gateway.server`` (argparse) and ``areal serve gateway`` (typer) read back into
the same flags, defaults and non-defaults alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from areal.cli.serve_cmd import app as serve_app
from areal.gateway import server
from areal.gateway.training_flags import FLAGS, OPTION, TrainingFlags

CASES = [
    TrainingFlags(),
    TrainingFlags(
        sink="zmq",
        sink_address="tcp://127.0.0.1:5555",
        staleness_threshold=0,  # falsy, yet given
        trigger_batch_size=8,
        max_concurrent=16,
        start_version=3,
        start_consumed=40,
        start_dropped=2,
        episode_journal="/tmp/episodes.journal",
        discount=0.1,
        session_idle_timeout=0.0,
        online=True,
        online_idle_timeout=2.5,
        online_reward_wait=0.0,  # falsy, yet given
        online_grouping="prompt",
        online_group_window=30.0,
        online_group_size=4,
    ),
    TrainingFlags(sink="none", staleness_threshold=2, discount=0.97, session_idle_timeout=12.5),
    TrainingFlags(sink="jsonl", sink_address="/tmp/out.jsonl", max_concurrent=1),
]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What ``serve`` is called with, instead of serving."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(
        server, "serve", lambda config, **kw: calls.append({"config": config, **kw})
    )
    return calls


@pytest.mark.parametrize("flags", CASES, ids=["defaults", "zmq", "none", "jsonl"])
def test_the_argparse_front_end_reads_back_to_argv(
    flags: TrainingFlags, served: list[dict[str, Any]]
) -> None:
    assert server.main(["--engine", "http://127.0.0.1:9", *flags.to_argv()]) == 0
    assert served[-1]["training"] == flags


@pytest.mark.parametrize("flags", CASES, ids=["defaults", "zmq", "none", "jsonl"])
def test_the_typer_front_end_reads_back_to_argv(
    flags: TrainingFlags, served: list[dict[str, Any]], tmp_path: Path
) -> None:
    router = tmp_path / "router.yaml"
    router.write_text("{}\n")
    args = ["gateway", "--config", str(router), "--engine", "http://127.0.0.1:9"]
    result = CliRunner().invoke(serve_app, [*args, *flags.to_argv()])
    assert result.exit_code == 0, result.output
    assert served[-1]["training"] == flags


def test_to_argv_spells_each_flag_once_and_leaves_out_unset_ones() -> None:
    argv = CASES[1].to_argv()
    assert [a for a in argv if a.startswith("--")] == [flag.option for flag in FLAGS.values()]
    assert argv[argv.index("--staleness-threshold") + 1] == "0"
    assert argv[argv.index("--online") + 1] == "--online-idle-timeout"  # a switch takes no value
    assert OPTION["sink_address"] not in TrainingFlags().to_argv()
    assert OPTION["online"] not in TrainingFlags().to_argv()  # off: left out
    assert TrainingFlags().to_argv()[:2] == ["--sink", "jsonl"]


@pytest.mark.parametrize(
    ("flags", "option"),
    [
        (TrainingFlags(online_idle_timeout=0), "--online-idle-timeout"),
        (TrainingFlags(online_reward_wait=-1), "--online-reward-wait"),
        (TrainingFlags(online_grouping="task"), "--online-grouping"),
        (TrainingFlags(online_group_window=0), "--online-group-window"),
        (TrainingFlags(online_group_size=0), "--online-group-size"),
    ],
)
def test_bad_online_settings_are_refused_naming_the_flag(flags: TrainingFlags, option: str) -> None:
    with pytest.raises(ValueError, match=option):
        flags.check()
