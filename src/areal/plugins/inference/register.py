"""Built-in inference backends: the embedded torch engine and SGLang."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl
from areal.core.specs import InferenceBackend


@hookimpl
def areal_register_inference_backends(register: Register) -> None:
    register(
        "embedded",
        InferenceBackend(
            name="embedded",
            launcher="areal.plugins.inference.embedded.launcher:engine_command",
            description="areal's torch engine: SGLang native HTTP API, runs on CPU",
        ),
    )
    register(
        "sglang",
        InferenceBackend(
            name="sglang",
            launcher="areal.plugins.inference.sglang_backend:engine_command",
            description="SGLang launch_server (GPU)",
            needs_gpu=True,
            collective="nccl",
        ),
    )
