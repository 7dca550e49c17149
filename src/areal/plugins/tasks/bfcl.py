"""``bfcl_multi_turn``: BFCL v4's multi-turn set, stateful tool APIs over several user turns.

The Berkeley Function Calling Leaderboard's 800 multi-turn items (``bfcl-eval``, Apache-2.0), in
four categories of 200: ``multi_turn_base``, ``multi_turn_miss_func`` (a function is held back and
offered at a later turn), ``multi_turn_miss_param`` (a turn lacks a parameter the model must not
invent) and ``multi_turn_long_context`` (the tools' state is large). Each item's tools are Python
classes with state (a file system, a trading account, a vehicle, a ticket desk...).

The agent plays an item as BFCL's function-calling handler does, with nothing but the ``openai``
SDK: each user turn is appended, then the model is called with the item's tools; its calls run in
the episode's sandbox (:mod:`areal.plugins.tasks.bfcl_sandbox`, the tools' state kept there across
turns) and each result goes back as a ``tool`` message; a reply without calls ends the turn. A
call the tools cannot run (a name not offered, arguments that are not a JSON object) is counted
and answered with an error message. More than ``max_steps_per_turn`` steps with calls in one turn
ends the episode, as BFCL's step limit does (its checker then fails the item), and so does the
episode's model-call budget (``agent.max_turns``) or a prompt longer than the policy's context.

The reward is BFCL's own ``multi_turn_checker`` run in the sandbox: after every turn the state of
the model's instances must equal the ground truth's, and the ground truth's results must be among
the model's; 1.0 when the whole item passes, 0.0 otherwise. No partial credit: BFCL gives none.

``dataset.options``: ``category`` (default ``multi_turn_base``), ``ids`` (BFCL ids or their
numbers within the category; default all 200), ``max_steps_per_turn`` (default BFCL's 20),
``tool_docs`` (``full``: BFCL's docs; ``compact``: names and types only, for small contexts) and
``max_tokens`` (per model call; default: the policy route's cap).
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from areal.core.config import ConfigError
from areal.core.tasks import TaskSet, check_option_names
from areal.plugins.tasks.bfcl_data import (
    CATEGORIES,
    MORE_FUNCTIONS_PROMPT,
    MalformedCall,
    call_string,
    entries,
    entry,
    openai_tools,
)
from areal.plugins.tasks.bfcl_sandbox import Sandbox, Verdict
from areal.plugins.tasks.tool_then_answer import assistant_message

if TYPE_CHECKING:
    from areal.core.episode import Episode

log = logging.getLogger(__name__)

NAME = "bfcl_multi_turn"
DESCRIPTION = "BFCL v4 multi-turn: stateful tool APIs over several user turns, scored by BFCL's state checker."
SUCCESS_REWARD = 1.0  # BFCL's checker passed the item; it gives nothing short of that
MAX_STEPS_PER_TURN = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT
TOOL_DOCS = ("full", "compact")


@dataclass(frozen=True)
class Options:
    """``dataset.options`` of the task set, checked."""

    category: str = "multi_turn_base"
    ids: tuple[str, ...] = ()  # empty: every item of the category
    max_steps_per_turn: int = MAX_STEPS_PER_TURN
    tool_docs: str = "full"
    max_tokens: int | None = None


def configure(options: Mapping[str, Any]) -> TaskSet:
    """The task set as ``dataset.options`` asks (the registry holds the defaults); a wrong option
    is a ConfigError naming it."""
    from areal.core.tasks import task_set

    return replace(task_set(NAME), task=functools.partial(build_task, parse_options(options)))


def parse_options(options: Mapping[str, Any]) -> Options:
    check_option_names(NAME, options, sorted(Options.__dataclass_fields__))
    category = options.get("category", Options.category)
    if category not in CATEGORIES:
        raise ConfigError(
            f"dataset.options.category: {category!r} is not one of {', '.join(CATEGORIES)}"
        )
    steps = options.get("max_steps_per_turn", MAX_STEPS_PER_TURN)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError(f"dataset.options.max_steps_per_turn: a whole number >= 1, got {steps!r}")
    docs = options.get("tool_docs", "full")
    if docs not in TOOL_DOCS:
        raise ConfigError(
            f"dataset.options.tool_docs: {docs!r} is not one of {', '.join(TOOL_DOCS)}"
        )
    max_tokens = options.get("max_tokens")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise ConfigError(f"dataset.options.max_tokens: a whole number >= 1, got {max_tokens!r}")
    return Options(category, _ids(category, options.get("ids")), steps, docs, max_tokens)


def _ids(category: str, given: Any) -> tuple[str, ...]:
    if given is None:
        return ()
    if isinstance(given, (str, int)) or not isinstance(given, Sequence) or not given:
        raise ConfigError(
            f"dataset.options.ids: a non-empty list of BFCL ids of {category}, got {given!r}"
        )
    known = entries(category)
    ids = []
    for one in given:
        bfcl_id = f"{category}_{one}" if isinstance(one, int) and not isinstance(one, bool) else one
        if bfcl_id not in known:
            raise ConfigError(
                f"dataset.options.ids: {one!r} is not an item of {category} (its ids: {category}_0 .. {category}_{len(known) - 1})"
            )
        ids.append(bfcl_id)
    return tuple(ids)


def build_task(options: Options, index: int, seed: int) -> dict[str, Any]:
    """Task ``index``: epoch ``index // n`` visits every chosen item once, in an order drawn from
    ``(seed, epoch)``, the same on every machine."""
    ids = list(options.ids or entries(options.category))
    epoch, offset = divmod(index, len(ids))
    random.Random(f"{NAME}:{seed}:{epoch}").shuffle(ids)
    item = entry(ids[offset])
    return {
        "task_id": item["id"],
        "bfcl_id": item["id"],
        "question": item["question"][0][0]["content"] if item["question"][0] else "",
        "turns": len(item["question"]),
        "max_steps_per_turn": options.max_steps_per_turn,
        "tool_docs": options.tool_docs,
        "max_tokens": options.max_tokens,
    }


def task(index: int, seed: int) -> dict[str, Any]:
    """Task ``index`` of the default task set (every ``multi_turn_base`` item)."""
    return build_task(Options(), index, seed)


# --- the agent --------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One played item: the verdict and what happened on the way."""

    verdict: Verdict | None = None  # None: the episode stopped before BFCL could check it
    stopped: str = ""  # why the episode ended early: step_limit, call_budget, context_length
    model_calls: list[list[list[str]]] = field(
        default_factory=list
    )  # per turn, per step (BFCL's shape)
    malformed: int = 0  # tool calls the tools could not run; each was answered with an error
    calls: int = 0  # model calls made
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reward(self) -> float:
        return SUCCESS_REWARD if self.verdict is not None and self.verdict.valid else 0.0


async def agent(episode: Episode) -> float:
    """The task set's agent (an :data:`areal.run.rollout.AgentFn`): play, return the reward."""
    client = episode.openai_client()
    try:
        outcome = await play(client, episode.model, episode.task, episode.max_turns)
    finally:
        await client.close()
    return outcome.reward


async def play(client: Any, model: str, task: Mapping[str, Any], max_calls: int) -> Outcome:
    """Play one item with an ``openai.AsyncOpenAI`` client; the model's garbage lowers nothing
    but its reward, only a failing gateway or sandbox raises."""
    item = entry(task["bfcl_id"])
    compact = task.get("tool_docs", "full") == "compact"
    functions = list(item["function"])
    outcome = Outcome()
    async with await Sandbox.open(item) as sandbox:
        for turn, user_messages in enumerate(item["question"]):
            if str(turn) in item["missed_function"]:  # miss_func: the held-out docs arrive now
                functions += item["missed_function"][str(turn)]
                user_messages = [{"role": "user", "content": MORE_FUNCTIONS_PROMPT}]
            outcome.transcript.extend(user_messages)
            steps = await _play_turn(
                client, model, task, openai_tools(functions, compact), sandbox, outcome, max_calls
            )
            outcome.model_calls.append(steps)
            if outcome.stopped:
                break
        else:
            outcome.verdict = await sandbox.check(outcome.model_calls, item["ground_truth"])
    _report(task, outcome)
    return outcome


async def _play_turn(
    client: Any,
    model: str,
    task: Mapping[str, Any],
    tools: list[dict[str, Any]],
    sandbox: Sandbox,
    outcome: Outcome,
    max_calls: int,
) -> list[list[str]]:
    """One user turn: model steps until a reply without calls; the steps' runnable calls."""
    import openai

    names = [t["function"]["name"] for t in tools]
    steps: list[list[str]] = []
    stepped = 0  # replies with calls in this turn (BFCL counts them, runnable or not)
    while True:
        if outcome.calls >= max_calls:
            outcome.stopped = "call_budget"
            return steps
        try:
            reply = await _complete(client, model, outcome, tools, task.get("max_tokens"))
        except openai.BadRequestError as err:
            if err.code != "context_length_exceeded":
                raise
            outcome.stopped = "context_length"
            return steps
        outcome.transcript.append(assistant_message(reply))
        if not reply.tool_calls:
            return steps
        stepped += 1
        runnable: list[str] = []
        answers: list[str | None] = []  # None: run it; else the error the model is told
        for tool_call in reply.tool_calls:
            try:
                runnable.append(
                    call_string(tool_call.function.name, tool_call.function.arguments or "", names)
                )
                answers.append(None)
            except MalformedCall as bad:
                outcome.malformed += 1
                answers.append(str(bad))
        results = iter(await sandbox.execute(runnable)) if runnable else iter(())
        for tool_call, answer in zip(reply.tool_calls, answers):
            content = answer if answer is not None else next(results)
            outcome.transcript.append(
                {"role": "tool", "tool_call_id": tool_call.id, "content": content}
            )
        if runnable:
            steps.append(runnable)
        if stepped > task.get("max_steps_per_turn", MAX_STEPS_PER_TURN):
            outcome.stopped = "step_limit"
            return steps


async def _complete(
    client: Any, model: str, outcome: Outcome, tools: list[dict[str, Any]], max_tokens: int | None
) -> Any:
    """One model call with the conversation so far; its token counts kept in ``outcome``."""
    extra = {"max_tokens": max_tokens} if max_tokens else {}
    response = await client.chat.completions.create(
        model=model, messages=list(outcome.transcript), tools=tools, **extra
    )
    outcome.calls += 1
    if response.usage is not None:
        outcome.prompt_tokens.append(response.usage.prompt_tokens)
        outcome.completion_tokens.append(response.usage.completion_tokens)
    return response.choices[0].message


def _report(task: Mapping[str, Any], outcome: Outcome) -> None:
    verdict = outcome.verdict
    log.debug(
        "bfcl %s: reward=%s calls=%d malformed=%d stopped=%s check=%s",
        task["bfcl_id"],
        outcome.reward,
        outcome.calls,
        outcome.malformed,
        outcome.stopped or "-",
        "pass" if verdict and verdict.valid else (verdict.error_type if verdict else "-"),
    )
