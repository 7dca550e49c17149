"""``reasoning_gym``: tasks nobody here wrote, from the reasoning-gym library, scored by its scorers.

reasoning-gym (Apache-2.0, offline) has about a hundred procedural generators with scorers
(``products``, ``basic_arithmetic``, ``chain_sum``, ``gsm_symbolic``...). ``dataset.options``
picks them:

- ``tasks``: one generator name or a list (index ``i`` plays ``tasks[i % len(tasks)]``);
- ``size``: items per pass of one generator (default 1000); pass ``e`` of the stream draws fresh
  items with the seed ``seed + e``, so a long run never repeats an item;
- ``seed``: the items' seed (default ``dataset.seed``): a held-out set is another seed;
- ``config``: each generator's own settings, e.g. ``{products: {max_digits: 1}}``;
- ``answer``: how the reply is read (``last_number``: the last number in it, what a chat model's
  "The answer is 42." means; ``full``: the whole reply, stripped). Default: ``last_number`` for
  an item whose answer is a number, else ``full``;
- ``partial_credit``: pay the scorer's partial scores (default false: 1 for a score of 1, else 0).

The reward is the generator's own ``score_answer`` of the answer read from the reply; success is
a score of 1. The answer is extracted first, and partial scores are not paid unless asked,
because reasoning-gym's scorers give partial credit to a wrong number that contains the right one
("112" earns 0.67 against "12"): paid, a wrong answer that shares digits with the right one
would be reinforced.

The agent is the plain ``openai`` SDK: the question as the user's one message, the reply read.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from areal.core.config import ConfigError

if TYPE_CHECKING:
    from areal.core.episode import Episode
    from areal.core.tasks import TaskSet

NAME = "reasoning_gym"
DESCRIPTION = "reasoning-gym's generators and scorers (dataset.options: tasks, size, seed, config)."
SUCCESS_REWARD = 1.0
DEFAULT_TASKS = ("products",)
DEFAULT_SIZE = 1000
SEED_STRIDE = 10**9
ANSWER_RULES = ("last_number", "full")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_OPTIONS = ("tasks", "size", "seed", "config", "answer", "partial_credit")


@dataclass(frozen=True)
class Options:
    tasks: tuple[str, ...] = DEFAULT_TASKS
    size: int = DEFAULT_SIZE
    seed: int | None = None  # None: the stream's seed (dataset.seed)
    config: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    answer: str | None = None  # None: by the item's answer
    partial_credit: bool = False


def parse_options(options: Mapping[str, Any]) -> Options:
    """``dataset.options`` checked against reasoning-gym itself: an unknown generator or setting
    is a ConfigError naming the key, now rather than in a rollout worker."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ConfigError(
            f"dataset.options.{unknown[0]}: reasoning_gym takes {', '.join(_OPTIONS)}"
        )
    tasks = options.get("tasks", DEFAULT_TASKS)
    tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
    known = _generators()
    for name in tasks:
        if name not in known:
            close = [k for k in known if name[:4] in k][:5]
            raise ConfigError(
                f"dataset.options.tasks: reasoning-gym has no generator {name!r}"
                + (f" (close: {', '.join(close)})" if close else "")
            )
    if not tasks:
        raise ConfigError("dataset.options.tasks: name at least one reasoning-gym generator")
    size = options.get("size", DEFAULT_SIZE)
    if not isinstance(size, int) or size < 1:
        raise ConfigError(f"dataset.options.size: a positive item count, got {size!r}")
    config = dict(options.get("config") or {})
    for name, settings in config.items():
        if name not in tasks:
            raise ConfigError(f"dataset.options.config.{name}: {name} is not in tasks")
        _check_settings(name, settings)
    answer = options.get("answer")
    if answer is not None and answer not in ANSWER_RULES:
        raise ConfigError(f"dataset.options.answer: one of {', '.join(ANSWER_RULES)}")
    seed = options.get("seed")
    partial = options.get("partial_credit", False)
    if not isinstance(partial, bool):
        raise ConfigError(f"dataset.options.partial_credit: true or false, got {partial!r}")
    return Options(tasks, size, None if seed is None else int(seed), config, answer, partial)


def configure(options: Mapping[str, Any]) -> TaskSet:
    """The task set with ``options`` bound (the registry holds the defaults)."""
    from areal.core.tasks import task_set

    parsed = parse_options(options)
    return replace(
        task_set(NAME),
        task=functools.partial(task, options=parsed),
        agent=f"{__name__}:agent",
    )


def task(index: int, seed: int, options: Options = Options()) -> dict[str, Any]:
    """Task ``index``: generator ``tasks[index % k]``, its item ``index // k`` of the pass it
    falls in. The same item on every machine."""
    k = len(options.tasks)
    name, position = options.tasks[index % k], index // k
    pass_number, item = divmod(position, options.size)
    base = seed if options.seed is None else options.seed
    # reasoning-gym draws item i of seed s from Random(s + i): streams of seeds 0 and 1 would be
    # the same items shifted by one. Seed s starts at s * 10^9, so two seeds share no draw.
    first = base * SEED_STRIDE + pass_number * options.size
    entry = _dataset(name, first, options.size, _frozen(options.config.get(name)))[item]
    return {
        "task_id": f"{NAME}-{name}-{base}-{position}",
        "question": entry["question"],
        "answer": str(entry["answer"]),
        "generator": name,
        "entry": entry,
        "answer_rule": options.answer or _rule_for(str(entry["answer"])),
        "partial_credit": options.partial_credit,
    }


def read_answer(reply: str, rule: str) -> str:
    """The answer a reply gives, by ``rule``; an empty string when there is none."""
    text = (reply or "").strip()
    if rule == "last_number":
        numbers = _NUMBER.findall(text.replace(",", ""))
        return numbers[-1] if numbers else ""
    return text


def score(task: Mapping[str, Any], reply: str) -> float:
    """reasoning-gym's own scorer of the answer read from ``reply`` (a partial score counts only
    with ``partial_credit``)."""
    answer = read_answer(reply, task["answer_rule"])
    if not answer:
        return 0.0
    generator = _dataset(task["generator"], 0, 1, ())
    scored = float(generator.score_answer(answer, task["entry"]))
    return scored if task.get("partial_credit") or scored >= 1.0 else 0.0


async def agent(episode: Episode) -> float:
    """The task set's agent: ask the question with the plain openai SDK, score the reply."""
    client = episode.openai_client()
    try:
        response = await client.chat.completions.create(
            model=episode.model,
            messages=[{"role": "user", "content": episode.task["question"]}],
        )
    finally:
        await client.close()
    return score(episode.task, response.choices[0].message.content or "")


def _rule_for(answer: str) -> str:
    return "last_number" if _NUMBER.fullmatch(answer.strip()) else "full"


def _frozen(settings: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """Settings as a cache key; a YAML list (``operators: [+, -]``) becomes the tuple
    reasoning-gym's own defaults are."""
    return tuple(
        sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in (settings or {}).items())
    )


@functools.lru_cache(maxsize=16)
def _dataset(name: str, seed: int, size: int, settings: tuple[tuple[str, Any], ...]) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=size, seed=seed, **dict(settings))


@functools.cache
def _generators() -> frozenset[str]:
    from reasoning_gym.factory import DATASETS

    return frozenset(DATASETS)


def _check_settings(name: str, settings: Any) -> None:
    import dataclasses

    from reasoning_gym.factory import DATASETS

    if not isinstance(settings, Mapping):
        raise ConfigError(f"dataset.options.config.{name}: a mapping of {name}'s settings")
    fields = {f.name for f in dataclasses.fields(DATASETS[name][1])} - {"seed", "size"}
    for key in settings:
        if key not in fields:
            raise ConfigError(
                f"dataset.options.config.{name}.{key}: {name} has the settings "
                f"{', '.join(sorted(fields))}"
            )
