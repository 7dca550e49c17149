"""Rewards given by a model: ``judge`` and ``reward_model``, called through the gateway.

Both call the router's model (``model_routing.judge_model`` / ``reward_model``) by its id on the
run's own gateway, which sends any non-policy model through the unified API channel (with its
timeout, retries and backoff, and the channel's key: the reward function never holds it). The
gateway's plain-call key comes from ``AREAL_GATEWAY_KEY``, which the run gives its rollout
workers.

- ``judge``: an instruction model grades the answer against the question (and the reference
  answer when the task has one) on a 0–10 scale; the reward is the grade / 10.
- ``reward_model``: the conversation (question, then the answer as the assistant's turn) is sent
  to a model that replies with a score in [0, 1].

The first number in the reply is the score, clamped to [0, 1]. A reply without a number, or a
failed call, raises :class:`ModelRewardError`: the rollout worker then records the episode as
failed (discarded, counted), since a reward nobody gave must not be trained on as a 0.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

JUDGE_SYSTEM = (
    "You grade answers. Reply with one number from 0 (wrong or useless) to 10 (correct and "
    "complete), and nothing else."
)
REWARD_MODEL_ASK = (
    "Score the assistant's last reply from 0 (bad) to 1 (good). Reply with the number."
)


class ModelRewardError(RuntimeError):
    """The reward model could not be asked, or did not answer with a score."""


@dataclass
class ModelReward:
    """A :class:`~areal.core.rewards.RewardFn` backed by a model on the gateway."""

    gateway_url: str  # the gateway, without /v1
    model: str  # the router's model id (judge_model or reward_model)
    kind: Literal["judge", "reward_model"] = "judge"
    api_key: str = field(default="", repr=False)
    timeout_s: float = 120.0

    @classmethod
    def from_options(cls, options: Mapping[str, Any], kind: str) -> ModelReward:
        """Built by the rollout worker: ``gateway_url``, ``model``, optional ``timeout_s``; the
        key from ``options["api_key"]`` or ``AREAL_GATEWAY_KEY``."""
        key = options.get("api_key") or os.environ.get("AREAL_GATEWAY_KEY", "")
        for name in ("gateway_url", "model"):
            if not options.get(name):
                raise ValueError(f"the {kind} reward needs options.{name}")
        if kind not in ("judge", "reward_model"):
            raise ValueError(f"unknown model reward kind {kind!r}")
        return cls(
            gateway_url=str(options["gateway_url"]).rstrip("/"),
            model=str(options["model"]),
            kind=kind,  # type: ignore[arg-type]
            api_key=str(key),
            timeout_s=float(options.get("timeout_s", 120.0)),
        )

    def messages(self, completion: str, task: Mapping[str, Any]) -> list[dict[str, str]]:
        question = str(task.get("question") or task.get("prompt") or "")
        if self.kind == "reward_model":
            return [
                {"role": "user", "content": question},
                {"role": "assistant", "content": completion},
                {"role": "user", "content": REWARD_MODEL_ASK},
            ]
        parts = [f"Question:\n{question}"]
        if task.get("answer") is not None:
            parts.append(f"Reference answer:\n{task['answer']}")
        parts.append(f"Answer to grade:\n{completion}")
        return [
            {"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": "\n\n".join(parts)},
        ]

    async def __call__(self, *, completion: str, task: Mapping[str, Any]) -> float:
        body = {
            "model": self.model,
            "messages": self.messages(completion, task),
            "temperature": 0.0,
            "max_tokens": 16,
        }
        headers = {"Authorization": f"Bearer {self.api_key}"}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        url = self.gateway_url + "/v1/chat/completions"
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.post(url, json=body, headers=headers) as resp,
            ):
                data = await resp.json(content_type=None)
                if resp.status != 200:
                    raise ModelRewardError(
                        f"the {self.kind} {self.model!r} answered HTTP {resp.status}: {data}"
                    )
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            raise ModelRewardError(f"could not ask the {self.kind} {self.model!r}: {err}") from err
        try:
            text = str(data["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError) as err:
            raise ModelRewardError(f"the {self.kind} answered without choices: {data}") from err
        return self.parse(text)

    def parse(self, text: str) -> float:
        match = _NUMBER.search(text)
        if match is None:
            raise ModelRewardError(f"the {self.kind} {self.model!r} gave no score: {text!r}")
        value = float(match.group(0))
        if self.kind == "judge":
            value /= 10.0
        return min(1.0, max(0.0, value))
