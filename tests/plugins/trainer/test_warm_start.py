"""The format warm start: the loss mask covers exactly the assistant turns of the rendered chat,
the shared-prefix loss is the plain loss, training lowers it, and the output is a complete,
cached model directory."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from areal.core.tasks import TaskSet
from areal.plugins.models.hf_io import load_model
from areal.plugins.models.tiny import init_tiny
from areal.plugins.tasks.tool_then_answer import demonstration
from areal.plugins.trainer import warm_start as ws
from areal.plugins.trainer.warm_start import RECORD_NAME, render_demonstration, warm_start


@pytest.fixture(scope="module")
def nano(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("warm-start") / "nano"
    init_tiny(path, size="nano", seed=0)
    return path


@pytest.fixture(scope="module")
def tokenizer(nano: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(nano)


def masked_runs(tokenizer: Any, ids: list[int], mask: list[int]) -> list[str]:
    """The text of each run of consecutive masked tokens."""
    runs: list[list[int]] = []
    for i, (token, m) in enumerate(zip(ids, mask, strict=True)):
        if m:
            if i == 0 or not mask[i - 1]:
                runs.append([])
            runs[-1].append(token)
    return [tokenizer.decode(run) for run in runs]


def test_the_mask_covers_exactly_the_assistant_turns(tokenizer: Any) -> None:
    demo = demonstration(0, 0)
    x_y = demo["messages"][1]["tool_calls"][0]["function"]["arguments"]
    result = demo["messages"][3]["content"]
    ids, mask = render_demonstration(tokenizer, demo)
    text = tokenizer.apply_chat_template(demo["messages"], tools=demo["tools"], tokenize=False)
    assert ids == tokenizer.encode(text, add_special_tokens=False)  # as the gateway tokenizes
    assert masked_runs(tokenizer, ids, mask) == [
        f'<tool_call>\n{{"name": "add", "arguments": {x_y}}}\n</tool_call><|im_end|>',
        f"{result}<|im_end|>",
    ]
    # Everything else (system prompt with the tool, the question, the tool's result, the turn
    # headers, the newline after each <|im_end|>) is context.
    unmasked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert unmasked.endswith(
        "</tool_response><|im_end|>\n<|im_start|>assistant\n\n"
    )  # the two masked runs removed leave their headers and trailing newlines behind
    assert "What is" in unmasked and "# Tools" in unmasked


def test_the_shared_prefix_loss_equals_the_plain_loss(nano: Path, tokenizer: Any) -> None:
    rendered = [render_demonstration(tokenizer, demonstration(i, 0)) for i in range(6)]
    input_ids, targets, mask = ws._batch(rendered)
    assert 150 < ws._shared_prefix_length(input_ids, mask) < input_ids.shape[1]
    model = load_model(nano)
    shared = ws._loss(model, input_ids, targets, mask)
    shared.backward()
    shared_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    # The textbook loss: every position's logits, then the masked targets' mean NLL.
    logprobs = torch.log_softmax(model(input_ids), dim=-1)
    plain = -logprobs.gather(-1, targets[..., None])[..., 0][mask].mean()
    plain.backward()
    assert torch.allclose(shared, plain, atol=1e-5)
    plain_grads = [p.grad for p in model.parameters() if p.grad is not None]
    for a, b in zip(shared_grads, plain_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_warm_start_learns_writes_a_model_dir_and_caches(nano: Path, tmp_path: Path) -> None:
    out = tmp_path / "warm"
    options: dict[str, Any] = {"task_set": "tool_then_answer", "steps": 20, "batch_size": 4}
    assert warm_start(nano, out, **options) == out
    record = json.loads((out / RECORD_NAME).read_text())
    assert record["loss_last"] < record["loss_first"] / 2
    assert len(record["losses"]) == 20
    assert record["inputs"]["task_set"] == "tool_then_answer"
    assert record["inputs"]["source_fingerprint"] == ws.model_fingerprint(nano)
    assert (record["inputs"]["steps"], record["inputs"]["seed"]) == (20, 0)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (out / name).is_file(), name
    before, after = load_model(nano), load_model(out)
    assert not torch.equal(before.model.embed_tokens.weight, after.model.embed_tokens.weight)
    assert not list(tmp_path.glob(".warm.*"))  # no staging directory left behind

    written = (out / RECORD_NAME).stat().st_mtime_ns
    began = time.perf_counter()
    assert warm_start(nano, out, **options) == out
    assert time.perf_counter() - began < 2.0
    assert (out / RECORD_NAME).stat().st_mtime_ns == written  # a cache hit writes nothing

    warm_start(nano, out, **{**options, "steps": 2})  # other inputs: trained again, replaced
    assert json.loads((out / RECORD_NAME).read_text())["inputs"]["steps"] == 2


def test_warm_start_refuses_to_replace_a_directory_it_did_not_write(
    nano: Path, tmp_path: Path
) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a warm start"):
        warm_start(nano, tmp_path, task_set="tool_then_answer", steps=1, batch_size=1)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_a_task_set_without_demonstrations_cannot_warm_start(
    nano: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = TaskSet("bare", "no demonstrations", lambda i, s: {"task_id": i}, "m:agent")
    monkeypatch.setattr(ws, "find_task_set", lambda name: bare)
    with pytest.raises(ValueError, match="'bare' gives no demonstrations"):
        warm_start(nano, tmp_path / "out", task_set="bare", steps=1)
