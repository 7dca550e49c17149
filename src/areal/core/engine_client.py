"""The one interface the gateway and the trainer use to drive an inference engine.

Every backend registers a client class (``InferenceBackend.client``) that speaks its server's
HTTP API and answers in areal's terms: SGLang-style sampling params in, :class:`GenerateOutput`
(token ids, log-probs, per-token weight versions) out, and the same pause modes and weight-update
calls everywhere. Callers build clients with :func:`engine_client` and never learn which backend
runs. Torch-free: the gateway and the run supervisor import it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from areal.core.inference_records import GenerateOutput, PauseMode, SamplingParams

DEFAULT_BACKEND = "embedded"


class EngineClient(Protocol):
    """What areal asks of an engine (``docs/inference.md`` has the table of who does what)."""

    base_url: str

    async def aclose(self) -> None: ...

    async def health(self, timeout: float = 5.0) -> bool: ...

    async def wait_healthy(self, timeout: float, interval: float = 0.5) -> None: ...

    async def model_info(self) -> dict[str, Any]:
        """At least ``model_path``, ``tokenizer_path``, ``context_length``, ``weight_version``."""
        ...

    async def generate(
        self,
        *,
        input_ids: list[int] | None = None,
        text: str | None = None,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        return_logprob: bool = True,
        rid: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> GenerateOutput: ...

    def generate_stream(
        self,
        *,
        input_ids: list[int] | None = None,
        text: str | None = None,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        return_logprob: bool = True,
        rid: str | None = None,
        extra: Mapping[str, Any] | None = None,
        coalesce: bool = False,
    ) -> AsyncIterator[GenerateOutput]: ...

    async def pause_generation(self, mode: PauseMode = "abort") -> dict[str, Any]: ...

    async def continue_generation(self) -> dict[str, Any]: ...

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None: ...

    async def update_weights_from_disk(
        self,
        model_path: str,
        weight_version: str | None = None,
        abort_all_requests: bool = False,
        load_format: str | None = None,
    ) -> dict[str, Any]: ...

    async def update_weight_version(
        self, new_version: str, abort_all_requests: bool = True
    ) -> dict[str, Any]: ...

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> dict[str, Any]: ...

    async def update_weights_from_distributed(
        self,
        *,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = "weight_update_group",
        flush_cache: bool = True,
        abort_all_requests: bool = False,
        weight_version: str | None = None,
        load_format: str | None = None,
    ) -> dict[str, Any]: ...

    async def destroy_weights_update_group(
        self, group_name: str = "weight_update_group"
    ) -> dict[str, Any]: ...


def engine_client(backend: str | None, base_url: str, **kwargs: Any) -> EngineClient:
    """A client for the engine of ``backend`` (registered name; ``None``: the embedded one's)."""
    from areal.core.plugins import registry

    spec = registry("inference_backends").get(backend or DEFAULT_BACKEND, key="inference.backend")
    client: EngineClient = spec.load_client()(base_url, **kwargs)
    return client


def collective_backend(backend: str | None, *, gpus: bool) -> str:
    """The ``torch.distributed`` backend of ``backend``'s weight-update group; ``gpus``: the
    engines run on this machine's GPUs if the backend can (vLLM: on its CPU without them, where
    the group is gloo)."""
    from areal.core.plugins import registry

    name = backend or DEFAULT_BACKEND
    spec = registry("inference_backends").get(name, key="inference.backend")
    if not spec.collective:
        raise ValueError(
            f"inference.weight_sync: collective is not available with inference.backend {name} "
            "yet; set inference.weight_sync: disk"
        )
    if spec.gpu_if_present and not gpus:
        return "gloo"
    return str(spec.collective)
