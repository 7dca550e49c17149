"""The regression gate's arithmetic: noise bands from repeated runs, and today's ratios against
the baseline. Pure functions, kept apart from ``bench/check.py`` (which runs the benchmarks) so
the verdicts can be tested on hand-made numbers.

Every gated figure is a ratio measured within one run (ours / a baseline run beside it), and
higher is better. The file keeps one baseline per host (its instruction set and core count):
the engine's ratios depend on the CPU as well as on the code. A ratio *fell* when ``now < baseline * (1 - band)``; the band of a ratio is the
spread of its repeated measurements, ``(max - min) / median``, never below ``MIN_BAND``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIN_BAND = 0.05  # a spread measured from a few runs can be tiny by luck: never trust it below 5 %


def band_of(samples: Sequence[float]) -> float:
    """The relative spread of repeated measurements of one ratio: ``(max - min) / median``."""
    if not samples:
        raise ValueError("a noise band needs at least one measurement")
    middle = statistics.median(samples)
    if middle <= 0:
        raise ValueError(f"a ratio must be positive, got median {middle}")
    return max(MIN_BAND, (max(samples) - min(samples)) / middle)


@dataclass(frozen=True)
class Verdict:
    """One ratio's line of the table."""

    name: str
    baseline: float | None
    now: float | None
    band: float | None
    verdict: str  # "ok", "FELL", "rose" (beyond the band: time to --update), "new", "missing"

    @property
    def change(self) -> float | None:
        """``now / baseline - 1``, or None when either side is missing."""
        if self.baseline is None or self.now is None or self.baseline == 0:
            return None
        return self.now / self.baseline - 1

    @property
    def fell(self) -> bool:
        return self.verdict == "FELL"


def compare(baseline: Mapping[str, Mapping[str, float]], now: Mapping[str, float]) -> list[Verdict]:
    """Each ratio of ``baseline`` (name -> {"value", "band"}) against ``now`` (name -> value);
    ratios only ``now`` has are listed as "new", those it lacks as "missing"."""
    verdicts = []
    for name, entry in baseline.items():
        value, band = float(entry["value"]), float(entry["band"])
        current = now.get(name)
        if current is None:
            verdicts.append(Verdict(name, value, None, band, "missing"))
            continue
        if current < value * (1 - band):
            verdict = "FELL"
        elif current > value * (1 + band):
            verdict = "rose"
        else:
            verdict = "ok"
        verdicts.append(Verdict(name, value, current, band, verdict))
    verdicts += [Verdict(n, None, v, None, "new") for n, v in now.items() if n not in baseline]
    return verdicts


def baseline_entries(rounds: Sequence[Mapping[str, float]]) -> dict[str, dict[str, object]]:
    """The baseline of each ratio from the rounds that measured it (a benchmark can fail or time
    out in one): its median, its band and the measurements they came from."""
    names = list(dict.fromkeys(n for r in rounds for n in r))
    out: dict[str, dict[str, object]] = {}
    for name in names:
        samples = [float(r[name]) for r in rounds if name in r]
        out[name] = {
            "value": round(statistics.median(samples), 4),
            "band": round(band_of(samples), 4),
            "samples": [round(s, 4) for s in samples],
        }
    return out


def median_of_rounds(rounds: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per ratio, the median over the rounds that measured it."""
    names = {n for r in rounds for n in r}
    return {n: statistics.median(r[n] for r in rounds if n in r) for n in sorted(names)}


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{100 * value:+.1f} %" if signed else f"±{100 * value:.1f} %"


def table(verdicts: Sequence[Verdict]) -> str:
    """The report: name, baseline, now, change, band, verdict."""
    rows = [("ratio", "baseline", "now", "change", "band", "verdict")]
    for v in verdicts:
        rows.append(
            (
                v.name,
                "—" if v.baseline is None else f"{v.baseline:.3f}",
                "—" if v.now is None else f"{v.now:.3f}",
                _pct(v.change, signed=True),
                _pct(v.band),
                v.verdict,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        cells = [
            c.ljust(w) if j in (0, 5) else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))
        ]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# --- one baseline per host -----------------------------------------------------------------------

# A file written before baselines were kept per host: its one baseline, under this name.
UNNAMED_HOST = "unnamed host"


def hosts_of(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The baseline file's baselines by host (the file from before hosts: one, ``UNNAMED_HOST``)."""
    if "hosts" in doc:
        return {key: dict(entry) for key, entry in doc["hosts"].items()}
    if "ratios" in doc:
        return {UNNAMED_HOST: {k: v for k, v in doc.items() if k != "about"}}
    return {}


def baseline_for(doc: Mapping[str, Any], host: str) -> tuple[str | None, dict[str, Any]]:
    """The baseline to compare ``host``'s ratios with, and whose it is: its own; else, the
    nearest, one of a host with the same instruction set (what a key starts with, up to its
    comma), else the first; ``(None, {})`` when the file has none."""
    hosts = hosts_of(doc)
    if host in hosts:
        return host, hosts[host]
    isa = host.split(",")[0]
    for key, entry in hosts.items():
        if key.split(",")[0] == isa:
            return key, entry
    return next(iter(hosts.items()), (None, {}))
