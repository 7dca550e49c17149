"""Every reward reaches the loss: a per-turn reward, the episode reward and the discount, set
through a real gateway process, arrive over the real ZeroMQ queue, and the advantages the loss is
handed in a real training step are the hand-computed GRPO values of the discounted returns. A
discarded member of the group reaches the trainer as a tombstone, so the group trains at once.
A turn's reward credits that turn's tokens and no later turn's, also when the turns merged into
one sample."""

from __future__ import annotations

import asyncio
import itertools
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


def train_one_step(
    engine_url: str,
    model_dir: str,
    tmp_path: Path,
    episodes: Any,
    *,
    discount: float,
    **options: Any,
) -> tuple[list[tuple[torch.Tensor, ...]], TrainerLoop, list[dict[str, float]]]:
    """A gateway process and a trainer loop over the real ZeroMQ queue; ``episodes(url)`` plays
    the agents; one training step of a policy with ``options``. Returns the advantages, loss
    masks and sequence bounds the loss was handed (one triple per pack), the loop and its
    history."""
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def recording_loss(**kwargs: Any) -> Any:
        if kwargs["loss_mask"].numel() > 4:  # not the step's 4-token probe of the loss
            seen.append(
                (
                    kwargs["advantages"].detach().clone(),
                    kwargs["loss_mask"].clone(),
                    kwargs["cu_seqlens"].clone(),
                )
            )
        return decoupled_ppo_loss(**kwargs)

    losses: Registry[Any] = Registry("loss")
    for name, path in BUILTIN_LOSSES.items():
        losses.add(name, recording_loss if name == "decoupled_ppo" else LazyFunction(path), "t")
    model = load_model(model_dir)
    policy = Policy.of(
        model, torch.optim.AdamW(model.parameters()), mini_batch_size=8, losses=losses, **options
    )
    router = tmp_path / "router.yaml"
    router.write_text("model_routing:\n  policy_model: {model_id: areal-tiny, max_tokens: 4}\n")
    with ZmqTrajectorySource("tcp://127.0.0.1:*") as source:
        command = [*SERVER, "--config", str(router), "--engine", engine_url]
        command += ["--log-dir", str(tmp_path / "logs"), "--sink", "zmq"]
        command += ["--sink-address", source.address, "--discount", str(discount)]
        with start_on_free_port(
            with_port(command),
            log_path=tmp_path / "gw.out",
            timeout=120,
            env={"AREAL_ADMIN_TOKEN": ADMIN},
            name="gw",
        ) as proc:
            assert proc.url is not None
            episodes(proc.url)
            loop = TrainerLoop(
                policy,
                source,
                DiskWeightSync([], tmp_path / "weights"),
                trigger_batch_size=2,
                staleness_threshold=10,
            )
            history = asyncio.run(loop.run(max_steps=1))
    return seen, loop, history


@pytest.mark.serial  # a gateway process, a ZeroMQ queue and a training step
def test_turn_rewards_and_discount_reach_the_advantages(
    engine: tuple[str, InferenceServer], gateway_model_dir: str, tmp_path: Path
) -> None:
    def episodes(url: str) -> None:
        episode(url, turn_reward=0.2, reward=1.0, discard=False)
        episode(url, turn_reward=0.1, reward=0.0, discard=False)
        episode(url, turn_reward=0.9, reward=1.0, discard=True)  # a tombstone, no samples

    seen, loop, history = train_one_step(
        engine[0], gateway_model_dir, tmp_path, episodes, discount=0.5
    )

    # Returns (discount 0.5): the turn-1 sample gets its turn reward plus the discounted
    # episode reward, the turn-2 sample the episode reward: [0.2 + 0.5 * 1.0, 1.0] and
    # [0.1 + 0.5 * 0.0, 0.0].
    returns = [0.7, 1.0, 0.1, 0.0]
    mean, std = statistics.mean(returns), statistics.stdev(returns)  # GRPO: unbiased std
    expected_per_sample = [(r - mean) / (std + 1e-6) for r in returns]
    assert history[0]["updated"] == 4.0 and history[0]["groups"] == 1.0
    assert loop.counters()["discarded"] == 1 and loop.counters()["trajectories"] == 2
    ((advantages, mask, _),) = seen
    trained = advantages[mask]
    # Samples are packed in order, each one's trained tokens contiguous: one value per run
    # (the four returns differ, so four runs).
    runs = torch.unique_consecutive(trained, return_counts=True)
    torch.testing.assert_close(
        runs[0], torch.tensor(expected_per_sample, dtype=torch.float32), atol=1e-5, rtol=0
    )
    assert int(runs[1].sum()) == int(mask.sum())


def two_merged_turns(url: str, first_turn_reward: float | None) -> None:
    """One member of group ``m`` (2 members): turn 2 replays turn 1 and asks more, so the two
    turns merge into one sample; ``first_turn_reward`` is posted for turn 1; episode reward 0."""
    meta = {"group": "m", "group_size": 2}
    opened = httpx.post(f"{url}/rl/sessions", headers=HEADERS, json={"metadata": meta}).json()
    sid, key = opened["session_id"], opened["api_key"]
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    first = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "areal-tiny", "messages": messages, "max_tokens": 4},
        headers=bearer(key),
        timeout=60,
    ).json()
    messages += [first["choices"][0]["message"], {"role": "user", "content": "And 3 + 3?"}]
    second = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "areal-tiny", "messages": messages, "max_tokens": 4},
        headers=bearer(key),
        timeout=60,
    )
    assert second.status_code == 200, second.text
    if first_turn_reward is not None:
        body = {"reward": first_turn_reward, "completion_id": first["id"]}
        resp = httpx.post(f"{url}/rl/sessions/{sid}/reward", headers=HEADERS, json=body)
        assert resp.status_code == 200, resp.text
    resp = httpx.post(f"{url}/rl/sessions/{sid}/end", headers=HEADERS, json={"reward": 0.0})
    assert resp.status_code == 200 and resp.json()["samples"] == 1, resp.text  # merged


@pytest.mark.serial  # a gateway process, a ZeroMQ queue and a training step
def test_a_first_turn_reward_credits_only_the_first_turn_of_a_merged_sample(
    engine: tuple[str, InferenceServer], gateway_model_dir: str, tmp_path: Path
) -> None:
    def episodes(url: str) -> None:
        two_merged_turns(url, first_turn_reward=1.0)
        two_merged_turns(url, first_turn_reward=None)

    seen, _, history = train_one_step(
        engine[0], gateway_model_dir, tmp_path, episodes, discount=1.0, advantage="turn"
    )
    assert history[0]["updated"] == 2.0
    ((advantages, mask, bounds),) = seen
    rewarded, plain = (
        advantages.flatten()[a:b][mask.flatten()[a:b]]
        for a, b in itertools.pairwise(bounds.tolist())
    )
    # advantage/turn: A = G_k − the other episode's G_k. Returns: the rewarded episode [1, 0]
    # (turn 1's reward reaches turn 1 only), the plain one [0, 0].
    assert rewarded[0] == 1.0 and rewarded[-1] == 0.0 and set(rewarded.tolist()) == {1.0, 0.0}
    assert plain[0] == -1.0 and plain[-1] == 0.0 and set(plain.tolist()) == {-1.0, 0.0}
