"""The suite's rule for skips, as pytest hooks (``tests/conftest.py`` takes them from here):

- under ``CI=true`` (``.ci/run`` sets it) a skip of anything but a ``gpu`` test is a failure
  that names the skip's reason: a setup that lost a part (a CLI, Slurm, a venv) goes red instead
  of shipping green with its tests quietly skipped;
- every run ends with ``skips: N`` and each skip's reason, so a skip is never silent.

A module of its own so that ``tests/test_support.py`` can load it into a pytest of its own
(``-p support.skips``) and check both on a real run.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

_SKIPS: list[tuple[str, str]] = []


def under_ci() -> bool:
    """``CI=true`` (``.ci/run`` sets it): the machine must have every part but a GPU."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Under CI a skip for anything but a GPU is a failure: a setup that lost a part (a CLI,
    Slurm, a venv) must go red, not ship green with its tests quietly skipped."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if under_ci() and item.get_closest_marker("gpu") is None:
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI=true, where only GPU tests may skip: {reason}\n"
            "(set the missing part up in `make setup`, or mark the test gpu if it needs one)"
        )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collects the skips where the summary is written (xdist's controller too)."""
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append((report.nodeid, _skip_reason(report)))


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Every run ends with its skip count and their reasons, so a skip is never silent."""
    if not _SKIPS:
        return
    terminalreporter.write_line(f"skips: {len(_SKIPS)}")
    for nodeid, reason in _SKIPS:
        terminalreporter.write_line(f"  {nodeid}: {reason}")
