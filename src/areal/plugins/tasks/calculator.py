"""``calculator``: ask a calculator with the question's numbers, read its answer, then reply.

The task ``make demo`` trains on. The user asks "What is 7 squared?"; turn 1 the model writes a
calculator request, ``square 7``; the agent (the environment) runs it and answers in a user
message, ``= 49``; turn 2 the model replies with the result. Two model calls per episode with the
environment's feedback between them, written with nothing but the plain ``openai`` SDK.

Why a text protocol and not OpenAI tool calling (which :mod:`.tool_then_answer` uses): the chat
template renders a tool spec into every prompt (~200 tokens of preamble for one tool), and a tiny
model learns to copy a number from the question far more slowly when the question is 10 tokens
out of 230 than when it is most of a 15-token prompt (measured: no progress in 60 GRPO steps with
the tool preamble). A real policy reads both; the demo has five minutes on two cores.

Reward in [0, 1] with partial credit, so RL has a gradient to climb from a format-only warm start
(:func:`demonstration` shows random numbers, so it teaches the shape of an episode, not which
number to copy): 0.2 for a well-formed request, 0.4 for its number equal to the question's, 0.4
for a reply equal to the true result. One number, not two: a tiny random-init model has no
copying circuit yet, and picking *which* of two digits to copy took it hundreds of steps even
supervised (measured), while reading the one digit that varies is within reach of ~40 RL steps.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from areal.plugins.tasks.tool_then_answer import LARGEST, Outcome, Score

if TYPE_CHECKING:
    from areal.core.rollout import Episode

NAME = "calculator"
DESCRIPTION = "Ask the calculator 'square N' with the question's digit, then reply its result."

REQUEST_MAX_TOKENS = 8
REPLY_MAX_TOKENS = 4
VALID_REQUEST = 0.2
NUMBER = 0.4
ANSWER = 0.4

_REQUEST = re.compile(r"\s*square (\d+)\s*")
_INTEGER = re.compile(r"\s*(-?\d+)\s*")


def task(index: int, seed: int) -> dict[str, Any]:
    """Task ``index`` of the stream seeded ``seed``: the same numbers on every machine."""
    n = random.Random(f"{NAME}:{seed}:{index}").randint(0, LARGEST)
    return {
        "task_id": f"{NAME}-{seed}-{index}",
        "question": f"What is {n} squared?",
        "n": n,
        "answer": str(n * n),
    }


def demonstration(index: int, seed: int) -> dict[str, Any]:
    """A format-only episode: the question, a request with RANDOM numbers, the calculator's true
    answer to that request, and a reply equal to it."""
    x = random.Random(f"{NAME}-demo:{seed}:{index}").randint(0, LARGEST)
    messages = [
        {"role": "user", "content": task(index, seed)["question"]},
        {"role": "assistant", "content": f"square {x}"},
        {"role": "user", "content": calculate(f"square {x}")},
        {"role": "assistant", "content": str(x * x)},
    ]
    return {"messages": messages, "tools": []}


def parse_request(text: str) -> int | None:
    match = _REQUEST.fullmatch(text or "")
    return int(match.group(1)) if match else None


def calculate(text: str) -> str:
    """The environment: ``square N`` -> ``= N*N``; anything else gets an error line."""
    n = parse_request(text)
    return "error: write square N" if n is None else f"= {n * n}"


def score(task: Mapping[str, Any], request: str, reply: str | None) -> Score:
    n = parse_request(request)
    parts: dict[str, float] = {}
    if n is not None:
        parts["call"] = VALID_REQUEST
        parts["a"] = NUMBER if n == task["n"] else 0.0
    match = _INTEGER.fullmatch(reply or "")
    if match and int(match.group(1)) == task["n"] ** 2:
        parts["answer"] = ANSWER
    return Score(**parts)


async def play(client: Any, model: str, task: Mapping[str, Any], max_calls: int = 2) -> Outcome:
    """Play one episode with an ``openai.AsyncOpenAI`` client; only a failing gateway raises."""
    outcome = Outcome(score=Score())
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    outcome.transcript = messages
    request = await _call(client, model, messages, REQUEST_MAX_TOKENS, outcome)
    messages.append({"role": "assistant", "content": request})
    if max_calls < 2 or parse_request(request) is None:
        outcome.score = score(task, request, None)
        return outcome
    messages.append({"role": "user", "content": calculate(request)})
    reply = await _call(client, model, messages, REPLY_MAX_TOKENS, outcome)
    messages.append({"role": "assistant", "content": reply})
    outcome.score = score(task, request, reply)
    return outcome


async def agent(episode: Episode) -> float:
    """The task set's agent (an :data:`areal.core.rollout.AgentFn`): play, return the reward."""
    client = episode.openai_client()
    try:
        outcome = await play(client, episode.model, episode.task, min(2, episode.max_turns))
    finally:
        await client.close()
    return outcome.score.total


async def _call(
    client: Any, model: str, messages: list[dict[str, Any]], max_tokens: int, outcome: Outcome
) -> str:
    response = await client.chat.completions.create(
        model=model, messages=list(messages), max_tokens=max_tokens
    )
    if response.usage is not None:
        outcome.prompt_tokens.append(response.usage.prompt_tokens)
        outcome.completion_tokens.append(response.usage.completion_tokens)
    return str(response.choices[0].message.content or "")
