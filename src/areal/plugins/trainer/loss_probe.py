"""One call of a loss on four made-up tokens, before any real one.

It answers two questions early and cheaply (microseconds on the CPU): are the option *values*
acceptable (a bad mode name or ``c_clip ≤ 1`` fails here, when the engine is built, not minutes
into the run), and which statistics does the loss return (so every rank of a step sums the same
names, even a pipeline stage that never computes the loss).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from areal.core.loss_options import OPTIONS_KEY

__all__ = ["probe_loss"]


def probe_loss(fn: Callable[..., Any], options: Mapping[str, Any], *, loss: str) -> list[str]:
    """The names of the statistics loss ``fn`` returns with ``options``, ``n_valid_tokens``
    left out; ``ValueError`` naming ``algorithm.loss_options`` if the call fails or returns
    something other than ``(scalar tensor, dict of floats with n_valid_tokens)``."""
    logprobs = torch.tensor([-1.0, -2.0, -0.5, -1.5], requires_grad=True)
    inputs = {
        "logprobs": logprobs,
        "proximal_logprobs": logprobs.detach() - 0.1,
        "behavior_logprobs": logprobs.detach() - 0.2,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "loss_mask": torch.tensor([True, True, False, True]),
        "cu_seqlens": torch.tensor([0, 2, 4]),
    }
    try:
        out = fn(**inputs, **options)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{OPTIONS_KEY}: loss {loss!r} refused its options: {err}") from err
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError(f"algorithm.loss: loss {loss!r} must return (loss, stats)")
    value, stats = out
    if not (isinstance(value, torch.Tensor) and value.dim() == 0 and isinstance(stats, dict)):
        raise ValueError(
            f"algorithm.loss: loss {loss!r} must return a 0-dim loss tensor and a stats dict"
        )
    if "n_valid_tokens" not in stats:
        raise ValueError(f"algorithm.loss: loss {loss!r} must report n_valid_tokens in its stats")
    return [name for name in stats if name != "n_valid_tokens"]
