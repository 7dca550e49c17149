"""The shared append-only line writer: whole lines under concurrency, append on reopen, closed is closed."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from areal.host.line_file import LineFile


def test_concurrent_writers_never_interleave(tmp_path: Path) -> None:
    out = LineFile(tmp_path / "x.log")

    def writer(n: int) -> None:
        for i in range(300):
            out.write(f"{n}:{i}:" + "y" * 50 + "\n")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.close()
    lines = (tmp_path / "x.log").read_text().splitlines()
    assert len(lines) == 1800 and all(line.endswith("y" * 50) for line in lines)


def test_reopen_appends_and_closed_refuses(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.jsonl"
    first = LineFile(path, "sink")
    first.write("1\n")
    first.close()
    first.close()  # twice is fine
    second = LineFile(path, "sink")
    second.write("2\n")
    second.close()
    assert path.read_text() == "1\n2\n"
    with pytest.raises(RuntimeError, match=r"the sink .* is closed"):
        second.write("3\n")
