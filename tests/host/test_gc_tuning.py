"""The gateway's collector settings: start-up objects frozen, young collections rarer, and cycles
still collected without anyone calling ``gc.collect``. Run in a fresh interpreter, so the test
process keeps its own settings."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import gc, json, weakref
from areal.host.gc_tuning import YOUNG_THRESHOLD, tune_for_serving
before = gc.get_threshold()
class Node:
    pass
startup = [Node() for _ in range(1000)]
tune_for_serving()
after = gc.get_threshold()
frozen = gc.get_freeze_count()
collected = []
for i in range(200):  # cycles, as a request's exceptions and closures make them
    a, b = Node(), Node()
    a.other, b.other = b, a
    weakref.finalize(a, collected.append, i)
    del a, b
early = len(collected)
junk = [[] for _ in range(3 * YOUNG_THRESHOLD)]  # allocations: the young threshold is passed
print(json.dumps({"before": before, "after": after, "frozen": frozen, "early": early,
                  "collected": len(collected), "young": YOUNG_THRESHOLD}))
"""


def test_cycles_are_still_collected_after_tuning() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(out.stdout)
    assert got["after"] == [got["young"], got["before"][1], got["before"][2]]
    assert got["frozen"] >= 1000  # start-up's objects are out of the collector's walks
    assert got["early"] < 200  # the cycles wait for the young threshold...
    assert got["collected"] == 200  # ...and are collected once it is passed, unasked
