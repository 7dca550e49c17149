"""Inference engines for the tests: the embedded server in this process, the reference
computations the engines are checked against, and the one way to wait for sequences to decode.

The embedded engine counts what it does (``stats()``: ``running``, ``waiting``,
``tokens_generated``), so a test that must act while a request decodes waits for those counts,
never for a time.
"""

from __future__ import annotations

import functools
import json
import random
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from support.wait import eventually, eventually_async

DECODE_S = 60.0  # the ceiling for a request to reach the engine and decode a few tokens


@dataclass
class RunningServer:
    """The embedded server's app on 127.0.0.1 with its engine, and a client for it."""

    url: str
    server: Any  # areal.plugins.inference.embedded.server.InferenceServer
    http: httpx.Client

    def generate(self, **body: Any) -> Any:
        resp = self.http.post("/generate", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def stats(self) -> dict[str, Any]:
        """The engine's counters, read on the engine thread between two steps."""
        engine = self.server.engine
        stats: dict[str, Any] = engine.call(engine.stats).result(timeout=DECODE_S)
        return stats


@contextmanager
def running_server(model_dir: str, **options: Any) -> Iterator[RunningServer]:
    """The real app on 127.0.0.1 (aiohttp on a side thread), the engine on its own thread."""
    from areal.plugins.inference.embedded.server import build_server

    options.setdefault("max_total_tokens", 8192)
    server = build_server(model_dir, **options)
    http_server = server.http().start()
    try:
        with httpx.Client(base_url=http_server.url, timeout=60) as http:
            yield RunningServer(http_server.url, server, http)
    finally:
        server.engine.stop()
        http_server.stop()


@contextmanager
def nano_engine(directory: Path) -> Iterator[tuple[str, Any]]:
    """areal's nano model (seed 0), made in ``directory``, served by the embedded engine on
    127.0.0.1: ``(url, server)``. The engine the gateway and adapter tests share."""
    from areal.plugins.inference.embedded.server import build_server
    from areal.plugins.models.tiny import init_tiny

    init_tiny(directory, size="nano", seed=0)
    server = build_server(str(directory), max_total_tokens=16384)
    http = server.http().start()
    try:
        yield http.url, server
    finally:
        server.engine.stop()
        http.stop()


def perturbed_model(
    model_dir: str, out: Path | None = None, scale: float = 0.05, seed: int | None = None
) -> Any:
    """The checkpoint with every weight moved a little: a stand-in for a trainer step's result.
    Saved to ``out`` (HF format) when given."""
    import torch

    from areal.plugins.models.hf_io import load_model, save_model

    model = load_model(model_dir)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    if out is not None:
        save_model(model, out)
    return model


# --- waiting for sequences to decode ---------------------------------------------------------


def decoding(n: int = 1, steps: int = 4) -> Callable[[dict[str, Any]], bool]:
    """A predicate on an engine's stats: true once ``n`` sequences run and each has had about
    ``steps`` decode steps since they all ran (tokens are out: a pause or an abort now lands
    mid-generation, with partial output to show)."""
    start: int | None = None

    def check(stats: dict[str, Any]) -> bool:
        nonlocal start
        if start is None and stats["running"] >= n:
            start = stats["tokens_generated"]
        return start is not None and stats["tokens_generated"] >= start + steps * n

    return check


def wait_decoding(stats: Callable[[], dict[str, Any]], n: int = 1) -> None:
    """Until ``n`` sequences decode (:func:`decoding`), reading ``stats`` (an engine's)."""
    seen = decoding(n)
    eventually(lambda: seen(stats()), DECODE_S, f"{n} sequence(s) running and decoding")


async def wait_decoding_async(stats: Callable[[], Awaitable[dict[str, Any]]], n: int = 1) -> None:
    """:func:`wait_decoding` on an event loop (``stats``: e.g. a client's ``server_info``)."""
    seen = decoding(n)

    async def check() -> bool:
        return seen(await stats())

    await eventually_async(check, DECODE_S, f"{n} sequence(s) running and decoding")


def queued(stats: dict[str, Any]) -> bool:
    """True once a request waits at a paused engine: it arrived, and nothing admitted it."""
    return bool(stats["paused"]) and stats["waiting"] >= 1 and stats["running"] == 0


@contextmanager
def bare_request(url: str, path: str, body: dict[str, Any]) -> Iterator[socket.socket]:
    """A ``POST`` written on a bare socket, which leaves when the block ends: a client that goes
    away at the moment the test chooses (not after a read timeout)."""
    where = urlsplit(url)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    with socket.create_connection((where.hostname, where.port), timeout=DECODE_S) as sock:
        sock.sendall(head.encode() + data)
        yield sock


# --- what the engines are checked against ----------------------------------------------------


@functools.cache
def _reference_model(model_dir: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)


def reference_logprobs(model_dir: str, ids: list[int], start: int) -> Any:
    """transformers' forward pass of the checkpoint: log-softmax at the positions that predict
    ``ids[start:]``, float32."""
    import torch

    with torch.no_grad():
        logits = _reference_model(model_dir)(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[start - 1 : -1], -1)


def alone(model: Any, ids: list[int]) -> Any:
    """Hidden states of one sequence by the model's plain causal forward (no cache)."""
    import torch

    with torch.inference_mode():
        return model.hidden_states(torch.tensor([ids]))[0]


def prefilled(
    model: Any, pool: Any, cached: list[int], seed: int = 3
) -> tuple[list[list[int]], list[Any]]:
    """Random sequences of ``cached`` + 1 tokens, all but the last already in ``pool`` (by the
    model's own modules, one sequence at a time), and each one's slots: a decode step's input."""
    import torch

    from areal.plugins.inference.embedded.paged_attention import build_step

    rng = random.Random(seed)
    seqs = [[rng.randrange(1, 4096) for _ in range(n + 1)] for n in cached]
    slots = [pool.alloc(40) for _ in seqs]
    with torch.inference_mode():
        for seq, seq_slots in zip(seqs, slots, strict=True):
            ids, positions, attention = build_step(pool, [seq_slots], [0], [seq[:-1]])
            model.hidden_states(ids, positions, attention)
    return seqs, slots
