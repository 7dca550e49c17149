"""``judge`` and ``reward_model`` rewards, asked through a real gateway whose unified channel
points at a stand-in upstream (a fake of a hosted model API, which cannot be reached here) that
answers like a judge would."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from areal.core.rewards import build_reward
from areal.host.http_server import ServerThread
from areal.plugins.rewards.model_judged import ModelRewardError


class FakeUpstream:
    """Answers every chat call with ``reply``; keeps what it was sent."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.seen: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append({"body": body, "auth": request.headers.get("Authorization")})
        message = {"role": "assistant", "content": self.reply}
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


def router(upstream_url: str) -> dict[str, Any]:
    return {
        "api_gateway": {"base_url": upstream_url + "/v1", "api_key": "upstream-secret-123456"},
        "model_routing": {
            "policy_model": {"model_id": "areal-tiny", "max_tokens": 256},
            "judge_model": {"model_id": "judge-1"},
            "reward_model": {"model_id": "rm-1"},
        },
    }


TASK = {"question": "What is 2 plus 2?", "answer": "4"}


@pytest.mark.parametrize(
    ("kind", "model", "reply", "expected"),
    [("judge", "judge-1", "8", 0.8), ("reward_model", "rm-1", "Score: 0.25", 0.25)],
)
def test_a_model_reward_asks_the_routed_model_through_the_gateway(
    start_gateway: Any, kind: str, model: str, reply: str, expected: float
) -> None:
    upstream = FakeUpstream(reply)
    http = ServerThread(upstream.app(), "127.0.0.1", 0).start()
    try:
        with start_gateway(config=router(http.url)) as gw:
            reward = build_reward(kind, {"gateway_url": gw.url, "model": model, "api_key": gw.key})
            value = asyncio.run(reward(completion="4", task=TASK))
    finally:
        http.stop()
    assert value == pytest.approx(expected)
    sent = upstream.seen[0]
    assert sent["body"]["model"] == model
    # The channel's key goes upstream; the gateway key the reward holds never does.
    assert sent["auth"] == "Bearer upstream-secret-123456"
    text = " ".join(m["content"] for m in sent["body"]["messages"])
    assert "What is 2 plus 2?" in text and "4" in text
    if kind == "judge":
        assert "Reference answer:\n4" in text


def test_a_reply_without_a_score_is_an_error_not_a_zero(start_gateway: Any) -> None:
    http = ServerThread(FakeUpstream("I cannot grade this.").app(), "127.0.0.1", 0).start()
    try:
        with start_gateway(config=router(http.url)) as gw:
            reward = build_reward(
                "judge", {"gateway_url": gw.url, "model": "judge-1", "api_key": gw.key}
            )
            with pytest.raises(ModelRewardError, match="gave no score"):
                asyncio.run(reward(completion="4", task=TASK))
    finally:
        http.stop()


def test_scores_are_clamped_and_options_checked() -> None:
    judge = build_reward("judge", {"gateway_url": "http://x", "model": "j"})
    assert judge.parse("12/10") == 1.0
    assert judge.parse("-3") == 0.0
    with pytest.raises(ValueError, match=r"options\.model"):
        build_reward("reward_model", {"gateway_url": "http://x"})
