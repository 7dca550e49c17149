"""Runs reference functions (AReaL's, verl's) in the reference venv, ``.venv/refs``.

Not a test module: ``tests/references/conftest.py`` runs it as
``.venv/refs/bin/python runner.py JOB OUT``. ``JOB`` is a ``torch.save`` of a list of calls::

    {"fn": "module:attr", "kwargs": {...}, "grad": ["logprobs"], "seed": 0}

A keyword value ``{"__build__": "module:Class", "kwargs": {...}}`` is built first (the packages'
own config classes). ``grad`` names tensor inputs to differentiate the call's scalar loss (the
first element of a tuple result) by. ``seed`` seeds torch's global generator just before the call.
``OUT`` gets a ``torch.save`` of one ``{"out": ..., "grads": {...}}`` per call, tensors detached,
dataclasses as dicts. Only the standard library, torch and the called packages are imported here:
our own ``areal`` package must not shadow the reference of the same name.
"""

import dataclasses
import importlib
import importlib.util
import sys
import types

import torch

# Packages whose ``__init__`` imports every trainer of AReaL with its logging and dataset
# backends (swanlab, wandb, datasets), none of which the functions called here use: they are
# registered bare, so that importing one of their modules runs that module's code only.
BARE_PACKAGES = ("areal.trainer", "areal.trainer.ppo")


def _bare_packages():
    for name in BARE_PACKAGES:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        package = types.ModuleType(name)
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules[name] = package


def _load(path):
    module, _, attr = path.partition(":")
    if module.startswith(BARE_PACKAGES):
        _bare_packages()
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _build(value):
    if isinstance(value, dict) and "__build__" in value:
        kwargs = {k: _build(v) for k, v in value.get("kwargs", {}).items()}
        return _load(value["__build__"])(**kwargs)
    return value


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return repr(value)


def run(call):
    kwargs = {k: _build(v) for k, v in call.get("kwargs", {}).items()}
    wrt = {}
    for name in call.get("grad", []):
        kwargs[name] = kwargs[name].detach().clone().requires_grad_()
        wrt[name] = kwargs[name]
    if "seed" in call:
        torch.manual_seed(call["seed"])
    out = _load(call["fn"])(**kwargs)
    grads = {}
    if wrt:
        loss = out[0] if isinstance(out, tuple) else out
        loss.sum().backward()
        grads = {name: t.grad.detach().clone() for name, t in wrt.items()}
    return {"out": _plain(out), "grads": grads}


def main():
    job, out = sys.argv[1], sys.argv[2]
    calls = torch.load(job, weights_only=False)
    torch.save([run(call) for call in calls], out)


if __name__ == "__main__":
    main()
