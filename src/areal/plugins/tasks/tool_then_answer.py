"""``tool_then_answer``: call a tool with numbers copied from the question, then answer.

The smallest real agent task: the user asks "What is 3 plus 5?", the agent offers one tool
``add(a, b)``; turn 1 the model must call it with the question's two numbers; the agent runs the
tool and appends its result; turn 2 the model answers. Two model calls per episode with the
environment's feedback between them, written with nothing but the plain ``openai`` SDK.

Sized for a tiny model on a CPU: the numbers are single digits, which our byte-level BPE keeps as
one token each, so copying them is copying two tokens; the tool spec is as short as a correct one
can be, since the chat template renders it into every prompt.

The reward (:func:`score`) gives partial credit, so a model that has learned only the format
(from :func:`demonstration`, which shows random arguments) scores about 0.25 and RL has a
gradient to climb: 0.2 for a valid ``add`` call with two integers, 0.2 for each argument equal to
the question's, 0.4 for a final answer equal to the true sum.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal.core.episode import Episode

NAME = "tool_then_answer"
DESCRIPTION = "Call add(a, b) with the question's two digits, then answer with the tool's result."

ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
LARGEST = 9  # operands are 0..9: one token each
# Output caps per turn: a well-formed call is 27 tokens, an answer at most 3 (two digits and
# <|im_end|>); the slack lets an imperfect model finish, the cap stops a rambling one early.
CALL_MAX_TOKENS = 48
ANSWER_MAX_TOKENS = 8

# The reward's parts (they sum to 1).
VALID_CALL = 0.2
EACH_ARGUMENT = 0.2
ANSWER = 0.4
SUCCESS_REWARD = 1.0  # a right call and the right answer

_INTEGER = re.compile(r"-?\d+")


def task(index: int, seed: int) -> dict[str, Any]:
    """Task ``index`` of the stream seeded ``seed``: the same numbers on every machine."""
    rng = random.Random(f"{NAME}:{seed}:{index}")
    a, b = rng.randint(0, LARGEST), rng.randint(0, LARGEST)
    return {
        "task_id": f"{NAME}-{seed}-{index}",
        "question": question(a, b),
        "a": a,
        "b": b,
        "answer": str(a + b),
    }


def question(a: int, b: int) -> str:
    return f"What is {a} plus {b}?"


def demonstration(index: int, seed: int) -> dict[str, Any]:
    """A format-only episode: the task's question, a call with RANDOM arguments, that call's true
    result, and an answer equal to it. It shows the shape of a good episode (call, read the
    result, answer with it) but not which numbers to copy: that is left for RL."""
    rng = random.Random(f"{NAME}-demo:{seed}:{index}")
    x, y = rng.randint(0, LARGEST), rng.randint(0, LARGEST)
    result = str(x + y)
    call = {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": "add", "arguments": json.dumps({"a": x, "b": y})},
    }
    messages = [
        {"role": "user", "content": task(index, seed)["question"]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": result},
        {"role": "assistant", "content": result},
    ]
    return {"messages": messages, "tools": [ADD_TOOL]}


# --- the environment and the reward ---------------------------------------------------------


def add_arguments(name: str, arguments: str) -> tuple[int, int] | None:
    """``(a, b)`` when this is a valid call of ``add`` (two integer arguments and nothing else)."""
    if name != "add":
        return None
    try:
        args = json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return None
    if not isinstance(args, dict) or set(args) != {"a", "b"}:
        return None
    a, b = args["a"], args["b"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (a, b)):
        return None
    return a, b


def run_tool(name: str, arguments: str) -> str:
    """What the environment answers to a tool call; a bad call gets an error message, as a real
    tool would answer, never an exception."""
    if name != "add":
        return f"error: there is no tool named {name!r}; the tool is add"
    args = add_arguments(name, arguments)
    if args is None:
        return "error: add takes two integers, a and b"
    return str(args[0] + args[1])


@dataclass(frozen=True)
class Score:
    """The reward and its parts, so a bench (or a curious user) can see what was learned."""

    call: float = 0.0  # a valid call of add
    a: float = 0.0  # its first argument is the question's first number
    b: float = 0.0
    answer: float = 0.0  # the final answer is the true sum (calculator: the right bare number)

    @property
    def total(self) -> float:
        return round(self.call + self.a + self.b + self.answer, 6)


def score(task: Mapping[str, Any], call: tuple[str, str] | None, answer: str | None) -> Score:
    """Score an episode: ``call`` is the first tool call of turn 1 as ``(name, arguments JSON)``
    (None: no call); ``answer`` the final reply's text (None: no final reply).

    Argument credit needs a valid call (garbage earns nothing); the answer must be the sum
    itself, optionally surrounded by whitespace.
    """
    args = add_arguments(*call) if call is not None else None
    parts: dict[str, float] = {}
    if args is not None:
        parts["call"] = VALID_CALL
        parts["a"] = EACH_ARGUMENT if args[0] == task["a"] else 0.0
        parts["b"] = EACH_ARGUMENT if args[1] == task["b"] else 0.0
    text = (answer or "").strip()
    if _INTEGER.fullmatch(text) and int(text) == task["a"] + task["b"]:
        parts["answer"] = ANSWER
    return Score(**parts)


# --- the agent ------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One played episode: its score and what each model call cost in tokens."""

    score: Score
    prompt_tokens: list[int] = field(default_factory=list)  # per model call
    completion_tokens: list[int] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)  # the chat, replies included
    # per model call: the response's id, which names its turn to the session API (a turn reward)
    completion_ids: list[str] = field(default_factory=list)


async def play(client: Any, model: str, task: Mapping[str, Any], max_calls: int = 2) -> Outcome:
    """Play one episode with an ``openai.AsyncOpenAI`` client; garbage from the model lowers the
    score, only a failing gateway raises.

    Turn 1 offers ``add``. If the model calls tools, each call is run and its result appended,
    and turn 2 (same tools, so the prompt extends turn 1 token for token) asks for the answer;
    a reply without tool calls is the final answer, as in any agent loop.
    """
    outcome = Outcome(score=Score())
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    outcome.transcript = messages
    reply = await chat(client, model, messages, CALL_MAX_TOKENS, outcome, tools=[ADD_TOOL])
    calls = reply.tool_calls or []
    messages.append(assistant_message(reply))
    if not calls:
        outcome.score = score(task, None, reply.content)
        return outcome
    first = (calls[0].function.name, calls[0].function.arguments)
    if max_calls < 2:
        outcome.score = score(task, first, None)
        return outcome
    for tool_call in calls:
        result = run_tool(tool_call.function.name, tool_call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": result})
    final = await chat(client, model, messages, ANSWER_MAX_TOKENS, outcome, tools=[ADD_TOOL])
    messages.append(assistant_message(final))
    outcome.score = score(task, first, None if final.tool_calls else final.content)
    return outcome


async def agent(episode: Episode) -> float:
    """The task set's agent (an :data:`areal.run.rollout.AgentFn`): play, return the reward."""
    return (await play_episode(play, episode)).score.total


Play = Callable[[Any, str, Mapping[str, Any], int], Awaitable[Outcome]]


async def play_episode(play: Play, episode: Episode) -> Outcome:
    """Run a task set's ``play`` (at most two calls) with the episode's own client. Shared by
    the built-in task sets' agents, whose reward is (mostly) the outcome's total score."""
    client = episode.openai_client()
    try:
        return await play(client, episode.model, episode.task, min(2, episode.max_turns))
    finally:
        await client.close()


async def chat(
    client: Any,
    model: str,
    messages: Sequence[dict[str, Any]],
    max_tokens: int,
    outcome: Outcome,
    **extra: Any,
) -> Any:
    """One model call of an episode (``extra``: e.g. ``tools``), its token counts and id kept in
    ``outcome``; returns the reply's message."""
    response = await client.chat.completions.create(
        model=model, messages=list(messages), max_tokens=max_tokens, **extra
    )
    if response.usage is not None:
        outcome.prompt_tokens.append(response.usage.prompt_tokens)
        outcome.completion_tokens.append(response.usage.completion_tokens)
    outcome.completion_ids.append(response.id)
    return response.choices[0].message


def assistant_message(message: Any) -> dict[str, Any]:
    """The model's turn as the next request sends it back: its text and its calls, unchanged."""
    turn: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        turn["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls
        ]
    return turn
