"""Built-in losses and advantage estimators, registered through ``areal_register_losses``.

The registry holds :class:`LazyFunction` stand-ins that import their module (and torch) on the
first call, so loading plugins, listing them or validating a config never imports torch. Names:

- the losses, one keyword signature ``(*, logprobs, proximal_logprobs, behavior_logprobs,
  advantages, loss_mask, cu_seqlens, **options) -> (loss, stats)`` (docs/training.md):
  ``decoupled_ppo`` (:func:`.ppo.decoupled_ppo_loss`, the default), ``ppo`` (:func:`.ppo.ppo_loss`),
  ``sapo`` (:func:`.sapo.sapo_loss`), ``cispo`` (:func:`.cispo.cispo_loss`), ``clip_cov`` and
  ``kl_cov`` (:mod:`.cov`);
- ``advantage/grpo``, ``advantage/rloo``, ``advantage/gae``: token-level advantage estimators with
  one keyword signature ``(*, rewards [N], group_ids [N], loss_mask [N, T], **options) -> [N, T]``
  (:mod:`areal.plugins.losses.advantages`), and ``advantage/turn``, ``advantage/gigpo``, which
  credit turns (:mod:`areal.plugins.losses.turn_advantages`; they also name per-turn inputs,
  :mod:`areal.plugins.trainer.turn_inputs`). They share the loss registry, under a prefix, because
  the trainer picks both by name from the same ``algorithm`` section;
- ``proximal/loglinear``: :func:`areal.plugins.losses.ppo.loglinear_proximal_logprobs`, the
  π_prox approximation for ``prox_logp: loglinear`` and ``loglinear_every_minibatch``;
- ``advantage_norm/batch``: :func:`areal.plugins.losses.advantages.normalize_batch_advantages`
  (``algorithm.advantage_norm: batch``), ``(advantages [N, T], loss_mask [N, T]) -> [N, T]``.
"""

from __future__ import annotations

from typing import Any

from areal.core.hookspecs import Register, hookimpl
from areal.core.specs import load_object

_PKG = "areal.plugins.losses"

ADVANTAGE_PREFIX = "advantage/"

BUILTIN_LOSSES: dict[str, str] = {
    "decoupled_ppo": f"{_PKG}.ppo:decoupled_ppo_loss",
    "ppo": f"{_PKG}.ppo:ppo_loss",
    "sapo": f"{_PKG}.sapo:sapo_loss",
    "cispo": f"{_PKG}.cispo:cispo_loss",
    "clip_cov": f"{_PKG}.cov:clip_cov_loss",
    "kl_cov": f"{_PKG}.cov:kl_cov_loss",
    f"{ADVANTAGE_PREFIX}grpo": f"{_PKG}.advantages:grpo_token_advantages",
    f"{ADVANTAGE_PREFIX}rloo": f"{_PKG}.advantages:rloo_token_advantages",
    f"{ADVANTAGE_PREFIX}gae": f"{_PKG}.advantages:gae_token_advantages",
    f"{ADVANTAGE_PREFIX}turn": f"{_PKG}.turn_advantages:turn_token_advantages",
    f"{ADVANTAGE_PREFIX}gigpo": f"{_PKG}.turn_advantages:gigpo_token_advantages",
    "proximal/loglinear": f"{_PKG}.ppo:loglinear_proximal_logprobs",
    "advantage_norm/batch": f"{_PKG}.advantages:normalize_batch_advantages",
}


class LazyFunction:
    """A ``"module:attr"`` function imported on first call, then called directly.

    Hot loops should still resolve it once (:meth:`load`) and keep the real function.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fn: Any = None

    def load(self) -> Any:
        if self._fn is None:
            self._fn = load_object(self.path)
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"LazyFunction({self.path!r})"


@hookimpl
def areal_register_losses(register: Register) -> None:
    for name, path in BUILTIN_LOSSES.items():
        register(name, LazyFunction(path))
