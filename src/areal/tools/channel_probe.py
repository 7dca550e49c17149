"""One chat call through the unified API channel, and which setting is wrong when it fails.

"HTTP 404" or "connection refused" alone sends people to the wrong place. Each failure is mapped
to the one thing to change: the base URL (unreachable, or a path that is not the API), the key
(named by the environment variable it came from, never shown), or the model id (with the ids the
upstream does serve, when it lists them). The key is redacted from everything reported, because
some providers echo it in their error text.
"""

from __future__ import annotations

import difflib
import json
import re
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import aiohttp

from areal.gateway.router_config import ApiGatewayConfig, ModelRoute
from areal.gateway.upstream import apply_route
from areal.host.redact import redact

Culprit = Literal["base_url", "key", "model", "endpoint", "upstream", "request"]
CHAT_PATH = "/chat/completions"
QUOTE_CHARS = 300
_NOT_FOUND = re.compile(r"not[ _]found|does not exist|unknown|invalid|no such|not supported", re.I)


@dataclass
class ProbeResult:
    """What one probe found; ``culprit`` is None when the channel answered properly."""

    ok: bool
    base_url: str
    model: str
    message: str
    culprit: Culprit | None = None
    fix: str = ""
    status: int | None = None
    key_env: str | None = None
    latency_s: float | None = None
    reply: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ChannelProbe:
    """The channel (``api_gateway``) of the router config at ``source``, tried with one model."""

    gateway: ApiGatewayConfig
    model: str
    source: str = "the router config"
    route: ModelRoute | None = None
    prompt: str = "Reply with one short sentence: is this channel working?"
    max_tokens: int = 64

    async def run(self) -> ProbeResult:
        cfg = self.gateway
        body = apply_route(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": self.prompt}],
                "max_tokens": self.max_tokens,
            },
            self.route,
            CHAT_PATH,
        )
        started = time.perf_counter()
        timeout = aiohttp.ClientTimeout(total=cfg.timeout)
        async with aiohttp.ClientSession(trust_env=True, timeout=timeout) as session:
            try:
                async with session.post(self.url, json=body, headers=self.headers) as resp:
                    raw = await resp.read()
                    status = resp.status
            except TimeoutError:
                return self._unreachable(f"no answer within api_gateway.timeout {cfg.timeout:g}s")
            except aiohttp.ClientError as err:
                return self._unreachable(_transport_reason(err))
            elapsed = time.perf_counter() - started
            if status == 200:
                return self._answered(raw, elapsed)
            text = self._quote(_error_text(raw))
            if status == 404 or (status in (400, 422) and self._about_model(text)):
                return await self._not_found(session, status, text)
        return self._refused(status, text)

    @property
    def url(self) -> str:
        return self.gateway.base_url + CHAT_PATH

    @property
    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": "areal-check-channel"}
        if self.gateway.api_key:
            headers["Authorization"] = f"Bearer {self.gateway.api_key}"
        return headers

    # --- outcomes ---------------------------------------------------------------------------

    def _result(
        self, culprit: Culprit | None, message: str, fix: str = "", **kw: Any
    ) -> ProbeResult:
        return ProbeResult(
            ok=culprit is None,
            base_url=self.gateway.base_url,
            model=self.model,
            message=self._clean(message),
            culprit=culprit,
            fix=self._clean(fix),
            key_env=self.gateway.api_key_env,
            **kw,
        )

    def _unreachable(self, reason: str) -> ProbeResult:
        return self._result(
            "base_url",
            f"the base URL is unreachable: {self.gateway.base_url}: {reason}",
            f"check api_gateway.base_url in {self.source}, the network, and HTTPS_PROXY if "
            "you need one",
        )

    def _answered(self, raw: bytes, elapsed: float) -> ProbeResult:
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            data = None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            what = "JSON without 'choices'" if data is not None else "something that is not JSON"
            return self._result(
                "endpoint",
                f"{self.url} is not an OpenAI-compatible chat endpoint: HTTP 200 with {what}: "
                f"{self._quote(raw.decode('utf-8', 'replace'))}",
                f"point api_gateway.base_url in {self.source} at the API's OpenAI-compatible "
                "base (usually ending in /v1), not a web page or another API",
                status=200,
                latency_s=round(elapsed, 3),
            )
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        reply = message.get("content") if isinstance(message, dict) else None
        return self._result(
            None,
            f"{self.gateway.host} answered model {self.model!r} in {elapsed:.2f}s",
            status=200,
            latency_s=round(elapsed, 3),
            reply=reply if isinstance(reply, str) else "",
        )

    async def _not_found(
        self, session: aiohttp.ClientSession, status: int, text: str
    ) -> ProbeResult:
        """A 404 about the model means the id is wrong; any other 404 means the URL's path is.

        ``GET /models`` settles the unclear cases: an upstream that lists models at this base is
        the right API, so the model id is what it does not know.
        """
        served = await self._served_models(session)
        about_model = self._about_model(text)
        if served is not None and self.model in served and not about_model:
            served = None  # the model exists here: the chat path itself is missing
        if about_model or served is not None:
            close = difflib.get_close_matches(self.model, served or [], n=3, cutoff=0.4)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            listed = f"; {len(served)} models are listed at /models" if served else ""
            return self._result(
                "model",
                f"the model id is wrong: {self.gateway.host} does not serve {self.model!r} "
                f"(HTTP {status}: {text}){listed}",
                f"use a model id the upstream serves{hint}: pass --model ID, or change model_id "
                f"in {self.source}'s model_routing",
                status=status,
            )
        return self._result(
            "base_url",
            f"the base URL path is wrong: {self.url} does not exist (HTTP {status}: {text})",
            f"check the path of api_gateway.base_url in {self.source}: an OpenAI-compatible "
            "base usually ends in /v1",
            status=status,
        )

    def _refused(self, status: int, text: str) -> ProbeResult:
        said = f"HTTP {status}: {text}" if text else f"HTTP {status}"
        if status in (401, 403):
            return self._result(
                "key",
                f"the API key is wrong: {self.gateway.host} rejected it ({said})",
                self._key_fix(),
                status=status,
            )
        if status == 429:
            return self._result(
                "upstream",
                f"{self.gateway.host} is rate-limiting (or out of quota for) this key ({said})",
                "wait and retry, or check the account's quota; the URL, key and model are right",
                status=status,
            )
        if status >= 500:
            return self._result(
                "upstream",
                f"{self.gateway.host} failed ({said})",
                "retry later; the provider's side is failing, not the channel config",
                status=status,
            )
        return self._result(
            "request",
            f"{self.gateway.host} refused the request for model {self.model!r} ({said})",
            f"check the model's route in {self.source} (temperature, max_tokens)",
            status=status,
        )

    def _key_fix(self) -> str:
        cfg = self.gateway
        if not cfg.api_key:
            return f"no key is configured: add api_key: ${{YOUR_KEY_VAR}} to api_gateway in {self.source}"
        if cfg.api_key_env:
            return (
                f"check the key in the environment variable {cfg.api_key_env} "
                f"(api_gateway.api_key in {self.source})"
            )
        return f"check api_gateway.api_key in {self.source} (better: api_key: ${{YOUR_KEY_VAR}})"

    # --- helpers ----------------------------------------------------------------------------

    async def _served_models(self, session: aiohttp.ClientSession) -> list[str] | None:
        """The ids at ``GET {base_url}/models``, or None when the upstream does not list them."""
        try:
            async with session.get(
                self.gateway.base_url + "/models",
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=min(10.0, self.gateway.timeout)),
            ) as resp:
                if resp.status != 200:
                    return None
                data = json.loads(await resp.read())
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            return None
        return [str(m["id"]) for m in items if isinstance(m, dict) and "id" in m]

    def _about_model(self, text: str) -> bool:
        if len(self.model) >= 3 and self.model in text:
            return True
        return "model" in text.lower() and bool(_NOT_FOUND.search(text))

    def _clean(self, text: str) -> str:
        return redact(text, (self.gateway.api_key or "",))

    def _quote(self, text: str) -> str:
        text = " ".join(text.split())
        if len(text) > QUOTE_CHARS:
            text = text[:QUOTE_CHARS] + "..."
        return self._clean(text)


def _error_text(raw: bytes) -> str:
    """The human part of an error body (OpenAI's ``error.message``, or the body itself)."""
    text = raw.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            parts = [str(error[k]) for k in ("message", "code") if error.get(k)]
            return "; ".join(parts) or text
        for key in ("error", "message", "detail", "msg"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return text


def _transport_reason(err: aiohttp.ClientError) -> str:
    """Why no HTTP answer came: the host name, nothing listening, TLS, or a proxy."""
    if isinstance(err, aiohttp.ClientConnectorDNSError) or isinstance(
        getattr(err, "os_error", None), socket.gaierror
    ):
        host = getattr(err, "host", "")
        return f"the host name {host} does not resolve"
    if isinstance(err, (aiohttp.ClientSSLError, aiohttp.ClientConnectorCertificateError)):
        return f"TLS failed: {err}"
    if isinstance(err, aiohttp.ClientConnectorError):
        os_error = err.os_error
        if isinstance(os_error, ConnectionRefusedError) or "refused" in str(os_error).lower():
            return f"connection refused: nothing listens at {err.host}:{err.port}"
        return f"cannot connect to {err.host}:{err.port}: {os_error.strerror or os_error}"
    return str(err) or type(err).__name__
