"""A real gateway in front of a real embedded nano engine on 127.0.0.1, and a helper that runs
episodes of a wrapped agent through a real :class:`~areal.run.rollout.RolloutWorker`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from areal.core.episode import AgentFn
from areal.core.rewards import RewardFn
from areal.core.types import Trajectory
from areal.gateway.app import build_app
from areal.gateway.router_config import RouterConfig
from areal.gateway.server import build_state
from areal.host.http_server import ServerThread
from areal.plugins.inference.embedded.server import InferenceServer
from areal.run.rollout import RolloutStats, RolloutWorker
from support.engines import nano_engine

ADMIN_TOKEN = "adapters-admin-token-0123456789"
GATEWAY_KEY = "adapters-gateway-key-0123456789"
POLICY = "areal-nano"


@dataclass
class Gateway:
    url: str  # without /v1
    log_dir: Path
    admin: str = ADMIN_TOKEN
    model: str = POLICY

    def trajectories(self) -> list[Trajectory]:
        path = self.log_dir / "trajectories.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [Trajectory.from_json(json.loads(line)) for line in lines]

    def run(
        self,
        agent: AgentFn,
        tasks: Sequence[dict[str, Any]],
        *,
        reward_fn: RewardFn | None = None,
        concurrency: int = 4,
    ) -> tuple[RolloutStats, dict[Any, Trajectory]]:
        """Run one episode per task; the trajectories that arrived, by task id."""
        worker = RolloutWorker(
            self.url, self.admin, agent, reward_fn=reward_fn, concurrency=concurrency,
            model=self.model, episode_timeout_s=60,
        )  # fmt: skip
        stats = asyncio.run(worker.run(tasks))
        return stats, {t.metadata["task_id"]: t for t in self.trajectories()}


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InferenceServer]]:
    with nano_engine(tmp_path_factory.mktemp("adapters-model") / "nano") as served:
        yield served


@pytest.fixture
def gateway(engine: tuple[str, InferenceServer], tmp_path: Path) -> Iterator[Gateway]:
    """A fresh gateway per test, so its trajectories file holds only that test's episodes."""
    route = {"model_id": POLICY, "max_tokens": 256}
    config = RouterConfig.model_validate({"model_routing": {"policy_model": route}})
    state = build_state(
        config, [engine[0]], gateway_key=GATEWAY_KEY, admin_token=ADMIN_TOKEN, log_dir=tmp_path
    )
    http = ServerThread(build_app(state), "127.0.0.1", 0).start()
    try:
        yield Gateway(http.url, tmp_path)
    finally:
        http.stop()


@pytest.fixture
def tasks() -> list[dict[str, Any]]:
    """Four tasks; ``r`` is the reward the test agents return for each."""
    return [
        {"task_id": f"t{i}", "question": f"What is {i} plus {i}?", "answer": str(2 * i), "r": i / 4}
        for i in range(4)
    ]
