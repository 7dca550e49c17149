"""A real embedded engine and a real gateway, each its own process, for the fault tests that
kill one of them mid-episode; and the few calls an episode makes through the gateway."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import openai
import yaml

from areal.core.plugins import registry
from areal.host.process import ServerProcess, start_on_free_port, with_port

ADMIN = "faults-admin-token-0123456789"
KEY = "faults-gateway-key-0123456789"
POLICY = "policy"


def start_engine(model: Path, logs: Path) -> tuple[ServerProcess, str]:
    launcher = registry("inference_backends").get("embedded").load_launcher()
    options = {"model_path": str(model), "log_level": "warning", "max_total_tokens": 8192}
    engine = start_on_free_port(
        lambda port: list(launcher({**options, "port": port})),
        log_path=logs / "engine.log",
        timeout=120,
        name="engine",
    )
    assert engine.url is not None
    return engine, engine.url


def start_gateway(
    engine_url: str,
    tmp: Path,
    *,
    sink: tuple[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[ServerProcess, str]:
    """A gateway journaling into ``tmp/episodes.journal``, sending to ``sink`` (a queue plugin's
    name and address; default: the JSONL file ``tmp/trajectories.jsonl``)."""
    router = tmp / "router.yaml"
    routing = {"policy_model": {"model_id": POLICY, "max_tokens": 4096}}
    router.write_text(yaml.safe_dump({"model_routing": routing}))
    name, address = sink or ("jsonl", str(tmp / "trajectories.jsonl"))
    command = [sys.executable, "-m", "areal.gateway.server", "--config", str(router)]
    command += ["--engine", engine_url, "--log-dir", str(tmp / "logs")]
    command += ["--sink", name, "--sink-address", address]
    # A start that lost its port to another process books only its boot here: no episode.
    command += ["--episode-journal", str(tmp / "episodes.journal")]
    gateway = start_on_free_port(
        with_port(command),
        log_path=tmp / "logs" / "gateway.out",
        timeout=120,
        env={"AREAL_ADMIN_TOKEN": ADMIN, "AREAL_GATEWAY_KEY": KEY, **(env or {})},
    )
    assert gateway.url is not None
    return gateway, gateway.url


def open_session(gateway: str) -> tuple[str, str]:
    answer = httpx.post(
        f"{gateway}/rl/sessions", headers={"Authorization": f"Bearer {ADMIN}"}, json={}, timeout=30
    )
    answer.raise_for_status()
    return answer.json()["session_id"], answer.json()["api_key"]


def end_session(gateway: str, session: str) -> httpx.Response:
    return httpx.post(
        f"{gateway}/rl/sessions/{session}/end",
        headers={"Authorization": f"Bearer {ADMIN}"},
        json={"reward": 1.0},
        timeout=30,
    )


def client(gateway: str, key: str) -> openai.OpenAI:
    # A timeout and no retries: a hang fails the test instead of waiting, a retry hides nothing.
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, timeout=60, max_retries=0)
