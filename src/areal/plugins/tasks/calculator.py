"""``calculator``: learn an undocumented calculator's protocol by trial and error, then reply.

The task ``make demo`` trains on. The user asks "What is 7 squared?". Turn 1 the model writes a
request to a calculator whose syntax it was never told; the agent (the environment) runs it and
answers in a user message: ``= 49`` when it understood (only ``square N`` works), else
``error: unknown command``. Turn 2 the model replies to the user; the grader reads only a bare
number. Two model calls per episode with the environment's feedback between them, written with
nothing but the plain ``openai`` SDK.

The format warm start (:func:`demonstration`) shows episodes of the right *shape* with requests
and replies in eight and six styles at random (and random numbers), so it teaches what an
episode looks like but not which request the calculator accepts or which reply the grader
reads: that is what RL finds out, from the reward alone (0.6 the calculator understood the
request, 0.4 the reply is a bare number). Whether the number is right is not rewarded.

Why this and not copying numbers from the question into a tool call (:mod:`.tool_then_answer`,
which rewards exactly that): a tiny random-init model has no copying circuit, and building one
took it hundreds of steps even fully supervised (measured), while learning which of a few
behaviours the environment rewards takes it tens: the five minutes of ``make demo`` on two
cores show the second, a real policy model the first.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from areal.plugins.tasks.tool_then_answer import LARGEST, Outcome, Score, chat, play_episode

if TYPE_CHECKING:
    from areal.core.episode import Episode

NAME = "calculator"
DESCRIPTION = "Find the calculator's request syntax and the grader's reply format by trial."

# What a warm-started model tries; only the first request style is the calculator's.
REQUEST_STYLES = (
    "square {n}",
    "pow {n} 2",
    "{n}^2",
    "calc {n}*{n}",
    "compute {n} times {n}",
    "multiply {n} {n}",
    "{n} squared",
    "eval {n}**2",
)
REPLY_STYLES = ("{r}", "It is {r}.", "The answer is {r}", "{r}!", "Result: {r}", "= {r}")
REQUEST_MAX_TOKENS = 10
REPLY_MAX_TOKENS = 8
UNDERSTOOD = 0.6
BARE_NUMBER = 0.4
UNKNOWN = "error: unknown command"

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
    """A format-only episode: the question, a request in a random style with a random number,
    the calculator's true answer to it, and a reply in a random style."""
    rng = random.Random(f"{NAME}-demo:{seed}:{index}")
    x = rng.randint(0, LARGEST)
    request = rng.choice(REQUEST_STYLES).format(n=x)
    answer = calculate(request)
    result = answer.removeprefix("= ") if answer != UNKNOWN else str(rng.randint(0, 81))
    messages = [
        {"role": "user", "content": task(index, seed)["question"]},
        {"role": "assistant", "content": request},
        {"role": "user", "content": answer},
        {"role": "assistant", "content": rng.choice(REPLY_STYLES).format(r=result)},
    ]
    return {"messages": messages, "tools": []}


def parse_request(text: str) -> int | None:
    match = _REQUEST.fullmatch(text or "")
    return int(match.group(1)) if match else None


def calculate(text: str) -> str:
    """The environment: ``square N`` -> ``= N*N``; anything else is not understood."""
    n = parse_request(text)
    return UNKNOWN if n is None else f"= {n * n}"


def score(task: Mapping[str, Any], request: str, reply: str | None) -> Score:
    """``call``: the calculator understood; ``a``: the reply is a bare number."""
    parts: dict[str, float] = {}
    if parse_request(request) is not None:
        parts["call"] = UNDERSTOOD
    match = _INTEGER.fullmatch(reply or "")
    if match:
        parts["a"] = BARE_NUMBER
    return Score(**parts)


async def play(client: Any, model: str, task: Mapping[str, Any], max_calls: int = 2) -> Outcome:
    """Play one episode with an ``openai.AsyncOpenAI`` client; only a failing gateway raises."""
    outcome = Outcome(score=Score())
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    outcome.transcript = messages
    request = str((await chat(client, model, messages, REQUEST_MAX_TOKENS, outcome)).content or "")
    messages.append({"role": "assistant", "content": request})
    if max_calls < 2:
        outcome.score = score(task, request, None)
        return outcome
    messages.append({"role": "user", "content": calculate(request)})
    reply = str((await chat(client, model, messages, REPLY_MAX_TOKENS, outcome)).content or "")
    messages.append({"role": "assistant", "content": reply})
    outcome.score = score(task, request, reply)
    return outcome


async def agent(episode: Episode) -> float:
    """The task set's agent (an :data:`areal.run.rollout.AgentFn`): play, return the reward."""
    return await play_episode(play, episode)
