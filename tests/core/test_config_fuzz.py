"""Property: a bad config file is one line naming the key and the fix, never a traceback.

Hypothesis writes at least 1,000 mutated run configs (``areal train``'s YAML) and 1,000 mutated
router configs (``api_gateway`` + ``model_routing``), each from a valid file holding every key of
its schema (the keys are read from the pydantic models, so a new one is fuzzed too): a value of
a wrong type or out of range, an unknown or misplaced key, a required key left out, a section
that is not a mapping (or a value that is one), an unset ``${VAR}``, an unknown plugin name,
broken YAML, garbage bytes, a document that is not a mapping. Loading must raise
:class:`~areal.core.config.ConfigError` (or its subclass) and nothing else, with a message of one
line that starts with the file and names the key by its dotted path. A sample also goes through
``areal config validate FILE`` in-process: exit code 1 and one ``error:`` line, never a
traceback or the "run with --debug" hint of an unexpected error.
"""

from __future__ import annotations

import copy
import os
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import annotated_types
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError
from typer.testing import CliRunner

from areal.cli.main import main, make_app
from areal.core.config import ConfigError
from areal.core.run_config import NAME_KEYS, RunConfig, known_names, load_run_config
from areal.gateway.router_config import ModelRoute, ModelRouting, RouterConfig

EXAMPLES = 1000
CLI_EXAMPLES = 150
SENT: Counter[str] = Counter()  # files loaded per property, to prove the count
FUZZ = settings(settings.get_profile("areal-fuzz"), max_examples=EXAMPLES)
UNSET = "AREAL_FUZZ_UNSET_VARIABLE"

# --- the schemas, read from the models ----------------------------------------------------------


def fields_of(model: type[BaseModel]) -> dict[str, Any]:
    return {(f.alias or name): f for name, f in model.model_fields.items()}


def section_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (``X`` or ``X | None``), else ``None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        found = [section_of(a) for a in get_args(annotation) if a is not type(None)]
        return found[0] if len(found) == 1 else None
    return None


@dataclass(frozen=True)
class Leaf:
    path: tuple[str, ...]
    adapter: TypeAdapter[Any]  # the field's type with its constraints (ge, gt, ...)
    bounds: tuple[Any, ...]  # annotated_types bounds, for values just outside them
    takes_str: bool
    takes_dict: bool


@dataclass(frozen=True)
class Section:
    path: tuple[str, ...]
    model: type[BaseModel]
    strict: bool  # unknown keys are refused (extra="forbid")


def schema_of(model: type[BaseModel], data: dict[str, Any]) -> tuple[list[Leaf], list[Section]]:
    """Every leaf and section of ``data`` (a full valid file) with its field's type."""
    leaves: list[Leaf] = []
    sections: list[Section] = []

    def walk(model: type[BaseModel], node: dict[str, Any], path: tuple[str, ...]) -> None:
        strict = model.model_config.get("extra") == "forbid"
        sections.append(Section(path, model, strict))
        known = fields_of(model)
        for key, value in node.items():
            field = known.get(key)
            if field is None and model is ModelRouting:  # its extra keys are routes too
                walk(ModelRoute, value, (*path, key))
                continue
            sub = section_of(field.annotation)
            if sub is not None and isinstance(value, dict):
                walk(sub, value, (*path, key))
                continue
            full = (
                Annotated[(field.annotation, *field.metadata)]
                if field.metadata
                else field.annotation
            )
            leaves.append(
                Leaf(
                    (*path, key),
                    TypeAdapter(full),
                    tuple(field.metadata),
                    accepts(field.annotation, "x"),
                    accepts(field.annotation, {}),
                )
            )

    walk(model, data, ())
    return leaves, sections


def accepts(annotation: Any, value: Any) -> bool:
    try:
        TypeAdapter(annotation).validate_python(value)
    except ValidationError:
        return False
    return True


RUN_BASE: dict[str, Any] = RunConfig.model_validate(
    {"model": {"path": "runs/fuzz/model", "init_tiny": "nano"}, "dataset": {"name": "calculator"}}
).model_dump(mode="json", by_alias=True)
ROUTER_BASE: dict[str, Any] = {
    "api_gateway": {
        "base_url": "https://upstream.example/api",
        "api_key": "sk-fuzz",
        "api_key_env": "AREAL_FUZZ_KEY",
        "timeout": 60.0,
        "max_retries": 3,
        "retry_backoff": 0.5,
        "retry_backoff_max": 8.0,
        "allow_unlisted_models": False,
    },
    "model_routing": {
        "policy_model": {
            "model_id": "policy",
            "temperature": 1.0,
            "top_p": 1.0,
            "max_tokens": 256,
            "override_client_sampling": False,
            "tool_parser": "hermes",
        },
        **{
            role: {
                "model_id": role.removesuffix("_model"),
                "temperature": 0.0,
                "top_p": 0.5,
                "max_tokens": 16,
                "override_client_sampling": True,
                "tool_parser": None,
            }
            for role in ("reward_model", "judge_model", "critic_model")
        },
    },
}
RUN_LEAVES, RUN_SECTIONS = schema_of(RunConfig, RUN_BASE)
ROUTER_LEAVES, ROUTER_SECTIONS = schema_of(RouterConfig, ROUTER_BASE)
# Required keys a file may leave out, and the key the message must name then.
RUN_REQUIRED = {("model",): "model", ("dataset",): "dataset", ("model", "path"): "model.path"}
RUN_REQUIRED |= {("dataset", "name"): "dataset"}  # neither path nor name: dataset says so
ROUTER_REQUIRED = {
    ("api_gateway", "base_url"): "api_gateway.base_url",
    ("model_routing", "policy_model", "model_id"): "model_routing.policy_model.model_id",
    ("model_routing", "critic_model", "model_id"): "model_routing.critic_model.model_id",
}

# --- values --------------------------------------------------------------------------------------

TEXT = st.text(max_size=12)
LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),  # nan and inf too: YAML has .nan and .inf
    TEXT,
)
JUNK = st.recursive(
    LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


def round_trip(value: Any) -> Any:
    """What a value reads back as from the YAML file it is written to."""
    return yaml.load(dump(value), Loader=yaml.CSafeLoader)


def refused_by(leaf: Leaf, value: Any) -> bool:
    try:
        leaf.adapter.validate_python(round_trip(value))
    except ValidationError:
        return True
    return False


def outside(bounds: tuple[Any, ...]) -> list[Any]:
    """Numbers just outside each bound: -1 for ge=0, 0 for gt=0, 1.5 for le=1..."""
    values: list[Any] = []
    for bound in bounds:
        if isinstance(bound, annotated_types.Ge):
            values += [bound.ge - 1, bound.ge - 0.5]
        elif isinstance(bound, annotated_types.Gt):
            values += [bound.gt, bound.gt - 1]
        elif isinstance(bound, annotated_types.Le):
            values += [bound.le + 1, bound.le + 0.5]
        elif isinstance(bound, annotated_types.Lt):
            values += [bound.lt, bound.lt + 1]
    return values


def dotted(path: tuple[str, ...]) -> str:
    """A key as messages name it: dotted, a part that would not print as itself as its repr."""
    return ".".join(p if p.isprintable() else repr(p) for p in path)


def get(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


# --- mutations -----------------------------------------------------------------------------------


@dataclass
class Case:
    """A file's bytes, what is wrong with it, and what its error must say."""

    why: str
    raw: bytes
    key: str | None = None  # the dotted key the message must name
    hint: str | None = None  # and a word of the fix
    may_load: bool = False  # a mutation that can leave a valid file (a cut at a line end)

    def __repr__(self) -> str:
        shown = self.raw[:400] + (b"..." if len(self.raw) > 400 else b"")
        return f"<{self.why}: {shown!r}>"


def dump(data: Any) -> bytes:
    # libyaml's dumper: the files are written fast; areal reads them with its own loader
    return yaml.dump(data, Dumper=yaml.CSafeDumper, allow_unicode=True, sort_keys=False).encode()


def mutations(
    base: dict[str, Any],
    leaves: list[Leaf],
    sections: list[Section],
    required: dict[tuple[str, ...], str],
    names: list[tuple[tuple[str, ...], list[str]]],
    empty_is_valid: bool,
) -> st.SearchStrategy[Case]:
    """``base`` made bad in one way. The strategies are built once, here."""
    leaf_of = st.sampled_from(leaves)
    strict = [s for s in sections if s.strict]
    section_of_ = st.sampled_from(strict)
    nested = [s for s in sections if s.path]
    str_leaves = [
        lf for lf in leaves if lf.takes_str and lf.path != ("api_gateway", "api_key")
    ]  # the upstream key may name an unset variable: that is a warning, not an error
    dict_free = [lf for lf in leaves if not lf.takes_dict]
    bounded = st.sampled_from([lf for lf in leaves if outside(lf.bounds)])
    kinds = [
        "wrong type",
        "wrong type",
        "wrong type",
        "out of range",
        "unknown key",
        "unknown key",
        "misplaced key",
        "missing key",
        "section not a mapping",
        "value a mapping",
        "unset variable",
        "unknown name",
        "broken YAML",
        "cut YAML",
        "garbage bytes",
        "not a mapping",
    ]
    if not names:
        kinds.remove("unknown name")
    kind_of = st.sampled_from(kinds)
    raw_base = dump(base)
    junk_key = TEXT.filter(lambda k: k not in ("<<", "=") and k.strip() == k and bool(k))

    @st.composite
    def build(draw: st.DrawFn) -> Case:
        data = copy.deepcopy(base)
        kind = draw(kind_of)
        if kind == "wrong type":
            leaf = draw(leaf_of)
            value = draw(JUNK.filter(lambda v, leaf=leaf: refused_by(leaf, v)))
            return set_at(data, leaf.path, value, f"{kind} at {dotted(leaf.path)}")
        if kind == "out of range":
            leaf = draw(bounded)
            value = draw(st.sampled_from(outside(leaf.bounds)))
            return set_at(data, leaf.path, value, f"{kind} at {dotted(leaf.path)}")
        if kind == "unknown key":
            section = draw(section_of_)
            known = set(fields_of(section.model)) | set(section.model.model_fields)
            key = draw(junk_key.filter(lambda k: k not in known))
            get(data, section.path)[key] = draw(JUNK)
            return Case(
                f"unknown key {key!r}", dump(data), dotted((*section.path, key)), "unknown key"
            )
        if kind == "misplaced key":
            leaf = draw(leaf_of)
            name = leaf.path[-1]
            homes = [
                s for s in strict if name not in fields_of(s.model) and s.path != leaf.path[:-1]
            ]
            section = draw(st.sampled_from(homes))
            get(data, section.path)[name] = get(data, leaf.path)
            return Case(
                f"{dotted(leaf.path)} under {dotted(section.path) or 'the top'}",
                dump(data),
                dotted((*section.path, name)),
                "unknown key",
            )
        if kind == "missing key":
            path = draw(st.sampled_from(sorted(required)))
            del get(data, path[:-1])[path[-1]]
            return Case(f"{dotted(path)} left out", dump(data), required[path], None)
        if kind == "section not a mapping":
            section = draw(st.sampled_from(nested))
            value = draw(JUNK.filter(lambda v: not isinstance(v, dict) and v is not None))
            return set_at(data, section.path, value, f"{dotted(section.path)} not a mapping")
        if kind == "value a mapping":
            leaf = draw(st.sampled_from(dict_free))
            value = draw(st.dictionaries(TEXT, JUNK, min_size=1, max_size=2))
            return set_at(data, leaf.path, value, f"a mapping at {dotted(leaf.path)}")
        if kind == "unset variable":
            leaf = draw(st.sampled_from(str_leaves))
            text = draw(TEXT).replace("$", "") + "${" + UNSET + "}"
            case = set_at(data, leaf.path, text, f"unset variable at {dotted(leaf.path)}")
            case.hint = f"export {UNSET}"
            return case
        if kind == "unknown name":
            path, known = draw(st.sampled_from(names))
            name = draw(TEXT.filter(lambda n: n not in known and "$" not in n))
            value: Any = (
                [name] if isinstance(get(data, path), list) or path[-1] == "metric_sinks" else name
            )
            return set_at(data, path, value, f"unknown name at {dotted(path)}", hint="known")
        if kind == "broken YAML":
            lines = raw_base.splitlines(keepends=True)
            at = draw(st.integers(0, len(lines) - 1))
            bad = draw(
                st.sampled_from(
                    [
                        b"\tkey: x\n",
                        b"a: [unclosed\n",
                        b"b: {c\n",
                        b"- x\n",
                        b"  : :\n",
                        b"k: 'open\n",
                        b"!!python/object:os.system x\n",
                        b"? [a]\n: b\n",
                        b"---\nother: 1\n",
                        b"x: *nowhere\n",
                    ]
                )
            )
            return Case("broken YAML", b"".join([*lines[:at], bad, *lines[at:]]))
        if kind == "cut YAML":
            cut = draw(st.integers(1, len(raw_base) - 1))
            return Case(f"cut at byte {cut}", raw_base[:cut], may_load=True)
        if kind == "garbage bytes":
            raw = draw(st.binary(min_size=1, max_size=200))
            if draw(st.booleans()):
                raw = raw_base[: draw(st.integers(0, len(raw_base)))] + raw
            return Case("garbage bytes", raw, may_load=True)
        value = draw(
            JUNK.filter(lambda v: not isinstance(v, dict) and (v is not None or not empty_is_valid))
        )
        if value is None:  # an empty file: a run config then lacks model and dataset
            return Case("an empty file", b"", "model and dataset", "missing")
        return Case("not a mapping", dump(value), None, "must hold a mapping")

    return build()


def set_at(
    data: dict[str, Any], path: tuple[str, ...], value: Any, why: str, hint: str | None = None
) -> Case:
    get(data, path[:-1])[path[-1]] = value
    return Case(why, dump(data), dotted(path), hint)


RUN_NAMES = [
    (tuple(k.key.split(".")), known_names(k.kind, prefix=k.prefix, modes=k.modes))
    for k in NAME_KEYS
]
RUN_CASES = mutations(RUN_BASE, RUN_LEAVES, RUN_SECTIONS, RUN_REQUIRED, RUN_NAMES, False)
ROUTER_CASES = mutations(ROUTER_BASE, ROUTER_LEAVES, ROUTER_SECTIONS, ROUTER_REQUIRED, [], True)

# --- the property --------------------------------------------------------------------------------


def check_load(path: Path, case: Case, load: Callable[[Path], Any], what: str) -> None:
    SENT[what] += 1
    path.write_bytes(case.raw)
    try:
        load(path)
    except ConfigError as err:
        message = str(err)
    except Exception as err:  # anything else reaches the user as a traceback
        pytest.fail(f"{type(err).__name__} for {case!r}: {err}")
    else:
        assert case.may_load, f"{case!r} loaded as a valid config"
        return
    assert len(message.splitlines()) == 1, f"more than one line for {case!r}: {message!r}"
    assert message.startswith(str(path)) and len(message) > len(str(path)) + 5, message
    if case.key is not None:
        assert case.key in message, f"the message does not name {case.key!r}: {message}"
    if case.hint is not None:
        assert case.hint in message, f"no {case.hint!r} in the message for {case!r}: {message}"


@pytest.fixture(autouse=True)
def _no_such_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(UNSET, raising=False)


def test_the_base_files_are_valid_and_hold_every_key(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_bytes(dump(RUN_BASE))
    (tmp_path / "router.yaml").write_bytes(dump(ROUTER_BASE))
    load_run_config(tmp_path / "run.yaml")
    RouterConfig.load(tmp_path / "router.yaml")
    for base, sections in ((RUN_BASE, RUN_SECTIONS), (ROUTER_BASE, ROUTER_SECTIONS)):
        for section in sections:  # every key of every section is in the base file: all fuzzed
            missing = set(fields_of(section.model)) - set(get(base, section.path))
            assert not missing, (section.path, missing)


def test_bad_run_configs_are_one_line_naming_the_key(tmp_path: Path) -> None:
    before = SENT["run"]

    @FUZZ
    @given(RUN_CASES)
    def prop(case: Case) -> None:
        check_load(tmp_path / "run.yaml", case, load_run_config, "run")

    prop()
    assert SENT["run"] - before >= EXAMPLES


def test_bad_router_configs_are_one_line_naming_the_key(tmp_path: Path) -> None:
    before = SENT["router"]

    @FUZZ
    @given(ROUTER_CASES)
    def prop(case: Case) -> None:
        check_load(tmp_path / "router.yaml", case, RouterConfig.load, "router")

    prop()
    assert SENT["router"] - before >= EXAMPLES


def test_areal_config_validate_says_one_line(tmp_path: Path) -> None:
    """The same files through the CLI (in-process): exit 1 and one ``error:`` line."""
    app = make_app()
    runner = CliRunner()
    path = tmp_path / "config.yaml"
    before = SENT["cli"]
    cases = st.one_of(RUN_CASES, ROUTER_CASES).filter(lambda c: not c.may_load)

    @settings(FUZZ, max_examples=CLI_EXAMPLES)
    @given(cases)
    def prop(case: Case) -> None:
        SENT["cli"] += 1
        path.write_bytes(case.raw)
        with runner.isolation() as (out, err, _):
            code = main(["config", "validate", str(path)], app=app)
            stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
        assert code == 1, f"exit {code} for {case!r}: {stdout}{stderr}"
        assert stdout == "", f"output on stdout for {case!r}: {stdout}"
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{case!r}: {stderr}"
        assert "--debug" not in stderr and "Traceback" not in stderr, f"{case!r}: {stderr}"

    prop()
    assert SENT["cli"] - before >= CLI_EXAMPLES
    assert not os.environ.get(UNSET)


# What the fuzzer found, kept as plain cases (each was a traceback or a message of many lines).
FOUND = [
    ("garbage bytes", b"\xff\xfe\x00garbage", "is not UTF-8 text (byte 0 is b'\\xff')"),
    ("nesting too deep", b"a: " + b"[" * 10_000 + b"]" * 10_000, "is nested too deeply"),
    (
        "broken YAML",
        b"model:\n  path: [unclosed\n",
        "is not valid YAML: line 3, column 1: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence); fix the YAML there",
    ),
    ("a tab", b"model:\n\tpath: x\n", "line 2, column 1: found character '\\t'"),
    (
        "a list",
        b"- a\n- b\n",
        "must hold a mapping at the top level (key: value lines), not a list",
    ),
    ("two documents", b"a: 1\n---\nb: 2\n", "expected a single document"),
    ("a key with a line break", b'model:\n  "pa\\nth": x\n', "model.'pa\\nth': unknown key"),
]


@pytest.mark.parametrize(("why", "raw", "needle"), FOUND, ids=[f[0] for f in FOUND])
@pytest.mark.parametrize("load", [load_run_config, RouterConfig.load], ids=["run", "router"])
def test_what_the_fuzzer_found_is_one_line(
    tmp_path: Path, load: Callable[[Path], Any], why: str, raw: bytes, needle: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(raw)
    with pytest.raises(ConfigError) as caught:
        load(path)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and message.startswith(str(path)), message
    if why != "a key with a line break" or load is load_run_config:
        assert needle in message, message
