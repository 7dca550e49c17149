"""A tiny-model learning rate on a real checkpoint is warned about by ``areal config validate``,
``areal doctor`` and ``areal train`` (``--dry-run`` too), naming the key, the model's size and the
fix; areal's own tiny model gets no warning.

The real checkpoint is SmolLM2-135M-Instruct's ``config.json`` alone (its sizes as published: a
llama, hidden 576, 30 layers, MLP 1536, 9 heads, 3 KV heads, vocabulary 49152, tied embeddings):
the check reads shapes, never weights. The parameter count is checked against transformers' own
models, built on the meta device from the same configs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from areal.cli.main import main, make_app
from areal.core.run_config import load_run_config
from areal.run.model_scale import estimate_params, model_scale, scale_warnings

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

SMOLLM2_135M: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
}
TINY = {  # areal's tiny model (model.init_tiny: tiny), as its config.json says
    "model_type": "qwen3",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "intermediate_size": 384,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 4096,
    "tie_word_embeddings": True,
}
REAL = "the settings for this model"


def warning(key: str, rate: str, config_json: Path) -> str:
    return (
        f"{key}: {rate} is areal's tiny-model rate; on a 135M-parameter model ({config_json}) "
        f"it wrecks the pretrained weights within a few steps; use ≤ 1e-5, e.g. --set {key}=1e-5"
    )


@pytest.fixture(autouse=True)
def _a_fresh_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """configs/ only (no model made by ``make demo``), no GPU, an empty offline Hub cache."""
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)


def checkpoint(where: Path, config: dict[str, Any]) -> Path:
    where.mkdir(parents=True)
    (where / "config.json").write_text(json.dumps(config))
    return where


@pytest.fixture
def smollm(tmp_path: Path) -> Path:
    return checkpoint(tmp_path / "SmolLM2-135M-Instruct", SMOLLM2_135M)


def on(model: Path) -> list[str]:
    """The quickstart's --sets that point it at ``model``, a checkpoint that exists."""
    return ["--set", f"model.path={model}", "--set", "model.init_tiny=null"]


# --- the count -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "sizes"),
    [
        ("llama", SMOLLM2_135M),
        ("qwen2", {**TINY, "model_type": "qwen2", "tie_word_embeddings": False}),
        ("qwen3", TINY),
        (
            "qwen3_moe",
            {**TINY, "model_type": "qwen3_moe", "num_experts": 4, "moe_intermediate_size": 96},
        ),
    ],
)
def test_the_estimate_is_transformers_own_parameter_count(
    family: str, sizes: dict[str, Any]
) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shapes = {k: v for k, v in sizes.items() if k not in ("architectures", "model_type")}
    reference = AutoConfig.for_model(family, **shapes)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(reference)
    expected = sum(p.numel() for p in model.parameters())  # tied weights counted once
    assert estimate_params(reference.to_dict()) == expected
    if family == "llama":
        assert expected == 134_515_008  # SmolLM2-135M's published count


# --- the three commands ----------------------------------------------------------------------


def test_validate_warns_with_the_key_the_size_and_the_fix(
    smollm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["config", "validate", "configs/quickstart.yaml", *on(smollm)]
    assert main(args) == 0  # a warning, not an error
    out, err = capsys.readouterr()
    assert out == f"configs/quickstart.yaml: valid (2 warnings about {REAL})\n"
    config_json = smollm / "config.json"
    assert err == (
        f"warning: {warning('train.learning_rate', '1e-3', config_json)}\n"
        f"warning: {warning('warm_start.learning_rate', '3e-3', config_json)}\n"
    )
    result = runner.invoke(make_app(), [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["warnings"] == [
        warning("train.learning_rate", "1e-3", config_json),
        warning("warm_start.learning_rate", "3e-3", config_json),
    ]
    assert main([*args, "--strict"]) == 1
    assert capsys.readouterr().err.endswith(
        "error: configs/quickstart.yaml: the warnings above (--strict)\n"
    )


def test_validate_counts_machine_and_model_warnings_apart(
    smollm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["config", "validate", "configs/quickstart.yaml", *on(smollm)]
    args += ["--set", "dataset.path=missing.jsonl", "--set", "warm_start.steps=0"]
    args += ["--set", "dataset.name=null"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert out == (
        f"configs/quickstart.yaml: valid (2 warnings: 1 about this machine, 1 about {REAL})\n"
    )
    assert err.count("warning: ") == 2 and "warm_start" not in err  # no warm start, no warning


def test_dry_run_warns_and_estimates_a_checkpoint(smollm: Path, tmp_path: Path) -> None:
    args = ["train", "configs/quickstart.yaml", "--dry-run", *on(smollm), "-o", str(tmp_path / "o")]
    result = runner.invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    config_json = smollm / "config.json"
    assert result.stderr == (
        f"warning: {warning('train.learning_rate', '1e-3', config_json)}\n"
        f"warning: {warning('warm_start.learning_rate', '3e-3', config_json)}\n"
    )
    body, _, plan = result.stdout.rpartition("# plan (nothing is started):")
    assert yaml.safe_load(body)["train"]["learning_rate"] == 1e-3  # stdout stays the YAML + plan
    (output,) = [line for line in plan.splitlines() if line.startswith("#   output")]
    # 134,515,008 float32 parameters, each with AdamW's two moments: 3 × 4 bytes.
    assert "keep 2; each ≈ 1.5 GiB: 134.5M parameters and AdamW's 2 moments in float32)" in output


def test_doctor_reports_each_rate_as_a_warning(
    smollm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["doctor", "configs/quickstart.yaml", *on(smollm), "--json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    config_json = smollm / "config.json"
    for key, rate in (("train.learning_rate", "1e-3"), ("warm_start.learning_rate", "3e-3")):
        assert checks[key]["status"] == "warn"
        assert f"{key}: {checks[key]['why']}" == warning(key, rate, config_json)
    # The config is valid and this machine can run it; the rates are the only findings about it.
    assert checks["config configs/quickstart.yaml"]["status"] == "ok"


# --- what gets no warning --------------------------------------------------------------------


def test_the_tiny_model_gets_no_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quickstart = load_run_config("configs/quickstart.yaml")
    assert model_scale(quickstart) is None  # init_tiny will make it: tiny by definition
    assert scale_warnings(quickstart) == []
    tiny = checkpoint(tmp_path / "tiny", TINY)  # made already: read, and small
    made = load_run_config("configs/quickstart.yaml", [f"model.path={tiny}"])
    scale = model_scale(made)
    assert scale is not None and scale.params < 2_000_000
    assert scale_warnings(made) == []
    assert main(["config", "validate", "configs/quickstart.yaml", "--strict"]) == 0
    assert capsys.readouterr() == ("configs/quickstart.yaml: valid\n", "")
    result = runner.invoke(make_app(), ["train", "configs/quickstart.yaml", "--dry-run"])
    assert result.exit_code == 0 and result.stderr == "", result.output


def test_fine_tuning_rates_on_the_real_model_get_no_warning(smollm: Path) -> None:
    config = load_run_config(
        "configs/quickstart.yaml",
        [f"model.path={smollm}", "model.init_tiny=null", "train.learning_rate=2e-6"],
    )
    (only,) = scale_warnings(config)  # the warm start's 3e-3 is still the tiny model's
    assert only.startswith("warm_start.learning_rate: 3e-3 ")
    calm = config.model_copy(
        update={"warm_start": config.warm_start.model_copy(update={"steps": 0})}
    )
    assert scale_warnings(calm) == []  # no warm start: its rate is never used


def _hub_cache(home: Path, repo_id: str, config: dict[str, Any]) -> Path:
    """``repo_id`` as ``hf download`` leaves it in ``home``: refs/main -> a snapshot."""
    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return checkpoint(repo / "snapshots" / commit, config)


def test_a_hub_id_is_read_from_the_cache_and_never_downloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    real, asked = huggingface_hub.snapshot_download, []

    def no_network(*args: Any, **kwargs: Any) -> str:
        asked.append(args[0])
        assert kwargs.get("local_files_only"), "a check asked the Hub"
        return str(real(*args, **kwargs))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    snapshot = _hub_cache(tmp_path / "hf-home", "HuggingFaceTB/SmolLM2-135M-Instruct", SMOLLM2_135M)
    cached = load_run_config(
        "configs/quickstart.yaml",
        ["model.path=HuggingFaceTB/SmolLM2-135M-Instruct", "model.init_tiny=null"],
    )
    scale = model_scale(cached)
    assert scale is not None and scale.config_json == snapshot / "config.json"
    assert len(scale_warnings(cached)) == 2
    monkeypatch.delenv("HF_HUB_OFFLINE")  # online, and still nothing is fetched
    elsewhere = cached.model_copy(
        update={"model": cached.model.model_copy(update={"path": "HuggingFaceTB/SmolLM2-360M"})}
    )
    assert model_scale(elsewhere) is None and scale_warnings(elsewhere) == []
    assert set(asked) == {"HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-360M"}
