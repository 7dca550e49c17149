"""Run inside the SGLang venv: checks what areal sends with SGLang's own parser and structs.

Reads one JSON job on stdin and prints one JSON answer, so a test pays SGLang's slow import once
for a whole batch. ``argvs``: command lines after ``-m sglang.launch_server``, parsed by
``prepare_server_args`` (argparse plus ``ServerArgs.__post_init__``); ``requests``: ``[class
name, body]`` pairs built as ``Class(**body)`` from ``sglang.srt.managers.io_struct``;
``sampling``: dicts built as ``SamplingParams(**params)``.

``io_struct`` imports torchvision through SGLang's multimodal configs, and no torchvision wheel
matches CPU torch, so the module's source is run statement by statement: an import that fails
binds its names to ``Any`` (annotations are strings there), everything else, the request classes
included, is SGLang's own code unchanged.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import dataclasses
import importlib.util
import io
import json
import sys
import types
from typing import Any


def parse(argv: list[str]) -> dict[str, Any]:
    from sglang.srt.server_args import prepare_server_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(argv)
    except SystemExit as exc:
        return {"ok": False, "exit_code": exc.code, "error": err.getvalue()[-2000:]}
    fields = {name: getattr(args, name) for name in type(args).__struct_fields__}
    return {"ok": True, "args": json.loads(json.dumps(fields, default=repr))}


_POSTPONED = __future__.annotations.compiler_flag


def io_struct() -> types.ModuleType:
    spec = importlib.util.find_spec("sglang.srt.managers.io_struct")
    assert spec is not None and spec.origin is not None
    with open(spec.origin, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    module = types.ModuleType("_sglang_io_struct")
    sys.modules[module.__name__] = module
    for node in tree.body:
        # The module starts with ``from __future__ import annotations``: keep them postponed.
        code = compile(ast.Module([node], []), spec.origin, "exec", flags=_POSTPONED)
        try:
            exec(code, module.__dict__)
        except ImportError:
            for alias in node.names:  # type: ignore[attr-defined]
                module.__dict__[(alias.asname or alias.name).split(".")[0]] = Any
        except Exception:  # a statement that needs what a failed import left as Any
            pass
    return module


def build(module: types.ModuleType, name: str, body: dict[str, Any]) -> dict[str, Any]:
    cls = getattr(module, name, None)
    if cls is None:
        return {"ok": False, "error": f"io_struct has no class {name}"}
    try:
        obj = cls(**body)
    except TypeError as exc:
        return {"ok": False, "error": f"TypeError: {exc}"}
    fields = getattr(cls, "__struct_fields__", None) or [f.name for f in dataclasses.fields(obj)]
    return {"ok": True, "fields": {k: getattr(obj, k) for k in fields if k in body}}


def sampling(params: dict[str, Any]) -> dict[str, Any]:
    from sglang.srt.sampling.sampling_params import SamplingParams

    try:
        obj = SamplingParams(**params)
        obj.verify(vocab_size=1 << 20)
    except (TypeError, ValueError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "fields": {k: getattr(obj, k) for k in params}}


def main() -> None:
    job = json.load(sys.stdin)
    out: dict[str, Any] = {"argvs": [parse(argv) for argv in job.get("argvs", [])]}
    if job.get("requests"):
        module = io_struct()
        out["requests"] = [build(module, name, body) for name, body in job["requests"]]
    out["sampling"] = [sampling(p) for p in job.get("sampling", [])]
    print("\n" + json.dumps(out, default=repr))


if __name__ == "__main__":
    main()
