"""The default group of an online conversation that names none (``--online-grouping``), on a fake
clock, and the prompt digest it groups by; the named groups are proved through a real gateway and
the real SDKs in ``test_online.py``."""

from __future__ import annotations

import pytest

from areal.core.run_config import OnlineConfig
from areal.gateway.online_groups import DEFAULT, DefaultGroups, prompt_digest
from areal.gateway.training_flags import (
    DEFAULT_ONLINE_GROUP_WINDOW_S,
    DEFAULT_ONLINE_GROUPING,
    DEFAULT_ONLINE_IDLE_S,
    DEFAULT_ONLINE_REWARD_WAIT_S,
    ONLINE_GROUPINGS,
)
from support.clock import FakeClock


def test_the_pool_takes_consecutive_conversations_up_to_its_size() -> None:
    groups = DefaultGroups("pool", window=60, size=3, clock=FakeClock())
    keys = [groups.assign(prompt=f"p{i}") for i in range(7)]  # prompts do not matter here
    assert keys[0] == keys[1] == keys[2] != keys[3]
    assert keys[3] == keys[4] == keys[5] != keys[6]
    assert all(k is not None and k.startswith(f"{DEFAULT}pool-") for k in keys)


def test_a_group_takes_no_one_once_its_window_has_passed() -> None:
    clock = FakeClock()
    groups = DefaultGroups("pool", window=60, size=100, clock=clock)
    first = groups.assign()
    clock.advance(59.5)
    assert groups.assign() == first  # within the window of its first member
    clock.advance(0.5)
    second = groups.assign()  # exactly at the window: a new group
    assert second != first
    clock.advance(30)
    assert groups.assign() == second  # the window counts from the new group's first


def test_prompt_groups_only_conversations_that_asked_the_same_first() -> None:
    clock = FakeClock()
    groups = DefaultGroups("prompt", window=60, size=2, clock=clock)
    assert groups.wants_prompt
    a1, b1, a2, a3 = (groups.assign(p) for p in ("aaa", "bbb", "aaa", "aaa"))
    assert a1 == a2 != b1 and a3 != a1  # size 2: the third "aaa" starts another
    assert a1 is not None and "prompt-aaa" in a1
    clock.advance(61)
    assert groups.assign("bbb") != b1  # b's group is past its window
    assert groups.assign(None) == groups.assign(None)  # no user message: the pool


def test_none_leaves_every_conversation_alone_and_keys_differ_across_gateways() -> None:
    assert DefaultGroups("none").assign("x") is None
    assert not DefaultGroups("pool").wants_prompt
    assert DefaultGroups("pool").assign() != DefaultGroups("pool").assign()  # a restarted one
    with pytest.raises(ValueError, match="grouping"):
        DefaultGroups("task")
    with pytest.raises(ValueError, match="window"):
        DefaultGroups("pool", window=0)


def test_the_first_user_message_is_one_prompt_in_every_protocol() -> None:
    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}  # fmt: skip
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    responses = {"input": "hi", "instructions": "be brief"}
    items = {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}  # fmt: skip
    later = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}]}  # fmt: skip
    digests = {prompt_digest(body) for body in (chat, parts, responses, items, later)}
    assert len(digests) == 1 and None not in digests
    assert prompt_digest({"messages": [{"role": "user", "content": "bye"}]}) not in digests
    image = {"messages": [{"role": "user", "content": [{"type": "image", "source": {"data": "x"}}]}]}  # fmt: skip
    assert prompt_digest(image) is not None
    assert prompt_digest({"messages": []}) is None and prompt_digest({}) is None


def test_the_run_config_and_the_gateway_flags_default_alike() -> None:
    online = OnlineConfig()
    assert online.grouping == DEFAULT_ONLINE_GROUPING
    assert set(OnlineConfig.model_fields["grouping"].annotation.__args__) == set(ONLINE_GROUPINGS)  # type: ignore[union-attr]
    assert online.group_window_s == DEFAULT_ONLINE_GROUP_WINDOW_S
    assert (online.idle_timeout_s, online.reward_wait_s) == (
        DEFAULT_ONLINE_IDLE_S,
        DEFAULT_ONLINE_REWARD_WAIT_S,
    )
