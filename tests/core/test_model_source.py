"""A model named by its Hub id: resolved in a real Hugging Face cache (the standard layout, in a
temporary HF_HOME) by the real huggingface_hub; offline, and with the Hub unreachable."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from areal.core.model_source import (
    ModelSourceError,
    cached_model,
    hub_cache_dir,
    hub_id,
    resolve_model,
    resolve_models,
)
from areal.core.run_config import run_config_from_dict


def test_a_hub_id_resolves_to_its_cached_snapshot(hub_model) -> None:
    assert hub_cache_dir() == str(hub_model.cache)
    path = resolve_model(hub_model.repo_id)
    assert Path(path) == hub_model.main
    assert (Path(path) / "config.json").is_file() and (Path(path) / "model.safetensors").is_file()
    assert cached_model(hub_model.repo_id) == path


def test_a_revision_after_at_picks_that_snapshot(hub_model) -> None:
    assert Path(resolve_model(f"{hub_model.repo_id}@v1")) == hub_model.tagged
    by_commit = resolve_model(f"{hub_model.repo_id}@{hub_model.tagged_commit}")
    assert Path(by_commit) == hub_model.tagged
    with pytest.raises(ModelSourceError, match="areal-test/nano@v2 is not in the cache"):
        resolve_model(f"{hub_model.repo_id}@v2")


def test_an_uncached_id_offline_says_what_to_do(hub_model) -> None:
    with pytest.raises(ModelSourceError) as err:
        resolve_model("Qwen/Qwen2.5-7B-Instruct")
    message = str(err.value)
    assert message.startswith("model.path: Qwen/Qwen2.5-7B-Instruct is not a local directory")
    assert f"not in the cache {hub_model.cache} while HF_HUB_OFFLINE is set" in message
    assert "`hf download Qwen/Qwen2.5-7B-Instruct`" in message
    assert "huggingface-cli download Qwen/Qwen2.5-7B-Instruct" in message
    assert "unset HF_HUB_OFFLINE" in message and "local checkpoint directory" in message
    assert cached_model("Qwen/Qwen2.5-7B-Instruct") is None


def test_the_cache_comes_from_the_environment_at_call_time(hub_model, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_model.cache.parent / "elsewhere"))
    with pytest.raises(ModelSourceError, match="elsewhere while HF_HUB_OFFLINE is set"):
        resolve_model(hub_model.repo_id)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_model.cache))
    assert Path(resolve_model(hub_model.repo_id)) == hub_model.main


def test_a_local_directory_stays_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "org" / "name"  # a directory that also reads as a Hub id
    model.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("org/name") == "org/name"
    assert resolve_model(str(model)) == str(model)


@pytest.mark.parametrize("spec", ["/no/such/dir", "./missing", "a/b/c", "org/na--me", "org/x@"])
def test_neither_a_directory_nor_a_hub_id_is_a_clear_error(spec: str) -> None:
    assert hub_id(spec) is None
    with pytest.raises(ModelSourceError) as err:
        resolve_model(spec, key="model.tokenizer")
    assert str(err.value).startswith(f"model.tokenizer: {spec!r} is neither a local directory")
    assert "Hugging Face Hub id (org/name, optionally @revision)" in str(err.value)


def test_a_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelSourceError, match=r"is a file; point model\.path at a checkpoint"):
        resolve_model(str(tmp_path / "config.json"))


def test_the_run_config_gets_local_directories(hub_model, tmp_path: Path) -> None:
    data = {"model": {"path": hub_model.repo_id, "tokenizer": f"{hub_model.repo_id}@v1"}}
    config = run_config_from_dict({**data, "dataset": {"name": "calculator"}})
    resolved = resolve_models(config)
    assert Path(resolved.model.path) == hub_model.main
    assert Path(resolved.model.tokenizer or "") == hub_model.tagged
    assert config.model.path == hub_model.repo_id  # the loaded config is not changed
    assert resolve_models(resolved) is resolved  # local already: nothing to do
    # model.init_tiny makes the model at model.path: a path, never looked up on the Hub.
    tiny = {"model": {"path": str(tmp_path / "m"), "init_tiny": "nano"}}
    tiny_config = run_config_from_dict({**tiny, "dataset": {"name": "calculator"}})
    assert resolve_models(tiny_config) is tiny_config


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_hub_without_offline_mode_is_a_clear_error(tmp_path: Path) -> None:
    # A fresh process: huggingface_hub reads HF_HUB_OFFLINE and HF_ENDPOINT at import.
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}")
    code = (
        "from areal.core.model_source import ModelSourceError, resolve_model\n"
        "try:\n    resolve_model('areal-test/absent')\n"
        "except ModelSourceError as err:\n    print(err)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    message = out.stdout.strip()
    assert message.startswith("model.path: the Hugging Face Hub is unreachable (")
    assert f"not in the cache {tmp_path / 'hf' / 'hub'}" in message
    assert "`hf download areal-test/absent`" in message and "local checkpoint" in message
