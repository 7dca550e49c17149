"""A supervised warm start: teach a fresh model the *format* of a task set's episodes, before RL.

A randomly initialised model never emits a well-formed tool call by chance, so RL alone gets no
reward to learn from. A short SFT on the task set's demonstrations fixes that. The demonstrations
show the format with random content (for ``tool_then_answer``: a call with random arguments), so
the model learns how an episode looks, and RL is left to learn what to put in it.

Conversations are rendered with the model's own chat template and tokenizer, exactly as the
gateway renders prompts, so the model learns the very tokens it will be asked to continue. The
loss covers the assistant turns only (their text, tool calls and closing ``<|im_end|>``): what the
policy generates in an episode, never what the user or the tool says.

The result is a full model directory (config, weights, tokenizer files) written atomically, with
``warm_start.json`` recording its inputs; a second call with the same inputs returns at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from areal.core.tasks import TaskSet
from areal.core.tasks import task_set as find_task_set
from areal.plugins.models.attention import CausalAttention, masked_attention
from areal.plugins.models.hf_io import INDEX_NAME, load_model, save_model

__all__ = ["RECORD_NAME", "render_demonstration", "warm_start"]

RECORD_NAME = "warm_start.json"
FORMAT_VERSION = 1  # bump when the recipe changes, so old caches are not reused
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def warm_start(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    task_set: str,
    steps: int = 100,
    batch_size: int = 16,
    learning_rate: float = 3e-3,
    seed: int = 0,
    num_threads: int | None = 1,
) -> Path:
    """Fine-tune ``model_dir`` on ``steps × batch_size`` demonstrations of ``task_set``; returns
    ``out_dir``.

    Step ``s`` trains on demonstrations ``s*batch_size ... (s+1)*batch_size - 1`` (seeded by
    ``seed``), with AdamW at a constant ``learning_rate``. The defaults suit the tiny model on
    ``tool_then_answer``: at 1e-3, 100 steps leave it making a valid call in ~12 % of episodes
    sampled at temperature 1; at 3e-3, ~90 %. ``num_threads`` sets torch's intra-op threads for
    the duration (a tiny model on a shared CPU gains little from more, and oversubscription
    costs a lot; None leaves torch's setting alone).

    Cached: when ``out_dir`` already holds a warm start of the same inputs (the source model's
    content, the demonstrations, the hyper-parameters), nothing is trained.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    source, out = Path(model_dir), Path(out_dir)
    tasks = find_task_set(task_set)
    demos = _demonstrations(tasks, steps * batch_size, seed)
    inputs = {
        "format": FORMAT_VERSION,
        "source_fingerprint": model_fingerprint(source),
        "task_set": task_set,
        "demonstrations_fingerprint": _digest(json.dumps(demos, sort_keys=True).encode()),
        "steps": steps,
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "seed": seed,
    }
    if _cached(out, inputs):
        return out
    with _threads(num_threads):
        began = time.perf_counter()
        model, losses = _train(source, demos, steps, batch_size, learning_rate)
        seconds = time.perf_counter() - began
    record = {
        "inputs": inputs,
        "source": str(source.resolve()),
        "seconds": round(seconds, 3),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,
    }
    _write_atomically(model, source, out, record)
    return out


def render_demonstration(tokenizer: Any, demo: dict[str, Any]) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of one demonstration: the chat template's rendering of the whole
    conversation, tokenized as one text (as the gateway tokenizes a prompt), with mask 1 on the
    tokens of each assistant turn, from after ``<|im_start|>assistant\\n`` through the end token.

    Each assistant turn's span is found by rendering the conversation up to it (with the
    generation prompt) and through it; a token crossing a span's edge is an error, since it would
    be neither prompt nor generation.
    """
    messages, tools = demo["messages"], demo.get("tools") or None
    eos = tokenizer.eos_token

    def render(upto: int, generation_prompt: bool) -> str:
        text = tokenizer.apply_chat_template(
            messages[:upto], tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(text)

    full = render(len(messages), False)
    spans: list[tuple[int, int]] = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, through = render(k, True), render(k + 1, False)
        if not (full.startswith(before) and full.startswith(through) and eos in through):
            raise ValueError(f"the chat template does not render turn {k} as a prefix")
        spans.append((len(before), through.rindex(eos) + len(eos)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = []
    for start, end in encoded["offset_mapping"]:
        inside = any(a <= start and end <= b for a, b in spans)
        if not inside and any(start < b and a < end for a, b in spans):
            raise ValueError(f"a token spans the edge of an assistant turn: {full[start:end]!r}")
        mask.append(int(inside))
    return list(encoded["input_ids"]), mask


def model_fingerprint(model_dir: Path) -> str:
    """A digest of a model directory's files (config, weights, tokenizer), by content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.iterdir() if p.is_file() and p.name != RECORD_NAME):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


# --- internals ------------------------------------------------------------------------------


def _demonstrations(tasks: TaskSet, n: int, seed: int) -> list[dict[str, Any]]:
    if tasks.demonstration is None:
        raise ValueError(f"task set {tasks.name!r} gives no demonstrations to warm start on")
    return [tasks.demonstration(i, seed) for i in range(n)]


def _train(
    source: Path,
    demos: list[dict[str, Any]],
    steps: int,
    batch_size: int,
    learning_rate: float,
) -> tuple[torch.nn.Module, list[float]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    rendered = [render_demonstration(tokenizer, demo) for demo in demos]
    model = load_model(source).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    losses: list[float] = []
    for step in range(steps):
        input_ids, targets, mask = _batch(rendered[step * batch_size : (step + 1) * batch_size])
        loss = _loss(model, input_ids, targets, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(round(loss.item(), 5))
    return model.eval(), losses


def _batch(rendered: list[tuple[list[int], list[int]]]) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded ``[B, S]`` ids, the next-token targets and their loss mask.

    Demonstrations of one task set have nearly one length, so padding wastes little, while
    plain causal attention over ``B`` rows of ``S`` costs ``B·S²``, against ``(B·S)²`` for one
    packed row. Causal attention never lets a real token see the padding after it.
    """
    width = max(len(ids) for ids, _ in rendered)
    input_ids = torch.zeros(len(rendered), width, dtype=torch.long)
    mask = torch.zeros(len(rendered), width, dtype=torch.bool)
    for row, (ids, loss_mask) in enumerate(rendered):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = torch.tensor(loss_mask, dtype=torch.bool)
    # Position t predicts token t + 1: shift the targets and their mask left by one.
    targets = torch.zeros_like(input_ids)
    targets[:, :-1] = input_ids[:, 1:]
    shifted = torch.zeros_like(mask)
    shifted[:, :-1] = mask[:, 1:]
    return input_ids, targets, shifted


def _loss(model: Any, input_ids: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """Mean negative log-likelihood of the masked targets.

    Two savings, both exact: the prefix all rows share (the system prompt with the tools, most of
    each demonstration) runs once, its keys and values reused by every row (:class:`_SharedPrefix`);
    and logits are computed only where a target counts (the vocabulary projection of every
    position would cost as much as the rest of a tiny model).
    """
    prefix = _shared_prefix_length(input_ids, mask)
    if prefix:
        attention = _SharedPrefix()
        model.hidden_states(input_ids[:1, :prefix], attention=attention)
        attention.suffix_mask(prefix, input_ids.shape[1] - prefix)
        positions = torch.arange(prefix, input_ids.shape[1]).expand(input_ids.shape[0], -1)
        input_ids, targets, mask = input_ids[:, prefix:], targets[:, prefix:], mask[:, prefix:]
        hidden = model.hidden_states(input_ids, positions, attention)[mask]  # [M, H]
    else:
        hidden = model.hidden_states(input_ids)[mask]
    logprobs = torch.log_softmax(model.lm_head(hidden).float(), dim=-1)
    return -logprobs.gather(-1, targets[mask][:, None]).mean()


def _shared_prefix_length(input_ids: Tensor, mask: Tensor) -> int:
    """Tokens every row starts with, up to the first position that predicts a trained token."""
    same = (input_ids == input_ids[:1]).all(dim=0)
    differs = (~same).nonzero()
    common = int(differs[0]) if len(differs) else input_ids.shape[1] - 1
    trained = mask.any(dim=0).nonzero()
    first_trained = int(trained[0]) if len(trained) else common
    return min(common, first_trained)


class _SharedPrefix:
    """An attention backend for two passes: the shared prefix as one ``[1, P]`` row (its keys and
    values kept per layer, in the autograd graph), then every row's suffix, attending to the
    prefix and causally to itself."""

    def __init__(self) -> None:
        self.kv: dict[int, tuple[Tensor, Tensor]] = {}
        self.mask: Tensor | None = None

    def suffix_mask(self, prefix: int, suffix: int) -> None:
        causal = torch.ones(suffix, suffix, dtype=torch.bool).tril()
        self.mask = torch.cat([torch.ones(suffix, prefix, dtype=torch.bool), causal], dim=1)[
            None, None
        ]

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.mask is None:
            self.kv[layer_idx] = (k, v)
            return CausalAttention().attend(layer_idx, q, k, v)
        prefix_k, prefix_v = self.kv[layer_idx]
        rows = q.shape[0]
        k = torch.cat([prefix_k.expand(rows, -1, -1, -1), k], dim=1)
        v = torch.cat([prefix_v.expand(rows, -1, -1, -1), v], dim=1)
        return masked_attention(q, k, v, self.mask)


def _cached(out: Path, inputs: dict[str, Any]) -> bool:
    try:
        record = json.loads((out / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return False
    return bool(record.get("inputs") == inputs)


def _write_atomically(model: Any, source: Path, out: Path, record: dict[str, Any]) -> None:
    """Write into a sibling temporary directory, then rename it into place: a crash leaves
    either the old directory or the new one, never half of one. Only a directory that is empty
    or an earlier warm start is replaced."""
    if out.exists() and any(out.iterdir()) and not (out / RECORD_NAME).is_file():
        raise FileExistsError(f"{out} is not empty and not a warm start; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    save_model(model, staging)
    for path in source.iterdir():
        if path.is_file() and not _is_weights_or_config(path):
            shutil.copy2(path, staging / path.name)
    (staging / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _is_weights_or_config(path: Path) -> bool:
    return (
        path.suffix in _WEIGHT_SUFFIXES
        or path.name in (INDEX_NAME, "config.json", RECORD_NAME)
        or path.name.endswith(".index.json")
    )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextmanager
def _threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
