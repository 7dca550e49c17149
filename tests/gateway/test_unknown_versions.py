"""An engine answer that does not say which weights sampled its tokens (an older SGLang's
non-streamed ``/generate``: one ``weight_version``, no ``weight_versions`` spans) is refused by the
gateway, never recorded with guessed versions."""

from __future__ import annotations

import pytest

from areal.core.inference_records import GenerateOutput
from areal.gateway.errors import GatewayError
from areal.gateway.policy import Generation


def test_an_answer_without_spans_is_a_502_naming_the_engine() -> None:
    old = GenerateOutput.from_json(
        {"output_ids": [5, 6], "meta_info": {"weight_version": "3", "finish_reason": "length"}}
    )
    with pytest.raises(GatewayError) as err:
        Generation.from_output(old, [1, 2], "http://127.0.0.1:30000")
    assert err.value.status == 502
    assert "http://127.0.0.1:30000" in err.value.message and "weight_versions" in err.value.message


def test_empty_spans_mean_no_change_and_are_recorded() -> None:
    meta = {"weight_version": "3", "weight_versions": [], "finish_reason": "length"}
    gen = Generation.from_output(
        GenerateOutput.from_json({"output_ids": [5, 6], "meta_info": meta}), [1, 2], "e"
    )
    assert gen.versions == [3, 3]
