"""``bench/async_vs_sync.py``'s report names a phase the host ran slow in (its GEMM probe, timed
just before the phase, well over the run's median), so a reader does not take the host's noise
for the code's figure."""

from __future__ import annotations

from support.cli import bench_script

async_vs_sync = bench_script("async_vs_sync")

# The probes of a real run of this benchmark (2026-12-06): async at 73 % of the bound.
PROBES = {
    "generation": 1.022,
    "training": 0.979,
    "sync": 0.997,
    "async": 1.249,
    "async_other": 1.034,
    "training_again": 0.995,
    "end": 0.987,
}


def test_a_phase_the_host_ran_slow_in_is_named() -> None:
    assert async_vs_sync.slow_host_phases(PROBES) == [("async", 1.249, 0.997)]
    quiet = {**PROBES, "async": 1.019}
    assert async_vs_sync.slow_host_phases(quiet) == []
    assert async_vs_sync.slow_host_phases({"a": 1.0, "b": 2.0}) == []  # too few to say


def test_the_report_warns_about_it() -> None:
    assert async_vs_sync.warnings({"host_probe_ms": PROBES, "other_load_cores": {}}) == [
        "warning: the host ran slow before async (1.249 ms per GEMM, +25% on the median probe "
        "0.997): that phase's figures are not comparable with the others': run again"
    ]
