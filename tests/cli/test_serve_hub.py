"""``areal serve inference --model ID`` and the gateway's ``--model`` / ``--tokenizer`` take a
Hub id: served from its snapshot in a real Hugging Face cache (offline), or a clear error."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from areal.cli.main import main
from areal.core.model_source import ModelSourceError
from areal.gateway.server import serve
from areal.host.process import start_on_free_port, with_port


@pytest.mark.slow
def test_serve_inference_serves_a_hub_id_from_its_snapshot(hub_model, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "areal", "serve", "inference"]
    command += [
        "--model",
        hub_model.repo_id,
        "--max-total-tokens",
        "4096",
        "--log-level",
        "warning",
    ]
    proc = start_on_free_port(
        with_port(command),
        log_path=tmp_path / "serve.log",
        timeout=90,
        name="serve",
    )
    try:
        info = httpx.get(f"{proc.url}/model_info", timeout=10, trust_env=False).json()
    finally:
        proc.stop(timeout=20)
    assert Path(info["model_path"]) == hub_model.main
    assert Path(info["tokenizer_path"]) == hub_model.main


def test_serve_inference_with_an_uncached_id_says_what_to_do(
    hub_model, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "inference", "--model", "areal-test/absent"]) == 1
    err = capsys.readouterr().err
    assert "--model: areal-test/absent is not a local directory" in err
    assert "HF_HUB_OFFLINE is set" in err and "`hf download areal-test/absent`" in err


@pytest.mark.parametrize("option", ["model", "tokenizer"])
def test_the_gateway_stops_before_starting_on_an_uncached_id(hub_model, option: str) -> None:
    with pytest.raises(ModelSourceError, match=f"^--{option}: areal-test/absent is not a local"):
        serve(None, engines=["http://127.0.0.1:9"], **{option: "areal-test/absent"})
