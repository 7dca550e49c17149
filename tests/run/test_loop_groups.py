"""Groups survive asynchrony: a task's group is trained whole, in one step, once every member is
accounted for (arrived, dropped as stale, or discarded by the gateway's tombstone); the batch is
counted in episodes. Real training steps on a tiny model; the batches are read from what the
engine was handed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch

from areal.core.types import Sample, Trajectory
from areal.plugins.models.hf_io import load_model
from areal.plugins.trainer.engine import Policy
from areal.run.loop import TrainerLoop


class Recording:
    """The real policy's step, keeping what each step was given."""

    def __init__(self, model_dir: str) -> None:
        model = load_model(model_dir)
        self.policy = Policy.of(model, torch.optim.AdamW(model.parameters()), mini_batch_size=8)
        self.steps: list[list[tuple[int, float]]] = []  # (group id, reward) per sample

    def step(
        self, samples: list[Sample], *, group_ids: list[int], current_version: int
    ) -> dict[str, float]:
        self.steps.append([(g, s.reward) for g, s in zip(group_ids, samples, strict=True)])
        return self.policy.step(samples, group_ids=group_ids, current_version=current_version)

    def weights(self) -> Any:
        return self.policy.weights()


class NoPublish:
    async def publish(self, model: Any, version: int) -> float:
        return 0.0


class Nothing:
    async def aget(self, timeout: float | None = None) -> Trajectory | None:
        return None


def member(group: str, i: int, version: int = 0, *, size: int | None = 4) -> Trajectory:
    meta: dict[str, Any] = {"group": group}
    if size is not None:
        meta["group_size"] = size
    sample = Sample([3, 4, 5 + i], [0, 0, 1], [0.0, 0.0, -1.5], [-1, -1, version], reward=float(i))
    return Trajectory(f"{group}-{i}", [sample], float(i), 1, meta)


def tombstone(group: str, i: int, size: int = 4) -> Trajectory:
    meta = {"group": group, "group_size": size, "discarded": True}
    return Trajectory(f"{group}-{i}", [], None, 0, meta)


def make_loop(engine: Recording, **options: Any) -> TrainerLoop:
    return TrainerLoop(
        engine,
        Nothing(),
        NoPublish(),
        trigger_batch_size=options.pop("trigger_batch_size", 4),
        staleness_threshold=options.pop("staleness_threshold", 2),
        **options,
    )


def sessions(batch: list[list[Any]] | None) -> list[list[str]]:
    assert batch is not None
    return [[e.session_id for e in group] for group in batch]


def test_a_sized_group_waits_for_its_last_member(model_dir: str) -> None:
    loop = make_loop(Recording(model_dir))
    for i in range(3):
        loop.add(member("a", i))
    for i in range(4):
        loop.add(member("b", i))
    # 7 episodes buffered, 4 needed: only b is whole.
    assert sessions(loop._take_batch()) == [["b-0", "b-1", "b-2", "b-3"]]
    assert loop._take_batch() is None
    loop.add(member("a", 3))
    assert sessions(loop._take_batch()) == [["a-0", "a-1", "a-2", "a-3"]]


def test_a_tombstone_or_a_stale_drop_accounts_for_a_member(model_dir: str) -> None:
    loop = make_loop(Recording(model_dir), staleness_threshold=1)
    loop.version = 2
    loop.add(member("a", 0, version=2))
    loop.add(tombstone("a", 1))  # the gateway discarded it
    loop.add(member("a", 2, version=0))  # 2 versions behind: dropped on arrival
    loop.add(member("a", 3, version=1))
    loop.add(member("b", 0, version=2, size=2))
    loop.add(member("b", 1, version=2, size=2))
    assert sessions(loop._take_batch()) == [["a-0", "a-3"], ["b-0", "b-1"]]
    counters = loop.counters()
    assert (counters["trajectories"], counters["discarded"], counters["dropped_stale"]) == (5, 1, 1)
    assert counters["dropped_trajectories"] == 1


def test_members_that_age_out_while_waiting_still_count(model_dir: str) -> None:
    loop = make_loop(Recording(model_dir), trigger_batch_size=2, staleness_threshold=0)
    loop.add(member("a", 0, size=2))
    loop.version = 1  # the buffered member is now stale; its group is accounted for but empty
    loop.add(member("a", 1, version=1, size=2))
    loop.add(member("b", 0, version=1, size=1))
    assert sessions(loop._take_batch()) == [["a-1"], ["b-0"]]


def test_incomplete_groups_go_only_after_group_wait_s(model_dir: str) -> None:
    loop = make_loop(Recording(model_dir), group_wait_s=30.0)
    for i in range(3):
        loop.add(member("a", i))
    loop.add(member("b", 0))
    assert loop._take_batch(now=100.0) is None  # blocked from here
    assert loop._take_batch(now=129.0) is None
    assert sessions(loop._take_batch(now=130.5)) == [["a-0", "a-1", "a-2"], ["b-0"]]
    assert (loop.counters()["groups_split"], loop.counters()["groups_split_at_bound"]) == (2, 0)
    loop.add(member("a", 3))  # a late member of a released group: its group is gone
    assert loop.buffered_trajectories == 0
    assert (loop.counters()["dropped_late"], loop.counters()["dropped_late_tokens"]) == (1, 1)


def test_an_incomplete_group_at_the_bound_is_trained_before_it_spoils(model_dir: str) -> None:
    """Three of a's four members came from version 0; at version 2 with a bound of 2 they are as
    old as the bound allows (after this step they would be 3 behind): a goes into this step as it
    is, first, while c (one version younger) keeps waiting for its last member."""
    engine = Recording(model_dir)
    loop = make_loop(engine, staleness_threshold=2, trigger_batch_size=4)
    loop.version = 2
    for i in range(3):
        loop.add(member("a", i, version=0))
    for i in range(3):
        loop.add(member("c", i, version=1))
    for i in range(4):
        loop.add(member("b", i, version=2))
    batch = loop._take_batch(now=0.0)
    assert sessions(batch) == [["a-0", "a-1", "a-2"], ["b-0", "b-1", "b-2", "b-3"]]
    assert batch is not None
    asyncio.run(loop.step(batch))
    assert [g for g, _ in engine.steps[0]] == [0, 0, 0, 1, 1, 1, 1]  # a is a group of 3
    counters = loop.counters()
    assert (counters["groups_split"], counters["groups_split_at_bound"]) == (1, 1)
    assert (counters["trained"], counters["dropped_stale"]) == (7, 0)
    # What the runner asks the gateway to end: the sessions of a's member still to come.
    assert loop.take_abandoned() == [{"group": "a"}]
    assert loop.take_abandoned() == []
    # a's fourth member comes after its group was trained: dropped, and the books still add up.
    loop.add(member("a", 3, version=1))
    loop.add(tombstone("c", 3))  # c is whole now: no longer waiting
    counters = loop.counters()
    assert (counters["dropped_late"], counters["discarded"]) == (1, 1)
    assert counters["dropped_trajectories"] == 1  # the gateway's budget frees its slot
    assert counters["dropped"] == 1  # stale, empty and late together
    assert counters["received"] == 11 == 7 + counters["dropped"] + counters["buffered"]
    assert loop._take_batch(now=0.0) is None  # c's three, still fresh, wait for a batch
    assert loop.buffered_trajectories == 3


def test_a_late_members_tombstone_is_counted_once(model_dir: str) -> None:
    loop = make_loop(Recording(model_dir), staleness_threshold=0, trigger_batch_size=2)
    loop.add(member("a", 0, version=0))  # at the bound at once: the bound is 0
    loop.add(member("b", 0, version=0, size=1))
    assert sessions(loop._take_batch(now=0.0)) == [["a-0"], ["b-0"]]
    for i in (1, 2):
        loop.add(tombstone("a", i))
    loop.add(member("a", 3))
    counters = loop.counters()
    assert (counters["discarded"], counters["dropped_late"], counters["trajectories"]) == (2, 1, 3)
    # The group's record is gone with its last member: a later round of "a" is a group again.
    for i in range(4):
        loop.add(member("a", i, version=0))
    assert loop.buffered_trajectories == 4


def test_groups_of_unknown_size_take_what_arrives_before_the_step(model_dir: str) -> None:
    loop = make_loop(Recording(model_dir), trigger_batch_size=3)
    loop.add(member("x", 0, size=None))
    loop.add(member("y", 0, size=None))
    loop.add(member("x", 1, size=None))
    assert sessions(loop._take_batch()) == [["x-0", "x-1"], ["y-0"]]


def test_a_task_trained_again_is_a_new_group_in_the_same_step(model_dir: str) -> None:
    engine = Recording(model_dir)
    loop = make_loop(engine, trigger_batch_size=4)
    for i in range(4):  # two rounds of the same task, groups of 2
        loop.add(member("a", i, size=2))
    batch = loop._take_batch()
    assert sessions(batch) == [["a-0", "a-1"], ["a-2", "a-3"]]
    assert batch is not None
    asyncio.run(loop.step(batch))
    # Each sample keeps its own reward (its return); the two rounds are two groups.
    assert engine.steps == [[(0, 0.0), (0, 1.0), (1, 2.0), (1, 3.0)]]


def test_an_incomplete_group_survives_a_checkpoint(model_dir: str, tmp_path: Path) -> None:
    engine = Recording(model_dir)
    loop = make_loop(engine, trigger_batch_size=3)
    loop.add(member("a", 0))
    loop.add(tombstone("a", 1))
    loop.add(member("a", 2))
    state, pending = loop.state_dict(), loop.pending()
    resumed = make_loop(engine, trigger_batch_size=3)
    resumed.restore(state, pending)
    assert resumed.counters() == loop.counters()
    resumed.add(member("a", 3))  # the fourth accounted member completes it
    assert sessions(resumed._take_batch()) == [["a-0", "a-2", "a-3"]]
    # A resumed run with a new gateway: the missing member will never come, so no waiting.
    fresh_gateway = make_loop(engine, trigger_batch_size=2)
    fresh_gateway.restore(state, pending, more_members=False)
    assert sessions(fresh_gateway._take_batch(now=0.0)) == [["a-0", "a-2"]]


def test_the_step_reports_the_share_of_episodes_that_solved_their_task(model_dir: str) -> None:
    """``success``: episodes whose reward reaches ``success_reward`` (rewards 0, 1, 2, 3 against
    2.0 -> half), carried through a checkpoint's pending trajectories; no rule, no key."""
    engine = Recording(model_dir)
    loop = make_loop(engine, success_reward=2.0)
    for i in range(4):
        loop.add(member("g", i))
    (stats,) = asyncio.run(loop.run(1))
    assert stats["success"] == 0.5

    waiting = make_loop(engine, success_reward=2.0)
    for i in (1, 3):
        waiting.add(member("h", i, size=2))
    resumed = make_loop(engine, success_reward=2.0, trigger_batch_size=2)
    resumed.restore(waiting.state_dict(), waiting.pending())
    (stats,) = asyncio.run(resumed.run(1))
    assert stats["success"] == 0.5  # reward 3 solved it, reward 1 did not

    plain = make_loop(engine)
    for i in range(4):
        plain.add(member("k", i))
    (stats,) = asyncio.run(plain.run(1))
    assert "success" not in stats


def test_on_batch_hears_of_the_groups_a_batch_takes_short_before_it_trains(
    model_dir: str, queued: Any
) -> None:
    """``run`` takes all the source holds, forms the batch, and calls ``on_batch`` before the
    step: that is when the runner has the gateway end the sessions still to come."""
    engine = Recording(model_dir)
    arrivals = [member("a", i, version=0) for i in range(3)] + [member("b", i) for i in range(4)]
    heard: list[tuple[int, list[dict[str, Any]]]] = []

    async def scenario() -> list[dict[str, float]]:
        async with queued(arrivals) as source:
            loop = TrainerLoop(
                engine, source, NoPublish(), trigger_batch_size=4, staleness_threshold=2
            )
            loop.version = 2

            async def on_batch() -> None:
                heard.append((len(engine.steps), loop.take_abandoned()))

            return await loop.run(1, on_batch=on_batch)

    history = asyncio.run(scenario())
    assert heard == [(0, [{"group": "a"}])]  # before the step trained
    assert history[0]["groups"] == 2.0 and history[0]["updated"] == 7.0


def test_the_buffer_takes_ahead_only_up_to_buffer_max(model_dir: str, queued: Any) -> None:
    """Beyond ``buffer_max`` buffered trajectories the rest wait in the real trajectory queue,
    whose back-pressure then holds the producers; memory stays bounded by the queue's size."""
    arrivals = [member(f"g{i}", 0, size=2) for i in range(10)]  # 10 incomplete groups

    async def scenario() -> tuple[int, int]:
        async with queued(arrivals) as source:
            loop = TrainerLoop(
                Recording(model_dir), source, NoPublish(), trigger_batch_size=4,
                staleness_threshold=2, buffer_max=4,
            )  # fmt: skip
            await loop._take_arrived()
            return loop.buffered_trajectories, source.buffered

    assert asyncio.run(scenario()) == (4, 6)
