"""Child processes the tests start, find and stand beside: stand-in servers and sleepers, this
test's own children by command line, "another process" holding a port the product wanted, and a
real embedded engine and a real gateway each in its own process (for the tests that kill one of
them mid-episode), with the few calls an episode makes through that gateway.

The stand-ins wait for a signal, never for a time: a sleeper is ``signal.pause()`` (it lives until
it is stopped), so a test never depends on how long a child happens to stay up.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import psutil
import yaml

from areal.core.plugins import registry
from areal.host.process import ServerProcess, start_on_free_port, with_port
from support.wait import eventually

# A child that says it is up and then lives until it is signalled.
SLEEPER = [sys.executable, "-c", "import signal; print('up', flush=True); signal.pause()"]

# A health-only server on ``argv[1]``. It forks a child into its process group, as SGLang does,
# so a stop must take the whole group down.
HEALTH_SERVER = """
import http.server, subprocess, sys
port = int(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
print(f"child {child.pid}", flush=True)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

print(f"serving on {port}", flush=True)
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def children(pattern: str) -> list[psutil.Process]:
    """This test process's live descendants whose command line contains ``pattern``."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and pattern in " ".join(proc.cmdline()):
                found.append(proc)
    return found


def serve(status: int, body: bytes, port: int = 0) -> Iterator[int]:
    """A server in this process answering ``status`` and ``body`` to every GET, on ``port``
    (0: a free one); yields its port. A generator: wrap it in ``contextlib.contextmanager`` or
    ``yield from`` it in a fixture."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def someone_else_on(port: int, timeout: float = 60.0) -> Iterator[None]:
    """Another process's server answering 200 on ``port`` once the dead child's socket has let
    go of it (as another run's gateway or engine picking that freed port would)."""
    with contextlib.ExitStack() as stack:

        def bound() -> bool:
            stack.enter_context(contextlib.contextmanager(serve)(200, b"", port))
            return True

        eventually(bound, timeout, f"port {port} to be free for another process")
        yield


# --- a real engine and a real gateway, each its own process --------------------------------------

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
