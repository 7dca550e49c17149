"""Hugging Face checkpoint directories <-> our modules: config.json plus safetensors, sharded or not.

Our parameter names equal the checkpoint names except routed experts, which we keep stacked
([E, out, in]) while checkpoints store one tensor per expert (``mlp.experts.3.up_proj.weight``)
or, as transformers 5 does in memory, a fused ``gate_up_proj``. Both are read; per-expert is written.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from areal.core.specs import ModelFamily
from areal.plugins.models.config import DecoderConfig
from areal.plugins.models.decoder import DecoderForCausalLM

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED_GATE_UP = re.compile(r"^(.*\.mlp\.experts)\.gate_up_proj$")


def family_for(model_type: str) -> ModelFamily:
    """The family registered for a Hugging Face ``model_type`` (plugins may add families)."""
    from areal.core.plugins import registry

    families = registry("model_families")
    for family in families.entries.values():
        if model_type in family.hf_model_types:
            return family
    known = sorted(t for f in families.entries.values() for t in f.hf_model_types)
    raise ValueError(f"no model family handles model_type {model_type!r}; known: {known}")


def read_config(model_dir: str | Path) -> DecoderConfig:
    """config.json parsed by the config class of the family that handles its ``model_type``."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{model_dir} has no config.json (expected a Hugging Face model dir)"
        )
    raw = json.loads(path.read_text())
    config_class: type[DecoderConfig] = family_for(str(raw.get("model_type"))).load_config_class()
    return config_class.from_hf_dict(raw)


def model_class_for(config: DecoderConfig) -> type[DecoderForCausalLM]:
    cls: type[DecoderForCausalLM] = family_for(config.model_type).load_model_class()
    return cls


def safetensors_files(model_dir: str | Path) -> list[Path]:
    model_dir = Path(model_dir)
    index = model_dir / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
            if not all(isinstance(n, str) for n in names):
                raise TypeError("file names must be strings")
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(
                f"{index} is not a safetensors index (a JSON object whose weight_map maps "
                f"tensor names to file names): {err!r}"
            ) from None
        return [model_dir / name for name in names]
    single = model_dir / SINGLE_NAME
    if single.is_file():
        return [single]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no *.safetensors weights")
    return files


def iter_checkpoint(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    for path in safetensors_files(model_dir):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    yield name, f.get_tensor(name)
        except SafetensorError as err:  # a truncated or corrupted file: not a crash
            raise ValueError(f"{path} is not a readable safetensors file: {err}") from None


def to_native(tensors: Iterator[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Checkpoint names -> our names (stacking per-expert tensors, splitting fused gate_up)."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[tuple[str, str], dict[int, torch.Tensor]] = defaultdict(dict)
    for name, tensor in tensors:
        if m := _PER_EXPERT.match(name):
            experts[(m.group(1), m.group(3))][int(m.group(2))] = tensor
        elif m := _FUSED_GATE_UP.match(name):
            gate, up = tensor.chunk(2, dim=1)
            out[f"{m.group(1)}.gate_proj"], out[f"{m.group(1)}.up_proj"] = gate, up
        else:
            out[name] = tensor
    for (prefix, proj), by_index in experts.items():
        if sorted(by_index) != list(range(len(by_index))):
            raise ValueError(f"checkpoint has a gap in the experts of {prefix}.{proj}")
        out[f"{prefix}.{proj}"] = torch.stack([by_index[i] for i in range(len(by_index))])
    return out


def to_checkpoint(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our names -> checkpoint names (one tensor per expert, as released checkpoints have)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        prefix, _, proj = name.rpartition(".")
        if prefix.endswith(".mlp.experts") and tensor.dim() == 3:
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.{proj}.weight"] = tensor[e]
        else:
            out[name] = tensor
    return out


def check_weights(
    model: DecoderForCausalLM,
    tensors: dict[str, torch.Tensor],
    *,
    source: str,
    complete: bool = True,
) -> dict[str, torch.Tensor]:
    """Check new tensors (our names) against the model: known names, same shapes, and all of them
    when ``complete``. Returns them without a tied ``lm_head.weight``; raises a ValueError naming
    ``source`` otherwise, before anything is copied, so a bad update changes nothing."""
    own = model.state_dict()
    tensors = dict(tensors)
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
        own.pop("lm_head.weight", None)
    unexpected = sorted(set(tensors) - set(own))
    missing = sorted(set(own) - set(tensors)) if complete else []
    if missing or unexpected:
        raise ValueError(
            f"{source} does not match the model: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    for name, tensor in tensors.items():
        if own[name].shape != tensor.shape:
            raise ValueError(
                f"{source}: {name} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(own[name].shape)}"
            )
    return tensors


def copy_weights(model: DecoderForCausalLM, tensors: dict[str, torch.Tensor]) -> None:
    """Copy checked tensors (see :func:`check_weights`) into the model's parameters in place."""
    own = model.state_dict()
    with torch.no_grad():
        for name, tensor in tensors.items():
            own[name].copy_(tensor)


def read_weights(model: DecoderForCausalLM, model_dir: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors, renamed to ours and checked against ``model``."""
    if not Path(model_dir).is_dir():
        raise ValueError(f"model_path {str(model_dir)!r} is not a directory")
    tensors = to_native(iter_checkpoint(model_dir))
    return check_weights(model, tensors, source=f"checkpoint {model_dir}")


def load_weights(model: DecoderForCausalLM, model_dir: str | Path) -> None:
    """Load a checkpoint's tensors into an existing model in place."""
    copy_weights(model, read_weights(model, model_dir))


def load_model(
    model_dir: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> DecoderForCausalLM:
    """Build the right family for a Hugging Face directory and load its weights."""
    config = read_config(model_dir)
    cls = model_class_for(config)
    with torch.device("meta"):
        model = cls(config)
    model.to_empty(device=device)
    model.reset_buffers()
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.to(dtype)
    load_weights(model, model_dir)
    return model.eval()


def save_model(
    model: DecoderForCausalLM,
    out_dir: str | Path,
    *,
    max_shard_bytes: int = 5 * 1024**3,
    dtype: torch.dtype | None = None,
) -> list[Path]:
    """Write config.json and safetensors (sharded with an index when over ``max_shard_bytes``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    tensors = {
        name: (t.to(dtype) if dtype is not None else t).contiguous().cpu()
        for name, t in to_checkpoint(state).items()
    }
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    for stale in out_dir.glob("*.safetensors"):
        stale.unlink()
    (out_dir / INDEX_NAME).unlink(missing_ok=True)
    paths: list[Path] = []
    metadata = {"format": "pt"}
    if len(shards) == 1:
        paths.append(out_dir / SINGLE_NAME)
        save_file(shards[0], str(paths[0]), metadata=metadata)
    else:
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards, start=1):
            fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out_dir / fname), metadata=metadata)
            paths.append(out_dir / fname)
            weight_map.update(dict.fromkeys(shard, fname))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    cfg = model.config
    if dtype is not None:
        cfg.torch_dtype = str(dtype).removeprefix("torch.")
    cfg.save(out_dir)
    return paths


def describe(model_dir: str | Path) -> dict[str, Any]:
    """What ``areal model info`` shows, read from config.json and safetensors headers only."""
    config = read_config(model_dir)
    n_params = 0
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118
                n_params += _numel(f.get_slice(name).get_shape())
    return {
        "path": str(Path(model_dir).resolve()),
        "model_type": config.model_type,
        "parameters": n_params,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "layers": config.num_hidden_layers,
        "heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads,
        "experts": config.num_experts,
        "dtype": config.torch_dtype,
        "shards": len(safetensors_files(model_dir)),
        **_import_record(model_dir),
    }


def _import_record(model_dir: str | Path) -> dict[str, Any]:
    """Where an imported checkpoint came from, and that its weights were dequantised."""
    record = Path(model_dir) / "areal_import.json"
    if not record.is_file():
        return {}
    found = json.loads(record.read_text())
    keep = ("source", "package", "quantisation", "note")
    return {f"imported_{key}": found[key] for key in keep if found.get(key)}


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
