"""Our SGLang command lines, parsed by SGLang's own ``prepare_server_args`` (the real package in
the venv ``make setup`` builds): a flag SGLang does not know, or a value it reads differently,
fails here rather than at start-up on a GPU machine. One probe subprocess parses every argv."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from areal.core.run_config import RunConfig
from areal.plugins.inference.sglang_backend import SGLangServerConfig, build_command, engine_command
from areal.run.processes import engine_child


def _argv(command: list[str]) -> list[str]:
    assert command[1:3] == ["-m", "sglang.launch_server"]
    return command[3:]


def _run_command(tmp_path: Path) -> list[str]:
    """What the run starts for engine 1 of a tp 2 SGLang run, via ``engine_child``."""
    config = RunConfig.model_validate(
        {
            "model": {"path": "m"},
            "dataset": {"name": "t"},
            "inference": {
                "backend": "sglang",
                "tp_size": 2,
                "max_total_tokens": 4096,
                "engine_args": ["--trust-remote-code"],
            },
            "train": {"seed": 10},
        }
    )
    child = engine_child(
        config, 1, model_dir=lambda: "/ckpt/step-3", version=lambda: 3, log_dir=tmp_path, threads=1
    )
    return child.command()


CASES: dict[str, tuple[list[str], dict[str, Any]]] = {
    "defaults": (
        build_command(SGLangServerConfig(model_path="/models/tiny")),
        {"model_path": "/models/tiny", "host": "127.0.0.1", "port": 30000, "tp_size": 1,
         "dp_size": 1, "dtype": "bfloat16", "random_seed": None, "weight_version": "default"},
    ),
    "engine options": (
        engine_command(
            {"model_path": "/ckpt/step-0", "host": "10.0.0.7", "port": 31001,
             "max_running_requests": 64,
             "weight_version": "0", "seed": 7, "log_level": "warning", "tp_size": 2,
             "max_total_tokens": 8192, "mem_fraction_static": 0.7}
        ),
        {"model_path": "/ckpt/step-0", "host": "10.0.0.7", "port": 31001,
         "max_running_requests": 64,
         "weight_version": "0", "random_seed": 7, "log_level": "warning", "tp_size": 2,
         "max_total_tokens": 8192, "mem_fraction_static": 0.7},
    ),
    "every key": (
        build_command(
            SGLangServerConfig(
                model_path="/ckpt/step-1", host="0.0.0.0", port=31000, dp_size=2, dtype="float16",
                context_length=8192, served_model_name="policy", skip_tokenizer_init=True,
                enable_metrics=True, api_key="sk-engine", extra_args=["--trust-remote-code"],
            )
        ),
        {"host": "0.0.0.0", "dp_size": 2, "dtype": "float16", "context_length": 8192,
         "served_model_name": "policy", "skip_tokenizer_init": True, "enable_metrics": True,
         "api_key": "sk-engine", "trust_remote_code": True},
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def parsed(
    sglang_probe: Callable[[dict[str, Any]], dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, Any]]:
    names = [*CASES, "run", "misspelled"]
    argvs = [_argv(command) for command, _ in CASES.values()]
    argvs.append(_argv(_run_command(tmp_path_factory.mktemp("logs"))))
    argvs.append(["--model-path", "/m", "--random-sead", "1"])
    return dict(zip(names, sglang_probe({"argvs": argvs})["argvs"], strict=True))


@pytest.mark.parametrize("case", list(CASES))
def test_sglang_parses_our_command_line(parsed: dict[str, dict[str, Any]], case: str) -> None:
    result = parsed[case]
    assert result["ok"], result.get("error")
    expected = CASES[case][1]
    assert {key: result["args"][key] for key in expected} == expected


def test_sglang_parses_the_runs_engine_command(parsed: dict[str, dict[str, Any]]) -> None:
    result = parsed["run"]
    assert result["ok"], result.get("error")
    args = result["args"]
    assert (args["model_path"], args["tp_size"], args["max_total_tokens"]) == (
        "/ckpt/step-3",
        2,
        4096,
    )
    assert args["random_seed"] == 11  # train.seed + engine index: engines sample differently
    assert args["weight_version"] == "3" and args["log_level"] == "warning"
    assert args["max_running_requests"] >= 64 and args["dtype"] == "bfloat16"
    assert args["trust_remote_code"] is True  # inference.engine_args, as given


def test_a_misspelled_flag_makes_sglang_exit(parsed: dict[str, dict[str, Any]]) -> None:
    result = parsed["misspelled"]
    assert not result["ok"] and result["exit_code"] == 2
    assert "unrecognized arguments: --random-sead" in result["error"]
