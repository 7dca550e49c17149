"""BFCL's multi-turn items as the ``bfcl_multi_turn`` agent reads them, from the installed
``bfcl-eval`` package: the user turns, the tool docs (in OpenAI's ``tools`` shape), the held-out
docs of the ``miss_func`` category, the initial tool state and the ground truth.

BFCL's own loader (``bfcl_eval.utils.load_dataset_entry``) takes a file lock under its project
root (next to site-packages unless ``BFCL_PROJECT_ROOT`` is set before its first import), and its
tool converter lives in a module that needs ``tree_sitter``; so the few lines of each that the
multi-turn categories use are mirrored here, and ``tests/plugins/test_bfcl_tasks.py`` compares
the items with BFCL's loader run in a process of its own.
"""

from __future__ import annotations

import copy
import functools
import json
import keyword
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CATEGORIES = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
# What BFCL appends to every function description it offers (multi-turn docs are Python).
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
# BFCL's user message for a turn that only brings the held-out functions (miss_func).
MORE_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"


class MalformedCall(ValueError):
    """A tool call the tools cannot run; its message is what the model is told."""


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


@functools.cache
def _function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    from bfcl_eval.constants.eval_config import MULTI_TURN_FUNC_DOC_PATH
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = MULTI_TURN_FUNC_DOC_PATH / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(_jsonl(path))


@functools.cache
def entries(category: str) -> dict[str, dict[str, Any]]:
    """The category's items by id, each with ``function`` (the docs offered from turn 0),
    ``missed_function`` (turn -> docs added then; empty outside miss_func) and ``ground_truth``
    (per turn, the calls BFCL's checker executes as the reference)."""
    from bfcl_eval.constants.category_mapping import VERSION_PREFIX
    from bfcl_eval.constants.eval_config import POSSIBLE_ANSWER_PATH, PROMPT_PATH

    name = f"{VERSION_PREFIX}_{category}.json"
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(POSSIBLE_ANSWER_PATH / name)}
    items = _jsonl(PROMPT_PATH / name)
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        item.update(_functions(item), ground_truth=answers[item["id"]])
        out[item["id"]] = item
    return out


def _functions(item: Mapping[str, Any]) -> dict[str, Any]:
    """BFCL's ``populate_test_cases_with_predefined_functions`` then its Python hint: the held-out
    docs leave the list before the hint is added, so they reach the model without it, as in BFCL."""
    functions = [copy.deepcopy(d) for c in item["involved_classes"] for d in _function_docs(c)]
    missed: dict[str, list[dict[str, Any]]] = {}
    for turn, names in item.get("missed_function", {}).items():
        missed[turn] = []
        for name in names:
            index = next(i for i, doc in enumerate(functions) if doc["name"] == name)
            missed[turn].append(functions.pop(index))
    for doc in functions:
        doc["description"] += PYTHON_HINT
    return {"function": functions, "missed_function": missed}


def entry(bfcl_id: str) -> dict[str, Any]:
    """One item by its BFCL id (``multi_turn_base_12``)."""
    category = bfcl_id.rsplit("_", 1)[0]
    if category not in CATEGORIES:
        raise KeyError(
            f"{bfcl_id!r} is not in a BFCL multi-turn category ({', '.join(CATEGORIES)})"
        )
    return entries(category)[bfcl_id]


# --- BFCL's function docs as OpenAI tools ---------------------------------------------------------


def openai_tools(
    functions: Sequence[Mapping[str, Any]], compact: bool = False
) -> list[dict[str, Any]]:
    """BFCL's ``convert_to_tool(functions, GORILLA_TO_OPENAPI, OPENAI_COMPLETIONS)``.

    ``compact`` drops every description and the ``response`` schemas: the names and argument types
    alone, so a small-context model sees all of an item's tools (areal's tiny model has 4,096
    positions; GorillaFileSystem's full docs are ~5,900 of its tokens, compact ~1,500).
    """
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    tools = []
    for doc in functions:
        item = copy.deepcopy(dict(doc))
        item["parameters"]["type"] = "object"
        item["parameters"]["properties"] = _cast(
            item["parameters"]["properties"], GORILLA_TO_OPENAPI
        )
        if compact:
            item.pop("description", None)
            item.pop("response", None)
            _strip_descriptions(item["parameters"])
        tools.append({"type": "function", "function": item})
    return tools


def _cast(properties: dict[str, Any], mapping: Mapping[str, str]) -> dict[str, Any]:
    """BFCL's ``_cast_to_openai_type``: Python type names to JSON schema types, recursively."""
    for value in properties.values():
        kind = value.get("type")
        if kind == "float":
            value["format"] = "float"
            value["description"] = value.get("description", "") + " This is a float type value."
        value["type"] = mapping.get(kind, "string") if kind is not None else "string"
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _cast(value["properties"], mapping)
            elif "items" in value:
                items = value["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast(items["properties"], mapping)
    return properties


def _strip_descriptions(schema: dict[str, Any]) -> None:
    schema.pop("description", None)
    for value in schema.get("properties", {}).values():
        _strip_descriptions(value)
    if isinstance(schema.get("items"), dict):
        _strip_descriptions(schema["items"])


# --- the model's calls as BFCL executes them ------------------------------------------------------


def call_string(name: str, arguments: str, allowed: Sequence[str]) -> str:
    """A tool call as the Python call BFCL's executor evaluates (``convert_to_function_call``:
    ``name(k=repr(v),...)``), or :class:`MalformedCall`.

    Only an offered function's name and identifier keys with JSON values pass, so the string is
    a call of one of the item's tools with literal arguments and never other code.
    """
    if name not in allowed:
        raise MalformedCall(f"Error: there is no function named {name!r}.")
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as err:
        raise MalformedCall(
            f"Error: the arguments of {name} are not valid JSON ({err.msg})."
        ) from None
    if not isinstance(args, dict):
        raise MalformedCall(f"Error: the arguments of {name} must be a JSON object.")
    for key in args:
        if not key.isidentifier() or keyword.iskeyword(key):
            raise MalformedCall(f"Error: {key!r} is not a parameter name of {name}.")
    return f"{name}({','.join(f'{k}={v!r}' for k, v in args.items())})"
