"""The log-prob SGLang reports is the one the trainer recomputes, as far as areal's side decides it,
checked with SGLang's own code in the SGLang venv.

SGLang's sampler reports log softmax(z' / T) over the whole vocabulary (z' the logits after its
penalties, grammar mask and logit_bias) unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set, which
makes it report the T = 1 value. areal pins that flag off in every SGLang it starts and refuses to
start one where the user's environment turns it on; a top-k of 1 reaches SGLang as greedy
decoding, whose log-prob is the plain log-softmax the trainer recomputes for it. (The grammar mask
itself is GPU-only: bench/gpu/check_engines.sh.)
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from areal.core.plugins import registry
from areal.core.types import sampling_record, training_temperature
from areal.gateway.policy import PolicyService
from areal.gateway.router_config import ModelRoute
from areal.plugins.inference.sglang_backend import LOGPROB_ENV, original_logprob_set
from areal.run.processes import server_env

ENV_PROBE = Path(__file__).parents[2] / "in_sglang_venv" / "logprob_env.py"
NAME = "SGLANG_RETURN_ORIGINAL_LOGPROB"
VALUES = ["1", "true", "True", "yes", "on", "0", "false", "no", "", None]


@pytest.fixture(scope="module")
def sglang_reads(
    sglang_venv_python: Path, sglang_env: Callable[[], dict[str, str]]
) -> dict[str | None, dict[str, bool]]:
    """Each value of :data:`VALUES` (and the pinned one) as SGLang's own readers read it."""
    values = [*VALUES, LOGPROB_ENV[NAME]]
    result = subprocess.run(
        [str(sglang_venv_python), str(ENV_PROBE), json.dumps(values)],
        env=sglang_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    return dict(zip(values, answers, strict=True))


def test_every_sglang_areal_starts_reports_the_temperature_scaled_log_prob(
    sglang_reads: dict[str | None, dict[str, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(NAME, raising=False)
    backend = registry("inference_backends").get("sglang")
    assert server_env(dict(backend.env)) == LOGPROB_ENV  # what `areal train` gives the engine
    assert sglang_reads[LOGPROB_ENV[NAME]] == {"sampler": False, "envs": False}


@pytest.mark.parametrize("value", [v for v in VALUES if v is not None])
def test_a_user_setting_either_sglang_reader_takes_as_on_is_refused(
    value: str, sglang_reads: dict[str | None, dict[str, bool]]
) -> None:
    """areal's refusal agrees with SGLang's own readers, value by value (they differ on some:
    either one reading it as on changes what some SGLang path reports)."""
    read = sglang_reads[value]
    why = original_logprob_set({NAME: value})
    assert (why is not None) == (read["sampler"] or read["envs"]), (value, read, why)
    if why is not None:
        assert NAME in why and "unset it" in why
    assert original_logprob_set({}) is None and sglang_reads[None] == {
        "sampler": False,
        "envs": False,
    }


def test_top_k_one_reaches_sglang_as_greedy_decoding(
    sglang_probe: Callable[[dict[str, Any]], dict[str, Any]],
) -> None:
    """SGLang divides by the request's temperature unless the whole batch is greedy; the
    gateway sends top-k 1 as temperature 0, which SGLang turns into its greedy form (T = 1,
    top-k 1) in every batch, the temperature the trainer uses for it."""
    policy = PolicyService(["http://127.0.0.1:1"], ModelRoute(model_id="policy"))
    params = policy.sampling(3, max_tokens=4, temperature=0.7, extra={"top_k": 1})
    answer = sglang_probe({"sampling": [params]})["sampling"][0]
    assert answer["ok"], answer.get("error")
    assert answer["fields"]["temperature"] == 1.0 and answer["fields"]["top_k"] == 1
    assert training_temperature(sampling_record(params)) == 1.0
