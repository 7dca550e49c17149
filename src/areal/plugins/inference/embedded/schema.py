"""Request bodies of the SGLang native API, validated strictly.

Unknown fields are refused (a typo must not be silently ignored); SGLang fields the embedded
engine does not implement are accepted only at their neutral value, otherwise a 400 names them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

_STRICT = ConfigDict(extra="forbid")
# What torch.Generator.manual_seed takes: a seed outside it would fail on the engine's thread.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


class SamplingParams(BaseModel):
    # Infinity and NaN (1e999 reads as infinity) are no sampling parameter.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_new_tokens: int = 128
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = Field(1, ge=1, le=64)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    min_new_tokens: int = Field(0, ge=0)
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    # accepted at their neutral values only (see unsupported())
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[str, float] | None = None
    custom_params: dict[str, Any] | None = None

    @field_validator("max_new_tokens")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("must be a positive number of tokens")
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError("must be -1 (off) or a positive number")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    def unsupported(self) -> list[str]:
        bad = []
        if self.frequency_penalty != 0.0:
            bad.append("frequency_penalty")
        if self.presence_penalty != 0.0:
            bad.append("presence_penalty")
        if self.repetition_penalty != 1.0:
            bad.append("repetition_penalty")
        if self.logit_bias:
            bad.append("logit_bias")
        if self.custom_params is not None:
            bad.append("custom_params")
        if not self.spaces_between_special_tokens:
            bad.append("spaces_between_special_tokens=false")
        return bad


class GenerateRequest(BaseModel):
    model_config = _STRICT

    # single or batch (a list); normalised by areal.plugins.inference.embedded.requests
    text: str | list[str] | None = None
    input_ids: list[Any] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] = -1  # checked per item in requests.expand_generate
    top_logprobs_num: int | list[int] = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None
    # accepted at their neutral values only
    lora_path: Any = None
    token_ids_logprob: Any = None
    return_hidden_states: bool = False
    return_routed_experts: bool = False
    image_data: Any = None
    custom_logit_processor: Any = None
    bootstrap_host: Any = None
    data_parallel_rank: int | None = None
    log_metrics: bool = True

    def unsupported(self) -> list[str]:
        names = [
            "lora_path",
            "token_ids_logprob",
            "image_data",
            "custom_logit_processor",
            "bootstrap_host",
        ]
        bad = [n for n in names if getattr(self, n) is not None]
        bad += [n for n in ("return_hidden_states", "return_routed_experts") if getattr(self, n)]
        return bad


class UpdateWeightsFromDiskRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # SGLang keeps adding tuning knobs here

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class PauseRequest(BaseModel):
    model_config = _STRICT

    mode: Literal["abort", "retract", "in_place"] = "abort"


class AbortRequest(BaseModel):
    model_config = _STRICT

    rid: str = ""
    abort_all: bool = False
    abort_message: str | None = None


class UpdateWeightVersionRequest(BaseModel):
    model_config = _STRICT

    new_version: str
    abort_all_requests: bool = True


def describe_validation_error(err: ValidationError) -> str:
    """One readable line per problem: ``sampling_params.max_new_tokens: must be positive``."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


class InitWeightsUpdateGroupRequest(BaseModel):
    model_config = _STRICT

    master_address: str
    master_port: int = Field(gt=0, lt=65536)
    rank_offset: int
    world_size: int = Field(ge=2)
    group_name: str = "weight_update_group"
    backend: str = "gloo"


class UpdateWeightsFromDistributedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # as with disk updates, tolerate SGLang's newer knobs

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: Literal["flattened_bucket"] | None = None


class DestroyWeightsUpdateGroupRequest(BaseModel):
    model_config = _STRICT

    group_name: str = "weight_update_group"
