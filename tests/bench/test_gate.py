"""The regression gate (``bench/check.py``): its verdicts on hand-made numbers, and one real run
of its cheapest benchmark against a baseline written by ``--update`` (the serial tier: a benchmark
runs several processes; the checks after it reuse its measurements, ``--reuse``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.cli import BENCH, bench_script

gate = bench_script("gate")
check = bench_script("check")
HERE = check.host()[0]  # this machine's key in a baseline file


def test_band_is_the_relative_spread_with_a_floor() -> None:
    assert gate.band_of([0.9, 1.0, 1.1]) == pytest.approx(0.2)
    assert gate.band_of([1.0, 1.0, 1.01]) == gate.MIN_BAND
    with pytest.raises(ValueError):
        gate.band_of([])


def test_verdicts() -> None:
    baseline = {
        "steady": {"value": 2.0, "band": 0.1},
        "fell": {"value": 2.0, "band": 0.1},
        "rose": {"value": 2.0, "band": 0.1},
        "edge": {"value": 2.0, "band": 0.1},
        "gone": {"value": 1.0, "band": 0.1},
    }
    now = {"steady": 1.9, "fell": 1.7, "rose": 2.5, "edge": 1.8, "fresh": 3.0}
    got = {v.name: v for v in gate.compare(baseline, now)}
    assert {n: v.verdict for n, v in got.items()} == {
        "steady": "ok",
        "fell": "FELL",
        "rose": "rose",
        "edge": "ok",  # exactly at the band's edge is noise
        "gone": "missing",
        "fresh": "new",
    }
    assert got["fell"].change == pytest.approx(-0.15)
    assert got["fell"].fell and not got["rose"].fell
    text = gate.table(list(got.values()))
    assert "-15.0 %" in text and "±10.0 %" in text and "FELL" in text


def test_baseline_entries_take_the_median_and_spread() -> None:
    rounds = [{"a": 1.0, "b": 5.0}, {"a": 1.2}, {"a": 0.8, "b": 5.0}]
    entries = gate.baseline_entries(rounds)
    assert entries == {
        "a": {"value": 1.0, "band": 0.4, "samples": [1.0, 1.2, 0.8]},
        "b": {"value": 5.0, "band": gate.MIN_BAND, "samples": [5.0, 5.0]},  # one round lacked it
    }
    assert gate.median_of_rounds(rounds) == {"a": 1.0, "b": 5.0}


def test_each_host_is_compared_with_its_own_baseline_or_the_nearest() -> None:
    amx = {"ratios": {"a": {"value": 1.0, "band": 0.1}}}
    avx2 = {"ratios": {"a": {"value": 2.0, "band": 0.1}}}
    avx2_big = {"ratios": {"a": {"value": 3.0, "band": 0.1}}}
    doc = {"hosts": {"avx512+amx, 2 cpus": amx, "avx2, 8 cpus": avx2_big, "avx2, 2 cpus": avx2}}
    assert gate.baseline_for(doc, "avx2, 2 cpus") == ("avx2, 2 cpus", avx2)  # its own
    assert gate.baseline_for(doc, "avx2, 4 cpus") == ("avx2, 8 cpus", avx2_big)  # same ISA
    assert gate.baseline_for(doc, "avx512, 2 cpus") == ("avx512+amx, 2 cpus", amx)  # the first
    assert gate.baseline_for({}, "avx2, 2 cpus") == (None, {})
    # a file from before hosts were kept: one baseline, the nearest for every host
    old = {"about": "...", "command": "c", "ratios": amx["ratios"]}
    assert gate.hosts_of(old) == {gate.UNNAMED_HOST: {"command": "c", "ratios": amx["ratios"]}}
    assert gate.baseline_for(old, "avx2, 2 cpus")[1]["ratios"] == amx["ratios"]


def test_this_host_has_a_key_naming_its_instruction_set_and_cores() -> None:
    key, cpu = check.host()
    isa, cores = key.split(", ")
    assert isa in ("avx512+amx", "avx512", "avx2") or isa == check.platform.machine()
    assert cores == f"{check.os.cpu_count()} cpus" and cpu


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    small = ("--extra", "queue", "--rounds 1 --megabytes 20")  # a test, not a measurement
    command = [sys.executable, str(BENCH / "check.py"), "--only", "queue", *small, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@dataclass(frozen=True)
class RealRun:
    baseline: Path  # what its --update wrote
    measured: Path  # its measurements (--json), for --reuse


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> RealRun:
    """The one real run of the queue benchmark, with ``--update`` into a fresh baseline."""
    where = tmp_path_factory.mktemp("real-run")
    run = RealRun(where / "first.json", where / "measured.json")
    done = _check("--baseline", str(run.baseline), "--update", "--json", str(run.measured))
    assert done.returncode == 0, done.stderr
    return run


@pytest.mark.serial
def test_a_real_queue_run_against_its_own_baseline(real_run: RealRun, tmp_path: Path) -> None:
    """``--update`` writes the file; a strict check against an impossible baseline exits 1 and
    names the fall; without ``--strict`` the same check exits 0 (those two reuse the real run's
    measurements: ``--reuse``)."""
    path, measured = tmp_path / "baseline.json", real_run.measured
    shutil.copy(real_run.baseline, path)
    doc = json.loads(path.read_text())
    assert list(doc["hosts"]) == [HERE]
    mine = doc["hosts"][HERE]
    assert set(mine["ratios"]) == {"queue_vs_raw_1k", "queue_vs_raw_8k"}
    assert "--update" in mine["command"] and mine["ratios"]["queue_vs_raw_8k"]["value"] > 0
    for entry in mine["ratios"].values():
        entry["value"], entry["band"] = 1000.0, 0.05  # no queue is 1000x raw ZeroMQ
    path.write_text(json.dumps(doc))
    again = ("--baseline", str(path), "--reuse", str(measured))
    strict = _check(*again, "--strict")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "FELL: queue_vs_raw_8k" in strict.stdout
    assert _check(*again).returncode == 0


@pytest.mark.serial
def test_an_update_of_some_entries_keeps_how_the_others_were_made(
    real_run: RealRun, tmp_path: Path
) -> None:
    """``--update --only queue`` on a file with other entries for this host keeps those entries
    and appends its command to the host's, each entry it wrote names that command, and another
    host's baseline stays as it was."""
    path, measured = tmp_path / "baseline.json", real_run.measured
    other = {"value": 2.0, "band": 0.1, "samples": [2.0], "command": "an earlier run"}
    elsewhere = {"cpu": "a CPU", "command": "a run there", "ratios": {"queue_vs_raw_8k": other}}
    hosts = {HERE: {"command": "an earlier run", "ratios": {"engine_x": other}}, "x": elsewhere}
    path.write_text(json.dumps({"hosts": hosts}))
    done = _check("--baseline", str(path), "--update", "--reuse", str(measured))
    assert done.returncode == 0, done.stderr
    doc = json.loads(path.read_text())
    mine = doc["hosts"][HERE]
    assert mine["ratios"]["engine_x"] == other
    assert mine["command"].startswith("an earlier run; later (")
    assert mine["command"].endswith(mine["ratios"]["queue_vs_raw_8k"]["command"])
    assert "--reuse" in mine["ratios"]["queue_vs_raw_8k"]["command"]
    assert doc["hosts"]["x"] == elsewhere


@pytest.mark.serial
def test_a_host_without_a_baseline_is_compared_with_another_hosts_and_told(
    real_run: RealRun, tmp_path: Path
) -> None:
    path, measured = tmp_path / "baseline.json", real_run.measured
    fell = {"value": 1000.0, "band": 0.05}
    path.write_text(json.dumps({"hosts": {"z80, 1 cpus": {"ratios": {"queue_vs_raw_8k": fell}}}}))
    done = _check("--baseline", str(path), "--reuse", str(measured), "--strict")
    assert done.returncode == 1 and "FELL: queue_vs_raw_8k" in done.stdout
    assert f"no baseline for this host ({HERE}" in done.stdout
    assert "compared with z80, 1 cpus's" in done.stdout
