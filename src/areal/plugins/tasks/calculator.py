"""``calculator``: answer "What is 7 squared?" through an undocumented calculator.

The task ``make demo`` trains on. Turn 1 the model writes a request to a calculator whose syntax
it was never told; the agent (the environment) runs it and answers in a user message: ``= 49``
when it understood (only ``square N`` works), else ``error: unknown command``. Turn 2 the model
replies to the user, and the grader reads only a bare number. Two model calls per episode with
the environment's feedback between them, written with nothing but the plain ``openai`` SDK.

The episode succeeds when the reply is exactly the right number, which takes three things: the
calculator's syntax, the question's number in the request, and the calculator's result copied
into a bare reply. The reward (:func:`score`) counts each: 0.3 the calculator understood the
request, 0.4 the reply's one number is the right answer, 0.3 that number is all the reply says;
only an episode with all three (1.0) is a success.

The format warm start (:func:`demonstration`) shows episodes of the right *shape*: a request
about the question's number in one of eight styles, the calculator's true answer, and a reply
in one of six styles that repeats the calculator's result (a random number when it did not
understand). It never says which request the calculator accepts or which reply the grader
reads, so the warm-started model succeeds about once in fifty episodes; RL has to find the rest
from the reward, using the calculator's feedback.

Why not copying numbers from the question into a tool call as the whole task
(:mod:`.tool_then_answer`): a tiny random-init model has no copying circuit, and building one
took it hundreds of steps even fully supervised (measured), while the demo has two cores and a
few minutes.
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
DESCRIPTION = "Answer squares right through a calculator whose syntax must be found by trial."

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
SMALLEST = 2  # 0 and 1 are their own squares: a misread request would answer them right
RIGHT_ANSWER = 1.0  # the reward: the reply is the right number, bare; nothing else earns
SUCCESS_REWARD = RIGHT_ANSWER
UNKNOWN = "error: unknown command"

_REQUEST = re.compile(r"\s*square (\d+)\s*")
_INTEGER = re.compile(r"\s*(-?\d+)\s*")
_FIRST_NUMBER = re.compile(r"-?\d+")


def task(index: int, seed: int) -> dict[str, Any]:
    """Task ``index`` of the stream seeded ``seed``: the same numbers on every machine."""
    n = random.Random(f"{NAME}:{seed}:{index}").randint(SMALLEST, LARGEST)
    return {
        "task_id": f"{NAME}-{seed}-{index}",
        "question": f"What is {n} squared?",
        "n": n,
        "answer": str(n * n),
    }


def demonstration(index: int, seed: int) -> dict[str, Any]:
    """A format-only episode: the question, a request about its number in a random style, the
    calculator's true answer to it, and a reply in a random style repeating that answer (a
    random number when the calculator did not understand)."""
    rng = random.Random(f"{NAME}-demo:{seed}:{index}")
    question = task(index, seed)
    request = rng.choice(REQUEST_STYLES).format(n=question["n"])
    answer = calculate(request)
    result = answer.removeprefix("= ") if answer != UNKNOWN else str(rng.randint(0, 81))
    messages = [
        {"role": "user", "content": question["question"]},
        {"role": "assistant", "content": request},
        {"role": "user", "content": answer},
        {"role": "assistant", "content": rng.choice(REPLY_STYLES).format(r=result)},
    ]
    return {"messages": messages, "tools": []}


def parse_request(text: str) -> int | None:
    match = _REQUEST.fullmatch(text or "")
    return int(match.group(1)) if match else None


def calculate(text: str) -> str:
    """The environment: ``square N`` -> ``= N*N``. A request it does not understand it reads as
    the first number in it (``pow 7 2`` -> ``= 7``), the way a calculator ignores keys it has
    no use for; with no number at all it answers ``error: unknown command``."""
    n = parse_request(text)
    if n is not None:
        return f"= {n * n}"
    number = _FIRST_NUMBER.search(text or "")
    return UNKNOWN if number is None else f"= {int(number.group())}"


def score(task: Mapping[str, Any], request: str, reply: str | None) -> Score:
    """``answer``: the reply is the right number and nothing else. Nothing short of the right
    answer earns anything: partial credit (for a request the calculator understood, for a bare
    number) reinforced whatever styles co-occurred with it, and runs collapsed onto them."""
    parts: dict[str, float] = {}
    match = _INTEGER.fullmatch(reply or "")
    if match and match.group(1) == task["answer"]:
        parts["answer"] = RIGHT_ANSWER
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
