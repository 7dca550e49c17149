"""The event loop areal's servers run on (areal.host.event_loop): uvloop by default, asyncio's
on request, and a clear error for anything else. The loops are the real ones."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from areal.host import event_loop
from areal.host.event_loop import EventLoopChoiceError, loop_name, new_event_loop


def test_the_default_is_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.ENV, raising=False)
    loop = new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
        assert loop_name(loop) == "uvloop"
    finally:
        loop.close()


def test_asyncio_is_one_variable_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENV, "asyncio")
    loop = new_event_loop()
    reference = asyncio.new_event_loop()
    try:
        assert type(loop) is type(reference)
        assert loop_name(loop) == "asyncio"
    finally:
        loop.close()
        reference.close()


def test_a_bad_value_names_the_variable_and_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENV, "trio")
    with pytest.raises(EventLoopChoiceError) as err:
        new_event_loop()
    assert "AREAL_EVENT_LOOP='trio'" in str(err.value)
    assert "auto, uvloop, asyncio" in str(err.value)


def test_uvloop_asked_for_but_missing_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now raises ImportError
    monkeypatch.setenv(event_loop.ENV, "uvloop")
    with pytest.raises(EventLoopChoiceError, match="pip install uvloop"):
        new_event_loop()
    monkeypatch.setenv(event_loop.ENV, "auto")
    loop = new_event_loop()  # auto falls back to asyncio's loop
    try:
        assert loop_name(loop) == "asyncio"
    finally:
        loop.close()


def test_run_returns_what_the_coroutine_returns_on_the_chosen_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(event_loop.ENV, raising=False)

    async def which() -> str:
        return loop_name(asyncio.get_running_loop())

    assert event_loop.run(which()) == "uvloop"
    monkeypatch.setenv(event_loop.ENV, "asyncio")
    assert event_loop.run(which()) == "asyncio"
