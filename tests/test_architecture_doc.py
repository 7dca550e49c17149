"""docs/architecture.md's table of rooms tells the truth: every room of ``src/areal`` is in it,
and its line count is within :data:`TOLERANCE` of the room's real size, so the doc goes stale
loudly instead of quietly."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "areal"
DOC = ROOT / "docs" / "architecture.md"
TOLERANCE = 0.15
# core holds contracts only; growing past this means something moved in. Raised from 4,500 for
# contracts: a sample's turn spans (the queue's record of per-turn credit) and agent.online.
CORE_CEILING = 4700


def lines_of(paths: list[Path]) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def real_sizes() -> dict[str, int]:
    sizes = {
        f"`{room.name}`": lines_of(sorted(room.rglob("*.py")))
        for room in SRC.iterdir()
        if room.is_dir() and room.name not in ("plugins", "__pycache__")
    }
    sizes["`plugins.X`"] = lines_of(sorted((SRC / "plugins").rglob("*.py")))
    entries = ["train.py", "demo.py", "demo_real.py"]
    sizes["`train.py`, `demo.py`, `demo_real.py`"] = lines_of([SRC / name for name in entries])
    return sizes


def documented_sizes() -> dict[str, int]:
    """The first and last cells of each row of the rooms table: ``| `core` | ... | 4.3k |``."""
    found = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"(\d+(?:\.\d+)?)k", cells[-1]) if len(cells) >= 4 else None
        if match and cells[0].startswith("`"):
            found[cells[0]] = round(float(match.group(1)) * 1000)
    return found


def test_every_room_is_documented_with_its_true_size() -> None:
    documented = documented_sizes()
    wrong = []
    for room, real in real_sizes().items():
        said = documented.get(room)
        if said is None:
            wrong.append(f"{room} is missing from the rooms table ({real} lines)")
        elif abs(said - real) > max(TOLERANCE * real, 100):
            wrong.append(f"{room}: the doc says {said / 1000:.1f}k lines, it has {real}")
    assert not wrong, "docs/architecture.md is stale:\n" + "\n".join(wrong)


def test_core_stays_the_contracts() -> None:
    core = lines_of(sorted((SRC / "core").rglob("*.py")))
    assert core <= CORE_CEILING, (
        f"areal.core has {core} lines (ceiling {CORE_CEILING}): it holds contracts only; "
        "code that needs nothing of areal goes to areal.host, a part's own workings to its room"
    )
