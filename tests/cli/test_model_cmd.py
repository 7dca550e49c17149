"""``areal model init-tiny`` and ``areal model info``: what they write, what they report, how they
refuse. Run through :func:`areal.cli.main.main`, the function behind ``python -m areal``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal.cli.main import main


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in err
    return lines[0]


def _tensor_sizes(model_dir: Path) -> dict[str, int]:
    """Element count per tensor, read straight from the safetensors files."""
    from safetensors import safe_open

    sizes: dict[str, int] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                sizes[name] = f.get_tensor(name).numel()
    return sizes


def test_init_tiny_json_and_info_json_describe_the_same_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "nano"
    code, stdout, err = _run(capsys, "model", "init-tiny", str(out), "--size", "nano", "--json")
    assert code == 0, err
    written = json.loads(stdout)
    assert written["family"] == "qwen3" and written["size"] == "nano"
    assert written["vocab_size"] == 4096 and written["seed"] == 0
    assert Path(written["path"]) == out.resolve()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        assert (out / name).is_file(), name

    code, stdout, err = _run(capsys, "model", "info", str(out), "--json")
    assert code == 0, err
    info = json.loads(stdout)
    config = json.loads((out / "config.json").read_text())
    sizes = _tensor_sizes(out)
    assert info["model_type"] == "qwen3" == config["model_type"]
    assert info["vocab_size"] == 4096 == config["vocab_size"]
    assert info["parameters"] == sum(sizes.values())
    # Tied embeddings: the checkpoint holds no lm_head, so the count is the model's own.
    assert "lm_head.weight" not in sizes
    assert info["parameters"] == written["parameters"]
    assert (info["hidden_size"], info["layers"], info["heads"], info["kv_heads"]) == (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    )
    assert (info["hidden_size"], info["layers"]) == (64, 2)
    assert info["shards"] == 1 and info["dtype"] == "float32"
    assert Path(info["path"]) == out.resolve()


def test_info_without_json_prints_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "nano"
    assert _run(capsys, "model", "init-tiny", str(out), "--size", "nano")[0] == 0
    code, stdout, _ = _run(capsys, "model", "info", str(out))
    assert code == 0
    params = str(sum(_tensor_sizes(out).values()))
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in stdout.splitlines()]
    rows = {row[0]: row[1] for row in cells if len(row) == 2}
    assert rows["model_type"] == "qwen3" and rows["parameters"] == params
    assert rows["vocab_size"] == "4096"
    with pytest.raises(json.JSONDecodeError):
        json.loads(stdout)


def test_non_empty_dir_is_refused_without_force_and_replaced_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model"
    assert _run(capsys, "model", "init-tiny", str(out), "--size", "nano", "--seed", "0")[0] == 0
    keep = out / "notes.txt"
    keep.write_text("mine")
    weights = (out / "model.safetensors").read_bytes()

    code, _, err = _run(capsys, "model", "init-tiny", str(out), "--size", "nano", "--seed", "1")
    assert code == 1
    line = _error_line(err)
    assert str(out) in line and "not empty" in line and "--force" in line
    assert keep.read_text() == "mine"  # nothing was touched
    assert (out / "model.safetensors").read_bytes() == weights

    code, stdout, err = _run(
        capsys, "model", "init-tiny", str(out), "--size", "nano", "--seed", "1", "--force", "--json"
    )
    assert code == 0, err
    assert json.loads(stdout)["seed"] == 1
    assert not keep.exists()  # --force replaces the directory, it does not merge into it
    assert (out / "model.safetensors").read_bytes() != weights  # new seed, new weights


def test_an_existing_empty_dir_needs_no_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    code, stdout, err = _run(capsys, "model", "init-tiny", str(out), "--size", "nano", "--json")
    assert code == 0, err
    assert json.loads(stdout)["parameters"] == sum(_tensor_sizes(out).values())


def test_info_on_a_missing_dir_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    code, stdout, err = _run(capsys, "model", "info", str(missing), "--json")
    assert code == 1 and stdout == ""
    line = _error_line(err)
    assert str(missing) in line and "config.json" in line


def test_unknown_size_is_one_clear_error(tmp_path: Path) -> None:
    """Typer rejects the size before any work; wide enough, the message fits on one line."""
    out = tmp_path / "huge-model"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AREAL_")}
    env.update(COLUMNS="200", TERMINAL_WIDTH="200", NO_COLOR="1")
    result = subprocess.run(
        [sys.executable, "-m", "areal", "model", "init-tiny", str(out), "--size", "huge"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2  # a usage error, as click reports it
    assert result.stdout == "" and "Traceback" not in result.stderr
    mentions = [line for line in result.stderr.splitlines() if "huge" in line]
    assert len(mentions) == 1, result.stderr
    assert "--size" in mentions[0]
    assert all(size in mentions[0] for size in ("'nano'", "'tiny'", "'small'"))
    assert not out.exists()
