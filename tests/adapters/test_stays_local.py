"""Nothing an adapter runs leaves 127.0.0.1: every network connection made during an episode is
observed and checked, not assumed.

In-process SDK agents (openai, anthropic, langchain) are watched with Python's audit hooks
(``socket.connect`` and ``socket.getaddrinfo`` events, raised by CPython itself for every socket
any library opens); the CLI harnesses (Claude Code, OpenClaw) run under ``strace -f -e
trace=connect``, which sees every connect(2) of the CLI and its children, DNS lookups included.
A lookup of a public name or a connection to a non-loopback address fails the test. The CLI
runs are in the serial tier.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import areal
from areal.adapters.claude_code import ClaudeCodeAdapter
from areal.adapters.codex import CodexAdapter
from areal.adapters.openclaw import OpenClawAdapter, find_node_dir
from areal.core.episode import session_fields
from areal.run.rollout import RolloutWorker
from support.cli import CLAUDE_CODE, CODEX, OPENCLAW, strace
from support.sockets import is_loopback, outside, watch_sockets

TASK = {"task_id": "local", "question": "What is 2 plus 2?", "prompt": "hi", "answer": "4"}


@pytest.fixture
def sockets() -> Iterator[list[tuple[str, Any]]]:
    with watch_sockets() as seen:
        yield seen


async def openai_agent(task: dict[str, Any], client: Any, model: str) -> float:
    messages = [{"role": "user", "content": task["question"]}]
    await client.chat.completions.create(model=model, messages=messages, max_tokens=3)
    return 1.0


async def anthropic_agent(task: dict[str, Any], client: Any, model: str) -> float:
    messages = [{"role": "user", "content": task["question"]}]
    await client.messages.create(model=model, max_tokens=3, messages=messages)
    return 1.0


async def langchain_agent(task: dict[str, Any], llm: Any) -> float:
    await llm.bind(max_tokens=3).ainvoke(task["question"])
    return 1.0


@pytest.mark.parametrize(
    ("framework", "agent"),
    [
        ("openai_sdk", openai_agent),
        ("anthropic_sdk", anthropic_agent),
        ("langchain", langchain_agent),
    ],
)
def test_sdk_adapters_connect_only_to_loopback(
    gateway: Any, sockets: list[tuple[str, Any]], framework: str, agent: Any
) -> None:
    stats, got = gateway.run(areal.wrap(agent, framework=framework), [TASK])
    assert (stats.finished, stats.failed) == (1, 0), stats.errors
    assert got["local"].completions == 1
    assert any(kind == "connect" for kind, _ in sockets)  # the watch works: calls were seen
    assert outside(sockets) == []


# --- the CLI harnesses, under strace ----------------------------------------------------------

CONNECT = re.compile(
    r'sa_family=AF_INET6?, .*?(?:inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)")'
)


def traced(binary: str, tmp_path: Path) -> tuple[str, Path]:
    """A wrapper running ``binary`` under strace; the log of its (and its children's) connects.
    ``--seccomp-bpf`` stops the traced processes at connect(2) only, not at every system call
    (the same connects are logged; Node's start-up runs at nearly full speed)."""
    log = tmp_path / "connects.log"
    wrapper = tmp_path / f"traced-{Path(binary).name}"
    wrapper.write_text(
        f"#!/bin/sh\nexec {strace()} -f -qq --seccomp-bpf -e trace=connect -e signal=none "
        f'-o {log} {binary} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper), log


def inet_connects(log: Path) -> list[str]:
    """Addresses of every AF_INET/AF_INET6 connect(2) in the strace log."""
    found = []
    for line in log.read_text().splitlines():
        match = CONNECT.search(line)
        if match:
            found.append(match.group(1) or match.group(2))
    return found


def run_harness(gateway: Any, adapter: Any) -> Any:
    worker = RolloutWorker(gateway.url, gateway.admin, adapter, model=gateway.model)
    return asyncio.run(worker.run([TASK]))


@pytest.mark.serial
def test_claude_code_connects_only_to_loopback(gateway: Any, tmp_path: Path) -> None:
    binary, log = traced(CLAUDE_CODE(), tmp_path)
    adapter = ClaudeCodeAdapter(binary=binary, max_output_tokens=16, timeout_s=120.0)
    stats = run_harness(gateway, adapter)
    assert stats.started == 1 and not stats.timed_out, stats.to_json()
    addresses = inet_connects(log)
    assert addresses, "strace saw no connection: the CLI never reached the gateway"
    assert [a for a in addresses if not is_loopback(a)] == []


FIXED_KEY = "openclaw-install-key-abcdef0123456789"


@pytest.mark.serial
def test_openclaw_with_a_fixed_key_stays_local_and_each_run_is_an_episode(
    gateway: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenClaw with one key for every run (as some installs keep it): the worker opens each
    session with that key, the gateway lets one episode hold it at a time, so two tasks at
    concurrency 2 still become two trajectories; and neither run connects beyond loopback."""
    openclaw = OPENCLAW()
    binary, log = traced(openclaw, tmp_path)
    monkeypatch.setenv("OPENCLAW_INSTALL_KEY", FIXED_KEY)
    adapter = OpenClawAdapter(
        binary=binary,
        node=find_node_dir(None, openclaw),
        fixed_key_env="OPENCLAW_INSTALL_KEY",
        reward_command="true",
        context_window=4096,
        max_tokens=32,
        supports_tools=False,
        tools_profile="minimal",
        timeout_s=120.0,
    )
    assert session_fields(adapter.agent_fn) == {"api_key": FIXED_KEY}
    worker = RolloutWorker(
        gateway.url, gateway.admin, adapter, model=gateway.model, concurrency=2,
        session_fields=session_fields(adapter.agent_fn),
    )  # fmt: skip
    stats = asyncio.run(worker.run([{"task_id": f"fixed{i}", "prompt": "hi"} for i in range(2)]))
    assert (stats.finished, stats.sent) == (2, 2), stats.to_json()
    assert stats.waited_s >= 1.0  # the second episode waited for the key
    got = {t.metadata["task_id"]: t for t in gateway.trajectories()}
    assert set(got) == {"fixed0", "fixed1"} and all(t.completions >= 1 for t in got.values())
    assert FIXED_KEY not in (gateway.log_dir / "gateway.log").read_text()
    addresses = inet_connects(log)
    assert addresses, "strace saw no connection: the CLI never reached the gateway"
    assert [a for a in addresses if not is_loopback(a)] == []


def test_both_watches_see_a_connection_that_leaves(
    sockets: list[tuple[str, Any]], tmp_path: Path
) -> None:
    """The checks above can fail: a UDP connect to a documentation address (RFC 5737; a UDP
    connect sends no packet) is caught by the audit hook and by strace."""
    import socket
    import subprocess

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect(("192.0.2.1", 53))
    assert outside(sockets) == [("connect", ("192.0.2.1", 53))]

    script = tmp_path / "leave.py"
    script.write_text(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.connect(('192.0.2.1', 53))\n"
    )
    script.chmod(0o755)
    binary, log = traced(sys.executable, tmp_path)
    subprocess.run([binary, str(script)], check=True)
    assert "192.0.2.1" in inet_connects(log)


@pytest.mark.serial
def test_codex_connects_only_to_loopback(gateway: Any, tmp_path: Path) -> None:
    """Codex with the adapter's switches (no update check, analytics, feedback, OTel exporters
    or plugin sync): only the gateway is reached."""
    binary, log = traced(CODEX(), tmp_path)
    stats = run_harness(gateway, CodexAdapter(binary=binary, timeout_s=120.0))
    assert stats.started == 1 and not stats.timed_out, stats.to_json()
    addresses = inet_connects(log)
    assert addresses, "strace saw no connection: the CLI never reached the gateway"
    assert [a for a in addresses if not is_loopback(a)] == []
