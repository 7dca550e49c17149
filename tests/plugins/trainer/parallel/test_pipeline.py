"""Pipeline stages in one process: the layer split, pruning that keeps checkpoint names, the
stage chain reproducing the whole model's log-probs, and the refusals that name the key."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from areal.core.types import Sample
from areal.plugins.models.qwen3 import Qwen3ForCausalLM
from areal.plugins.models.tiny import tiny_config
from areal.plugins.trainer.packing import pack
from areal.plugins.trainer.parallel.pipeline import (
    _segments,
    check_schedule,
    split_stage,
    stage_ids,
    stage_layers,
)
from areal.plugins.trainer.step import token_logprobs


def _untied(layers: int = 3) -> Qwen3ForCausalLM:
    config = dataclasses.replace(
        tiny_config("nano"), tie_word_embeddings=False, num_hidden_layers=layers
    )
    model = Qwen3ForCausalLM(config)
    model.init_weights(generator=torch.Generator().manual_seed(0))
    return model


@pytest.mark.parametrize(
    ("layers", "stages", "expected"),
    [(4, 2, [[0, 1], [2, 3]]), (5, 2, [[0, 1, 2], [3, 4]]), (3, 3, [[0], [1], [2]])],
)
def test_stage_layers(layers: int, stages: int, expected: list[list[int]]) -> None:
    assert [list(stage_layers(layers, s, stages)) for s in range(stages)] == expected


def test_stages_chain_to_the_whole_model_with_its_names() -> None:
    whole = _untied()
    samples = [Sample([5, 6, 7, 8], [0, 1, 1, 1], [0.0] * 4, [-1, 0, 0, 0])]
    samples.append(Sample([9, 10, 11], [0, 0, 1], [0.0] * 3, [-1, -1, 0]))
    (batch,) = pack(samples)
    parts = [copy.deepcopy(whole) for _ in range(2)]
    stages = [split_stage(part, s, 2) for s, part in enumerate(parts)]
    names = set().union(*(part.state_dict() for part in parts))
    assert names == set(whole.state_dict())
    assert "model.layers.2.mlp.up_proj.weight" in parts[1].state_dict()
    assert "model.embed_tokens.weight" not in parts[1].state_dict()
    args = (
        batch.input_ids,
        batch.positions,
        _segments(batch)[None],
        batch.target_ids[None],
        batch.loss_mask.long()[None],
    )
    with torch.no_grad():
        out = stages[1](*stages[0](*args))
        expected = token_logprobs(whole, batch)
    torch.testing.assert_close(out[0], expected)


def test_a_tied_head_is_a_copy_on_the_last_stage() -> None:
    """The first stage keeps the embedding, the last the LM head, which is the same matrix."""
    first, last = Qwen3ForCausalLM(tiny_config("nano")), Qwen3ForCausalLM(tiny_config("nano"))
    last.load_state_dict(first.state_dict())
    embedding = first.model.embed_tokens.weight.detach().clone()
    split_stage(first, 0, 2)
    split_stage(last, 1, 2)
    assert first.lm_head is None and first.model.embed_tokens is not None
    assert last.model.embed_tokens is None
    assert torch.equal(last.lm_head.weight, embedding)


def test_refusals_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"train\.parallelism\.pp: 4 stages.*3 layers"):
        split_stage(_untied(3), 0, 4)


@pytest.mark.parametrize(
    ("rank", "per_rank", "style", "expected"),
    [(0, 1, "loop", [0]), (1, 2, "loop", [1, 3]), (0, 2, "v", [0, 3]), (1, 2, "v", [1, 2])],
)
def test_stage_ids(rank: int, per_rank: int, style: str, expected: list[int]) -> None:
    assert stage_ids(rank, 2, per_rank, style) == expected


def test_schedule_options_are_checked() -> None:
    with pytest.raises(ValueError, match="pipeline_schedule: 'nope' is unknown"):
        check_schedule("nope", 1)
    with pytest.raises(ValueError, match="pipeline_stages_per_rank: 1F1B runs one stage"):
        check_schedule("1F1B", 2)
    with pytest.raises(ValueError, match="unknown"):
        check_schedule("ZBV", 2)  # torch cannot run it forward-only
    check_schedule("Interleaved1F1B", 3)


def test_the_run_configs_schedules_are_the_pipelines() -> None:
    """The config names the schedules without importing torch; they must be these."""
    from typing import get_args

    from areal.core.run_config import SINGLE_STAGE_SCHEDULES, PipelineSchedule
    from areal.plugins.trainer.parallel import pipeline

    assert set(get_args(PipelineSchedule)) == set(pipeline.SCHEDULES)
    assert set(SINGLE_STAGE_SCHEDULES) == set(pipeline._SINGLE_STAGE)


def test_the_run_configs_train_options_reach_parallelize() -> None:
    from areal.core.run_config import run_config_from_dict
    from areal.plugins.trainer.parallel.parallelize import ParallelizeOptions
    from areal.plugins.trainer.ranks import describe_layout

    train = {
        "parallelism": {
            "dp": 2,
            "pp": 2,
            "pipeline_schedule": "ZeroBubble",
            "pipeline_stages_per_rank": 2,
        },
        "activation_checkpointing": True,
        "compile": True,
        "param_dtype": "bfloat16",
    }
    config = run_config_from_dict(
        {
            "model": {"path": "m"},
            "dataset": {"name": "tool_then_answer"},
            "train": train,
            "async": {"train_workers": 4},
        }
    )
    assert ParallelizeOptions.from_config(config.train) == ParallelizeOptions(
        activation_checkpointing=True,
        compile=True,
        param_dtype="bfloat16",
        reduce_dtype="float32",
        pipeline_schedule="ZeroBubble",
        pipeline_stages_per_rank=2,
    )
    assert describe_layout(config.train) == (
        "dp 2 × pp 2 (ZeroBubble, 2 stages per rank; activation checkpointing; compiled layers; "
        "compute in bfloat16, gradients reduced in float32)"
    )
