"""``model.path`` as a Hub id through the run's real entry (``areal train``'s ``run``): resolved
once from a real Hugging Face cache (offline), the trainer and the engine start from the
snapshot, and the cache is never written; an uncached id stops the run before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal.core.run_config import RunConfig
from areal.run.checkpoint import latest_checkpoint
from areal.run.machine import check_machine
from areal.run.train import run
from support.runs import make_config


def hub_config(tmp: Path, model_path: str) -> RunConfig:
    """The tests' small run of one step on ``model_path`` (a Hub id or a folder), not a tiny
    model areal makes."""
    return make_config(tmp, model={"path": model_path, "init_tiny": None}, train={"max_steps": 1})


def _tree(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*"))}


@pytest.mark.serial
def test_a_run_trains_the_hub_model_from_its_cached_snapshot(hub_model, tmp_path: Path) -> None:
    before = _tree(hub_model.cache)
    out = tmp_path / "out"
    assert run(hub_config(tmp_path, hub_model.repo_id), out) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["version"] == 1
    checkpoint = latest_checkpoint(out)
    assert checkpoint is not None
    # The checkpoint carries the snapshot's tokenizer: the trainer started from the snapshot.
    for name in ("tokenizer.json", "generation_config.json"):
        saved = (checkpoint / "model" / name).read_bytes()
        assert saved == (hub_model.main / name).read_bytes()
    assert _tree(hub_model.cache) == before  # nothing downloaded, nothing written in the cache


def test_an_uncached_hub_id_stops_the_run_before_anything_starts(
    hub_model, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert run(hub_config(tmp_path, "areal-test/absent"), out) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: model.path: areal-test/absent is not a local directory")
    assert "HF_HUB_OFFLINE is set" in error and "`hf download areal-test/absent`" in error
    assert not out.exists()  # no process, no output directory


def test_the_machine_check_warns_only_about_an_uncached_hub_id(hub_model, tmp_path: Path) -> None:
    def model_warnings(path: str) -> list[str]:
        found = check_machine(hub_config(tmp_path, path), gpus=0)
        return [w for w in found if w.startswith("model.path")]

    assert model_warnings(hub_model.repo_id) == []
    assert model_warnings(f"{hub_model.repo_id}@v1") == []
    (warning,) = model_warnings("Qwen/Qwen3-0.6B")
    assert f"not in the Hugging Face cache {hub_model.cache}" in warning
    assert "`hf download Qwen/Qwen3-0.6B`" in warning
