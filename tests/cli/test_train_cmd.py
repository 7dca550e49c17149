"""``areal train`` without starting a run: --dry-run, config errors, and the seed's
``python -m areal.train --agent-config`` mapping of AGENT_CONFIG onto run config keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from areal.cli.main import main, make_app
from areal.core.config import ConfigError
from areal.run import train as entry

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_prints_the_resolved_config_and_the_processes() -> None:
    args = ["train", "configs/quickstart.yaml", "--dry-run", "--set", "async.rollout_workers=2"]
    args += ["--set", "inference.cpu_affinity=[0]", "--set", "async.staleness_threshold=3"]
    args += ["--set", "agent.cpu_affinity=[1]"]
    result = runner.invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    body, _, tail = result.stdout.rpartition("# plan (nothing is started):")
    assert yaml.safe_load(body)["async"]["rollout_workers"] == 2
    rows = [line.removeprefix("#   ") for line in tail.strip().splitlines()]
    assert [row.split()[0] for row in rows] == [
        "engine0", "gateway", "rollout0", "rollout1", "trainer", "output", "launcher",
    ]  # fmt: skip
    engine, gateway, rollout, _, trainer, output, launcher = rows
    assert launcher == "launcher   local: every process on this machine"
    assert "embedded on 127.0.0.1:<free port at start>, cpu (cores 0)" in engine
    assert "ZeroMQ queue" in gateway and "staleness_threshold 3 (cores 1)" in gateway
    assert "openai_sdk on task set calculator, 128 episodes at once (cores 1)" in rollout
    assert trainer.startswith("trainer    1 rank(s) (dp 1 tp 1 pp 1 cp 1 ep 1), fsdp on ")
    assert output.startswith("output     runs/quickstart (checkpoint every 20 steps")


def test_an_unpinned_agent_runs_beside_the_pinned_engine() -> None:
    """With the trainer and the engine pinned and ``agent.cpu_affinity`` unset, the gateway and
    the workers run on the engine's cores, leaving the trainer's core to the trainer
    (areal.run.processes.agent_cpus)."""
    args = ["train", "configs/quickstart.yaml", "--dry-run"]
    args += ["--set", "inference.cpu_affinity=[0]", "--set", "train.cpu_affinity=[1]"]
    result = runner.invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    rows = result.stdout.rpartition("# plan (nothing is started):")[2].strip().splitlines()
    gateway = next(r for r in rows if r.startswith("#   gateway"))
    rollout = next(r for r in rows if r.startswith("#   rollout0"))
    assert gateway.endswith("(cores 0)") and rollout.endswith("(cores 0)")


def test_dry_run_says_where_a_launcher_puts_each_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["train", "configs/quickstart.yaml", "--dry-run", "--launcher", "ray"]
    args += ["--set", "launcher.options={resources: {engine: {inference: 1}}}"]
    result = runner.invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    plan = result.stdout.rpartition("#   launcher   ray:")[2].strip().splitlines()
    assert [line.removeprefix("#     ") for line in plan] == [
        "engine0  -> Ray actor 'engine0' on a node with 1 CPU, 1 inference",
        "gateway  -> Ray actor 'gateway' on a node with 1 CPU",
        "rollout0 -> Ray actor 'rollout0' on a node with 1 CPU",
        "trainer  -> Ray actor 'trainer' on a node with 1 CPU",
        "the servers listen on 127.0.0.1: every node on one host (launcher.listen: loopback)",
    ]
    across = runner.invoke(make_app(), [*args, "--set", "launcher.listen=node"])
    assert across.stdout.rstrip().endswith(
        "#     the servers listen on their node's address (launcher.listen: node)"
    ), across.output
    assert main([*args[:5], "--set", "launcher.options={adress: x}"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: launcher.options.adress: ") and err.count("\n") == 1


def test_a_bad_config_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "configs/quickstart.yaml", "--set", "train.max_steps=0"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("error: configs/quickstart.yaml: train.max_steps:") and err.count("\n") == 1
    )


def test_agent_config_keys_become_run_config_keys(tmp_path: Path) -> None:
    agent = tmp_path / "agent_config.py"
    agent.write_text(
        "AGENT_CONFIG = {'model_base_url': 'http://elsewhere/v1', 'api_key': 'k', "
        "'model_name': 'gpt-x', 'max_turns': 3, 'entrypoint': 'my_agent:run'}\n"
    )
    assert entry.agent_config_overrides(agent) == [
        "agent.gateway_url=http://elsewhere/v1",
        "agent.max_turns=3",
        "agent.entrypoint=my_agent:run",
    ]
    config = entry.load("configs/quickstart.yaml", ["agent.max_turns=5"], str(agent))
    # --set wins over the agent config; the key and model name are per-episode, not kept; the
    # base URL names the gateway the run attaches to (its own URL, without /v1).
    assert (config.agent.max_turns, config.agent.entrypoint) == (5, "my_agent:run")
    assert config.agent.gateway_url == "http://elsewhere"
    seed = entry.load(
        "configs/quickstart.yaml", ["agent.gateway_url=http://localhost:9000/gateway/v1/"]
    )
    assert seed.agent.gateway_url == "http://localhost:9000"
    with pytest.raises(ConfigError, match=r"agent\.gateway_url"):
        entry.load("configs/quickstart.yaml", ["agent.gateway_url=localhost:9000"])
    (tmp_path / "bad.py").write_text("X = 1\n")
    with pytest.raises(ConfigError, match="must define AGENT_CONFIG"):
        entry.agent_config_overrides(tmp_path / "bad.py")
    with pytest.raises(ConfigError, match="does not exist"):
        entry.agent_config_overrides(tmp_path / "missing.py")


def test_the_seed_agent_config_names_the_gateway_and_max_turns() -> None:
    """The repo's agent_config.py, as the article writes it: its base URL names the gateway the
    run attaches to; the model name and key are the agent's own (replaced per episode)."""
    agent = ROOT / "agent_config.py"
    assert entry.agent_config_overrides(agent) == [
        "agent.gateway_url=http://localhost:9000/gateway/v1",
        "agent.max_turns=8",
    ]
    sets = ["model.path=m", "dataset.name=calculator", "async.train_workers=8"]
    config = entry.load("configs/agent_async_train.yaml", sets, str(agent))
    assert config.agent.gateway_url == "http://localhost:9000"
    assert config.agent.max_turns == 8 and config.agent.gateway_config == (
        "configs/taotoken_router.yaml"
    )
    assert "sk-..." not in config.to_yaml()  # the agent's key never lands in the run's config


def test_dry_run_on_slurm_prints_the_sbatch_script_it_would_submit(tmp_path: Path) -> None:
    """The same script ``submit`` writes (read back by Slurm's own sbatch in the cluster tests),
    and with ``launcher.listen: node`` the servers' addresses are their nodes'."""
    from areal.core.run_config import load_run_config
    from areal.plugins.launchers.slurm import SlurmOptions, sbatch_script

    sets = ["launcher.options={trainer_nodes: 2, inference_nodes: 1}", "launcher.listen=node"]
    args = ["train", "configs/quickstart.yaml", "--dry-run", "--launcher", "slurm"]
    args += [part for s in sets for part in ("--set", s)] + ["--output-dir", str(tmp_path)]
    result = runner.invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    plan, _, script = result.stdout.partition("# the script `areal train` would submit")
    assert "#   engine0    embedded on <its node's address>:<free port at start>" in plan
    config = load_run_config("configs/quickstart.yaml", [*sets, "launcher.name=slurm"])
    options = SlurmOptions(trainer_nodes=2, inference_nodes=1)
    expected = sbatch_script(config, tmp_path, tmp_path / "run" / "resolved.yaml", options)
    assert script.partition("):\n")[2].strip() == expected.strip()
    assert "#SBATCH --nodes=3" in expected and "--rdzv-backend c10d" in expected
