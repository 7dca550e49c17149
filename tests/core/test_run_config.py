"""The run config: the shipped configs load, each inconsistency names its key and the fix, and
what this machine lacks is reported separately as warnings."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from areal.core.config import ConfigError
from areal.core.plugins import registry
from areal.core.run_config import (
    EMBEDDED_DEFAULTS,
    RunConfig,
    RunConfigError,
    apply_overrides,
    load_run_config,
    parse_override,
)
from areal.run.machine import check_machine

BUILTIN_ADAPTERS = registry("adapters").names()  # the registry is the only list of them

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "configs" / "agent_async_train.yaml"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


@pytest.fixture(autouse=True)
def _in_a_fresh_checkout(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Relative paths in the configs (router files, model dirs) are read from the working
    directory: one holding only configs/, as a fresh checkout before ``make demo``."""
    checkout = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "configs", checkout / "configs")
    monkeypatch.chdir(checkout)
    for name in ("TAOTOKEN_API_KEY", "AREAL_MODEL_PATH", "AREAL_DATASET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def errors_of(overrides: list[str], path: Path = QUICKSTART) -> list[str]:
    with pytest.raises(RunConfigError) as err:
        load_run_config(path, overrides)
    assert str(err.value) == f"{path}: " + "; ".join(err.value.errors)
    return err.value.errors


# What the seed article's file lacks, borrowed from configs/quickstart.yaml, and a trainer layout
# that matches async.train_workers: the --sets its header comment gives to run it on a CPU.
CPU_SETS = [
    "model.path=runs/quickstart/model",
    "model.init_tiny=tiny",
    "dataset.name=calculator",
    "train.parallelism.dp=1",
    "train.parallelism.tp=1",
    "async.train_workers=1",
    "inference.backend=embedded",
    "inference.engines=1",
]
MISSING_MESSAGE = (
    "model and dataset: missing; give model.path (a checkpoint directory or Hub id) and "
    "dataset.path (a tasks JSONL) or dataset.name (a built-in task set), or take the embedded "
    "defaults of `areal train configs/quickstart.yaml`: --set model.path=runs/quickstart/model "
    "--set model.init_tiny=tiny --set dataset.name=calculator"
)
LAYOUT_MESSAGE = (
    "train.parallelism: dp 4 × tp 2 × pp 1 × cp 1 = 8 ranks but async.train_workers is 4: set "
    "async.train_workers=8 or make the product 4"
)
KEY_WARNING = (
    "agent.gateway_config: configs/taotoken_router.yaml: api_gateway.api_key: environment "
    "variable TAOTOKEN_API_KEY is not set (export TAOTOKEN_API_KEY=...)"
)


def test_seed_config_as_written_says_what_it_lacks_in_one_line_each() -> None:
    assert errors_of([], SEED) == [MISSING_MESSAGE, LAYOUT_MESSAGE]
    assert errors_of(["async.train_workers=8"], SEED) == [MISSING_MESSAGE]
    fixed_model = ["model.path=m", "dataset.name=calculator"]
    assert errors_of(fixed_model, SEED) == [LAYOUT_MESSAGE]


def test_seed_config_keeps_the_articles_values() -> None:
    config = load_run_config(
        SEED, ["model.path=m", "dataset.name=calculator", "async.train_workers=8"]
    )
    par = config.train.parallelism
    assert (config.train.engine, par.dp, par.tp, par.pp, par.cp, par.ep) == (
        "archon",
        4,
        2,
        1,
        1,
        1,
    )
    run = config.async_
    assert (run.enabled, run.rollout_workers) == (True, 4)
    assert (run.staleness_threshold, run.queue_max_size, run.trigger_batch_size) == (2, 1024, 64)
    assert config.agent.gateway_config == "configs/taotoken_router.yaml"
    assert (config.agent.framework, config.agent.max_turns, config.agent.reward_source) == (
        "openai_sdk",
        8,
        "rule",
    )
    assert (config.inference.backend, config.inference.engines) == ("sglang", 4)
    assert config.logging.log_dir == "./logs"
    assert config.train.learning_rate == 1e-6
    data = yaml.safe_load(SEED.read_text())
    assert "model" not in data and "dataset" not in data


def test_seed_config_with_the_cpu_sets_of_its_header_validates() -> None:
    header = [line for line in SEED.read_text().splitlines() if line.startswith("#")]
    assert re.findall(r"--set (\S+)", "\n".join(header)) == CPU_SETS
    config = load_run_config(SEED, CPU_SETS)
    assert (config.model.init_tiny, config.dataset.name) == ("tiny", "calculator")
    assert check_machine(config, gpus=0) == [KEY_WARNING]  # init_tiny makes the model


def test_embedded_defaults_are_the_quickstarts() -> None:
    quickstart = yaml.safe_load(QUICKSTART.read_text())
    for section, values in EMBEDDED_DEFAULTS.items():
        assert {k: quickstart[section][k] for k in values} == values, section


def test_a_missing_model_or_dataset_alone_is_named_alone(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model: {path: m}\n")
    assert errors_of([], path) == [
        "dataset: missing; give dataset.path (a tasks JSONL) or dataset.name (a built-in task "
        "set), or take the embedded defaults of `areal train configs/quickstart.yaml`: "
        "--set dataset.name=calculator"
    ]


def test_archon_is_the_fsdp_engine() -> None:
    engines = registry("engines")
    assert engines.get("archon") is engines.get("fsdp")
    assert engines.aliases() == {"archon": "fsdp"}
    assert engines.implementations() == ["fsdp"] and engines.names() == ["archon", "fsdp"]


def test_seed_config_on_a_gpu_node_with_its_files_has_no_warnings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "tasks.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "model").mkdir()
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-test-0000000000")
    sets = [f"model.path={tmp_path / 'model'}", f"dataset.path={tmp_path / 'tasks.jsonl'}"]
    config = load_run_config(SEED, [*sets, "async.train_workers=8"])
    assert check_machine(config, gpus=12) == []  # 8 trainer ranks + 4 SGLang engines
    assert check_machine(config, gpus=0) == [
        "inference.backend: sglang needs GPUs and this machine has none; use inference.backend: "
        "embedded or vllm to generate on CPU",
        "async.train_workers: 8 trainer ranks (dp×tp×pp×cp) + 4 inference engines "
        "(inference.engines) need 12 GPUs; this machine has 0",
    ]


def test_quickstart_config_loads_and_names_the_missing_model(tmp_path: Path) -> None:
    config = load_run_config(QUICKSTART)
    assert (config.async_.rollout_workers, config.async_.train_workers) == (1, 1)
    assert (config.inference.backend, config.train.device) == ("embedded", "cpu")
    assert check_machine(config, gpus=0) == []  # model.init_tiny creates it
    no_init = load_run_config(QUICKSTART, ["model.init_tiny=null"])
    assert check_machine(no_init, gpus=0) == [
        "model.path: runs/quickstart/model does not exist; create a tiny model there with "
        "`areal model init-tiny runs/quickstart/model` or point it at a checkpoint"
    ]
    (tmp_path / "model").mkdir()
    moved = load_run_config(
        QUICKSTART, [f"model.path={tmp_path / 'model'}", "model.init_tiny=null"]
    )
    assert check_machine(moved, gpus=0) == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["train.mini_batch_size=6"],
            "train.mini_batch_size: 6 does not divide train.global_batch_size 128; "
            "use a divisor such as 4",
        ),
        (
            ["async.trigger_batch_size=512"],
            "async.trigger_batch_size: 512 is more than async.queue_max_size 256, so a step "
            "could never trigger; raise queue_max_size to at least 512",
        ),
        (
            ["train.parallelism.dp=2", "train.parallelism.tp=2"],
            "train.parallelism: dp 2 × tp 2 × pp 1 × cp 1 = 4 ranks but async.train_workers is "
            "1: set async.train_workers=4 or make the product 1",
        ),
        (
            ["train.parallelism.dp=3", "train.parallelism.ep=2", "async.train_workers=3"],
            "train.parallelism.ep: 2 does not divide dp×cp = 3 (experts are sharded over "
            "data/context-parallel ranks); use a divisor of dp×cp",
        ),
        (
            [
                "train.parallelism.dp=4",
                "train.parallelism.dp_replicate=2",
                "train.parallelism.ep=4",
                "async.train_workers=4",
            ],
            "train.parallelism.ep: 4 does not divide (dp / dp_replicate)×cp = 2 (experts are "
            "sharded over data/context-parallel ranks); use a divisor of (dp / dp_replicate)×cp",
        ),
        (
            ["train.parallelism.dp=4", "train.parallelism.dp_replicate=3", "async.train_workers=4"],
            "train.parallelism.dp_replicate: 3 does not divide dp = 4 (HSDP shards within a "
            "replica group of dp / dp_replicate ranks); use a divisor of dp",
        ),
        (
            ["async.enabled=false", "train.global_batch_size=512", "train.mini_batch_size=8"],
            "async.queue_max_size: 256 cannot hold one sync batch of train.global_batch_size 512; "
            "raise it to at least 512",
        ),
        (
            ["algorithm.advantage=rloo", "algorithm.group_size=1"],
            "algorithm.group_size: rloo needs at least 2 samples per task (each is compared "
            "with the others); set group_size >= 2",
        ),
        (
            ["sampling.max_new_tokens=40000"],
            "sampling.max_new_tokens: 40000 exceeds inference.max_total_tokens 32768; "
            "lower it or raise the engine's capacity",
        ),
        (
            ["agent.reward_source=judge", "agent.gateway_config=null"],
            "agent.gateway_config: reward_source 'judge' calls the router's judge_model; set "
            "gateway_config to a router config whose model_routing has it",
        ),
        (
            ["launcher.name=slurm", "launcher.options={trainer_nodes: 2}"],
            "launcher.options.trainer_nodes: 2 nodes put the trainer's rank 0 (and the queue "
            "and weight group it serves) on any of them; set launcher.listen: node so the "
            "engines and the gateway reach it there",
        ),
        (
            ["launcher.listen=node"],
            "launcher.listen: node spreads the run over machines, but launcher.name is local "
            "(every process on this one); pick a launcher that places processes (ray, slurm) "
            "or keep listen: loopback",
        ),
        (
            ["dataset.path=tasks.jsonl"],
            "dataset: give exactly one of dataset.path (a tasks file) and dataset.name "
            "(a built-in task set)",
        ),
        (
            ["async.rollout_workers=0"],
            "async.rollout_workers: 0 runs no agent, and agent.online.enabled is false, so no "
            "episode would ever reach the trainer; set async.rollout_workers: 1 or more, or "
            "agent.online.enabled: true to train on the conversations of agents that call the "
            "run's gateway with AREAL_GATEWAY_KEY",
        ),
        (
            ["agent.gateway_url=http://localhost:9000", "agent.online.port=9100"],
            "agent.online.port: the port of the run's own gateway, but agent.gateway_url names "
            "one that runs on its own (its port is its own); drop agent.online.port",
        ),
    ],
)
def test_each_inconsistency_names_the_key_and_the_fix(overrides: list[str], expected: str) -> None:
    assert errors_of(overrides)[0] == expected


def test_online_agents_alone_are_a_run() -> None:
    """With agent.online on, no rollout worker is needed: the trainer trains on the online
    conversations the run's gateway records."""
    config = load_run_config(QUICKSTART, ["async.rollout_workers=0", "agent.online.enabled=true"])
    assert (config.async_.rollout_workers, config.agent.online.grouping) == (0, "pool")
    assert errors_of(["agent.online.grouping=task"])[0].startswith("agent.online.grouping: ")


def test_engine_args_may_not_move_the_engine() -> None:
    errors = errors_of(["inference.engine_args=[--port=9, --enable-prefix-caching]"])
    assert errors == [
        "inference.engine_args: --port is chosen by the run (it must know where each engine "
        "listens and what it serves); drop it from inference.engine_args"
    ]
    config = load_run_config(QUICKSTART, ["inference.engine_args=[--enable-prefix-caching]"])
    assert config.inference.engine_args == ["--enable-prefix-caching"]


def test_group_size_must_divide_the_batches() -> None:
    assert errors_of(["algorithm.group_size=6"]) == [
        "train.global_batch_size: 128 is not a multiple of algorithm.group_size 6 (grpo trains "
        "whole groups); use a multiple of 6",
        "async.trigger_batch_size: 128 is not a multiple of algorithm.group_size 6 (grpo trains "
        "whole groups); use a multiple of 6",
    ]
    # gae has no groups
    assert load_run_config(QUICKSTART, ["algorithm.group_size=6", "algorithm.advantage=gae"])


def test_unknown_keys_list_the_known_ones() -> None:
    assert errors_of(["train.parallelism.dq=2"]) == [
        "train.parallelism.dq: unknown key; did you mean dp? known keys: dp, tp, pp, cp, ep, "
        "dp_replicate, pipeline_schedule, pipeline_stages_per_rank"
    ]
    assert errors_of(["asyn.enabled=false"]) == [
        "asyn: unknown key; did you mean async? known keys: model, dataset, train, algorithm, "
        "sampling, inference, async, agent, logging, warm_start, launcher"
    ]


def test_wrong_types_and_ranges_name_the_key_and_the_value() -> None:
    assert errors_of(["async.train_workers=four", "sampling.top_p=1.5"]) == [
        "sampling.top_p: Input should be less than or equal to 1 (got 1.5)",
        "async.train_workers: Input should be a valid integer, unable to parse string as an "
        "integer (got 'four')",
    ]
    assert errors_of(["algorithm.prox_logp=exact"]) == [
        "algorithm.prox_logp: Input should be 'recompute', 'loglinear' or "
        "'loglinear_every_minibatch' (got 'exact')"
    ]


def test_a_missing_section_is_named(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("dataset: {name: x}\n")
    with pytest.raises(RunConfigError) as err:
        load_run_config(path)
    assert err.value.errors[0].startswith("model: missing; give model.path ")
    assert err.value.errors[1].startswith("dataset.name: unknown name 'x'")  # checked as well


def test_unknown_names_are_listed_against_the_known_ones() -> None:
    assert errors_of(["agent.framework=crewai", "algorithm.advantage=ppo"]) == [
        f"agent.framework: unknown name 'crewai'; known: {', '.join(sorted(BUILTIN_ADAPTERS))}",
        "algorithm.advantage: unknown name 'ppo'; known: gae, gigpo, grpo, rloo, turn",
    ]
    assert errors_of(["inference.backend=tensorrt"]) == [
        "inference.backend: unknown name 'tensorrt'; known: embedded, sglang, vllm"
    ]
    # Names can be left unchecked (a tool that only reads the file, without the plugins).
    assert load_run_config(QUICKSTART, ["agent.framework=crewai"], check_names=False)


def test_set_overrides_are_yaml_values() -> None:
    config = load_run_config(
        QUICKSTART,
        [
            "train.learning_rate=1e-5",
            "async.enabled=false",
            "agent.max_turns=3",
            "model.tokenizer=runs/tok",
            "logging.log_dir=/tmp/x=y",  # only the first = splits
        ],
    )
    assert config.train.learning_rate == 1e-5
    assert config.agent.max_turns == 3 and config.model.tokenizer == "runs/tok"
    assert config.logging.log_dir == "/tmp/x=y"
    # sync mode runs the same code with the staleness bound at 0, whatever the file says
    assert config.async_.enabled is False and config.async_.staleness_threshold == 0
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_override("a=") == (["a"], None)
    assert apply_overrides({}, ["x.y.z=on"]) == {"x": {"y": {"z": True}}}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "train.max_steps",
            "--set 'train.max_steps': write key=value, e.g. --set train.max_steps=10",
        ),
        ("train..x=1", "--set 'train..x=1': write key=value, e.g. --set train.max_steps=10"),
        (
            "train.max_steps.x=1",
            "--set 'train.max_steps.x=1': train.max_steps is a value, not a section",
        ),
    ],
)
def test_malformed_overrides(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_run_config(QUICKSTART, [override])
    assert str(err.value) == message


def test_unset_variable_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AREAL_TEST_MODEL_DIR", raising=False)
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  path: ${AREAL_TEST_MODEL_DIR}\ndataset:\n  name: calculator\n")
    with pytest.raises(ConfigError) as err:
        load_run_config(path)
    assert str(err.value) == (
        f"{path}: model.path: environment variable AREAL_TEST_MODEL_DIR is not set "
        "(export AREAL_TEST_MODEL_DIR=...)"
    )
    monkeypatch.setenv("AREAL_TEST_MODEL_DIR", "/models/m")
    assert load_run_config(path).model.path == "/models/m"


def test_defaults_of_a_minimal_config() -> None:
    config = RunConfig.model_validate({"model": {"path": "m"}, "dataset": {"name": "t"}})
    assert config.async_.staleness_threshold == 2 and config.async_.train_workers == 1
    assert config.algorithm.loss == "decoupled_ppo" and config.algorithm.prox_logp == "recompute"
    assert config.inference.backend == "embedded" and config.train.device == "auto"


def test_cuda_device_without_gpus_is_a_machine_warning() -> None:
    config = load_run_config(QUICKSTART, ["train.device=cuda", "model.path=."])
    assert check_machine(config, gpus=0) == [
        "async.train_workers: 1 trainer ranks (dp×tp×pp×cp) + 0 inference engines "
        "(inference.engines) need 1 GPUs; this machine has 0"
    ]
    assert check_machine(config, gpus=1) == []


def test_the_schema_uses_the_seed_key_names() -> None:
    schema = RunConfig.model_json_schema(by_alias=True)
    assert list(schema["properties"]) == [
        "model",
        "dataset",
        "train",
        "algorithm",
        "sampling",
        "inference",
        "async",
        "agent",
        "logging",
        "warm_start",
        "launcher",
    ]
    assert schema["required"] == ["model", "dataset"]
    json.dumps(schema)


def _all_keys(model: type, prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        key = f"{prefix}{field.alias or name}"
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            keys.extend(_all_keys(annotation, f"{key}."))
        else:
            keys.append(key)
    return keys


def test_every_key_is_documented() -> None:
    text = (ROOT / "docs" / "training.md").read_text()
    missing = [k for k in _all_keys(RunConfig) if not re.search(rf"`{re.escape(k)}`", text)]
    assert not missing, f"docs/training.md does not describe: {missing}"


def test_the_sharded_trainers_options_are_checked_against_each_other() -> None:
    """A one-stage schedule with several stages per rank, and a sharded-trainer option with one
    trainer worker (where it would do nothing), are refused naming the key and the fix."""
    assert errors_of(["train.parallelism.pipeline_stages_per_rank=2"]) == [
        "train.parallelism.pipeline_stages_per_rank: 1F1B runs one stage per rank, not 2; use "
        "pipeline_schedule Interleaved1F1B or ZeroBubble, or 1 stage per rank"
    ]
    assert errors_of(["train.activation_checkpointing=true"]) == [
        "train.activation_checkpointing: applies to the sharded trainer, which runs with "
        "async.train_workers > 1 (and train.parallelism to match); with one worker leave it at "
        "its default"
    ]
    assert errors_of(["train.parallelism.pipeline_schedule=ZBV"])[0].startswith(
        "train.parallelism.pipeline_schedule: "
    )
    sharded = ["async.train_workers=2", "train.parallelism.pp=2", "train.param_dtype=bfloat16"]
    config = load_run_config(QUICKSTART, [*sharded, "train.parallelism.pipeline_schedule=GPipe"])
    assert config.train.param_dtype == "bfloat16"
