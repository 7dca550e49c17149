"""A checkpoint save killed at every phase, and one that meets a full disk, with the save code of
``areal train`` (``save_checkpoint`` + the ``fsdp`` engine's ``save``, nano model, CPU): the last
good checkpoint always loads back exact through the ``--resume`` path (``recover_checkpoints``,
``latest_checkpoint``, ``load_checkpoint``, the engine's ``build``), and nothing partial stays.

Why killing at the named phases covers every moment of a save: between two crash points a save
either writes inside its hidden ``.step-N.tmp/`` (invisible to a loader, removed by the next
writer) or does one ``rename`` (atomic); so a kill anywhere leaves what a kill at the point before
or after it leaves. The phase list is the code's own (``SAVE_PHASES`` of the run and of the
engine), and a test checks that a save passes exactly those points and that the source holds no
others. A save killed by the kernel in the middle of writing each of its files is tested as
well (``RLIMIT_FSIZE``: the kill lands at an exact byte).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from areal.core.run_config import RunConfig, run_config_from_dict
from areal.core.train_engine import EngineSetup
from areal.core.types import Sample, Trajectory
from areal.host import faults
from areal.plugins.trainer import engine as fsdp
from areal.run import checkpoint as ckpt
from support.runs import make_config, trained

ROOT = Path(__file__).resolve().parents[2]
UNSHARED_ENV = "AREAL_TEST_IN_MOUNT_NAMESPACE"

# Where each scenario's save goes: a new step (then the retention deletes the oldest), or a step
# that exists saved again (the final save after draining the queue).
SCENARIOS = {
    "new_step": [p for p in ckpt.SAVE_PHASES if p != "checkpoint.moved_aside"],
    "same_step": [p for p in ckpt.SAVE_PHASES if p != "checkpoint.pruning"],
}


def with_engine_phases(phases: list[str]) -> list[str]:
    """The run's phases with the engine's own between "started" and "engine_written"."""
    i = phases.index("checkpoint.started") + 1
    return [*phases[:i], *fsdp.SAVE_PHASES, *phases[i:]]


# --- a small run's trainer state ------------------------------------------------------------


def world_config(tmp: Path) -> RunConfig:
    return run_config_from_dict(
        {
            "model": {"path": str(tmp / "model"), "dtype": "float32", "init_tiny": "nano"},
            "dataset": {"name": "calculator"},
            "warm_start": {"steps": 0},
            "train": {"global_batch_size": 2, "mini_batch_size": 2},
            "algorithm": {"group_size": 2},
        }
    )


def samples(step: int) -> list[Sample]:
    ids = [1 + step, 2, 3, 4, 5]
    return [
        Sample(ids, [0, 0, 1, 1, 1], [0.0, 0.0, -0.5, -0.7, -0.2], [-1, -1, 0, 0, 0], reward=1.0),
        Sample(ids, [0, 0, 1, 1, 1], [0.0, 0.0, -0.9, -0.1, -0.4], [-1, -1, 0, 0, 0], reward=0.0),
    ]


@dataclass
class Saved:
    """What one checkpoint must load back as."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    state: dict[str, Any]
    pending: list[Trajectory] = field(default_factory=list)


def pending_of(step: int, n: int) -> list[Trajectory]:
    return [
        Trajectory(f"s{step}-{i}", samples(step)[:1], None, step, metadata={"task_index": i})
        for i in range(n)
    ]


def snapshot(engine: fsdp.FSDPEngine, step: int, pending: list[Trajectory]) -> Saved:
    assert engine.policy is not None
    model = {k: v.detach().clone() for k, v in engine.policy.model.state_dict().items()}
    optimizer = _clone(engine.policy.optimizer.state_dict())
    state = {"loop": {"version": step, "steps": step}, "data": {"seen": [[0, step]]}}
    return Saved(step, model, optimizer, state, pending)


def save(out: Path, engine: fsdp.FSDPEngine, saved: Saved, keep: int = 2) -> Path:
    """What ``areal train``'s ``_Run.save`` does, with this state."""
    return ckpt.save_checkpoint(
        out,
        step=saved.step,
        write_engine=lambda tmp: engine.save(tmp, saved.step),
        state=saved.state,
        pending=saved.pending,
        keep=keep,
    )


def resume(config: RunConfig, out: Path) -> tuple[ckpt.Checkpoint, fsdp.FSDPEngine]:
    """The ``--resume`` path of ``areal train`` (runner.build): clean up, find, load, build."""
    ckpt.recover_checkpoints(out)
    found = ckpt.latest_checkpoint(out)
    assert found is not None, "no checkpoint to resume"
    checkpoint = ckpt.load_checkpoint(found)
    engine = fsdp.build(EngineSetup.from_config(config, out, resume_from=checkpoint.path))
    return checkpoint, engine


def assert_exact(config: RunConfig, out: Path, expected: Saved) -> None:
    checkpoint, engine = resume(config, out)
    assert checkpoint.step == expected.step
    assert engine.policy is not None
    model = engine.policy.model.state_dict()
    assert model.keys() == expected.model.keys()
    for name, tensor in expected.model.items():
        assert torch.equal(model[name], tensor), name
    _assert_same(engine.policy.optimizer.state_dict(), expected.optimizer)
    state = {k: v for k, v in checkpoint.state.items() if k not in ("files", "step")}
    assert state == expected.state
    assert [t.to_json() for t in checkpoint.pending] == [t.to_json() for t in expected.pending]


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("."))


def steps_on_disk(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir() if not p.name.startswith("."))


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clone(v) for v in value)
    return value


def _assert_same(actual: Any, expected: Any, where: str = "optimizer") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and torch.equal(actual, expected), where
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), where
        for k in expected:
            _assert_same(actual[k], expected[k], f"{where}.{k}")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _assert_same(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, where


@dataclass
class World:
    """Two good checkpoints (steps 1 and 2) of a real engine, and the state a third save holds."""

    config: RunConfig
    base: Path  # the output dir with steps 1 and 2, copied for each test
    engine: fsdp.FSDPEngine
    saved: dict[int, Saved]
    again: Saved  # step 2 saved again: the same weights, the queue's drained trajectories added

    def fresh(self, tmp: Path) -> Path:
        out = tmp / "out"
        shutil.copytree(self.base, out)
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("world")
    config = world_config(tmp)
    base = tmp / "out"
    engine = fsdp.build(EngineSetup.from_config(config, base))
    saved: dict[int, Saved] = {}
    for step in (1, 2, 3):
        engine.step(samples(step), group_ids=[0, 0], current_version=step - 1)
        saved[step] = snapshot(engine, step, pending_of(step, 2))
        if step < 3:
            save(base, engine, saved[step])
    # The engine now holds step 3; "again" is step 2's state (as saved) with more trajectories.
    again = Saved(2, saved[2].model, saved[2].optimizer, saved[2].state, pending_of(2, 5))
    return World(config, base, engine, saved, again)


def holding(engine: fsdp.FSDPEngine, saved: Saved) -> contextlib.AbstractContextManager[None]:
    """The engine with ``saved``'s weights and optimizer for the duration (to re-save step 2)."""

    @contextlib.contextmanager
    def swap() -> Iterator[None]:
        assert engine.policy is not None
        policy = engine.policy
        now_model = _clone(policy.model.state_dict())
        now_optimizer = _clone(policy.optimizer.state_dict())
        policy.model.load_state_dict(saved.model)
        policy.optimizer.load_state_dict(_clone(saved.optimizer))
        try:
            yield
        finally:
            policy.model.load_state_dict(now_model)
            policy.optimizer.load_state_dict(now_optimizer)

    return swap()


def save_scenario(world: World, out: Path, scenario: str) -> Callable[[], Path]:
    if scenario == "new_step":
        return lambda: save(out, world.engine, world.saved[3])

    def again() -> Path:
        with holding(world.engine, world.again):
            return save(out, world.engine, world.again)

    return again


# --- a child process that saves, and dies ---------------------------------------------------


def in_child(
    work: Callable[[], Any], *, crash_at: str | None = None, file_limit: int | None = None
) -> int:
    """Run ``work`` in a forked child (with ``AREAL_TEST_CRASH_AT=crash_at``; killed by the
    kernel at the write that takes a file past ``file_limit`` bytes); its wait status.

    Forked, not spawned, so the child starts in milliseconds with torch and the engine already
    in memory; it runs torch on one thread (a forked OpenMP pool is not to be used)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            torch.set_num_threads(1)
            if crash_at is not None:
                os.environ[faults.CRASH_ENV] = crash_at
            if file_limit is not None:
                signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it by default
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
            work()
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


# --- the phase list is the code's, and complete -----------------------------------------------


def test_a_save_passes_exactly_the_declared_phases(world: World, tmp_path: Path) -> None:
    for scenario, phases in SCENARIOS.items():
        out = world.fresh(tmp_path / scenario)
        with faults.trace() as reached:
            save_scenario(world, out, scenario)()
        assert reached == with_engine_phases(phases), scenario
    declared = [*ckpt.SAVE_PHASES, *fsdp.SAVE_PHASES]
    assert len(set(declared)) == len(declared)
    assert set().union(*(with_engine_phases(p) for p in SCENARIOS.values())) == set(declared)
    # No crash point in the source that the list does not name (one in a branch not taken here,
    # the several-ranks save, would show up here).
    sources = [p.read_text() for p in (ROOT / "src" / "areal").rglob("*.py")]
    calls = [c for text in sources for c in re.findall(r"\bcrash_point\(([^)]*)\)", text)]
    assert all(re.fullmatch(r'"[^"]+"', c) for c in calls if c != "name: str"), calls
    in_source = {c.strip('"') for c in calls if c != "name: str"}
    assert {p for p in in_source if p.split(".")[0] in ("checkpoint", "engine")} == set(declared)


# --- killed at every phase ----------------------------------------------------------------


KILLS = [
    (scenario, phase)
    for scenario, phases in SCENARIOS.items()
    for phase in with_engine_phases(phases)
]


@pytest.mark.parametrize(("scenario", "phase"), KILLS, ids=[f"{s}-{p}" for s, p in KILLS])
def test_a_save_killed_at_a_phase_leaves_the_last_good_checkpoint(
    world: World, tmp_path: Path, scenario: str, phase: str, caplog: pytest.LogCaptureFixture
) -> None:
    out = world.fresh(tmp_path)
    status = in_child(save_scenario(world, out, scenario), crash_at=phase)
    assert killed(status), f"the save never reached {phase} (wait status {status})"
    left = leftovers(out)  # what the killed save left behind

    order = with_engine_phases(SCENARIOS[scenario])
    committed = order.index(phase) >= order.index("checkpoint.committed")
    if scenario == "new_step":
        expected = world.saved[3] if committed else world.saved[2]
    else:
        expected = world.again if committed else world.saved[2]
    with caplog.at_level(logging.WARNING, logger="areal.train"):
        assert_exact(world.config, out, expected)
    assert leftovers(out) == [], "the recovery left hidden directories"
    # One log line says what was cleaned up, naming each leftover.
    cleaned = [r.getMessage() for r in caplog.records if "interrupted" in r.getMessage()]
    assert len(cleaned) == (1 if left else 0), cleaned
    assert all(name in cleaned[0] for name in left)

    # The run goes on: the next save works and the retention holds.
    save_scenario(world, out, "new_step")()
    assert steps_on_disk(out) == ["step-000002", "step-000003"]
    assert leftovers(out) == []
    assert_exact(world.config, out, world.saved[3])


def cut_points(world: World) -> list[int]:
    """Byte counts that cut each file of a checkpoint in the middle (half its size)."""
    files = [p for p in (world.base / "checkpoints" / "step-000002").rglob("*") if p.is_file()]
    return sorted({p.stat().st_size // 2 for p in files if p.stat().st_size >= 2})


def test_a_save_killed_in_the_middle_of_a_file_leaves_the_last_good_checkpoint(
    world: World, tmp_path: Path
) -> None:
    """The kernel stops the save at an exact byte: with ``RLIMIT_FSIZE`` at ``limit``, the write
    (or preallocation) that would take a file past it is cut there and the process is killed
    (SIGXFSZ, which the child does not ignore), as a power cut mid-write would leave the file. One cut in the middle
    of each of a checkpoint's files; each leaves the last good checkpoint, exact, and nothing
    partial after the recovery."""
    limits = cut_points(world)
    assert len(limits) >= 3, limits  # the weights, the optimizer, the run's files
    for limit in limits:
        out = world.fresh(tmp_path / f"cut{limit}")
        status = in_child(save_scenario(world, out, "new_step"), file_limit=limit)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXFSZ, (limit, status)
        tmp = out / "checkpoints" / ".step-000003.tmp"
        # SIGXFSZ comes only from a write past the limit: the file it cut is in the save's
        # hidden folder, holding at most ``limit`` bytes (a preallocating writer: none).
        cut = [p.name for p in tmp.rglob("*") if p.is_file() and p.stat().st_size <= limit]
        assert cut, f"no file was cut at {limit} bytes in {tmp}"
        assert_exact(world.config, out, world.saved[2])
        assert leftovers(out) == []


# --- a full disk ------------------------------------------------------------------------------


@functools.cache
def cannot_mount() -> str | None:
    """Why this process cannot mount a tmpfs, or ``None`` when it can."""
    probe = Path(tempfile.mkdtemp(prefix="areal-tmpfs-probe-"))
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        return "no mount command"
    finally:
        if probe.is_mount():
            subprocess.run(["umount", str(probe)], check=False)
        probe.rmdir()
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount: {done.returncode}")


def needs_tmpfs(test: Callable[..., None]) -> Callable[..., None]:
    """Run the test where it may mount a tmpfs: here (root), else again under ``unshare -rm`` (a
    user and mount namespace of its own), else fail with the reason: a full disk can be had on
    any Linux machine that allows either."""

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        why = cannot_mount()
        if why is None:
            test(*args, **kwargs)
            return
        if os.environ.get(UNSHARED_ENV):
            pytest.fail(f"cannot mount a tmpfs, even under unshare -rm: {why}", pytrace=False)
        unshare = shutil.which("unshare")
        if unshare is None or subprocess.run([unshare, "-rm", "true"]).returncode != 0:
            pytest.fail(
                f"cannot mount a tmpfs ({why}), and unshare -rm is not permitted: run as root, "
                "or allow unprivileged user namespaces",
                pytrace=False,
            )
        nodeid = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]
        done = subprocess.run(
            [
                unshare,
                "-rm",
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                nodeid,
            ],
            cwd=ROOT,
            env={**os.environ, UNSHARED_ENV: "1"},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert " passed" in done.stdout, done.stdout[-4000:]

    return wrapper


@contextlib.contextmanager
def tmpfs(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``path`` (a small disk that fills up)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def resize(path: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def free_bytes(path: Path) -> int:
    fs = os.statvfs(path)
    return fs.f_bfree * fs.f_frsize


def pages(path: Path) -> int:
    """The bytes ``path``'s files take on a tmpfs (whole 4 KiB pages)."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in files)


# Where the disk fills up: the free space left before the save, from the sizes of a checkpoint's
# parts, and the last phase the save passes.
FILLS: dict[str, tuple[Callable[[Path], int], str]] = {
    "in_the_weights": (lambda c: 64 * 1024, "checkpoint.started"),
    "in_the_optimizer": (lambda c: pages(c / "model") + 64 * 1024, "engine.model_written"),
    "in_the_run_files": (
        lambda c: pages(c / "model") + pages(c / fsdp.OPTIMIZER_FILE),
        "checkpoint.engine_written",
    ),
}


@pytest.mark.parametrize("where", list(FILLS))
@needs_tmpfs
def test_a_full_disk_fails_the_save_in_one_line_and_keeps_the_last_good(
    world: World, tmp_path: Path, where: str
) -> None:
    free_before_save, last_phase = FILLS[where]
    with tmpfs(tmp_path / "disk", 32 << 20) as disk:
        out = disk / "out"
        last_good = out / "checkpoints" / "step-000002"
        shutil.copytree(world.base / "checkpoints" / "step-000002", last_good)
        filler = disk / "filler"
        with open(filler, "wb") as f:
            f.write(b"\0" * (free_bytes(disk) - free_before_save(last_good)))
        free = free_bytes(disk)

        with faults.trace() as reached, pytest.raises(ckpt.CheckpointError) as failed:
            save_scenario(world, out, "new_step")()
        message = str(failed.value)
        assert "\n" not in message and failed.value.no_space
        assert message == (
            f"checkpoint step-000003 not saved: no space left on device in {out / 'checkpoints'}; "
            f"the last good checkpoint {last_good} is kept"
        )
        assert reached[-1] == last_phase, reached
        assert leftovers(out) == [] and steps_on_disk(out) == ["step-000002"]
        assert free_bytes(disk) == free, "the partial files were not all removed"
        assert_exact(world.config, out, world.saved[2])

        # Room again: the next save works.
        filler.unlink()
        save_scenario(world, out, "new_step")()
        assert_exact(world.config, out, world.saved[3])


@pytest.mark.slow
@pytest.mark.serial
@needs_tmpfs
def test_areal_train_stops_in_one_line_on_a_full_disk_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """``areal train`` with its checkpoints on a disk that holds one and a half of them: step 1
    is saved, step 2's save fails; the run stops with one line, step 1 stays; with room again,
    ``--resume`` goes on from step 1 to the end."""
    from areal.run import train as entry

    out = tmp_path / "out"
    config = make_config(tmp_path, logging={"save_interval": 1})
    with tmpfs(out / "checkpoints", 7 << 20) as disk:
        with caplog.at_level(logging.INFO):
            assert entry.run(config, out) == 1
        errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert errors == [
            f"error: checkpoint step-000002 not saved: no space left on device in {disk}; the "
            f"last good checkpoint {disk / 'step-000001'} is kept; free space, then "
            "`areal train --resume`"
        ]
        assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
        assert steps_on_disk(out) == ["step-000001"] and leftovers(out) == []
        assert json.loads((disk / "step-000001" / "state.json").read_text())["step"] == 1
        first = len(trained(out))

        resize(disk, 64 << 20)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert entry.run(config, out, resume=True) == 0
        assert f"resuming from {disk / 'step-000001'} (step 1)" in caplog.messages
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps"] == 3 and summary["version"] == 3
        assert steps_on_disk(out) == ["step-000002", "step-000003"] and leftovers(out) == []
        # The audit trail: the first run trained steps 1 and 2 (step 2 lost with its save), the
        # resumed one steps 2 and 3 from step 1's checkpoint (its data position and the
        # episodes it had buffered). The final model's lineage, step 1 of the first run and
        # then the resumed run, trains no episode twice; an episode of the lost step 2 that
        # step 1's checkpoint held is trained again, as it must be (its update was lost).
        records = trained(out)
        assert {r["step"] for r in records[:first]} == {1, 2}
        assert {r["step"] for r in records[first:]} == {2, 3}
        lineage = [r for r in records[:first] if r["step"] == 1] + records[first:]
        ids = [r["session_id"] for r in lineage]
        assert len(ids) == len(set(ids))
        lost = {r["session_id"] for r in records[:first] if r["step"] == 2}
        first_step = {r["session_id"] for r in records[:first] if r["step"] == 1}
        assert not lost & first_step
