"""Property: no bad request ever gets a 5xx or a dropped connection from the embedded engine.

Hypothesis throws at least 1,000 generated bad requests at ``/generate`` and at least 1,000 more
at the rest of the engine's SGLang-style API (weight updates from disk and over a collective,
pause, continue, abort, the weight version, the cache flush, the info routes; the routes are read
from the app itself, so a new one cannot be forgotten) on one real embedded engine serving the
nano model. Every generated request starts from a valid one and carries at least one change that
the API forbids: malformed or non-object JSON, NaN and Infinity, an unknown field, a wrong type
or range, a token outside the vocabulary, a broken grammar, a checkpoint directory that is
missing, empty, truncated or corrupted, a wrong method or path. The answer must be a 4xx in the
engine's error shape (docs/inference.md, "Errors"), and the engine must serve afterwards. Valid
requests keep ``max_new_tokens`` at 1 and no generated request can start a weight transfer, pause
the engine or change its version, so one the engine wrongly accepts fails fast (as a 200)
instead of changing the server for the cases after it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError
from safetensors.torch import save_file

from areal.plugins.inference.embedded.schema import (
    AbortRequest,
    GenerateRequest,
    InitWeightsUpdateGroupRequest,
    SamplingParams,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    UpdateWeightVersionRequest,
)
from support import fuzz
from support.fuzz import (
    JUNK,
    MISSING,
    NON_FINITE,
    OVERFLOW,
    TEXT,
    BadRequest,
    encode,
)

EXAMPLES = 1000
SENT: Counter[str] = Counter()  # requests sent per property, to prove the count
BY_PATH: Counter[str] = Counter()  # and per route, to prove that each got its share
FUZZ = settings(settings.get_profile("areal-fuzz"), max_examples=EXAMPLES)
WEIGHT_ROUTES = {
    "/update_weights_from_disk",
    "/init_weights_update_group",
    "/update_weights_from_distributed",
}


# --- values --------------------------------------------------------------------------------------

VOCAB = 4096  # the nano model's (checked against /model_info's server in a fixture)


def refused(annotation: Any) -> st.SearchStrategy[Any]:
    """Junk of a type the field's annotation cannot take, even by pydantic's lax coercions
    ("yes" for true, "5" for 5), plus the non-finite numbers no field takes."""
    adapter = TypeAdapter(annotation)

    def bad(value: Any) -> bool:
        try:
            adapter.validate_python(value)
        except ValidationError:
            return True
        return False

    return st.one_of(JUNK.filter(bad), NON_FINITE)


def field_of(model: Any, name: str) -> st.SearchStrategy[Any]:
    return refused(model.model_fields[name].annotation)


def malformed(base: dict[str, Any]) -> st.SearchStrategy[tuple[str, bytes]]:
    """Bytes that are not one JSON object (never empty: an empty body is ``{}`` here), and
    Python's own non-JSON constants, which the engine's parser must refuse."""
    raw = encode(base)
    constants = st.sampled_from(["NaN", "Infinity", "-Infinity"]).map(
        lambda c: ("a non-JSON constant", raw[:-1] + f', "x_nan": {c}}}'.encode())
    )
    return fuzz.malformed(base, empty_is_object=True, extra=(constants,))


def bad_bodies(
    base: dict[str, Any],
    fields: dict[str, st.SearchStrategy[Any]],
    extra: list[st.SearchStrategy[tuple[str, dict[str, Any]]]] | None = None,
    unknown_keys: bool = True,
) -> st.SearchStrategy[tuple[str, bytes]]:
    """``base`` made bad: malformed bytes, one field set to a value the API refuses (or left
    out), an unknown key, or one of ``extra``'s whole-body mistakes."""
    known = set(base) | set(fields)
    kinds = ["malformed", "field", "field", "field"]
    if unknown_keys:
        kinds.append("unknown")
    if extra:
        kinds.append("extra")
    # The strategies are built once here: building them per example costs more than sending.
    kind_of = st.sampled_from(kinds)
    broken = malformed(base)
    keys = st.sampled_from(sorted(fields))
    mistakes = st.one_of(*extra) if extra else st.nothing()
    unknown = st.one_of(
        TEXT, st.sampled_from(["temperature", "max_tokens", "model", "lora"])
    ).filter(lambda k: k not in known)

    @st.composite
    def build(draw: st.DrawFn) -> tuple[str, bytes]:
        body = json.loads(json.dumps(base))
        kind = draw(kind_of)
        if kind == "malformed":
            return draw(broken)
        if kind == "unknown":
            key = draw(unknown)
            body[key] = draw(JUNK)
            return f"unknown field {key!r}", encode(body)
        if kind == "extra":
            why, changes = draw(mistakes)
            body.update(changes)
            return why, encode(body)
        key = draw(keys)
        value = draw(fields[key])
        if value is MISSING:
            body.pop(key, None)
            return f"{key} missing", encode(body)
        body[key] = value
        return f"bad {key}", encode(body)

    return build()


# --- /generate -----------------------------------------------------------------------------------

BAD_REGEX = st.one_of(
    st.sampled_from(["(unclosed", "[", "a{2,1}", "*a", "(?P<x", "\\"]),
    TEXT.map(lambda t: "(" + t),
)
BAD_SCHEMA = st.one_of(
    TEXT.filter(lambda t: not _is_json(t)).map(lambda t: "{" + t),
    st.sampled_from(['{"type": "nope"}', '{"type": 3}', '{"properties": 1, "type": "object"}']),
)
BAD_EBNF = st.one_of(
    st.sampled_from(["root ::=", "::= a", 'root ::= "a', "x ::= y"]),
    TEXT.map(lambda t: "root ::= (" + t),
)


def _is_json(text: str) -> bool:
    try:
        json.loads("{" + text)
    except ValueError:
        return False
    return True


def sampling_fields() -> dict[str, st.SearchStrategy[Any]]:
    """A wrong value for each sampling parameter: of a wrong type, or out of its range."""
    fields = {name: field_of(SamplingParams, name) for name in SamplingParams.model_fields}
    out_of_range: dict[str, st.SearchStrategy[Any]] = {
        "max_new_tokens": st.one_of(st.integers(max_value=0), st.integers(10**6, 10**30)),
        "temperature": st.one_of(st.floats(max_value=0, exclude_max=True), st.just(OVERFLOW)),
        "top_p": st.one_of(
            st.floats(max_value=0), st.floats(min_value=1, exclude_min=True, allow_infinity=False)
        ),
        "top_k": st.one_of(st.just(0), st.integers(max_value=-2)),
        "min_p": st.one_of(
            st.floats(max_value=0, exclude_max=True),
            st.floats(min_value=1, exclude_min=True, allow_infinity=False),
        ),
        "n": st.one_of(st.integers(max_value=0), st.integers(min_value=65)),
        "min_new_tokens": st.integers(max_value=-1),
        "sampling_seed": st.one_of(
            st.integers(min_value=2**64), st.integers(max_value=-(2**63) - 1)
        ),
        "stop": st.one_of(
            st.just(""), st.just([""]), st.lists(TEXT, min_size=1).map(lambda s: [*s, ""])
        ),
        "stop_token_ids": st.lists(
            st.one_of(st.integers(max_value=-1), st.integers(min_value=VOCAB)),
            min_size=1,
            max_size=3,
        ),
        "json_schema": BAD_SCHEMA,
        "regex": BAD_REGEX,
        "ebnf": BAD_EBNF,
        "frequency_penalty": st.floats(allow_nan=False, allow_infinity=False).filter(bool),
        "presence_penalty": st.floats(allow_nan=False, allow_infinity=False).filter(bool),
        "repetition_penalty": st.floats(allow_nan=False, allow_infinity=False).filter(
            lambda f: f != 1.0
        ),
        "logit_bias": st.dictionaries(TEXT, st.floats(-5, 5), min_size=1, max_size=2),
        "structural_tag": TEXT,
        "custom_params": st.dictionaries(TEXT, JUNK, max_size=2),
        "spaces_between_special_tokens": st.just(False),
    }
    return {name: fields[name] | out_of_range.get(name, st.nothing()) for name in fields}


def generate_requests() -> st.SearchStrategy[BadRequest]:
    # min_new_tokens with a stop token outside the vocabulary was an IndexError in the step
    base = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "min_new_tokens": 1}}
    text_base = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    per_param = sampling_fields()
    fields = {name: field_of(GenerateRequest, name) for name in GenerateRequest.model_fields}
    token = st.one_of(st.integers(max_value=-1), st.integers(min_value=VOCAB))
    fields |= {
        "input_ids": fields["input_ids"]
        | st.one_of(
            st.just([]),
            st.just([[]]),
            st.just([[1], []]),
            st.lists(token, min_size=1, max_size=3),
            st.lists(junk_except_int(), min_size=1, max_size=3),
            st.just([[1, 2], 3]),
            st.just([1, [2]]),
            st.just([True, False]),
            st.just([1.0, 2.0]),
            st.integers(5000, 6000).map(lambda n: [1] * n),  # longer than the context
        ),
        "sampling_params": fields["sampling_params"]
        | st.lists(st.just({"max_new_tokens": 1}), min_size=2, max_size=3),
        "return_logprob": fields["return_logprob"] | st.just([True, True]),
        "logprob_start_len": fields["logprob_start_len"]
        | st.integers(max_value=-2)
        | st.just([0, 0]),
        "top_logprobs_num": fields["top_logprobs_num"]
        | st.integers(min_value=VOCAB + 1)
        | st.integers(max_value=-1)
        | st.just([1, 1]),
        "rid": fields["rid"] | st.just(["a", "b"]),
        "lora_path": JUNK.filter(lambda v: v is not None),
        "token_ids_logprob": JUNK.filter(lambda v: v is not None),
        "image_data": JUNK.filter(lambda v: v is not None),
        "custom_logit_processor": JUNK.filter(lambda v: v is not None),
        "bootstrap_host": JUNK.filter(lambda v: v is not None),
        "return_hidden_states": st.just(True),
        "return_routed_experts": st.just(True),
    }
    fields.pop("text")  # with input_ids: both or neither, in ``extra`` below
    batch = {"input_ids": [[1, 2], [3]], "sampling_params": {"max_new_tokens": 1}}
    extra = [
        st.builds(
            lambda t: ("both text and input_ids", {"text": t}), st.one_of(TEXT, st.lists(TEXT))
        ),
        st.just(("neither text nor input_ids", {"input_ids": None})),
        one_param(
            per_param,
            lambda name, value: (
                f"bad sampling_params.{name}",
                {"sampling_params": {"max_new_tokens": 1, name: value}},
            ),
        ),
        one_param(
            per_param,
            lambda name, value: (
                f"bad sampling_params.{name} in a batch",
                {**batch, "sampling_params": [{"max_new_tokens": 1}, {name: value}]},
            ),
        ),
        one_param(
            {
                "rid": st.sampled_from(["one", ["a"], ["a", "b", "c"]]),
                "return_logprob": st.just([True]),
                "top_logprobs_num": st.just([1, 2, 3]),
            },
            lambda key, value: (f"batch with a bad {key}", {**batch, key: value}),
        ),
        st.builds(
            lambda param: ("two grammars", {"sampling_params": {"max_new_tokens": 1, **param}}),
            st.sampled_from(
                [
                    {"regex": "a", "ebnf": 'root ::= "a"'},
                    {"json_schema": "{}", "regex": "a"},
                    {"json_schema": "{}", "ebnf": 'root ::= "a"'},
                ]
            ),
        ),
    ]
    by_ids = bad_bodies(base, fields, extra)
    by_text = bad_bodies(
        text_base,
        {
            "text": st.one_of(
                refused(str | list[str]),
                st.just(""),
                st.just([]),
                st.just([""]),
                st.just(["a", ""]),
                st.integers(9000, 12000).map(lambda n: "hello " * n),  # longer than the context
            )
        },
        unknown_keys=False,
    )
    methods = st.sampled_from(["POST", "POST", "POST", "PUT"])
    bodies = st.one_of(by_ids, by_ids, by_ids, by_text)
    return st.builds(lambda wb, m: BadRequest(wb[0], "/generate", wb[1], m), bodies, methods)


def one_param(
    values: dict[str, st.SearchStrategy[Any]], make: Callable[[str, Any], tuple[str, Any]]
) -> st.SearchStrategy[tuple[str, Any]]:
    """``make(name, value)`` for one name of ``values`` and a value from its strategy."""
    names = st.sampled_from(sorted(values))

    @st.composite
    def build(draw: st.DrawFn) -> tuple[str, Any]:
        name = draw(names)
        return make(name, draw(values[name]))

    return build()


def junk_except_int() -> st.SearchStrategy[Any]:
    return JUNK.filter(lambda v: isinstance(v, bool) or not isinstance(v, int))


# --- the other routes ----------------------------------------------------------------------------


def bad_checkpoints(root: Path) -> list[tuple[str, str]]:
    """Directories /update_weights_from_disk must refuse: (what is wrong, path)."""
    cases: list[tuple[str, str]] = [("missing", str(root / "missing" / "model"))]
    (root / "a-file").write_text("not a directory")
    cases.append(("a file, not a directory", str(root / "a-file")))

    def make(name: str, files: dict[str, bytes | dict[str, torch.Tensor]]) -> None:
        path = root / name
        path.mkdir()
        for file, content in files.items():
            if isinstance(content, bytes):
                (path / file).write_bytes(content)
            else:
                save_file(content, str(path / file))
        cases.append((name, str(path)))

    make("empty", {})
    make("garbage safetensors", {"model.safetensors": b"garbage" * 10})
    make("header too large", {"model.safetensors": (10**9).to_bytes(8, "little") + b"{}"})
    make("unknown tensors", {"model.safetensors": {"foo.weight": torch.zeros(2)}})
    make("wrong shape", {"model.safetensors": {"model.embed_tokens.weight": torch.zeros(3)}})
    make("expert gap", {"model.safetensors": {"a.mlp.experts.1.up_proj.weight": torch.zeros(2)}})
    make("index not JSON", {"model.safetensors.index.json": b"{"})
    make("index without weight_map", {"model.safetensors.index.json": b"{}"})
    make("index weight_map a list", {"model.safetensors.index.json": b'{"weight_map": [1]}'})
    make("index weight_map numbers", {"model.safetensors.index.json": b'{"weight_map": {"a": 1}}'})
    make(
        "index names a missing file",
        {"model.safetensors.index.json": b'{"weight_map": {"a": "nope.safetensors"}}'},
    )
    save_file({"model.embed_tokens.weight": torch.zeros(64, 8)}, str(root / "whole.safetensors"))
    whole = (root / "whole.safetensors").read_bytes()
    for cut in (4, 8, 20, len(whole) // 2, len(whole) - 1):
        make(f"truncated at {cut} bytes", {"model.safetensors": whole[:cut]})
    return cases


def control_requests(
    checkpoints: list[tuple[str, str]],
) -> dict[str, st.SearchStrategy[BadRequest]]:
    """Bad requests for every route but /generate, by path."""
    bool_ = refused(bool)
    str_ = refused(str)
    disk_base = {"model_path": checkpoints[0][1]}
    disk = bad_bodies(
        disk_base,
        {
            "model_path": st.one_of(
                field_of(UpdateWeightsFromDiskRequest, "model_path"),
                st.just(MISSING),
                st.sampled_from([path for _, path in checkpoints]),
                TEXT.map(lambda t: str(Path(checkpoints[0][1]).parent / "nope" / quote(t))),
            ),
            "abort_all_requests": bool_,
            "flush_cache": bool_,
            "weight_version": field_of(UpdateWeightsFromDiskRequest, "weight_version"),
            "load_format": field_of(UpdateWeightsFromDiskRequest, "load_format"),
        },
        unknown_keys=False,  # SGLang keeps adding knobs here: unknown keys are ignored
    )
    # Never a valid group: joining one would wait for a trainer's store for two minutes.
    group_base = {
        "master_address": "127.0.0.1",
        "master_port": 29500,
        "rank_offset": 1,
        "world_size": 2,
        "backend": "nccl",
    }
    group = bad_bodies(
        {**group_base, "backend": "gloo"},
        {
            "backend": st.one_of(str_, TEXT.filter(lambda b: b != "gloo")),
            "master_address": st.one_of(str_, st.just(MISSING)),
            "master_port": st.one_of(
                field_of(InitWeightsUpdateGroupRequest, "master_port"),
                st.integers(max_value=0),
                st.integers(min_value=65536),
                st.just(MISSING),
            ),
            "rank_offset": st.one_of(
                field_of(InitWeightsUpdateGroupRequest, "rank_offset"),
                st.integers(max_value=0),
                st.integers(min_value=2),
                st.just(MISSING),
            ),
            "world_size": st.one_of(
                field_of(InitWeightsUpdateGroupRequest, "world_size"),
                st.integers(max_value=1),
                st.just(MISSING),
            ),
            "group_name": str_,
        },
    )
    distributed = bad_bodies(
        {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[8]]},
        {
            "names": st.one_of(
                field_of(UpdateWeightsFromDistributedRequest, "names"), st.just(MISSING)
            ),
            "dtypes": st.one_of(
                field_of(UpdateWeightsFromDistributedRequest, "dtypes"),
                st.just(MISSING),
                st.lists(TEXT, max_size=2),  # and no group was ever joined
            ),
            "shapes": st.one_of(
                field_of(UpdateWeightsFromDistributedRequest, "shapes"), st.just(MISSING)
            ),
            "group_name": st.one_of(str_, TEXT),
            "load_format": st.one_of(
                field_of(UpdateWeightsFromDistributedRequest, "load_format"),
                TEXT.filter(lambda f: f != "flattened_bucket"),
            ),
            "flush_cache": bool_,
            "abort_all_requests": bool_,
            "weight_version": field_of(UpdateWeightsFromDistributedRequest, "weight_version"),
        },
        unknown_keys=False,
    )
    destroy = bad_bodies(
        {"group_name": "weight_update_group"}, {"group_name": st.one_of(str_, TEXT)}
    )
    modes = {"abort", "retract", "in_place"}
    pause = bad_bodies(
        {"mode": "abort"},
        {"mode": st.one_of(str_, TEXT.filter(lambda m: m not in modes), st.just("ABORT"))},
    )
    abort = bad_bodies(
        {"rid": "", "abort_all": False},
        {
            "rid": st.one_of(field_of(AbortRequest, "rid"), st.just("")),
            "abort_all": st.one_of(bool_, st.just(False)),
            "abort_message": field_of(AbortRequest, "abort_message"),
        },
    )
    version = bad_bodies(
        {"abort_all_requests": False},
        {
            "new_version": st.one_of(field_of(UpdateWeightVersionRequest, "new_version")),
            "abort_all_requests": bool_,
        },
    )
    cont = malformed({"torch_empty_cache": True})  # any JSON object is fine here

    def posts(path: str, bodies: st.SearchStrategy[tuple[str, bytes]]) -> st.SearchStrategy[Any]:
        return bodies.map(lambda wb: BadRequest(wb[0], path, wb[1]))

    return {
        "/update_weights_from_disk": posts("/update_weights_from_disk", disk),
        "/init_weights_update_group": posts("/init_weights_update_group", group),
        "/update_weights_from_distributed": posts("/update_weights_from_distributed", distributed),
        "/destroy_weights_update_group": posts("/destroy_weights_update_group", destroy),
        "/pause_generation": posts("/pause_generation", pause),
        "/continue_generation": posts("/continue_generation", cont),
        "/abort_request": posts("/abort_request", abort),
        "/update_weight_version": posts("/update_weight_version", version),
    }


METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]


def wrong_methods(routes: dict[str, set[str]]) -> st.SearchStrategy[BadRequest]:
    """A method a route does not take (405), on every route."""
    wrong = {path: [m for m in METHODS if m not in taken] for path, taken in routes.items()}
    bodies = st.one_of(st.none(), JUNK.map(encode))

    @st.composite
    def build(draw: st.DrawFn) -> BadRequest:
        path = draw(st.sampled_from(sorted(wrong)))
        method = draw(st.sampled_from(wrong[path]))
        return BadRequest(f"method {method}", path, draw(bodies), method)

    return build()


def unknown_paths(routes: dict[str, set[str]]) -> st.SearchStrategy[BadRequest]:
    """A path the engine does not serve (404), under any method."""
    near = [p + suffix for p in routes for suffix in ("/", "/x", "_")]
    paths = st.one_of(
        st.sampled_from([*near, "/v1/chat/completions", "/", "/generate/stream", "/GENERATE"]),
        st.text(min_size=1, max_size=20).map(lambda t: "/nope-" + quote(t, safe="")),
    )
    return st.builds(
        lambda p, m: BadRequest("unknown path", p, b"{}", m), paths, st.sampled_from(METHODS)
    )


# --- the property --------------------------------------------------------------------------------


def served_routes(server: Any) -> dict[str, set[str]]:
    """path -> methods, read from the engine's app (HEAD is aiohttp's own, for every GET)."""
    routes: dict[str, set[str]] = {}
    for route in server.server.app().router.routes():
        if route.method != "HEAD":
            routes.setdefault(route.resource.canonical, set()).add(route.method)
    return routes


def check_refusal(status: int, body: Any, req: BadRequest) -> None:
    """A 4xx in the engine's error shape (docs/inference.md, "Errors"), exactly; a weight update
    that failed also carries SGLang's ``success: false`` fields."""
    assert 400 <= status < 500, f"{status} for {req}: {body!r}"[:800]
    assert isinstance(body, dict), f"not a JSON object for {req}: {body!r}"[:800]
    keys = {"error"}
    if req.path in WEIGHT_ROUTES and "success" in body:
        keys |= {"success", "message", "num_paused_requests"}
        assert body["success"] is False and body["num_paused_requests"] == 0, body
        assert body["message"] == body["error"]["message"], body
    assert set(body) == keys, f"not the engine's error shape for {req}: {body!r}"[:800]
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "code", "retryable"}, body
    assert error["type"] == "invalid_request_error" and error["code"] == status, body
    assert error["retryable"] is False, body
    assert isinstance(error["message"], str) and error["message"].strip(), body


def send(server: Any, req: BadRequest, prop: str) -> None:
    SENT[prop] += 1
    BY_PATH[req.path] += 1
    headers = {"Content-Type": "application/json"} if req.body is not None else {}
    resp = server.http.request(req.method, req.path, content=req.body, headers=headers)
    try:
        body = resp.json()
    except ValueError:
        pytest.fail(f"{resp.status_code} without a JSON body for {req}: {resp.text[:300]}")
    check_refusal(resp.status_code, body, req)


def run_property(server: Any, prop: str, strategy: st.SearchStrategy[BadRequest]) -> None:
    before = SENT[prop]

    @FUZZ
    @given(strategy)
    def check(req: BadRequest) -> None:
        send(server, req, prop)

    check()
    assert SENT[prop] - before >= EXAMPLES


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    return bad_checkpoints(tmp_path_factory.mktemp("bad-checkpoints"))


def test_the_nano_model_has_the_vocabulary_the_strategies_assume(server: Any) -> None:
    assert server.server.vocab_size == VOCAB


def test_generate_bad_requests(server: Any) -> None:
    run_property(server, "generate", generate_requests())


def test_every_other_route_bad_requests(server: Any, checkpoints: list[tuple[str, str]]) -> None:
    routes = served_routes(server)
    bodies = control_requests(checkpoints)
    body_routes = {p for p, methods in routes.items() if methods & {"POST", "PUT"}}
    # the routes that take a body have bad bodies; flush_cache reads none, generate has its own
    assert body_routes - {"/generate", "/flush_cache"} == set(bodies), "a route without a fuzzer"
    for path, taken in sorted(routes.items()):  # every route: each method it does not take
        for method in METHODS:
            if method not in taken:
                send(server, BadRequest(f"method {method}", path, None, method), "methods")
    for why, path in checkpoints:  # every bad checkpoint, whatever the draws below pick
        body = encode({"model_path": path, "abort_all_requests": True})
        send(server, BadRequest(why, "/update_weights_from_disk", body), "checkpoints")
    methods = wrong_methods(routes)
    before = BY_PATH.copy()
    run_property(server, "control", st.one_of(*bodies.values(), methods, unknown_paths(routes)))
    for path in bodies:  # each got its share of bad bodies
        assert BY_PATH[path] - before[path] >= 40, (path, BY_PATH[path] - before[path])


def test_the_engine_serves_afterwards(server: Any) -> None:
    assert server.http.get("/health").status_code == 200
    info = server.http.get("/server_info").json()
    assert info["weight_version"] == "0" and info["paused"] is False and info["running"] == 0
    out = server.generate(
        input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 3, "ignore_eos": True}
    )
    assert len(out["output_ids"]) == 3 and out["meta_info"]["finish_reason"]["type"] == "length"
    assert server.http.post("/flush_cache").status_code == 200


# What the fuzzer found, kept as plain cases: each was a 500, an aborted batch or a dead engine.
FOUND = [
    ("invalid UTF-8", b'{"input_ids": [1], "x": "\xff"}'),
    ("nested too deep", b'{"input_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ("NaN", b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}'),
    ("1e999", b'{"input_ids": [1], "sampling_params": {"temperature": 1e999}}'),
    (
        "top_logprobs_num beyond the vocabulary (the step's topk failed)",
        encode({"input_ids": [1], "return_logprob": True, "top_logprobs_num": 10**6}),
    ),
    (
        "stop token outside the vocabulary (the step's masking failed)",
        encode(
            {"input_ids": [1], "sampling_params": {"stop_token_ids": [10**6], "min_new_tokens": 1}}
        ),
    ),
    (
        "sampling_seed torch cannot take (it killed the engine's thread)",
        encode({"input_ids": [1], "sampling_params": {"sampling_seed": 2**64}}),
    ),
]


@pytest.mark.parametrize(("why", "body"), FOUND, ids=[f[0] for f in FOUND])
def test_what_the_fuzzer_found_is_a_400(server: Any, why: str, body: bytes) -> None:
    send(server, BadRequest(why, "/generate", body), "found")
    assert server.server.engine.alive


def test_a_request_that_fails_on_the_engine_thread_ends_alone(server: Any) -> None:
    """A request the HTTP layer let through that then fails while the engine queues it ends as
    an abort with status 500; the engine's loop keeps serving the others."""
    import queue

    from areal.plugins.inference.embedded.requests import SequenceRequest

    params = SamplingParams.model_construct(
        **{**SamplingParams().model_dump(), "sampling_seed": 2**64}
    )
    done: queue.Queue[dict[str, Any]] = queue.Queue()
    req = SequenceRequest(rid="doomed", input_ids=[1, 2], params=params)
    server.server.engine.submit(req, lambda payload, final: final and done.put(payload))
    finish = done.get(timeout=30)["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and finish["status_code"] == 500
    assert server.server.engine.alive
    assert server.generate(input_ids=[1], sampling_params={"max_new_tokens": 1})["output_ids"]
