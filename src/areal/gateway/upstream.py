"""The unified API channel: the model ids ``model_routing`` lists, other than the policy, go to one
OpenAI-compatible upstream (the seed article's ``api_gateway``), with the model's defaults.

Only listed ids are forwarded: the channel pays with the operator's key, so any other id is
answered ``404 model_not_found`` naming the known ones, and nothing is sent, unless the router
says ``api_gateway.allow_unlisted_models: true``.

The channel fills in the route's temperature / top_p / max_tokens where the client sent none and
caps what it asks for at the route's ``max_tokens`` (Claude Code asks for 32k); it retries 429,
5xx, refused or dropped connections and timeouts with capped exponential backoff and jitter,
honouring ``Retry-After``, but never once a streamed answer has started to reach the client: a
stream whose upstream breaks off, stalls or ends without its last event ends with an error event
in the protocol's own shape, never a silent end. 401/403 are not retried, and the upstream's
words are not quoted (a provider may echo the key it refused). Failures become errors that say
what to fix; the key is never part of any of them. A key variable that was unset when the
gateway started is one such error, answered without calling the upstream. What each attempt came
to goes into the request's ``gateway.log`` line (``upstream=429,503,200``).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from areal.gateway.errors import GatewayError, anthropic_error_body, is_anthropic, openai_error_body
from areal.gateway.request_log import LOG_FIELDS
from areal.gateway.router_config import ApiGatewayConfig, ModelRoute, ModelRouting
from areal.host.redact import redact

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
    label: str  # what gateway.log says of this attempt: "503", "timeout", "reset", ...
    retry_after: float | None = None

    @property
    def timed_out(self) -> bool:
        return self.label == "timeout"


class UpstreamChannel:
    """Forwards non-policy model calls to ``api_gateway.base_url`` (one connection pool).

    ``sleep`` waits out the delay between attempts (backoff, ``Retry-After``); a test passes one
    that records the delay instead of spending it."""

    def __init__(
        self,
        config: ApiGatewayConfig,
        routing: ModelRouting,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self._sleep = sleep
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
        route = self.routes.get(model) if isinstance(model, str) else None
        fields = request.get(LOG_FIELDS)
        if fields is None:
            fields = {}
        fields.update(model=model, route=self.host, retries=0)
        if route is None and not self.config.allow_unlisted_models:
            raise self._unlisted(model)
        if self.config.unset_key_env:
            raise self._key_unset(self.config.unset_key_env)
        payload = apply_route(body, route, path)
        url = self.base_url + "/" + path.lstrip("/")
        data = json.dumps(payload).encode()
        headers = self._headers(request, path)
        streaming = bool(payload.get("stream"))
        timeout = self._timeout(streaming)
        session = self._client()

        def send() -> Any:
            return session.post(url, data=data, headers=headers, timeout=timeout)

        attempts: list[str] = []  # what each attempt came to, for gateway.log
        while True:
            outcome = await self._attempt(request, send, path, model, streaming, fields, attempts)
            if not isinstance(outcome, _Failure):
                return outcome
            attempts.append(outcome.label)
            fields["upstream"] = ",".join(attempts)
            retries = len(attempts) - 1
            delay = self._retry_delay(outcome, retries)
            if delay is None:
                raise self._give_up(outcome, model, retries)
            fields["retries"] = retries + 1
            log.info(
                "upstream %s: %s; retry %d/%d in %.2fs",
                self.host,
                outcome.label,
                retries + 1,
                self.config.max_retries,
                delay,
            )
            await self._sleep(delay)

    async def _attempt(
        self,
        request: web.Request,
        send: Any,
        path: str,
        model: Any,
        streaming: bool,
        fields: dict[str, Any],
        before: list[str],
    ) -> web.StreamResponse | _Failure:
        """One try: the answer, relayed to the client, or why there is none yet. Until the
        client has a first byte, every failure is one the caller may retry."""
        try:
            resp = await send()
        except _TRANSPORT_ERRORS as err:
            return self._no_answer(err)
        try:
            if not 200 <= resp.status < 300:
                return await self._refusal(resp)
            answered = ",".join([*before, str(resp.status)])  # gateway.log's upstream=...
            if not (streaming and resp.content_type == "text/event-stream"):
                fields["upstream"] = answered
                return await self._answer(resp, path, model)  # a bad answer is not retried
            first = await resp.content.readany()
            if not first:
                return _Failure(None, "the stream ended before its first byte", "empty")
            fields["upstream"] = answered
            return await self._relay(request, resp, path, first, fields)
        except _TRANSPORT_ERRORS as err:  # the body broke off before anything was sent
            return self._no_answer(err)
        finally:
            resp.release()

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
        self,
        request: web.Request,
        resp: aiohttp.ClientResponse,
        path: str,
        first: bytes,
        fields: dict[str, Any],
    ) -> web.StreamResponse:
        """Pass an SSE stream through as it arrives. From here on nothing is retried: the client
        has the first bytes, so a broken upstream ends the stream with an error event instead,
        and so does one that closes without the protocol's last event (``[DONE]``,
        ``message_stop``, ``response.completed``): the client must not take a cut answer for
        a whole one."""
        out = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": resp.headers.get("Content-Type", "text/event-stream"),
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            },
        )
        await out.prepare(request)
        end = StreamEnd()
        end.feed(first)
        fault: tuple[str, int, str] | None = None  # (label, status, why)
        try:
            await out.write(first)
            try:
                async for chunk in resp.content.iter_any():
                    end.feed(chunk)
                    await out.write(chunk)
            except _TRANSPORT_ERRORS as err:
                if end.done:
                    pass  # the connection broke after the last event: the answer is whole
                elif isinstance(err, asyncio.TimeoutError):
                    fault = ("stalled", 504, f"no data for {self.config.timeout:g}s")
                else:
                    fault = ("truncated", 502, self._clean(str(err) or type(err).__name__))
            else:
                if not end.done:
                    fault = ("truncated", 502, f"it closed before {_last_event(path)}")
            if fault is not None:
                label, status, why = fault
                fields["upstream"] = f"{fields.get('upstream', '200')}+{label}"
                fields["error"] = f"upstream_stream_{label}"
                message = f"the upstream channel {self.host} broke off the stream: {why}"
                await out.write(_sse_error(path, status, message))
            await out.write_eof()
        except ConnectionResetError:  # the client went away; release() drops the upstream too
            fields.setdefault("error", "client_gone")
        return out

    def _no_answer(self, err: BaseException) -> _Failure:
        text = self._clean(str(err) or type(err).__name__)
        if isinstance(err, asyncio.TimeoutError):
            label = "timeout"
        elif isinstance(err, aiohttp.ClientConnectorError):
            label = "unreachable"  # no connection was made
        else:
            label = "reset"  # connected, then dropped before a whole answer
        return _Failure(None, text, label)

    async def _refusal(self, resp: aiohttp.ClientResponse) -> _Failure:
        raw = await resp.read()
        retry_after = retry_after_seconds(resp.headers.get("Retry-After"))
        if resp.status in (401, 403):
            # Not quoted: a provider may echo the key it refused, or a part of it.
            return _Failure(resp.status, "", str(resp.status))
        text = raw.decode("utf-8", "replace")
        with contextlib.suppress(json.JSONDecodeError):
            text = _error_text(json.loads(text))
        return _Failure(resp.status, self._quote(text), str(resp.status), retry_after=retry_after)

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
            if failure.label == "unreachable":
                return GatewayError(
                    502,
                    f"cannot reach the upstream channel {host} ({tries}){said}; check "
                    "api_gateway.base_url and the network",
                    code="upstream_unreachable",
                )
            return GatewayError(
                502,
                f"the upstream channel {host} dropped the connection before answering model "
                f"{model!r} ({tries}){said}",
                code="upstream_disconnected",
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

    def _unlisted(self, model: Any) -> GatewayError:
        """A model id the router does not list: nothing is sent with the operator's key."""
        known = ", ".join(repr(m) for m in self.routes)
        return GatewayError(
            404,
            f"the model {model!r} does not exist on this gateway; the known model ids are "
            f"{known} (the operator can forward any id to the upstream channel {self.host} with "
            "api_gateway.allow_unlisted_models: true in the router config)",
            param="model",
            code="model_not_found",
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
    """A final SSE event in the protocol's own error shape: Anthropic's ``event: error``, the
    Responses API's ``error`` event, else a chat-completions ``data: {"error": ...}`` chunk."""
    if is_anthropic(path):
        payload = json.dumps(anthropic_error_body(status, message))
        return f"event: error\ndata: {payload}\n\n".encode()
    error = openai_error_body(status, message, code="upstream_stream_broken")
    if _api(path) == "/responses":
        body = error["error"]
        event = {"type": "error", "code": body["code"], "message": message, "param": None}
        return f"event: error\ndata: {json.dumps(event)}\n\n".encode()
    return f"data: {json.dumps(error)}\n\n".encode()


_TERMINAL_EVENTS = frozenset(
    {"message_stop", "error", "response.completed", "response.failed", "response.incomplete"}
)
_TERMINAL_HINTS = (b"[DONE]", b'"error"', *(name.encode() for name in _TERMINAL_EVENTS))
_LINE_MAX = 64 * 1024  # longer lines are content, never a stream's last event


class StreamEnd:
    """Watches a relayed SSE stream for the protocol's last event: ``data: [DONE]`` (OpenAI chat
    and completions), ``event: message_stop`` (Anthropic), ``response.completed`` /
    ``.failed`` / ``.incomplete`` (Responses), or an error event of any of them."""

    def __init__(self) -> None:
        self.done = False
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        if self.done:
            return
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        if len(self._partial) > _LINE_MAX:
            self._partial = b""
        for line in lines:
            if self._is_last(line.strip()):
                self.done = True
                return

    @staticmethod
    def _is_last(line: bytes) -> bool:
        if not any(hint in line for hint in _TERMINAL_HINTS):
            return False
        field, _, value = line.partition(b":")
        value = value.strip()
        if field == b"event":
            return value.decode("utf-8", "replace") in _TERMINAL_EVENTS
        if field != b"data":
            return False
        if value == b"[DONE]":
            return True
        try:
            data = json.loads(value)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return False
        return isinstance(data, dict) and (
            data.get("type") in _TERMINAL_EVENTS or data.get("error") is not None
        )


def _last_event(path: str) -> str:
    api = _api(path)
    if api == "/messages":
        return "message_stop"
    if api == "/responses":
        return "response.completed"
    return "data: [DONE]"
