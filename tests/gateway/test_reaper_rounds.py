"""When the reapers skip a round: after the gateway's own loop stood still, not for the lag a
loaded loop always has (the rounds' lateness, as ``reap_in_rounds`` measures it)."""

from __future__ import annotations

from areal.gateway.reaper_rounds import stood_still


def skips(lateness: list[float], every: float = 0.5) -> list[bool]:
    out, last = [], 0.0
    for late in lateness:
        out.append(stood_still(late, last, every))
        last = late
    return out


def test_a_stall_is_skipped_even_right_after_a_round_made_late_by_load() -> None:
    # The case that reaped a client whose call had waited through the stall: a round 0.6 s
    # late (load), then the loop stood still 5 s. Both are skipped; the next round reaps.
    assert skips([0.0, 0.6, 4.5, 0.01]) == [False, True, True, False]


def test_a_loop_that_lags_all_the_time_still_reaps() -> None:
    assert skips([0.6, 0.6, 0.7, 0.6, 0.6]) == [True, False, False, False, False]
    assert skips([0.2, 0.3, 0.1]) == [False, False, False]  # within one interval: never skipped
