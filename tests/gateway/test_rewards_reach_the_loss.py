"""Every reward reaches the loss: a per-turn reward, the episode reward and the discount, set
through a real gateway process, arrive over the real ZeroMQ queue, and the advantages the loss is
handed in a real training step are the hand-computed GRPO values of the discounted returns. A
discarded member of the group reaches the trainer as a tombstone, so the group trains at once."""

from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from areal.core.registry import Registry
from areal.host.process import start_on_free_port, with_port
from areal.plugins.inference.embedded.server import InferenceServer
from areal.plugins.losses.ppo import decoupled_ppo_loss
from areal.plugins.losses.register import BUILTIN_LOSSES, LazyFunction
from areal.plugins.models.hf_io import load_model
from areal.plugins.queues.zmq_queue import ZmqTrajectorySource
from areal.plugins.trainer.engine import Policy
from areal.plugins.trainer.weight_sync import DiskWeightSync
from areal.run.loop import TrainerLoop
from support.http import bearer, chat_completion

SERVER = [sys.executable, "-m", "areal.gateway.server"]
ADMIN = "rewards-admin-token-0123456789"
HEADERS = bearer(ADMIN)


def episode(url: str, turn_reward: float | None, reward: float | None, discard: bool) -> None:
    """One member of group ``g`` (3 members): two unmerged turns, rewards, end."""
    meta = {"group": "g", "group_size": 3}
    opened = httpx.post(f"{url}/rl/sessions", headers=HEADERS, json={"metadata": meta}).json()
    sid, key = opened["session_id"], opened["api_key"]
    first = chat_completion(url, key, "What is 2 + 2?")["id"]
    chat_completion(url, key, "Another question entirely")  # not a continuation: a second sample
    if turn_reward is not None:
        body = {"reward": turn_reward, "completion_id": first}
        resp = httpx.post(f"{url}/rl/sessions/{sid}/reward", headers=HEADERS, json=body)
        assert resp.status_code == 200, resp.text
    end = {"discard": True} if discard else {"reward": reward}
    resp = httpx.post(f"{url}/rl/sessions/{sid}/end", headers=HEADERS, json=end)
    assert resp.status_code == 200, resp.text


@pytest.mark.serial  # a gateway process, a ZeroMQ queue and a training step
def test_turn_rewards_and_discount_reach_the_advantages(
    engine: tuple[str, InferenceServer], gateway_model_dir: str, tmp_path: Path
) -> None:
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def recording_loss(**kwargs: Any) -> Any:
        if kwargs["loss_mask"].numel() > 4:  # not the step's 4-token probe of the loss
            seen.append((kwargs["advantages"].detach().clone(), kwargs["loss_mask"].clone()))
        return decoupled_ppo_loss(**kwargs)

    losses: Registry[Any] = Registry("loss")
    for name, path in BUILTIN_LOSSES.items():
        losses.add(name, recording_loss if name == "decoupled_ppo" else LazyFunction(path), "t")
    model = load_model(gateway_model_dir)
    policy = Policy.of(
        model, torch.optim.AdamW(model.parameters()), mini_batch_size=8, losses=losses
    )
    router = tmp_path / "router.yaml"
    router.write_text("model_routing:\n  policy_model: {model_id: areal-tiny, max_tokens: 4}\n")
    with ZmqTrajectorySource("tcp://127.0.0.1:*") as source:
        command = [*SERVER, "--config", str(router), "--engine", engine[0]]
        command += ["--log-dir", str(tmp_path / "logs"), "--sink", "zmq"]
        command += ["--sink-address", source.address, "--discount", "0.5"]
        with start_on_free_port(
            with_port(command),
            log_path=tmp_path / "gw.out",
            timeout=120,
            env={"AREAL_ADMIN_TOKEN": ADMIN},
            name="gw",
        ) as proc:
            assert proc.url is not None
            url = proc.url
            episode(url, turn_reward=0.2, reward=1.0, discard=False)
            episode(url, turn_reward=0.1, reward=0.0, discard=False)
            episode(url, turn_reward=0.9, reward=1.0, discard=True)  # a tombstone, no samples
            loop = TrainerLoop(
                policy,
                source,
                DiskWeightSync([], tmp_path / "weights"),
                trigger_batch_size=2,
                staleness_threshold=10,
            )
            history = asyncio.run(loop.run(max_steps=1))

    # Returns (discount 0.5): the turn-1 sample gets its turn reward plus the discounted
    # episode reward, the turn-2 sample the episode reward: [0.2 + 0.5 * 1.0, 1.0] and
    # [0.1 + 0.5 * 0.0, 0.0].
    returns = [0.7, 1.0, 0.1, 0.0]
    mean, std = statistics.mean(returns), statistics.stdev(returns)  # GRPO: unbiased std
    expected_per_sample = [(r - mean) / (std + 1e-6) for r in returns]
    assert history[0]["updated"] == 4.0 and history[0]["groups"] == 1.0
    assert loop.counters()["discarded"] == 1 and loop.counters()["trajectories"] == 2
    ((advantages, mask),) = seen
    trained = advantages[mask]
    # Samples are packed in order, each one's trained tokens contiguous: one value per run
    # (the four returns differ, so four runs).
    runs = torch.unique_consecutive(trained, return_counts=True)
    torch.testing.assert_close(
        runs[0], torch.tensor(expected_per_sample, dtype=torch.float32), atol=1e-5, rtol=0
    )
    assert int(runs[1].sum()) == int(mask.sum())
