"""The SGLang backend's config, command line and launcher (SGLang itself needs a GPU).

launch() is exercised end to end with a stand-in ``sglang`` package put on PYTHONPATH: a real
subprocess started as ``python -m sglang.launch_server ...`` that answers /health.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from areal.core.specs import load_object
from areal.host.process import ServerExitedError
from areal.plugins.inference.sglang_backend import (
    INSTALL_HINT,
    SGLangNotInstalledError,
    SGLangServerConfig,
    build_command,
    launch,
)

needs_no_sglang = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is not None, reason="sglang is installed here"
)


def _flags(command: list[str]) -> list[str]:
    assert command[1:3] == ["-m", "sglang.launch_server"]
    return command[3:]


def test_defaults() -> None:
    command = build_command(SGLangServerConfig(model_path="/models/tiny"))
    assert command[0] == sys.executable
    assert _flags(command) == [
        "--model-path", "/models/tiny",
        "--host", "127.0.0.1",
        "--port", "30000",
        "--tp-size", "1",
        "--dp-size", "1",
        "--dtype", "bfloat16",
    ]  # fmt: skip


def test_every_key() -> None:
    config = SGLangServerConfig(
        model_path="/ckpt/step-0",
        host="0.0.0.0",
        port=31000,
        tp_size=2,
        dp_size=4,
        mem_fraction_static=0.75,
        dtype="float16",
        context_length=8192,
        served_model_name="policy",
        weight_version="0",
        skip_tokenizer_init=True,
        enable_metrics=True,
        api_key="sk-engine",
        log_level="warning",
        python_executable="/opt/sglang/bin/python",
        extra_args=["--trust-remote-code", "--attention-backend", "fa3"],
    )
    command = build_command(config)
    assert command[0] == "/opt/sglang/bin/python"
    assert _flags(command) == [
        "--model-path", "/ckpt/step-0",
        "--host", "0.0.0.0",
        "--port", "31000",
        "--tp-size", "2",
        "--dp-size", "4",
        "--dtype", "float16",
        "--mem-fraction-static", "0.75",
        "--context-length", "8192",
        "--served-model-name", "policy",
        "--weight-version", "0",
        "--api-key", "sk-engine",
        "--log-level", "warning",
        "--skip-tokenizer-init",
        "--enable-metrics",
        "--trust-remote-code", "--attention-backend", "fa3",
    ]  # fmt: skip
    assert config.url == "http://127.0.0.1:31000"


def test_build_command_takes_a_mapping_as_the_plugin_registry_does() -> None:
    launcher = load_object("areal.plugins.inference.sglang_backend:build_command")
    command = launcher({"model_path": "/m", "port": 30123, "mem_fraction_static": 0.5})
    flags = _flags(command)
    assert flags[flags.index("--port") + 1] == "30123"
    assert flags[flags.index("--mem-fraction-static") + 1] == "0.5"


def test_ipv6_and_named_hosts_in_url() -> None:
    assert SGLangServerConfig(model_path="/m", host="::1", port=1).url == "http://[::1]:1"
    assert SGLangServerConfig(model_path="/m", host="node-3", port=2).url == "http://node-3:2"


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"model_path": ""}, "model_path"),
        ({"port": 70000}, "port"),
        ({"port": -1}, "port"),
        ({"tp_size": 0}, "tp_size"),
        ({"dp_size": 0}, "dp_size"),
        ({"mem_fraction_static": 1.5}, "mem_fraction_static"),
        ({"mem_fraction_static": 0.0}, "mem_fraction_static"),
        ({"dtype": "fp8"}, "dtype"),
        ({"context_length": 0}, "context_length"),
        ({"served_model_name": "base:lora"}, "served_model_name"),
        ({"prot": 30000}, "prot"),
        ({"extra_args": "--foo"}, "extra_args"),
    ],
)
def test_validation_errors_name_the_key(kwargs: dict[str, object], key: str) -> None:
    data = {"model_path": "/m", **kwargs}
    with pytest.raises(ValidationError) as info:
        SGLangServerConfig.model_validate(data)
    assert key in str(info.value)


def test_model_path_is_required() -> None:
    with pytest.raises(ValidationError, match="model_path"):
        SGLangServerConfig.model_validate({})


@pytest.mark.parametrize(
    ("arg", "key"),
    [
        ("--port=31000", "port"),
        ("--mem-fraction-static", "mem_fraction_static"),
        ("--tp", "tp_size"),
        ("--model", "model_path"),
        ("--context-length", "context_length"),
    ],
)
def test_extra_args_may_not_shadow_a_config_key(arg: str, key: str) -> None:
    with pytest.raises(ValidationError) as info:
        SGLangServerConfig(model_path="/m", extra_args=[arg, "1"])
    assert f"({key})" in str(info.value) and "extra_args" in str(info.value)


@needs_no_sglang
def test_launch_without_sglang_gives_the_install_hint(tmp_path: Path) -> None:
    with pytest.raises(SGLangNotInstalledError) as info:
        launch(SGLangServerConfig(model_path="/m", port=0), tmp_path / "sglang.log", timeout=5)
    assert INSTALL_HINT in str(info.value)
    assert "pip install 'areal[sglang]' on a GPU machine" in str(info.value)
    assert sys.executable in str(info.value)
    assert not (tmp_path / "sglang.log").exists()  # nothing was started


def test_launch_with_a_missing_interpreter(tmp_path: Path) -> None:
    config = SGLangServerConfig(model_path="/m", python_executable=str(tmp_path / "nopython"))
    with pytest.raises(SGLangNotInstalledError, match="cannot run"):
        launch(config, tmp_path / "sglang.log", timeout=5)


# A stand-in for SGLang's entry point: reads the flags areal passes and answers /health.
STANDIN_LAUNCH_SERVER = """
import argparse, http.server, json, sys
parser = argparse.ArgumentParser()
parser.add_argument("--model-path", required=True)
parser.add_argument("--host")
parser.add_argument("--port", type=int)
args, rest = parser.parse_known_args()
if args.model_path == "/crash":
    print("RuntimeError: CUDA out of memory", flush=True)
    sys.exit(1)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"model_path": args.model_path, "argv": sys.argv[1:]}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass

http.server.HTTPServer((args.host, args.port), Handler).serve_forever()
"""


@pytest.fixture
def standin_sglang(tmp_path: Path) -> dict[str, str]:
    package = tmp_path / "site" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(STANDIN_LAUNCH_SERVER)
    return {"PYTHONPATH": str(package.parent)}


def test_launch_starts_the_server_and_waits_for_health(
    tmp_path: Path, standin_sglang: dict[str, str]
) -> None:
    config = SGLangServerConfig(
        model_path="/models/tiny", port=0, extra_args=["--trust-remote-code"]
    )
    server = launch(config, tmp_path / "sglang.log", timeout=30, env=standin_sglang)
    try:
        assert server.running and server.url is not None
        seen = httpx.get(f"{server.url}/model_info", trust_env=False).json()
        assert seen["model_path"] == "/models/tiny"
        argv = seen["argv"]
        assert argv[argv.index("--port") + 1] == server.url.rsplit(":", 1)[1] != "0"
        assert argv[-1] == "--trust-remote-code"
    finally:
        server.stop()
    assert not server.running


def test_launch_reports_a_crash_with_the_log_tail(
    tmp_path: Path, standin_sglang: dict[str, str]
) -> None:
    config = SGLangServerConfig(model_path="/crash", port=0)
    with pytest.raises(ServerExitedError, match="CUDA out of memory"):
        launch(config, tmp_path / "sglang.log", timeout=30, env=standin_sglang)
