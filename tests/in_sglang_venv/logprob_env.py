"""Run inside the SGLang venv: how SGLang's own environment readers read
``SGLANG_RETURN_ORIGINAL_LOGPROB`` (the flag that makes its sampler report T = 1 log-probs).

Usage: logprob_env.py '["1", "false", null, ...]'. For each value (``null``: the variable
unset), prints ``sampler``, the value as SGLang's sampler reads it (``get_bool_env_var``,
evaluated at import in ``sglang.srt.layers.sampler``), and ``envs``, as
``sglang.srt.environ.envs`` reads it (the log-prob processor's reader). One JSON list on one
line. (The sampler module itself needs CUDA-only kernels to import, so its reader is called
directly.)
"""

from __future__ import annotations

import json
import os
import sys

from sglang.srt.environ import envs
from sglang.srt.utils import get_bool_env_var

NAME = "SGLANG_RETURN_ORIGINAL_LOGPROB"


def read(value: str | None) -> dict[str, bool]:
    os.environ.pop(NAME, None)
    if value is not None:
        os.environ[NAME] = value
    return {
        "sampler": get_bool_env_var(NAME),
        "envs": bool(envs.SGLANG_RETURN_ORIGINAL_LOGPROB.get()),
    }


def main() -> None:
    print(json.dumps([read(value) for value in json.loads(sys.argv[1])]))


if __name__ == "__main__":
    main()
