"""A loss's options, read from its signature, and the checks that name a wrong one.

Every loss takes the same tensor inputs (:data:`LOSS_INPUTS`) and its own keyword options; the
options a config may give are the other keyword parameters of the function (a loss declaring
``**options`` takes any). The run config gives them as ``algorithm.loss_options``; three typed
``algorithm`` fields older configs use (:data:`TYPED_OPTIONS`) reach the losses that name them.
Nothing here imports torch: it reads signatures only.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

__all__ = [
    "LOSS_INPUTS",
    "OPTIONS_KEY",
    "TURN_INPUTS",
    "TYPED_OPTIONS",
    "call_options",
    "check_advantage_options",
    "ignored_typed",
    "option_defaults",
]

# The tensors every loss gets from the trainer, by keyword.
LOSS_INPUTS = (
    "logprobs",
    "proximal_logprobs",
    "behavior_logprobs",
    "advantages",
    "loss_mask",
    "cu_seqlens",
)
# The inputs every advantage estimator gets (``advantage/<name>``).
ADVANTAGE_INPUTS = ("rewards", "group_ids", "loss_mask")
# The per-turn inputs an estimator gets when its signature names them
# (:mod:`areal.plugins.trainer.turn_inputs`).
TURN_INPUTS = ("token_returns", "turn_ids", "episode_ids", "input_ids")
# The run-config key of a loss's own options.
OPTIONS_KEY = "algorithm.loss_options"
# ``algorithm`` fields that are options of the PPO-family losses: a config may set them there as
# well as in ``loss_options``, and they reach the losses that name them.
TYPED_OPTIONS = ("eps_clip", "eps_clip_high", "behavior_weight_cap")


def option_defaults(fn: Callable[..., Any]) -> dict[str, Any] | None:
    """The options ``fn`` takes with their defaults (``inspect.Parameter.empty`` if required), or
    ``None`` when it declares ``**options`` and so takes any."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name: p.default for p in params if p.name not in LOSS_INPUTS}


def call_options(
    fn: Callable[..., Any],
    *,
    loss: str,
    options: Mapping[str, Any] | None = None,
    typed: Mapping[str, Any] | None = None,
    explicit: Collection[str] = (),
) -> dict[str, Any]:
    """The keyword options to call loss ``fn`` (registered as ``loss``) with.

    ``options`` (``algorithm.loss_options``) are checked against the signature; ``typed`` (the
    :data:`TYPED_OPTIONS` fields' values) are added where ``fn`` names them and the value is not
    ``None``, under ``options``. ``explicit`` names the typed fields the user set: one also given
    in ``options`` is an error (one the loss does not take is left out: :func:`ignored_typed`
    says which, so a config written for PPO still runs with ``--set algorithm.loss=sapo``).
    Raises ``ValueError`` listing every problem as ``key: why; fix``.
    """
    options = dict(options or {})
    known = option_defaults(fn)
    problems = _missing_inputs(fn, loss)
    for name in options:
        if name in LOSS_INPUTS:
            problems.append(
                f"{OPTIONS_KEY}.{name}: {name} is an input the trainer passes to every loss, not "
                "an option; remove it"
            )
        elif known is not None and name not in known:
            problems.append(f"{OPTIONS_KEY}.{name}: {_unknown(name, loss, known)}")
    merged: dict[str, Any] = {}
    for name, value in (typed or {}).items():
        if name in explicit and name in options:
            problems.append(
                f"algorithm.{name}: also set as {OPTIONS_KEY}.{name}; keep one of the two"
            )
        elif value is not None and (name in known if known is not None else name in explicit):
            merged[name] = value
    if problems:
        raise ValueError("\n".join(problems))
    merged.update(options)
    return merged


def check_advantage_options(
    fn: Callable[..., Any], options: Mapping[str, Any], *, advantage: str
) -> None:
    """``algorithm.advantage_options`` against the estimator's signature (inputs
    :data:`ADVANTAGE_INPUTS` and :data:`TURN_INPUTS`); ``ValueError`` naming each unknown key."""
    inputs = (*ADVANTAGE_INPUTS, *TURN_INPUTS)
    given = [n for n in options if n in inputs]
    if given:
        raise ValueError(
            "\n".join(
                f"algorithm.advantage_options.{n}: {n} is an input the trainer passes to the "
                "estimator, not an option; remove it"
                for n in given
            )
        )
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    known = {p.name: p.default for p in params if p.name not in inputs}
    problems = [
        f"algorithm.advantage_options.{name}: "
        + _unknown(name, advantage, known).replace("loss ", "advantage ", 1)
        for name in options
        if name not in known
    ]
    if problems:
        raise ValueError("\n".join(problems))


def ignored_typed(fn: Callable[..., Any], *, loss: str, explicit: Collection[str]) -> list[str]:
    """A line for each typed ``algorithm`` field the user set that loss ``fn`` does not take."""
    known = option_defaults(fn)
    if known is None:
        return []
    return [
        f"algorithm.{name}: loss {loss!r} has no option {name!r}, so it is ignored "
        f"({_listing(known)})"
        for name in TYPED_OPTIONS
        if name in explicit and name not in known
    ]


def _missing_inputs(fn: Callable[..., Any], loss: str) -> list[str]:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    missing = [name for name in LOSS_INPUTS if name not in params]
    if not missing:
        return []
    return [
        f"algorithm.loss: loss {loss!r} does not take the input(s) {', '.join(missing)}; a loss "
        f"takes keyword arguments {', '.join(LOSS_INPUTS)}, **options (docs/training.md)"
    ]


def _unknown(name: str, loss: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"loss {loss!r} has no option {name!r}; {hint}{_listing(known)}"


def _listing(known: Mapping[str, Any] | None) -> str:
    if known is None:
        return "it takes any option"
    return f"its options: {', '.join(known) or 'none'}"
