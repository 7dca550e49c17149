"""``areal config validate|show|schema``: exact outputs, exit codes, and no torch on the way."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from areal.cli.main import main, make_app
from areal.core.run_config import RunConfig, load_run_config

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

SEED = "configs/agent_async_train.yaml"
SEED_ERRORS = [
    "model and dataset: missing; give model.path (a checkpoint directory or Hub id) and "
    "dataset.path (a tasks JSONL) or dataset.name (a built-in task set), or take the embedded "
    "defaults of `areal train configs/quickstart.yaml`: --set model.path=runs/quickstart/model "
    "--set model.init_tiny=tiny --set dataset.name=calculator",
    "train.parallelism: dp 4 × tp 2 × pp 1 × cp 1 = 8 ranks but async.train_workers is 4: set "
    "async.train_workers=8 or make the product 4",
]
# The --sets of the seed file's header comment: areal's embedded defaults, one rank, one engine
# (tests/core/test_run_config.py checks the header says just these).
HEADER = [line for line in (ROOT / SEED).read_text().splitlines() if line.startswith("#")]
CPU_SETS = re.findall(r"--set (\S+)", "\n".join(HEADER))
QUICKSTART_WARNING = (
    "model.path: runs/quickstart/model does not exist; create a tiny model there with "
    "`areal model init-tiny runs/quickstart/model` or point it at a checkpoint"
)


@pytest.fixture(autouse=True)
def _no_gpu_in_a_fresh_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The same machine answers everywhere: a checkout with only configs/ (no model made by
    ``make demo``), no visible GPU, offline Hub, no API key."""
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "hf-home")  # an empty Hugging Face cache in tmp_path
    for name in ("TAOTOKEN_API_KEY", "AREAL_MODEL_PATH", "AREAL_DATASET", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)


def test_validate_seed_config_says_what_it_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    result = runner.invoke(make_app(), ["config", "validate", SEED, "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {
        "config": SEED,
        "kind": "run",
        "valid": False,
        "errors": SEED_ERRORS,
        "warnings": [],
    }
    assert main(["config", "validate", SEED]) == 1
    assert capsys.readouterr().err == f"error: {SEED}: {'; '.join(SEED_ERRORS)}\n"


def test_validate_seed_config_with_the_cpu_sets(capsys: pytest.CaptureFixture[str]) -> None:
    sets = [arg for value in CPU_SETS for arg in ("--set", value)]
    assert main(["config", "validate", SEED, *sets]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{SEED}: valid (1 warning about this machine)\n"
    assert captured.err == (
        "warning: agent.gateway_config: configs/taotoken_router.yaml: api_gateway.api_key: "
        "environment variable TAOTOKEN_API_KEY is not set (export TAOTOKEN_API_KEY=...)\n"
    )


def test_validate_prints_warnings_on_stderr() -> None:
    args = ["config", "validate", "configs/quickstart.yaml", "--set", "model.init_tiny=null"]
    result = runner.invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    assert result.stdout == "configs/quickstart.yaml: valid (1 warning about this machine)\n"
    assert result.stderr == f"warning: {QUICKSTART_WARNING}\n"


def test_validate_clean_config(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    args = ["config", "validate", "configs/quickstart.yaml", "--strict"]
    result = runner.invoke(make_app(), [*args, "--set", f"model.path={tmp_path / 'model'}"])
    assert result.exit_code == 0, result.output
    assert (result.stdout, result.stderr) == ("configs/quickstart.yaml: valid\n", "")


def test_validate_strict_fails_on_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["config", "validate", "configs/quickstart.yaml", "--strict"]
    assert main([*args, "--set", "model.init_tiny=null"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "configs/quickstart.yaml: valid (1 warning about this machine)\n"
    assert captured.err == (
        f"warning: {QUICKSTART_WARNING}\n"
        "error: configs/quickstart.yaml: this machine cannot run it (--strict)\n"
    )


def test_validate_errors_json_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["config", "validate", "configs/quickstart.yaml", "--set", "train.mini_batch_size=6"]
    result = runner.invoke(make_app(), [*args, "--set", "async.queue_max_size=8", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {
        "config": "configs/quickstart.yaml",
        "kind": "run",
        "valid": False,
        "errors": [
            "train.mini_batch_size: 6 does not divide train.global_batch_size 128; use a divisor "
            "such as 4",
            "async.trigger_batch_size: 128 is more than async.queue_max_size 8, so a step could "
            "never trigger; raise queue_max_size to at least 128",
        ],
        "warnings": [],
    }
    assert main(args) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "error: configs/quickstart.yaml: train.mini_batch_size: 6 does not divide "
        "train.global_batch_size 128; use a divisor such as 4\n"
    )


def test_validate_missing_file_and_unset_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["config", "validate", "no/such.yaml"]) == 1
    assert capsys.readouterr().err == "error: config file no/such.yaml does not exist\n"
    monkeypatch.delenv("AREAL_TEST_DATA", raising=False)
    path = tmp_path / "run.yaml"
    path.write_text("model: {path: m}\ndataset: {path: '${AREAL_TEST_DATA}'}\n")
    result = runner.invoke(make_app(), ["config", "validate", str(path), "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["errors"] == [
        f"{path}: dataset.path: environment variable AREAL_TEST_DATA is not set "
        "(export AREAL_TEST_DATA=...)"
    ]


ROUTER = "configs/taotoken_router.yaml"
KEY_WARNING = (
    "api_gateway.api_key: environment variable TAOTOKEN_API_KEY is not set "
    "(export TAOTOKEN_API_KEY=...)"
)
ROUTER_SUMMARY = (
    "upstream: https://taotoken.net/api\n"
    "policy: your-policy-model-id (policy_model, served by areal's engines)\n"
    "routed to the upstream: your-reward-model-id (reward_model), your-judge-model-id "
    "(judge_model)\n"
    "any other model id: refused, 404 model_not_found (nothing is sent)\n"
)


def test_validate_router_file_says_where_each_model_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = runner.invoke(make_app(), ["config", "validate", ROUTER])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{ROUTER}: valid router config (1 warning)\n" + ROUTER_SUMMARY
    assert result.stderr == f"warning: {KEY_WARNING}\n"  # unset key: a warning, not an error
    assert main(["config", "validate", ROUTER, "--strict"]) == 1
    assert capsys.readouterr().err == (
        f"warning: {KEY_WARNING}\nerror: {ROUTER}: the warnings above (--strict)\n"
    )


def test_validate_router_file_json(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = {
        "config": ROUTER,
        "kind": "router",
        "valid": True,
        "errors": [],
        "warnings": [KEY_WARNING],
        "upstream": "https://taotoken.net/api",
        "policy": "your-policy-model-id",
        "routes": {
            "policy_model": "your-policy-model-id",
            "reward_model": "your-reward-model-id",
            "judge_model": "your-judge-model-id",
        },
        "allow_unlisted_models": False,
    }
    result = runner.invoke(make_app(), ["config", "validate", ROUTER, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == expected
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-validate-0123456789")
    result = runner.invoke(make_app(), ["config", "validate", ROUTER, "--json", "--strict"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {**expected, "warnings": []}
    assert "sk-validate" not in result.output
    local = runner.invoke(make_app(), ["config", "validate", "configs/router.yaml"])
    assert local.exit_code == 0, local.output
    assert local.stdout.splitlines()[1:] == [
        "upstream: none (no api_gateway: only the policy is served)",
        "policy: areal-tiny (policy_model, served by areal's engines)",
    ]


def test_validate_router_file_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("api_gateway:\n  base_url: https://taotoken.net/api\n  retires: 3\n")
    result = runner.invoke(make_app(), ["config", "validate", str(path), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert (report["kind"], report["valid"]) == ("router", False)
    assert report["errors"] == [f"{path}: api_gateway.retires: unknown key (check its spelling)"]
    assert main(["config", "validate", str(path)]) == 1
    assert capsys.readouterr().err == (
        f"error: {path}: api_gateway.retires: unknown key (check its spelling)\n"
    )
    assert main(["config", "validate", ROUTER, "--set", "api_gateway.timeout=5"]) == 1
    assert "--set applies to run configs" in capsys.readouterr().err


def test_show_prints_the_resolved_config() -> None:
    result = runner.invoke(
        make_app(),
        ["config", "show", "configs/quickstart.yaml", "--set", "async.enabled=false"],
    )
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.stdout)
    assert shown["async"] == {
        "enabled": False,
        "rollout_workers": 1,
        "train_workers": 1,
        "staleness_threshold": 0,  # sync mode
        "queue_max_size": 256,
        "trigger_batch_size": 128,
        "overlap_sync": True,  # only acts in async mode
        "group_wait_s": 10.0,
    }
    expected = load_run_config("configs/quickstart.yaml", ["async.enabled=false"])
    assert shown == expected.model_dump(mode="json", by_alias=True)
    assert RunConfig.model_validate(shown) == expected  # what show prints loads back


def test_show_reports_errors_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "configs/quickstart.yaml", "--set", "train.lr=1"]) == 1
    assert capsys.readouterr().err == (
        "error: configs/quickstart.yaml: train.lr: unknown key; known keys: engine, device, "
        "parallelism, global_batch_size, mini_batch_size, learning_rate, max_steps, "
        "max_grad_norm, seed, cpu_affinity, activation_checkpointing, compile, param_dtype, "
        "reduce_dtype\n"
    )


def test_schema_is_the_run_config_schema() -> None:
    result = runner.invoke(make_app(), ["config", "schema"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == RunConfig.model_json_schema(by_alias=True)


NO_TORCH_SCRIPT = """
import sys
from typer.testing import CliRunner
from areal.cli.main import app

runner = CliRunner()
for args, code in (
    (["config", "--help"], 0),
    (["config", "validate", "--help"], 0),
    (["config", "validate", "configs/agent_async_train.yaml"], 1),
    (["config", "validate", "configs/agent_async_train.yaml", "--set", "model.path=m",
      "--set", "dataset.name=calculator", "--set", "async.train_workers=8"], 0),
    (["config", "validate", "configs/taotoken_router.yaml"], 0),
    (["config", "show", "configs/quickstart.yaml"], 0),
    (["config", "schema"], 0),
):
    result = runner.invoke(app, args)
    assert result.exit_code == code, (args, result.output)
heavy = sorted(m for m in ("torch", "transformers", "xgrammar", "sglang") if m in sys.modules)
print("heavy:", heavy)
"""


def test_config_commands_never_import_torch() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AREAL_")}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NO_TORCH_SCRIPT)],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path.cwd(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "heavy: []"
