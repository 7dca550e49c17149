"""The gateway's command line as the run builds it: its training flags come from the run's config
(through ``TrainingFlags.to_argv``) and parse back, with the server's own parser, into what the
run meant; a restart starts the staleness clock at the trainer's version then."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from areal.core.run_config import run_config_from_dict
from areal.gateway import server
from areal.gateway.training_flags import TrainingFlags
from areal.host.on_node import NODE_HOST
from areal.host.process import pick_free_port
from areal.run import processes
from areal.run.gateway_client import GatewayAdmin
from areal.run.processes import gateway_child, router_config, worker_child
from areal.run.supervisor import Child, Supervisor
from support.processes import serve

QUEUE = "tcp://127.0.0.1:5555"


def parsed(command: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``python -m areal.gateway.server`` makes of ``command``."""
    assert command[1:3] == ["-m", "areal.gateway.server"]
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(
        server, "serve", lambda config, **kw: calls.append({"config": config, **kw})
    )
    assert server.main(command[3:]) == 0
    return calls[0]


@pytest.mark.parametrize("enabled", [True, False])
def test_gateway_command_parses_back_into_the_runs_flags(
    enabled: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = run_config_from_dict(
        {
            "model": {"path": str(tmp_path / "model")},
            "dataset": {"name": "tool_then_answer"},
            "train": {"global_batch_size": 6, "mini_batch_size": 6},
            "algorithm": {"discount": 0.9, "group_size": 2},
            "async": {"enabled": enabled, "staleness_threshold": 2, "trigger_batch_size": 4},
            "agent": {"concurrency": 3},
        }
    )
    version = [5]
    child, admin = gateway_child(
        config, router=tmp_path / "router.yaml", engine_urls=lambda: ["http://e0", "http://e1"],
        queue_address=QUEUE, version=lambda: version[0], log_dir=tmp_path,
        admin_token="admin-token-0123456789", gateway_key="gateway-key-0123456789",
    )  # fmt: skip
    assert isinstance(admin, GatewayAdmin) and admin.url == child.url
    got = parsed(child.command(), monkeypatch)
    assert got["config"] == str(tmp_path / "router.yaml")
    assert (got["engines"], got["log_dir"], got["log_level"]) == (
        ["http://e0", "http://e1"], str(tmp_path), "warning",
    )  # fmt: skip
    assert (got["host"], got["allow_remote"]) == ("127.0.0.1", False)
    assert f"http://127.0.0.1:{got['port']}" == child.url
    assert got["training"] == TrainingFlags(
        sink="zmq",
        sink_address=QUEUE,
        staleness_threshold=2 if enabled else 0,
        trigger_batch_size=4 if enabled else 6,  # sync: a trigger is a whole global batch
        max_concurrent=3,
        start_version=5,
        discount=0.9,
    )
    version[0] = 9  # the trainer moved on; a restarted gateway starts there
    assert parsed(child.command(), monkeypatch)["training"].start_version == 9
    assert "admin-token-0123456789" not in " ".join(child.command())


def test_an_online_run_gateway_admits_online_agents_on_its_fixed_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agent.online``: the gateway is started with ``--online`` and its grouping flags, on the
    port the agents were given (never moved to another), with room for a worker's concurrency
    of conversations; a default group is one trigger batch."""
    config = run_config_from_dict(
        {
            "model": {"path": str(tmp_path / "model")},
            "dataset": {"name": "tool_then_answer"},
            "train": {"global_batch_size": 4, "mini_batch_size": 4},
            "algorithm": {"group_size": 2},
            "async": {"rollout_workers": 0, "trigger_batch_size": 4},
            "agent": {
                "concurrency": 3,
                "online": {"enabled": True, "port": 9123, "grouping": "prompt", "reward_wait_s": 5},
            },
        }
    )
    child, _ = gateway_child(
        config, router=tmp_path / "router.yaml", engine_urls=lambda: ["http://e0"],
        queue_address=QUEUE, version=lambda: 0, log_dir=tmp_path,
        admin_token="admin-token-0123456789", gateway_key="gateway-key-0123456789",
    )  # fmt: skip
    assert (child.url, child.new_port) == ("http://127.0.0.1:9123", None)
    got = parsed(child.command(), monkeypatch)
    assert got["port"] == 9123
    flags = got["training"]
    assert (flags.online, flags.online_grouping, flags.online_reward_wait) == (True, "prompt", 5.0)
    assert (flags.online_group_size, flags.max_concurrent) == (4, 3)


def test_a_gateway_on_its_nodes_address_binds_there_and_is_reached_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``launcher.listen: node``: the command carries the node-address placeholder (the shim on
    the node fills it in) and allows the remote bind; the url is a template until then."""
    config = run_config_from_dict(
        {
            "model": {"path": str(tmp_path / "model")},
            "dataset": {"name": "tool_then_answer"},
            "launcher": {"name": "ray", "listen": "node"},
        }
    )
    child, admin = gateway_child(
        config, router=tmp_path / "router.yaml", engine_urls=lambda: ["http://10.0.0.7:8000"],
        queue_address="tcp://10.0.0.1:5555", version=lambda: 0, log_dir=tmp_path,
        admin_token="admin-token-0123456789", gateway_key="gateway-key-0123456789",
    )  # fmt: skip
    assert child.url_template == child.url and NODE_HOST in (child.url or "")
    on_the_node = [part.replace(NODE_HOST, "10.0.0.9") for part in child.command()]
    got = parsed(on_the_node, monkeypatch)
    assert (got["host"], got["allow_remote"]) == ("10.0.0.9", True)
    assert got["engines"] == ["http://10.0.0.7:8000"]
    assert child.url_template.replace(NODE_HOST, "10.0.0.9") == f"http://10.0.0.9:{got['port']}"
    assert admin.url == child.url  # the admin client follows once the supervisor learns the url


def test_a_gateway_whose_port_was_taken_before_it_bound_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port race a run met: its gateway's port, picked free, was bound by another process's
    server before the gateway started. The gateway's health check must not take that server's
    200 for the gateway's (the run's workers then talked to the wrong server); the gateway
    starts on another port, and the run's admin client follows it there."""
    config = run_config_from_dict(
        {"model": {"path": str(tmp_path / "model")}, "dataset": {"name": "tool_then_answer"}}
    )
    # Another process's server answering 200 on every path, as another run's gateway would.
    with contextlib.contextmanager(serve)(200, b"") as taken:
        picks = iter([taken])
        monkeypatch.setattr(processes, "pick_free_port", lambda: next(picks, 0) or pick_free_port())
        child, admin = gateway_child(
            config, router=router_config(config, tmp_path), engine_urls=lambda: [],
            queue_address=QUEUE, version=lambda: 0, log_dir=tmp_path,
            admin_token="admin-token-0123456789", gateway_key="gateway-key-0123456789",
        )  # fmt: skip
        assert child.url == f"http://127.0.0.1:{taken}"
        supervisor = Supervisor([child])
        try:
            asyncio.run(supervisor.start_all())
            assert child.up and child.url != f"http://127.0.0.1:{taken}"
            assert admin.url == child.url
            # The gateway answers there: its admin API, which the other server does not have.
            models = httpx.get(f"{child.url}/v1/models", trust_env=False,
                               headers={"Authorization": "Bearer gateway-key-0123456789"})  # fmt: skip
            assert models.status_code == 200 and models.json()["data"][0]["id"] == "policy"
        finally:
            supervisor.stop_all(timeout=5)
    assert "address already in use" in (tmp_path / "gateway.out").read_text().lower()


def _agent_pair(tmp_path: Path, **sections: Any) -> tuple[Child, Child]:
    """The gateway and the first rollout worker a run of this config would start."""
    config = run_config_from_dict(
        {"model": {"path": str(tmp_path / "model")}, "dataset": {"name": "tool_then_answer"}}
        | sections
    )
    gateway, _ = gateway_child(
        config, router=tmp_path / "router.yaml", engine_urls=lambda: [], queue_address=QUEUE,
        version=lambda: 0, log_dir=tmp_path, admin_token="a" * 24, gateway_key="k" * 24,
    )  # fmt: skip
    worker = worker_child(
        config, 0, gateway_url=lambda: gateway.url or "", model_id="policy", run_dir=tmp_path,
        log_dir=tmp_path, admin_token="a" * 24, start=0, skip=[],
    )  # fmt: skip
    return gateway, worker


@pytest.mark.serial
def test_agent_cpu_affinity_places_the_gateway_and_the_rollout_workers(tmp_path: Path) -> None:
    pinned = {"train": {"cpu_affinity": [1]}, "inference": {"cpu_affinity": [0]}}
    gateway, worker = _agent_pair(tmp_path, **pinned, agent={"cpu_affinity": [0]})
    assert gateway.cpus == worker.cpus == {0}
    assert gateway.nice == worker.nice == 0  # placed by the user: their priority is left alone
    gateway, worker = _agent_pair(tmp_path)
    assert gateway.cpus is worker.cpus is None  # the runner's mask, inherited
    assert gateway.nice == worker.nice == 0
    # both sides pinned, the agent unset: the engines' cores; the trainer's stays its own
    pinned = {"train": {"cpu_affinity": [2]}, "inference": {"cpu_affinity": [0, 1]}}
    gateway, worker = _agent_pair(tmp_path, **pinned)
    assert gateway.cpus == worker.cpus == {0, 1}
    assert gateway.nice == worker.nice == 0
    _, worker = _agent_pair(tmp_path, **pinned, agent={"nice": 2})
    assert worker.nice == 2
    gateway, worker = _agent_pair(tmp_path, train={"cpu_affinity": [1]})  # engines unpinned
    assert worker.cpus is None and worker.nice == 0  # the runner's mask and niceness
