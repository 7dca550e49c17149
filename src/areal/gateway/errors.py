"""Errors in each protocol's own schema: OpenAI ``{"error": {...}}``, Anthropic
``{"type": "error", "error": {...}}``. Handlers raise :class:`GatewayError`; the app's middleware
renders it for the protocol of the route, so no handler ever answers with a 500 for bad input."""

from __future__ import annotations

from typing import Any

from aiohttp import web

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
}
_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


class GatewayError(Exception):
    """A request the gateway cannot serve, with the status and a message that says what to fix."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


_RL_PREFIXES = ("/rl/", "/gateway/rl/")  # the RL API answers in the OpenAI schema


def is_anthropic(path: str) -> bool:
    """Anthropic's routes; not an /rl route whose id holds "/messages" (a decoded %2F)."""
    return "/messages" in path and not path.startswith(_RL_PREFIXES)


def openai_error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(path: str, err: GatewayError) -> web.Response:
    if is_anthropic(path):
        body = anthropic_error_body(err.status, err.message)
    else:
        body = openai_error_body(err.status, err.message, err.param, err.code)
    return web.json_response(body, status=err.status, headers=err.headers)
