"""``calculator``: answer "What is 7 squared?" with a calculator whose keys are unlabelled.

The task ``make demo`` trains on. The question's number is already on the calculator's display;
turn 1 the model names the key to press, not knowing which key does what; the agent (the
environment) presses it and answers in a user message with the display (``= 49`` for
``square``; ``= 14`` for ``double``, ``= 343`` for ``cube``, ...; ``error: no such key`` for
anything else). Turn 2 the model replies to the user, and the grader reads only a bare number.
Two model calls per episode with the environment's feedback between them, written with nothing
but the plain ``openai`` SDK.

The reward (:func:`score`) is 1 for the right answer and 0 for anything else, and a right answer
takes three things: the key that squares, the calculator's result read off its reply, and that
result given as a bare number. Every key computes something real and, for the questions asked
(3 to 9), never the square, so a wrong key always gives a wrong answer.

Measured on the way here (docs/benchmarks.md): partial credit (for a request the calculator
understood, for any bare number) was reachable without ever answering right, reinforced the
styles that co-occurred with it, and about one run in four collapsed onto them; a request that
had to restate the question's number (``square 7``) lost that copy under RL (runs settled on
``square 3`` for every question); and where a misread request gave back one of its own numbers,
runs learned to reply with the request's number.

The format warm start (:func:`demonstration`) shows episodes of the right *shape*: a key chosen
at random, the calculator's true result, and a reply in one of six styles repeating it. It never
says which key squares or which reply the grader reads, so one demonstration in 48 is a right
answer, and the warm-started model answers right in a few percent of episodes; RL finds the rest
from the reward, and only by reading the calculator's feedback.

``dataset.options`` (:class:`Options`) add a reward for turn 1 alone, to measure turn-level credit
(``bench/turn_credit.py``): ``key_reward`` for pressing the key that squares, posted for turn 1's
completion (``key_reward_to: turn``, so turn 1 earns it and turn 2 does not) or added to the
episode's reward (``episode``: the same total, every token credited with it). Success still means
the right answer: the episode reward stays the answer's in ``turn`` mode, and a key reward below
the answer's keeps ``reward >= 1`` true of right answers only in ``episode`` mode.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from areal.core.config import ConfigError
from areal.core.tasks import check_option_names
from areal.plugins.tasks.tool_then_answer import LARGEST, Outcome, Score, chat, play_episode

if TYPE_CHECKING:
    from areal.core.episode import Episode
    from areal.core.tasks import TaskSet

NAME = "calculator"
DESCRIPTION = "Square a digit with a calculator whose keys must be found by trial."

# The calculator's keys; what a warm-started model tries. Only ``square`` answers the question.
KEYS: dict[str, Callable[[int], int]] = {
    "square": lambda n: n * n,
    "double": lambda n: 2 * n,
    "cube": lambda n: n**3,
    "increment": lambda n: n + 1,
    "decrement": lambda n: n - 1,
    "negate": lambda n: -n,
    "tenfold": lambda n: 10 * n,
    "triangle": lambda n: n * (n + 1) // 2,
}
REPLY_STYLES = ("{r}", "It is {r}.", "The answer is {r}", "{r}!", "Result: {r}", "= {r}")
REQUEST_MAX_TOKENS = 8  # the longest key is 6 tokens
REPLY_MAX_TOKENS = 8
SMALLEST = 3  # from 3 on, no key but square gives the square (2 doubled is 2 squared)
RIGHT_ANSWER = 1.0  # the reward: the reply is the right number, bare; nothing else earns
SUCCESS_REWARD = RIGHT_ANSWER
UNKNOWN = "error: no such key"
RIGHT_KEY = "square"
KEY_REWARD_TO = ("turn", "episode")


@dataclass(frozen=True)
class Options:
    """``dataset.options``: a reward for pressing the key that squares (none by default: the
    demo's task)."""

    key_reward: float = 0.0
    key_reward_to: str = "turn"  # one of KEY_REWARD_TO


def parse_options(options: Mapping[str, Any]) -> Options:
    """``dataset.options`` checked now, not in a rollout worker: a wrong one is a ConfigError
    naming its key."""
    check_option_names(NAME, options, sorted(Options.__dataclass_fields__))
    reward = options.get("key_reward", Options.key_reward)
    number = isinstance(reward, int | float) and not isinstance(reward, bool)
    # Below the answer's reward, so that in ``episode`` mode reward >= 1 still means a right
    # answer, and pressing the key never pays as much as answering.
    if not number or not math.isfinite(reward) or not 0 <= reward < RIGHT_ANSWER:
        raise ConfigError(
            f"dataset.options.key_reward: a number from 0 up to (not including) the right "
            f"answer's {RIGHT_ANSWER}, got {reward!r}"
        )
    to = options.get("key_reward_to", Options.key_reward_to)
    if to not in KEY_REWARD_TO:
        raise ConfigError(
            f"dataset.options.key_reward_to: {to!r} is not one of {', '.join(KEY_REWARD_TO)}"
        )
    return Options(float(reward), to)


def configure(options: Mapping[str, Any]) -> TaskSet:
    """The task set with ``options`` bound (the registry holds the defaults)."""
    from areal.core.tasks import task_set

    return replace(task_set(NAME), task=functools.partial(task, options=parse_options(options)))


def task(index: int, seed: int, options: Options = Options()) -> dict[str, Any]:
    """Task ``index`` of the stream seeded ``seed``: the same numbers on every machine. A key
    reward travels in the task, where the agent reads it."""
    n = random.Random(f"{NAME}:{seed}:{index}").randint(SMALLEST, LARGEST)
    found: dict[str, Any] = {
        "task_id": f"{NAME}-{seed}-{index}",
        "question": f"What is {n} squared?",
        "n": n,
        "answer": str(n * n),
    }
    if options.key_reward:
        found.update(key_reward=options.key_reward, key_reward_to=options.key_reward_to)
    return found


def demonstration(index: int, seed: int) -> dict[str, Any]:
    """A format-only episode: the question, a key chosen at random, the calculator's true
    result, and a reply in a random style repeating it."""
    rng = random.Random(f"{NAME}-demo:{seed}:{index}")
    question = task(index, seed)
    key = rng.choice(list(KEYS))
    display = calculate(key, question["n"])
    messages = [
        {"role": "user", "content": question["question"]},
        {"role": "assistant", "content": key},
        {"role": "user", "content": display},
        {"role": "assistant", "content": rng.choice(REPLY_STYLES).format(r=display[2:])},
    ]
    return {"messages": messages, "tools": []}


def calculate(request: str, n: int) -> str:
    """The environment: press the key ``request`` names with ``n`` on the display."""
    key = KEYS.get((request or "").strip())
    return UNKNOWN if key is None else f"= {key(n)}"


def score(task: Mapping[str, Any], request: str, reply: str | None) -> Score:
    """``answer``: the reply is the right number and nothing else. Nothing short of the right
    answer earns anything (the module's docstring says why)."""
    text = (reply or "").strip()
    return Score(answer=RIGHT_ANSWER if text == task["answer"] else 0.0)


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
    messages.append({"role": "user", "content": calculate(request, task["n"])})
    reply = str((await chat(client, model, messages, REPLY_MAX_TOKENS, outcome)).content or "")
    messages.append({"role": "assistant", "content": reply})
    outcome.score = score(task, request, reply)
    return outcome


def pressed_right_key(outcome: Outcome) -> bool:
    """Whether turn 1 pressed the key that squares (as :func:`calculate` reads the request)."""
    played = outcome.transcript[1:2]
    return bool(played) and str(played[0]["content"] or "").strip() == RIGHT_KEY


async def agent(episode: Episode) -> float:
    """The task set's agent (an :data:`areal.run.rollout.AgentFn`): play, return the reward (the
    answer's score). A task's ``key_reward`` for the right key is posted for turn 1's completion
    (``key_reward_to: turn``) or added to the returned reward (``episode``)."""
    outcome = await play_episode(play, episode)
    key_reward = float(episode.task.get("key_reward", 0.0))
    if not key_reward or not pressed_right_key(outcome):
        return outcome.score.total
    if episode.task.get("key_reward_to") == "episode":
        return outcome.score.total + key_reward
    await episode.post_reward(key_reward, completion_id=outcome.completion_ids[0])
    return outcome.score.total
