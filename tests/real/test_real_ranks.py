"""The trainer on 2 ranks with the real checkpoint (SmolLM2-135M-Instruct, fp32): one RL step on
2 gloo ranks, started by areal's own torchrun command, equals the same step in one process.

- ``dp2``: FSDP2 over 2 ranks, each taking one sample of every minibatch;
- ``pp2``: 2 pipeline stages of 15 layers, the tied embedding and LM head one copy on each
  stage, their gradients summed between the two.

tp=2 and cp=2 are not layouts of this model: its 9 attention heads (3 key/value heads) do not
divide by 2, and :func:`~areal.plugins.trainer.parallel.parallelize.apply_tp` and
``check_cp`` refuse them (tp=3 would fit, on 3 ranks).

The samples are short chats in SmolLM2's own template, tokenized by its own tokenizer, trained on
the answer and its ``<|im_end|>``, their behaviour log-probs the model's own plus noise (a little
off-policy), with rewards that differ within each group of two. Two minibatches: the second runs
on weights the first moved. The optimizer is SGD, as in
tests/plugins/trainer/parallel/test_parity.py, so the parameters differ by lr × the gradients'
difference and their comparison means something.

This file is also the ranks' script (``__main__``): each rank loads the checkpoint, parallelizes
it in each layout and runs ``train_step``; the statistics and every full updated parameter come
back in ``OUT/<layout>-rank<R>.pt`` (:func:`_save_held`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from areal.core.types import Sample
from areal.plugins.models.hf_io import load_model
from areal.plugins.trainer.packing import pack
from areal.plugins.trainer.step import token_logprobs, train_step
from areal.run.launch import torchrun_command
from support import dist_worker

# Two torchrun ranks of a 135M-parameter model, each loading it.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

LAYOUTS: dict[str, dict[str, int]] = {"dp2": {"dp": 2}, "pp2": {"pp": 2}}
LR = 0.1  # clipped to a norm of 1: the second minibatch runs on moved weights, not wrecked ones
STEP: dict[str, Any] = {
    "mini_batch_size": 2,
    "current_version": 1,
    "max_grad_norm": 1.0,
    "behavior_weight_cap": 5.0,
}
SYSTEM = "Answer briefly."
CHATS = [  # (question, answer): groups of two answers to one question
    ("What is 7 times 8?", "56."),
    ("What is 7 times 8?", "It is 54."),
    ("Name a colour.", "Blue."),
    ("Name a colour.", "A colour is red."),
]
REWARDS = [1.0, 0.0, 0.0, 1.0]
# A parameter the step must move: the embedding, also the LM head (tied), held by both pp stages
WATCHED = "model.embed_tokens.weight"


def write_samples(model_dir: Path, out: Path) -> None:
    """The step's samples as JSON, from the real tokenizer and model: everything a rank needs."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows: list[dict[str, Any]] = []
    for (question, answer), reward in zip(CHATS, REWARDS, strict=True):
        chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        reply = [*tokenizer(answer, add_special_tokens=False)["input_ids"], end]
        mask = [0] * len(prompt) + [1] * len(reply)
        versions = [-1] * len(prompt) + [0] * len(reply)
        rows.append({"input_ids": prompt + reply, "loss_mask": mask, "versions": versions})
        rows[-1]["reward"] = reward
    samples = [
        Sample(r["input_ids"], r["loss_mask"], [0.0] * len(r["input_ids"]), r["versions"])
        for r in rows
    ]
    (p,) = pack(samples)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        lp = token_logprobs(load_model(model_dir), p) + 0.05 * torch.randn(
            p.n_tokens, generator=gen
        )
    for i, row in enumerate(rows):  # column t: the log-prob of token t + 1
        start = int(p.cu_seqlens[i])
        values = lp[start : start + len(row["input_ids"]) - 1].tolist()
        trained = zip(values, row["loss_mask"][1:], strict=True)
        row["logprobs"] = [0.0] + [v if m else 0.0 for v, m in trained]
    (out / "samples.json").write_text(json.dumps(rows))


def read_samples(out: Path) -> tuple[list[Sample], list[int]]:
    rows = json.loads((out / "samples.json").read_text())
    samples = [
        Sample(r["input_ids"], r["loss_mask"], r["logprobs"], r["versions"], r["reward"])
        for r in rows
    ]
    return samples, [i // 2 for i in range(len(samples))]


def single_process_step(model_dir: Path, out: Path) -> dict[str, Any]:
    """The step in this process: statistics, updated parameters, the watched one before it."""
    model = load_model(model_dir).train()
    before = model.state_dict()[WATCHED].clone()
    samples, groups = read_samples(out)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    stats = train_step(model, optimizer, samples, group_ids=groups, **STEP)
    return {"stats": stats, "params": dist_worker.full_parameters(model), "before": before}


def test_two_ranks_train_the_real_model_like_one_process(real_model: Any, tmp_path: Path) -> None:
    write_samples(real_model.path, tmp_path)
    command = torchrun_command(2, tmp_path / "unused.yaml", tmp_path, resume=False)
    launcher = command[: command.index("areal.run.train") - 1]  # torchrun and its flags
    done = subprocess.run(
        [*launcher, __file__, str(real_model.path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,  # a hang's bound, several times the launch
        env={**dist_worker.env(), "AREAL_DIST_TIMEOUT_S": "120"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    reference = single_process_step(real_model.path, tmp_path)
    ref, params = reference["stats"], reference["params"]
    assert ref["n_minibatches"] == 2 and ref["grad_norm"] > 0
    moved = float((params[WATCHED] - reference["before"]).abs().max())
    assert moved > 1e-3  # measured 0.015: not a comparison of two untouched models
    for layout in LAYOUTS:
        files = sorted(tmp_path.glob(f"{layout}-rank*.pt"))
        got: dict[str, Any] = {"params": {}}
        for f in files:  # rank 0's first: the statistics, and every parameter it holds
            part = torch.load(f)
            got["params"].update(part.pop("params"))
            got.update(part)
        stats = got["stats"]
        print(f"{layout}: " + " ".join(f"{k} {stats[k]:.9g}/{ref[k]:.9g}" for k in ref))
        for name in ("n_tokens", "n_valid_tokens", "n_minibatches"):
            assert stats[name] == ref[name], name
        # measured (dp2, pp2): loss 3e-5 and 1e-6 relative, grad_norm 1e-5 and 1e-6
        assert stats["loss"] == pytest.approx(ref["loss"], rel=1e-4, abs=1e-6)
        assert stats["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
        assert stats["behave_approx_kl"] == pytest.approx(ref["behave_approx_kl"], abs=1e-5)
        assert stats["clip_fraction"] == pytest.approx(ref["clip_fraction"], abs=1e-6)
        assert got["params"].keys() == params.keys()
        worst = max(float((got["params"][k] - v).abs().max()) for k, v in params.items())
        print(
            f"{layout}: parameters within {worst:.3g} (moved up to {moved:.3g}), {got['seconds']:.1f} s"
        )
        for name, expected in params.items():  # measured: 2e-6 (dp2), 1e-7 (pp2)
            torch.testing.assert_close(got["params"][name], expected, atol=1e-5, rtol=0, msg=name)


def _rank_main(model_dir: Path, out: Path) -> None:
    """One rank (torchrun's ``env://``): every layout of :data:`LAYOUTS` in turn."""
    import torch.distributed as dist

    from areal.plugins.trainer.parallel.parallel_dims import ParallelDims
    from areal.plugins.trainer.parallel.parallelize import parallelize
    from areal.plugins.trainer.parallel.pipeline import make_layout

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        samples, groups = read_samples(out)
        for name, sizes in LAYOUTS.items():
            start = time.perf_counter()
            mesh = ParallelDims(world_size=dist.get_world_size(), **sizes).build_mesh()
            model = parallelize(load_model(model_dir).train(), mesh)
            optimizer = torch.optim.SGD(model.parameters(), lr=LR)
            layout = make_layout(mesh)
            stats = train_step(model, optimizer, samples, group_ids=groups, layout=layout, **STEP)
            seconds = time.perf_counter() - start
            _save_held(model, out / f"{name}-rank{dist.get_rank()}.pt", stats, seconds)
            del model, optimizer
    finally:
        dist.destroy_process_group()


def _save_held(model: torch.nn.Module, path: Path, stats: dict[str, float], seconds: float) -> None:
    """Every parameter once, as a full tensor, over the ranks' files (a collective): rank 0's
    holds the step's statistics and the parameters it holds, another rank's those rank 0 lacks
    (a later pipeline stage's). Files, not ``dist_worker.full_parameters``: pickling 0.5 GB
    through gloo took 10 s of a 2-rank launch."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    names: list[Any] = [list(state)]
    dist.broadcast_object_list(names, src=0)
    if dist.get_rank() == 0:
        torch.save({"stats": stats, "params": state, "seconds": seconds}, path)
        return
    held = {k: v for k, v in state.items() if k not in set(names[0])}
    if held:
        torch.save({"params": held}, path)


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]), Path(sys.argv[2]))
