"""The unified API channel: every model id that is not the policy goes to one OpenAI-compatible
upstream (the seed article's ``api_gateway``), with the model's defaults from ``model_routing``.

The channel fills in the route's temperature / top_p / max_tokens where the client sent none and
caps what it asks for at the route's ``max_tokens`` (Claude Code asks for 32k); it retries 429,
5xx, refused connections and timeouts with exponential backoff and jitter, honouring
``Retry-After``, but never once a streamed answer has started to reach the client. Streams are
relayed chunk by chunk as they arrive. Failures become errors that say what to fix; the key is
never part of any of them. A key variable that was unset when the gateway started is one such
error, answered without calling the upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from areal.gateway.access_log import redact
from areal.gateway.errors import GatewayError, anthropic_error_body, is_anthropic, openai_error_body
from areal.gateway.request_log import LOG_FIELDS
from areal.gateway.router_config import ApiGatewayConfig, ModelRoute, ModelRouting

log = logging.getLogger("areal.gateway.upstream")

# Which body keys carry the output budget, and which key a successful answer must hold, per API.
_TOKEN_KEYS: dict[str, tuple[str, ...]] = {
    "/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/completions": ("max_tokens",),
    "/messages": ("max_tokens",),
    "/responses": ("max_output_tokens",),
}
_ANSWER_KEYS = {
    "/chat/completions": "choices",
    "/completions": "choices",
    "/messages": "content",
    "/responses": "output",
}
_QUOTE_CHARS = 500  # how much of an upstream's error text an error message quotes
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def _api(path: str) -> str:
    """The API a path belongs to ("/chat/completions", "/messages", ...), ignoring any prefix."""
    bare = path.split("?", 1)[0].rstrip("/")
    for api in ("/chat/completions", "/messages", "/responses", "/completions"):
        if bare.endswith(api):
            return api
    return bare


def apply_route(body: dict[str, Any], route: ModelRoute | None, path: str) -> dict[str, Any]:
    """The body with the route's defaults filled in and its ``max_tokens`` cap applied."""
    if route is None:
        return body
    out = dict(body)
    if route.temperature is not None and out.get("temperature") is None:
        out["temperature"] = route.temperature
    if route.top_p is not None and out.get("top_p") is None:
        out["top_p"] = route.top_p
    if route.max_tokens is not None:
        keys = _TOKEN_KEYS.get(_api(path), ("max_tokens",))
        given = [k for k in keys if out.get(k) is not None]
        if not given:
            out[keys[0]] = route.max_tokens
        for key in given:
            value = out[key]
            if isinstance(value, int) and not isinstance(value, bool) and value > route.max_tokens:
                out[key] = route.max_tokens
    return out


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds from now: a number, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass
class _Failure:
    """Why one attempt did not produce an answer (kept for the final error if retries run out)."""

    status: int | None  # the upstream's HTTP status, None when no answer came back
    message: str
    timed_out: bool = False
    retry_after: float | None = None


class UpstreamChannel:
    """Forwards non-policy model calls to ``api_gateway.base_url`` (one connection pool)."""

    def __init__(self, config: ApiGatewayConfig, routing: ModelRouting) -> None:
        self.config = config
        self.routing = routing
        self.base_url = config.base_url.rstrip("/")
        self.host = config.host
        self.routes = routing.routes()  # resolved once: forward() runs per request
        self._secrets = tuple(s for s in (config.api_key,) if s)
        self._session: aiohttp.ClientSession | None = None

    # --- the request ----------------------------------------------------------------------

    async def forward(
        self, request: web.Request, body: dict[str, Any], path: str
    ) -> web.StreamResponse:
        """Send ``body`` (with the model's defaults and caps) to the upstream's ``path``."""
        model = body.get("model")
        payload = apply_route(
            body, self.routes.get(model) if isinstance(model, str) else None, path
        )
        fields = request.get(LOG_FIELDS)
        if fields is not None:
            fields.update(model=model, route=self.host, retries=0)
        if self.config.unset_key_env:
            raise self._key_unset(self.config.unset_key_env)
        url = self.base_url + "/" + path.lstrip("/")
        data = json.dumps(payload).encode()
        headers = self._headers(request, path)
        streaming = bool(payload.get("stream"))
        timeout = self._timeout(streaming)
        session = self._client()

        retries = 0
        while True:
            failure: _Failure
            try:
                resp = await session.post(url, data=data, headers=headers, timeout=timeout)
            except _TRANSPORT_ERRORS as err:
                failure = self._no_answer(err)
            else:
                try:
                    if 200 <= resp.status < 300:
                        if streaming and resp.content_type == "text/event-stream":
                            return await self._relay(request, resp, path)
                        return await self._answer(resp, path, model)
                    failure = await self._refusal(resp)
                except _TRANSPORT_ERRORS as err:  # the body broke off before anything was sent
                    failure = self._no_answer(err)
                finally:
                    resp.release()
            delay = self._retry_delay(failure, retries)
            if delay is None:
                raise self._give_up(failure, model, retries)
            retries += 1
            if fields is not None:
                fields["retries"] = retries
            log.info(
                "upstream %s: %s; retry %d/%d in %.2fs",
                self.host,
                failure.status or failure.message,
                retries,
                self.config.max_retries,
                delay,
            )
            await asyncio.sleep(delay)

    def _headers(self, request: web.Request, path: str) -> dict[str, str]:
        """The channel's own credentials, never the client's (that is the gateway key)."""
        headers = {"Content-Type": "application/json", "User-Agent": "areal-gateway"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        if _api(path) == "/messages":
            if self.config.api_key:
                headers["x-api-key"] = self.config.api_key
            headers["anthropic-version"] = request.headers.get("anthropic-version", "2023-06-01")
            if "anthropic-beta" in request.headers:
                headers["anthropic-beta"] = request.headers["anthropic-beta"]
        return headers

    def _timeout(self, streaming: bool) -> aiohttp.ClientTimeout:
        # A whole answer must come within ``timeout``; a stream may run longer as long as it
        # keeps moving (no gap between chunks longer than ``timeout``).
        t = self.config.timeout
        if streaming:
            return aiohttp.ClientTimeout(total=None, sock_connect=t, sock_read=t)
        return aiohttp.ClientTimeout(total=t)

    def _client(self) -> aiohttp.ClientSession:
        """One session per channel, made on first use inside the running loop."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256),
                trust_env=True,  # a remote API may only be reachable through HTTPS_PROXY
            )
        return self._session

    # --- answers --------------------------------------------------------------------------

    async def _answer(self, resp: aiohttp.ClientResponse, path: str, model: Any) -> web.Response:
        raw = await resp.read()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise GatewayError(
                502,
                f"the upstream channel {self.host} answered model {model!r} with something that "
                f"is not JSON: {self._quote(raw.decode('utf-8', 'replace'))}",
                code="upstream_error",
            ) from None
        expected = _ANSWER_KEYS.get(_api(path))
        if expected and (not isinstance(data, dict) or expected not in data):
            raise GatewayError(
                502,
                f"the upstream channel {self.host} answered model {model!r} without "
                f"'{expected}': {self._quote(_error_text(data))}",
                code="upstream_error",
            )
        return web.Response(body=raw, status=resp.status, content_type="application/json")

    async def _relay(
        self, request: web.Request, resp: aiohttp.ClientResponse, path: str
    ) -> web.StreamResponse:
        """Pass an SSE stream through as it arrives. From here on nothing is retried: the client
        has the first bytes, so a broken upstream ends the stream with an error event instead."""
        out = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": resp.headers.get("Content-Type", "text/event-stream"),
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            },
        )
        await out.prepare(request)
        try:
            try:
                async for chunk in resp.content.iter_any():
                    await out.write(chunk)
            except _TRANSPORT_ERRORS as err:
                timed_out = isinstance(err, asyncio.TimeoutError)
                why = (
                    f"no data for {self.config.timeout:g}s"
                    if timed_out
                    else self._clean(str(err) or type(err).__name__)
                )
                message = f"the upstream channel {self.host} broke off the stream: {why}"
                await out.write(_sse_error(path, 504 if timed_out else 502, message))
            await out.write_eof()
        except ConnectionResetError:  # the client went away; release() drops the upstream too
            pass
        return out

    def _no_answer(self, err: BaseException) -> _Failure:
        text = self._clean(str(err) or type(err).__name__)
        return _Failure(None, text, timed_out=isinstance(err, asyncio.TimeoutError))

    async def _refusal(self, resp: aiohttp.ClientResponse) -> _Failure:
        text = (await resp.read()).decode("utf-8", "replace")
        with contextlib.suppress(json.JSONDecodeError):
            text = _error_text(json.loads(text))
        return _Failure(
            resp.status,
            self._quote(text),
            retry_after=retry_after_seconds(resp.headers.get("Retry-After")),
        )

    # --- retries and errors ---------------------------------------------------------------

    def _retry_delay(self, failure: _Failure, retries: int) -> float | None:
        """Seconds to wait before the next attempt, or None when this failure is final."""
        retryable = failure.status is None or failure.status == 429 or failure.status >= 500
        if not retryable or retries >= self.config.max_retries:
            return None
        if failure.retry_after is not None:
            # Honour the upstream's wish, unless it is longer than a whole request may take:
            # then the client hears it (429 + Retry-After) instead of waiting here.
            return failure.retry_after if failure.retry_after <= self.config.timeout else None
        step = min(self.config.retry_backoff_max, self.config.retry_backoff * 2**retries)
        return step / 2 + random.uniform(0, step / 2)

    def _give_up(self, failure: _Failure, model: Any, retries: int) -> GatewayError:
        host, status = self.host, failure.status
        tries = f"after {retries + 1} attempt{'s' if retries else ''}"
        said = f": {failure.message}" if failure.message else ""
        if status is None:
            if failure.timed_out:
                return GatewayError(
                    504,
                    f"the upstream channel {host} did not answer within "
                    f"{self.config.timeout:g}s ({tries}); raise api_gateway.timeout or check "
                    f"that {host} is up",
                    code="upstream_timeout",
                )
            return GatewayError(
                502,
                f"cannot reach the upstream channel {host} ({tries}){said}; check "
                "api_gateway.base_url and the network",
                code="upstream_unreachable",
            )
        if status in (401, 403):
            return GatewayError(502, self._key_rejected(status, said), code="upstream_auth")
        if status == 429:
            headers = {}
            if failure.retry_after is not None:
                headers["Retry-After"] = str(max(1, round(failure.retry_after)))
            return GatewayError(
                429,
                f"the upstream channel {host} is rate-limiting model {model!r} ({tries}){said}",
                code="upstream_rate_limited",
                headers=headers,
            )
        if status >= 500:
            return GatewayError(
                502,
                f"the upstream channel {host} failed for model {model!r}: HTTP {status} "
                f"({tries}){said}",
                code="upstream_error",
            )
        # Other 4xx: the request itself is wrong for the upstream; keep the status, say who.
        return GatewayError(
            status if status in (400, 404, 413, 422) else 400,
            f"the upstream channel {host} refused the request for model {model!r} "
            f"(HTTP {status}){said}",
            code="upstream_rejected",
        )

    def _key_unset(self, name: str) -> GatewayError:
        """Nothing is sent without the key: the upstream would only refuse it, less clearly."""
        return GatewayError(
            502,
            f"the upstream channel {self.host} has no API key: api_gateway.api_key reads the "
            f"environment variable {name}, which was not set when the gateway started; export "
            f"{name}=<your key> and restart the gateway",
            code="upstream_key_unset",
        )

    def _key_rejected(self, status: int, said: str) -> str:
        cfg = self.config
        if not cfg.api_key:
            fix = (
                "no key is configured: set api_gateway.api_key in the router config, e.g. "
                "api_key: ${TAOTOKEN_API_KEY}"
            )
        elif cfg.api_key_env:
            fix = (
                f"check the key in the environment variable {cfg.api_key_env} "
                "(api_gateway.api_key in the router config)"
            )
        else:
            fix = "check api_gateway.api_key in the router config"
        return f"the upstream channel {self.host} rejected the API key (HTTP {status}){said}; {fix}"

    def _clean(self, text: str) -> str:
        return redact(text, self._secrets)

    def _quote(self, text: str) -> str:
        text = " ".join(text.split())
        if len(text) > _QUOTE_CHARS:
            text = text[:_QUOTE_CHARS] + "..."
        return self._clean(text)

    async def close(self) -> None:
        """Release connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def _error_text(data: Any) -> str:
    """The human part of an upstream's error body (OpenAI, Anthropic, or a provider's own)."""
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        for key in ("message", "msg", "detail"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return json.dumps(data, ensure_ascii=False)


def _sse_error(path: str, status: int, message: str) -> bytes:
    """A final SSE event in the protocol's own error shape."""
    if is_anthropic(path):
        payload = json.dumps(anthropic_error_body(status, message))
        return f"event: error\ndata: {payload}\n\n".encode()
    return f"data: {json.dumps(openai_error_body(status, message))}\n\n".encode()
