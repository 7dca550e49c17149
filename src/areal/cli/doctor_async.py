"""The seed article's "async is not faster" checklist, automated: settings that are each valid
but together make an asynchronous run wait like a synchronous one.

The checks read the raw ``async``/``agent``/``train`` values (defaults from the schema), so they
still speak when the config fails validation elsewhere: "0 rollout workers" deserves its own
sentence, not only a schema error.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

from areal.cli.doctor_checks import Check
from areal.core.run_config import AgentConfig, AsyncConfig, TrainConfig


def async_checks(data: dict[str, Any]) -> list[Check]:
    """One check per way of defeating asynchrony, for a parsed (not yet validated) run config."""
    run = _Values(data, "async", AsyncConfig)
    agent = _Values(data, "agent", AgentConfig)
    train = _Values(data, "train", TrainConfig)
    enabled = run.get("enabled")
    workers = run.integer("rollout_workers")
    staleness = run.integer("staleness_threshold")
    queue = run.integer("queue_max_size")
    trigger = run.integer("trigger_batch_size")
    global_batch = train.integer("global_batch_size")
    concurrency = agent.integer("concurrency")
    async_on = enabled is not False
    batch, batch_key = (trigger, "async.trigger_batch_size")
    if not async_on:
        batch, batch_key = (global_batch, "train.global_batch_size")

    online = agent.get("online")
    online_on = isinstance(online, dict) and online.get("enabled") is True
    checks = [_enabled(async_on), _workers(workers, online_on)]
    if async_on and staleness is not None:
        checks.append(_staleness(staleness))
    if queue is not None and batch is not None:
        budget = (staleness + 1) * batch if async_on and staleness is not None else batch
        checks.append(_queue(queue, batch, batch_key, budget))
    if workers and concurrency is not None and batch is not None:
        checks.append(_concurrency(workers, concurrency, batch, batch_key))
    return checks


def _enabled(async_on: bool) -> Check:
    name = "async.enabled"
    if async_on:
        return Check(name, "ok", "rollout and training overlap")
    return Check(
        name,
        "warn",
        "false: sync mode, generation stops for every train step and training waits for every "
        "batch",
        "set async.enabled: true (keep false only for a sync baseline)",
    )


def _workers(workers: int | None, online: bool) -> Check:
    name = "async.rollout_workers"
    if workers is None:
        return Check(name, "skip", "not a number (see the config check)")
    if workers < 1 and online:
        return Check(name, "ok", f"{workers}: online agents only (agent.online.enabled)")
    if workers < 1:
        return Check(
            name,
            "fail",
            f"{workers}: no process runs episodes, so no sample is ever generated",
            "set async.rollout_workers: 1 or more, or agent.online.enabled: true to train on "
            "online agents only",
        )
    return Check(name, "ok", f"{workers} rollout worker(s)")


def _staleness(staleness: int) -> Check:
    name = "async.staleness_threshold"
    if staleness <= 0:
        return Check(
            name,
            "warn",
            f"{staleness} is lock-step: once one batch is admitted, no episode starts until the "
            "next weight version, so generation idles through every train step",
            "set async.staleness_threshold: 1 to 4 (2 is the default)",
        )
    return Check(name, "ok", f"samples may lag up to {staleness} version(s)")


def _queue(queue: int, batch: int, batch_key: str, budget: int) -> Check:
    name = "async.queue_max_size"
    if queue < batch:
        return Check(
            name,
            "fail",
            f"{queue} holds less than one batch ({batch_key} {batch}), so a step never triggers",
            f"set async.queue_max_size to at least {budget}",
        )
    if queue < budget:
        return Check(
            name,
            "warn",
            f"{queue} holds fewer samples than the staleness budget lets rollout run ahead "
            f"((staleness_threshold + 1) × {batch} = {budget}), so producers block early",
            f"set async.queue_max_size to at least {budget}",
        )
    return Check(name, "ok", f"{queue} ≥ {budget} samples the staleness budget admits")


def _concurrency(workers: int, concurrency: int, batch: int, batch_key: str) -> Check:
    name = "concurrent episodes"
    total = workers * concurrency
    if total < batch:
        waves = math.ceil(batch / total)
        return Check(
            name,
            "warn",
            f"async.rollout_workers {workers} × agent.concurrency {concurrency} = {total} "
            f"episodes at once, below one batch ({batch_key} {batch}): each step waits for "
            f"{waves} waves of episodes",
            f"set agent.concurrency to at least {math.ceil(batch / workers)}",
        )
    return Check(name, "ok", f"{total} episodes at once ≥ one batch of {batch}")


class _Values:
    """A section's raw values, the schema's defaults where a key is missing."""

    def __init__(self, data: dict[str, Any], key: str, schema: type[BaseModel]) -> None:
        section = data.get(key)
        self.values = section if isinstance(section, dict) else {}
        self.schema = schema

    def get(self, key: str) -> Any:
        if key in self.values:
            return self.values[key]
        field = self.schema.model_fields.get(key)
        return None if field is None else field.default

    def integer(self, key: str) -> int | None:
        value = self.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
