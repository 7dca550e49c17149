"""``-o DIR`` puts the run's logs in ``DIR/logs`` unless the config or a ``--set`` names
``logging.log_dir`` (no shipped config does, examples included); a finished ``areal train`` prints its footprint (peak RSS of its processes,
the size of one checkpoint), and ``logging.keep_checkpoints`` bounds the checkpoints on disk.

The logs used to stay where the quickstart's file put them (``runs/quickstart/logs``) whatever
``-o`` said, so a second run of one config wrote into the first one's train.log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import areal
from areal.cli.main import make_app
from areal.core.run_config import load_run_config
from areal.host.footprint import disk_bytes
from areal.run.train import default_output_dir, with_log_dir
from support.runs import QUICKSTART

runner = CliRunner()


def test_no_shipped_config_pins_its_logs_and_examples_get_their_own_directory() -> None:
    root = Path(areal.__file__).parents[2]
    for path in [*root.glob("configs/*.yaml"), *root.glob("examples/*/config.yaml")]:
        logging = (yaml.safe_load(path.read_text()) or {}).get("logging") or {}
        if path.name != "agent_async_train.yaml":  # the design article's values, kept as is
            assert "log_dir" not in logging, f"{path} pins logging.log_dir: -o would not move it"
    assert default_output_dir("configs/quickstart.yaml") == Path("runs/quickstart")
    example = default_output_dir("examples/openai_math/config.yaml")
    assert example == Path("runs/examples/openai_math")  # not runs/config, shared by all
    assert default_output_dir("config.yaml") == Path("runs/config")


def test_an_unset_log_dir_follows_the_output_dir(tmp_path: Path) -> None:
    config = load_run_config(QUICKSTART)
    assert config.logging.log_dir is None  # the shipped quickstart leaves it to -o
    assert config.logging.directory(tmp_path / "o") == tmp_path / "o" / "logs"
    placed = with_log_dir(config, tmp_path / "o")
    assert placed.logging.log_dir == str(tmp_path / "o" / "logs")
    assert with_log_dir(placed, tmp_path / "elsewhere") == placed  # written out once, kept
    mine = load_run_config(QUICKSTART, [f"logging.log_dir={tmp_path / 'mine'}"])
    assert with_log_dir(mine, tmp_path / "o").logging.log_dir == str(tmp_path / "mine")


def _dry_run(*args: str) -> tuple[dict[str, object], str]:
    result = runner.invoke(make_app(), ["train", str(QUICKSTART), "--dry-run", *args])
    assert result.exit_code == 0, result.output
    body, _, plan = result.stdout.rpartition("# plan (nothing is started):")
    (output,) = [line for line in plan.splitlines() if line.startswith("#   output")]
    return yaml.safe_load(body)["logging"], output


def test_dry_run_puts_the_logs_under_the_output_dir_unless_set(tmp_path: Path) -> None:
    out = tmp_path / "o"
    logging, output = _dry_run("-o", str(out))
    assert logging["log_dir"] == str(out / "logs")
    assert output.endswith(f"; logs {out / 'logs'}")
    logging, output = _dry_run("-o", str(out), "--set", f"logging.log_dir={tmp_path / 'y'}")
    assert logging["log_dir"] == str(tmp_path / "y")  # the user's --set wins
    assert output.endswith(f"; logs {tmp_path / 'y'}")
    logging, output = _dry_run()
    assert logging["log_dir"] == str(Path("runs") / "quickstart" / "logs")  # the default -o


@pytest.mark.slow
@pytest.mark.serial
def test_a_run_logs_under_o_keeps_one_checkpoint_and_prints_its_footprint(tmp_path: Path) -> None:
    """One 2-step ``areal train`` of an example (``examples/openai_math``, whose config names no
    log directory) on a Parquet task file read through a column mapping, with ``-o``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"problem": f"What is {a} plus {b}?", "solution": str(a + b)} for a, b in [(1, 2), (3, 4)]
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "tasks.parquet")
    env = dict(os.environ)
    src = Path(areal.__file__).resolve().parents[1]  # the areal under test, and its examples
    env["PYTHONPATH"] = os.pathsep.join(
        [str(src), str(src.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    out = tmp_path / "o"
    sets = [
        f"dataset.path={tmp_path / 'tasks.parquet'}",
        "dataset.columns.question=problem",
        "dataset.columns.answer=solution",
        f"model.path={tmp_path / 'model'}",
        "model.init_tiny=nano",
        "train.max_steps=2",
        "train.global_batch_size=4",
        "train.mini_batch_size=4",
        "async.trigger_batch_size=4",
        "agent.concurrency=4",
        "sampling.max_new_tokens=8",
        "logging.save_interval=1",
        "logging.keep_checkpoints=1",
    ]
    config = src.parent / "examples" / "openai_math" / "config.yaml"
    command = [sys.executable, "-m", "areal", "train", str(config), "-o", str(out)]
    command += [arg for value in sets for arg in ("--set", value)]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    trained = [
        line
        for line in (out / "logs" / "train.log").read_text().splitlines()
        if line.startswith("[train] ")
    ]
    assert [line.split()[1] for line in trained] == ["step=1", "step=2"]
    assert all(" updated=4 " in f" {line} " for line in trained)  # the Parquet file's tasks
    assert not (tmp_path / "runs").exists()  # nothing in the config's default place

    # Checkpoints at steps 1 and 2 (and the final save); keep_checkpoints 1 leaves one.
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == ["step-000002"], kept

    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoint_bytes"] == disk_bytes(out / "checkpoints" / "step-000002")
    assert summary["checkpoint_bytes"] > 0 and summary["keep_checkpoints"] == 1
    # areal train, its engine, gateway and rollout worker, each at its own peak.
    assert summary["processes"] >= 4 and summary["peak_rss_bytes"] > 100 * 2**20
    (footprint,) = [line for line in done.stderr.splitlines() if line.startswith("footprint: ")]
    assert footprint.startswith("footprint: peak RSS ")
    assert f"({summary['processes']} processes, each one's peak summed)" in footprint
    assert "; one checkpoint " in footprint and "logging.keep_checkpoints 1 keeps ≤ " in footprint
