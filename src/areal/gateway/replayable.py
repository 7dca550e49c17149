"""What a call recorded for training may ask of the sampler: only what the trainer replays.

The trainer recomputes each recorded token's log-prob as log softmax(z / T) over the whole
vocabulary (docs/training.md, "The behaviour log-prob"), z the policy's raw logits and T the
temperature of the call's sampling record. A penalty (``frequency_penalty``, ``presence_penalty``,
``repetition_penalty``) or a ``logit_bias`` changes z itself, token by token, before the engine
draws; the sampling record does not carry it and the trainer cannot apply it, so a token sampled
under one would be trained with a behaviour probability of another distribution. A recorded call
that asks for one is therefore refused (400, naming the field); a call that is not recorded (a
plain-key call outside any session) is served with it as the engine applies it.

Truncation (top-k, top-p, min-p) and grammars only choose which token is drawn; the embedded
engine and vLLM report the full-vocabulary value for it, so they need no refusal. SGLang reports a
grammar-constrained token's log-prob after the mask: such calls are served (forced tool calls are
what agents are trained on) and counted (:meth:`areal.gateway.policy.PolicyService._note_masked`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from areal.gateway.errors import GatewayError
from areal.gateway.recording import RECORDING

# The sampling params (SGLang's names, as the protocols' parsers pass them on) that change the
# logits themselves, each with its neutral value (a neutral one is never sent).
UNREPLAYED: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
}
NOT_TRAINABLE = "not_trainable"  # the error code of the refusal


def recorded(request: web.Request) -> bool:
    """Whether this policy call is recorded for training (known once its episode is)."""
    recording = request.get(RECORDING)
    return recording is not None and recording.recorded


def check_replayable(request: web.Request, params: Mapping[str, Any]) -> None:
    """Refuse a recorded call whose sampling params change the logits (see the module doc)."""
    if not recorded(request):
        return
    for key, neutral in UNREPLAYED.items():
        value = params.get(key)
        if value is not None and value != neutral:
            raise GatewayError(
                400,
                f"{key}: this call is recorded for training, and the trainer cannot replay "
                f"{key}: it recomputes each token's log-prob as log softmax(logits / T) over the "
                "whole vocabulary, so a token sampled under it would be trained with another "
                "distribution's probability; leave it out (calls outside a training session may "
                "use it)",
                param=key,
                code=NOT_TRAINABLE,
            )
