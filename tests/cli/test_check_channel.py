"""``areal check-channel`` against a real OpenAI-compatible stand-in on 127.0.0.1.

The stand-in is an aiohttp server (the project's one server stack) that checks the bearer key,
answers ``good-model``, answers 200 without ``choices`` for ``no-choices``, says 404 "model does
not exist" for any other model, lists its models at ``/v1/models``, and serves a web page (not an
API) under ``/site``. Each failure must name its culprit (base URL, key by its variable, model
id), exit 1, and never print the key, even when the upstream echoes it back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from areal.cli.main import main
from areal.host.http_server import ServerThread
from areal.host.process import pick_free_port

KEY_VAR = "AREAL_TEST_CHANNEL_KEY"
RIGHT_KEY = "sk-right-channel-key-0123456789"
WRONG_KEY = "wrong-channel-key-abcdef987654"
REPLY = "Yes, the channel works."
MODELS = ("good-model", "judge-large")


async def _chat(request: web.Request) -> web.Response:
    given = request.headers.get("Authorization", "").removeprefix("Bearer ")
    if given != RIGHT_KEY:  # echoes the key, as some providers do: it must not reach the user
        return web.json_response(
            {"error": {"message": f"Incorrect API key provided: {given}", "code": "invalid_key"}},
            status=401,
        )
    body = await request.json()
    model = body.get("model")
    if model == "no-choices":
        return web.json_response({"result": "hello", "status": "done"})
    if model not in MODELS:
        return web.json_response(
            {"error": {"message": f"The model `{model}` does not exist", "code": "not_found"}},
            status=404,
        )
    message = {"role": "assistant", "content": REPLY}
    return web.json_response(
        {"id": "c1", "object": "chat.completion", "model": model, "choices": [{"message": message}]}
    )


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": m} for m in MODELS]})


async def _page(request: web.Request) -> web.Response:
    return web.Response(text="<html><body>Welcome</body></html>", content_type="text/html")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/site/chat/completions", _page)
    server = ServerThread(app, "127.0.0.1", 0).start()
    try:
        yield server.url
    finally:
        server.stop()


def _router(tmp_path: Path, base_url: str, *, gateway: bool = True, judge: bool = True) -> Path:
    lines = []
    if gateway:
        lines += [
            "api_gateway:",
            f"  base_url: {base_url}",
            f"  api_key: ${{{KEY_VAR}}}",
            "  timeout: 5",
            "  max_retries: 0",
        ]
    lines += ["model_routing:", "  policy_model:", "    model_id: areal-tiny"]
    if judge:
        lines += ["  judge_model:", "    model_id: good-model", "    max_tokens: 32"]
    path = tmp_path / "router.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check-channel", *args])
    out, err = capsys.readouterr()
    for secret in (RIGHT_KEY, WRONG_KEY):
        assert secret not in out + err
    return code, out, err


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    code, out, _ = _run(capsys, *args, "--json")
    return code, json.loads(out)


@pytest.fixture
def right_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, RIGHT_KEY)


@pytest.mark.usefixtures("right_key")
def test_a_working_channel_prints_the_reply(
    upstream: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _router(tmp_path, upstream + "/v1")
    code, out, err = _run(capsys, "--config", str(config))
    assert code == 0, err
    assert out.startswith("ok: 127.0.0.1:")
    assert "'good-model'" in out  # the judge's route, as no --model was given
    assert REPLY in out

    code, report = _json(capsys, "--config", str(config), "--model", "judge-large")
    assert code == 0
    assert report["ok"] is True and report["culprit"] is None
    assert report["reply"] == REPLY and report["key_env"] == KEY_VAR


def test_a_rejected_key_names_its_variable_and_never_the_key(
    upstream: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_VAR, WRONG_KEY)
    config = _router(tmp_path, upstream + "/v1")
    code, _out, err = _run(capsys, "--config", str(config))
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the API key is wrong")
    assert "HTTP 401" in err and f"environment variable {KEY_VAR}" in err
    assert "***" in err  # the echoed key, redacted

    code, report = _json(capsys, "--config", str(config))
    assert (code, report["culprit"], report["status"], report["key_env"]) == (
        1,
        "key",
        401,
        KEY_VAR,
    )


def test_an_unset_key_variable_is_the_key_culprit(
    upstream: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KEY_VAR, raising=False)
    code, report = _json(capsys, "--config", str(_router(tmp_path, upstream + "/v1")))
    assert (code, report["culprit"], report["key_env"]) == (1, "key", KEY_VAR)
    assert f"export {KEY_VAR}=" in str(report["fix"])


@pytest.mark.usefixtures("right_key")
def test_an_unknown_model_is_the_model_culprit_with_suggestions(
    upstream: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _router(tmp_path, upstream + "/v1")
    code, _out, err = _run(capsys, "--config", str(config), "--model", "good-modle")
    assert code == 1
    assert err.startswith("error: the model id is wrong")
    assert "'good-modle'" in err and "did you mean good-model" in err

    code, report = _json(capsys, "--config", str(config), "--model", "good-modle")
    assert (code, report["culprit"], report["status"]) == (1, "model", 404)


@pytest.mark.usefixtures("right_key")
def test_a_404_not_about_the_model_blames_the_base_url_path(
    upstream: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _router(tmp_path, upstream + "/api")  # no such path; nothing lists models there
    code, _out, err = _run(capsys, "--config", str(config))
    assert code == 1
    assert err.startswith("error: the base URL path is wrong")
    assert "/api/chat/completions" in err and "/v1" in err

    code, report = _json(capsys, "--config", str(config))
    assert (code, report["culprit"], report["status"]) == (1, "base_url", 404)


@pytest.mark.usefixtures("right_key")
def test_a_200_without_choices_is_not_a_chat_endpoint(
    upstream: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _router(tmp_path, upstream + "/v1")
    code, _out, err = _run(capsys, "--config", str(config), "--model", "no-choices")
    assert code == 1
    assert "not an OpenAI-compatible chat endpoint" in err and "without 'choices'" in err

    site = _router(tmp_path, upstream + "/site")  # a web page answers 200 with HTML
    code, report = _json(capsys, "--config", str(site))
    assert (code, report["culprit"]) == (1, "endpoint")
    assert "not an OpenAI-compatible chat endpoint" in str(report["message"])


@pytest.mark.usefixtures("right_key")
def test_nothing_listening_is_an_unreachable_base_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = f"http://127.0.0.1:{pick_free_port()}/v1"
    code, _out, err = _run(capsys, "--config", str(_router(tmp_path, base)))
    assert code == 1
    assert err.startswith("error: the base URL is unreachable") and "connection refused" in err

    code, report = _json(
        capsys, "--config", str(_router(tmp_path, "http://no-such-host.invalid/v1"))
    )
    assert (code, report["culprit"], report["status"]) == (1, "base_url", None)


@pytest.mark.usefixtures("right_key")
def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "--config", str(tmp_path / "missing.yaml"))
    assert code == 2 and "does not exist" in err

    local = _router(tmp_path, "", gateway=False)
    code, _, err = _run(capsys, "--config", str(local))
    assert code == 2 and "no api_gateway section" in err

    policy_only = _router(tmp_path, "http://127.0.0.1:1/v1", judge=False)
    code, report = _json(capsys, "--config", str(policy_only))
    assert (code, report["culprit"]) == (2, "config")
    assert "--model" in str(report["message"])
