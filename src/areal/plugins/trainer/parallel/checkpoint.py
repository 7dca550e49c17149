"""Checkpoints of a sharded trainer: DCP for resuming, Hugging Face safetensors for everyone else.

- :func:`save_distributed` / :func:`load_distributed`: ``torch.distributed.checkpoint`` of the
  model, the optimizer and the step. Every rank writes its own shards; loading plans the reads
  against the *current* layout, so a run saved with dp=2×tp=2 resumes with dp=4 (resharding).
- :func:`export_hf`: the full weights gathered to rank 0 and written by :func:`hf_io.save_model`
  (config.json + safetensors), loadable by transformers and the inference engines.
- :func:`load_hf`: a Hugging Face directory straight into a sharded model (each rank keeps its
  shards of the full tensors).

All are collectives: every rank of the mesh calls them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from areal.plugins.models.decoder import DecoderForCausalLM
from areal.plugins.models.hf_io import iter_checkpoint, model_class_for, save_model, to_native

__all__ = ["export_hf", "load_distributed", "load_hf", "save_distributed"]


# The optimizer's state flattened to one entry per parameter name, its hyperparameters too
# (``param_groups.<name>.lr``), as torchtitan saves it: pipeline stages hold different parameters,
# and a group saved by its index (``param_groups.0``) would be one rank's, its ``params`` naming
# that stage's parameters, so every other stage loaded its group without lr, betas, eps.
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
# A tied matrix's two names: a pipeline's last stage saves the head's state under the embedding's.
HEAD, EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"


def save_distributed(
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int
) -> None:
    """Write model, optimizer and step as a DCP checkpoint directory (every rank its shards)."""
    model_state, optim_state = get_state_dict(model, optimizer, options=FLAT)
    if _holds_tied_copy(model):
        optim_state = _renamed(optim_state, HEAD, EMBEDDING)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state, "step": step}
    dcp.save(state, checkpoint_id=str(path))


def load_distributed(
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> int:
    """Load a :func:`save_distributed` checkpoint into ``model``/``optimizer`` in whatever layout
    they have now; return the saved step. A checkpoint of an earlier areal (groups by index,
    never right for a pipeline) still loads as it was saved."""
    if not Path(path).is_dir():
        raise FileNotFoundError(f"no distributed checkpoint at {path}")
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    options = StateDictOptions() if "optim.param_groups.0.params" in saved else FLAT
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    copy = options is FLAT and _holds_tied_copy(model)
    if copy:
        optim_state = _renamed(optim_state, HEAD, EMBEDDING)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state, "step": 0}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=_renamed(state["optim"], EMBEDDING, HEAD) if copy else state["optim"],
        options=options,
    )
    return int(state["step"])


def _holds_tied_copy(model: torch.nn.Module) -> bool:
    """Whether this rank holds a tied LM head without its embedding (a pipeline's last stage).
    Its optimizer state is saved under the embedding's name, as one process saves a tied
    matrix's, so a checkpoint resumes with or without a pipeline (the first stage's copy is the
    same values, and DCP keeps one)."""
    if not isinstance(model, DecoderForCausalLM) or not model.config.tie_word_embeddings:
        return False
    return model.lm_head is not None and model.model.embed_tokens is None


def _renamed(optim_state: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """A flattened optimizer state (``state.<name>.exp_avg``, ``param_groups.<name>.lr``) with
    the parameter ``old`` named ``new``."""
    out = {}
    for key, value in optim_state.items():
        for prefix in ("state.", "param_groups."):
            if key.startswith(f"{prefix}{old}."):
                key = f"{prefix}{new}{key[len(prefix) + len(old) :]}"
        out[key] = value
    return out


def export_hf(model: DecoderForCausalLM, out_dir: str | Path) -> None:
    """Gather the full weights to rank 0 and write a Hugging Face directory there."""
    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if dist.get_rank() == 0:
        # A plain copy on rank 0 reuses save_model's naming and sharding of the files.
        with torch.device("meta"):
            plain = model_class_for(model.config)(model.config)
        plain.to_empty(device="cpu")
        if model.config.tie_word_embeddings:
            plain.lm_head.weight = plain.model.embed_tokens.weight
        plain.load_state_dict(full)
        save_model(plain, out_dir)
    dist.barrier()


def load_hf(model: DecoderForCausalLM, model_dir: str | Path) -> None:
    """Load a Hugging Face checkpoint into a (sharded) model: every rank reads the files and
    keeps its own shards; a pipeline stage skips the other stages' weights (any other name the
    model lacks is still an error)."""
    tensors: dict[str, Any] = dict(to_native(iter_checkpoint(model_dir)))
    if model.config.tie_word_embeddings:
        tensors.setdefault("lm_head.weight", tensors["model.embed_tokens.weight"])
    for name in _other_stages_names(model, tensors):
        del tensors[name]
    set_model_state_dict(model, tensors, options=StateDictOptions(full_state_dict=True))


def _other_stages_names(model: DecoderForCausalLM, tensors: dict[str, Any]) -> list[str]:
    """The names in ``tensors`` that the whole model has and this (pipeline-pruned) one does
    not: the weights of the stages other ranks hold."""
    own = set(model.state_dict())
    if own >= tensors.keys():
        return []
    with torch.device("meta"):
        whole = set(model_class_for(model.config)(model.config).state_dict())
    return [name for name in tensors if name not in own and name in whole]
