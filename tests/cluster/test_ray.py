"""The Ray launcher on a real two-node Ray cluster on this machine: a head node holding the
``inference`` resource and a second ``ray start --address`` node holding ``train``. A stand-in
runs its command as an actor where the resources are and passes exit codes and signals
through; the quickstart trains 3 steps with ``--launcher ray``, the engine on one node and the
trainer on the other, as ``ray list actors`` shows. The nodes run at this machine's routed
address, not loopback, and the run listens there (``launcher.listen: node``): its engine, gateway
and queue bind that address only, so the run trains only if every process reaches the others
where Ray's nodes are. One cluster for the module (≈ 30-50 s)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import areal
from areal.host.on_node import node_address
from areal.host.process import pick_free_port
from support import eventually

pytestmark = [pytest.mark.slow, pytest.mark.serial]

REPO = Path(__file__).parents[2]
RAY = Path(sys.executable).with_name("ray")
# Ray's fixed default ports inside the kernel's ephemeral range, where pick_free_port's come
# from: each node's dashboard agent listens on 52365, so a GCS or dashboard port that happened
# to be 52365 failed `ray start` ("used by other components").
RAY_DEFAULT_PORTS = {52365}


def _free_port() -> int:
    """A free port none of Ray's components takes by default."""
    while (port := pick_free_port()) in RAY_DEFAULT_PORTS:
        pass
    return port


@dataclass(frozen=True)
class RayCluster:
    address: str  # the GCS, for ray.init and ``ray start --address``
    node_ip: str  # where both nodes are: this machine's address off loopback
    dashboard: str  # the state API, for ``ray list``
    env: dict[str, str]  # what a process needs to find this cluster and run this areal
    temp: Path  # the cluster's --temp-dir: its session logs, named when a ``ray`` call fails

    def ray(self, *args: str) -> Any:
        """``ray list ... --format json`` of the real CLI, parsed."""
        done = subprocess.run(
            [str(RAY), *args, "--format", "json", "--address", self.dashboard, "--limit", "500"],
            env=self.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:] + self.dashboard_log()
        return json.loads(done.stdout)

    def dashboard_log(self) -> str:
        """The end of the dashboard's own log: why the state API did not answer."""
        logs = sorted(self.temp.glob("session_*/logs/dashboard.log"))
        return f"\n--- {logs[-1]}:\n" + logs[-1].read_text()[-3000:] if logs else ""

    def node_with(self, resource: str) -> str:
        (node,) = [
            n["node_id"] for n in self.ray("list", "nodes") if resource in n["resources_total"]
        ]
        return str(node)

    def actors(self, namespace: str | None = None) -> dict[str, dict[str, Any]]:
        """The actors by name (the newest of each), of one namespace or all."""
        found: dict[str, dict[str, Any]] = {}
        for actor in self.ray("list", "actors"):
            if namespace is None or actor["ray_namespace"] == namespace:
                found[actor["name"]] = actor
        return found


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    if not RAY.exists():
        pytest.fail(f"no ray CLI at {RAY}: `make setup` installs areal[ray]")
    port, dashboard = _free_port(), _free_port()
    ip = node_address()  # what the shim on a node finds without Ray's word
    assert not ip.startswith("127."), "this machine has no address off loopback to run Ray at"
    # Ray's socket paths must stay short: a temp dir of its own under /tmp.
    temp = Path(f"/tmp/ray-areal-{os.getpid()}")
    src = str(Path(areal.__file__).resolve().parents[1])
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": f"{ip}:{port}",
           "PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
    env.pop("CUDA_VISIBLE_DEVICES", None)
    head = [str(RAY), "start", "--head", "--port", str(port), "--node-ip-address", ip]
    head += ["--num-cpus", "4", "--resources", '{"inference": 4}', "--temp-dir", str(temp)]
    head += ["--include-dashboard", "true", "--dashboard-port", str(dashboard)]
    second = [str(RAY), "start", "--address", f"{ip}:{port}", "--node-ip-address", ip]
    second += ["--num-cpus", "4", "--resources", '{"train": 4}']
    try:
        for command in (head, second):
            done = subprocess.run(
                [*command, "--disable-usage-stats"], env=env, capture_output=True, text=True,
                timeout=240,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        yield RayCluster(f"{ip}:{port}", ip, f"http://127.0.0.1:{dashboard}", env, temp)
    finally:
        subprocess.run([str(RAY), "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


def stand_in(*args: str) -> list[str]:
    return [sys.executable, "-m", "areal.plugins.launchers.ray_exec", *args]


def test_a_stand_in_runs_its_command_as_an_actor_where_the_resource_is(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    env = {**ray_cluster.env, "AREAL_RAY_NAMESPACE": "stand-in", "GREETING": "hello"}
    program = "import os, sys; print(os.environ['GREETING'], os.getpid(), flush=True); sys.exit(7)"
    command = stand_in(
        "--name", "exits", "--resources", '{"train": 1}', "--", sys.executable, "-c", program
    )
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 7, done.stderr[-2000:]  # the command's own exit code
    assert "hello " in done.stdout  # its output, and the environment the supervisor gave it

    # SIGTERM reaches the command, which exits on its own terms; its actor goes with it.
    program = (
        "import signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(3)))\n"
        "print('ready', flush=True)\n"
        "signal.pause()\n"
    )
    log = tmp_path / "stopped.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            stand_in("--name", "stopped", "--resources", '{"inference": 1}', "--",
                     sys.executable, "-c", program),
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        eventually(lambda: "ready" in log.read_text() or proc.poll() is not None, 120, "ready")
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 3, log.read_text()
    assert "got SIGTERM" in log.read_text()
    actors = ray_cluster.actors("stand-in")
    assert actors["exits"]["node_id"] == ray_cluster.node_with("train")
    assert actors["stopped"]["node_id"] == ray_cluster.node_with("inference")
    assert {a["state"] for a in actors.values()} == {"DEAD"}


SPREAD = ("--spread",)  # the engines' default (RayOptions.spread)


def test_spread_actors_land_on_different_nodes(ray_cluster: RayCluster, tmp_path: Path) -> None:
    """Two small actors fit on either node; ``--spread`` (the engines' default) puts them on
    both, where Ray's default would pack them."""
    env = {**ray_cluster.env, "AREAL_RAY_NAMESPACE": "spread"}
    program = "import signal; print('ready', flush=True); signal.pause()"
    logs = [tmp_path / f"engine{i}.log" for i in range(2)]
    procs = []
    for i, log in enumerate(logs):
        with log.open("wb") as out:
            procs.append(subprocess.Popen(
                stand_in("--name", f"engine{i}", *SPREAD, "--", sys.executable, "-c", program),
                env=env, stdout=out, stderr=subprocess.STDOUT,
            ))  # fmt: skip
    try:
        eventually(
            lambda: (
                all("ready" in log.read_text() for log in logs)
                or any(p.poll() is not None for p in procs)
            ),
            120,
            "both actors ready",
        )
        assert all(p.poll() is None for p in procs), [log.read_text() for log in logs]
        actors = ray_cluster.actors("spread")
        assert actors["engine0"]["node_id"] != actors["engine1"]["node_id"], actors
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)


def quickstart(tmp_path: Path, steps: int, *sets: str) -> list[str]:
    """``areal train`` of the quickstart, made small, on Ray, with the engine and the trainer
    on the nodes holding their resources."""
    return [
        sys.executable, "-m", "areal", "train", str(REPO / "configs" / "quickstart.yaml"),
        "--launcher", "ray", *(part for s in sets for part in ("--set", s)),
        "--set", "launcher.options={resources: {engine: {inference: 1}, trainer: {train: 1}}}",
        "--set", f"train.max_steps={steps}", "--set", "warm_start.steps=0",
        "--set", "model.init_tiny=nano", "--set", f"model.path={tmp_path / 'model'}",
        "--set", "async.trigger_batch_size=8", "--set", "train.global_batch_size=8",
        "--set", "train.mini_batch_size=8", "--set", "agent.concurrency=8",
        "--set", f"logging.log_dir={tmp_path / 'logs'}", "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip


def test_the_quickstart_trains_three_steps_on_two_ray_nodes(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    command = quickstart(tmp_path, 3, "launcher.listen=node")
    done = subprocess.run(
        command, cwd=tmp_path, env=ray_cluster.env, capture_output=True, text=True, timeout=600
    )
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert "done: 3 steps, version 3" in done.stdout + done.stderr
    # Each server said where it listens, on its node; the others reached it there.
    for server in ("engine0", "gateway"):
        said = f"{server} runs on {ray_cluster.node_ip}: http://{ray_cluster.node_ip}:"
        assert said in done.stdout + done.stderr, output
    (namespace,) = {line.split("namespace ")[1].rstrip(")") for line in done.stderr.splitlines()
                    if "the trainer goes to Ray (namespace" in line}  # fmt: skip
    actors = ray_cluster.actors(namespace)
    assert set(actors) == {"trainer", "engine0", "gateway", "rollout0"}, actors
    assert actors["engine0"]["node_id"] == ray_cluster.node_with("inference")
    assert actors["trainer"]["node_id"] == ray_cluster.node_with("train")
    assert all(a["state"] == "DEAD" for a in actors.values())  # nothing outlives the run
    # The accounting is exact: every episode received is trained, dropped or still buffered.
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    counters = summary["counters"]
    assert counters["received"] == counters["trained"] + counters["dropped"] + counters["buffered"]
    assert counters["trained"] == 3 * 8
    lines = (tmp_path / "logs" / "train.log").read_text().splitlines()
    assert [line.split()[1] for line in lines if line.startswith("[train] ")] == [
        "step=1", "step=2", "step=3"
    ]  # fmt: skip


def test_ray_job_submit_runs_areal_train_as_the_jobs_driver(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """``ray job submit -- areal train ... --launcher ray``: the driver runs on the head node in
    a job of its own, hands the trainer to Ray from there, and the job ends with the run."""
    submission = f"areal-job-{os.getpid()}"
    command = [str(RAY), "job", "submit", "--address", ray_cluster.dashboard]
    command += ["--submission-id", submission, "--", *quickstart(tmp_path, 2)]
    done = subprocess.run(
        command, cwd=tmp_path, env=ray_cluster.env, capture_output=True, text=True, timeout=600
    )
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output + ray_cluster.dashboard_log()  # 0: the job succeeded
    assert "done: 2 steps, version 2" in done.stdout, output  # the job's log, streamed back
    (job,) = [j for j in ray_cluster.ray("list", "jobs") if j["submission_id"] == submission]
    assert job["status"] == "SUCCEEDED", job
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps"] == 2
    counters = summary["counters"]
    assert counters["received"] == counters["trained"] + counters["dropped"] + counters["buffered"]
    (namespace,) = {line.split("namespace ")[1].rstrip(")") for line in done.stdout.splitlines()
                    if "the trainer goes to Ray (namespace" in line}  # fmt: skip
    actors = ray_cluster.actors(namespace)
    assert actors["trainer"]["node_id"] == ray_cluster.node_with("train")
    assert all(a["state"] == "DEAD" for a in actors.values())


def test_a_trainer_over_two_ray_nodes_trains_with_one_rank_on_each(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """``launcher.options.trainer_nodes: 2``: a placement group puts one trainer actor on each
    node (STRICT_SPREAD), each runs torchrun with one rank, they meet at the first bundle's
    node, and the dp2 run trains with rank 0's supervisor placing the rest."""
    port = pick_free_port()
    options = "launcher.options={resources: {engine: {inference: 1}}, trainer_nodes: 2, "
    options += f"rendezvous_port: {port}}}"
    command = quickstart(tmp_path, 2, "launcher.listen=node")
    at = command.index(
        "launcher.options={resources: {engine: {inference: 1}, trainer: {train: 1}}}"
    )
    command[at] = options  # the trainer's bundles: a CPU each, on two different nodes
    command += ["--set", "async.train_workers=2", "--set", "train.parallelism.dp=2"]
    done = subprocess.run(
        command, cwd=tmp_path, env=ray_cluster.env, capture_output=True, text=True, timeout=600
    )
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    everything = done.stdout + done.stderr
    assert f"2 trainer nodes meet at {ray_cluster.node_ip}:{port}" in everything, output
    assert "done: 2 steps, version 2" in everything, output
    (namespace,) = {line.split("namespace ")[1].rstrip(")") for line in done.stderr.splitlines()
                    if "the trainer goes to Ray (namespace" in line}  # fmt: skip
    actors = ray_cluster.actors(namespace)
    assert {"trainer0", "trainer1", "engine0", "gateway", "rollout0"} <= set(actors), actors
    assert actors["trainer0"]["node_id"] != actors["trainer1"]["node_id"]  # one per node
    assert all(a["state"] == "DEAD" for a in actors.values())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps"] == 2
    counters = summary["counters"]
    assert counters["received"] == counters["trained"] + counters["dropped"] + counters["buffered"]
