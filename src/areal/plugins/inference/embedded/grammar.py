"""Grammar-constrained decoding for the embedded engine: SGLang's json_schema, regex, ebnf and
structural_tag.

A request's grammar is compiled once, when the request is admitted, so that a bad one becomes
an HTTP 400 instead of a failure inside the decode loop; distinct grammars are cached because
agents send the same schema over and over. Each running request then owns a matcher, and every
decode step masks the whole batch with one int32 bitmask (32 token ids per word) filled and
applied by xgrammar's native kernels, never by a Python loop over token ids.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import torch
import xgrammar as xgr

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

GrammarKind = Literal["json_schema", "regex", "ebnf", "structural_tag"]
GRAMMAR_PARAMS: tuple[GrammarKind, ...] = ("json_schema", "regex", "ebnf", "structural_tag")
ANY_JSON = "$$ANY$$"
"""The json_schema value SGLang uses for `response_format: json_object`: any JSON object/array."""

CompiledGrammar: TypeAlias = xgr.CompiledGrammar

# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: " and may carry a
# "Check failed: (expr) is false: " preamble; neither helps the person who sent the request.
_NATIVE_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*|Check failed: \(.*?\) is false:\s*")
_MAX_REASON_CHARS = 500

# xgrammar (0.2.9 and before) writes each character of a minLength/maxLength-bounded JSON string
# as a bare class that admits raw control characters and no escapes (mlc-ai/xgrammar#800), so
# strict JSON parsers reject the output. We rewrite that rule body; a fixed xgrammar no longer
# prints it, and the rewrite then does nothing.
_BOUNDED_STRING_CHAR = r"(([^\"\\\r\n]))"
_JSON_STRING_CHAR = r'(([^\"\\\0-\x1f]) | ("\\" basic_escape))'


class GrammarError(ValueError):
    """A grammar in the sampling params cannot be used; `param` names the offending key(s)."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class GrammarSpec:
    """What a request asked for; hashable, so it is also the compile cache key."""

    kind: GrammarKind
    source: str


def grammar_spec_from_sampling_params(params: Mapping[str, Any]) -> GrammarSpec | None:
    """Read SGLang's grammar keys; None values count as absent, as in SGLang."""
    given = [key for key in GRAMMAR_PARAMS if params.get(key) is not None]
    if len(given) > 1:
        raise GrammarError(
            f"only one of {', '.join(GRAMMAR_PARAMS)} may be set; got {', '.join(given)}",
            param=",".join(given),
        )
    if not given:
        return None
    kind = given[0]
    value = params[kind]
    if kind in ("json_schema", "structural_tag") and isinstance(value, Mapping):
        value = json.dumps(value)  # keeps key order: it fixes the order of generated properties
    if not isinstance(value, str):
        raise GrammarError(f"{kind} must be a string, got {type(value).__name__}", param=kind)
    return GrammarSpec(kind, value)


class GrammarMatcher:
    """One request's progress through its grammar; fed every sampled token."""

    __slots__ = ("_matcher", "_vocab_size")

    def __init__(self, compiled: CompiledGrammar, vocab_size: int) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self._vocab_size = vocab_size

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar forbids it."""
        # Guard what xgrammar would reject with a log line on stderr.
        if not 0 <= token_id < self._vocab_size or self._matcher.is_terminated():
            return False
        return self._matcher.accept_token(token_id)

    def can_stop(self) -> bool:
        """The output so far is a complete sentence of the grammar, so a stop token is allowed."""
        return self._matcher.is_completed()

    def is_terminated(self) -> bool:
        """The grammar is complete and a stop token was accepted: the request is done."""
        return self._matcher.is_terminated()


class GrammarCompiler:
    """Compiles grammars against one tokenizer and model vocabulary; one per engine.

    `vocab_size` is the model's logits width: ids the tokenizer does not know (padding rows of
    the LM head) are never allowed under a grammar. Stop tokens (the tokenizer's EOS plus
    `stop_token_ids`) are what a grammar allows once it is complete, so generation ends there.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vocab_size: int,
        stop_token_ids: Sequence[int] | None = None,
        *,
        max_cached: int = 256,
        json_any_whitespace: bool = True,
        max_threads: int = 4,
    ) -> None:
        stops = _stop_ids(tokenizer, stop_token_ids, vocab_size)
        self._info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stops or None
        )
        # Our LRU is the only cache: it bounds memory and returns the same object per spec.
        self._compiler = xgr.GrammarCompiler(
            self._info, max_threads=max_threads, cache_enabled=False
        )
        self._cache: OrderedDict[GrammarSpec, CompiledGrammar] = OrderedDict()
        self._max_cached = max_cached
        self._json_any_whitespace = json_any_whitespace
        # Admission (HTTP thread) and decoding (engine thread) may both reach the cache.
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self._info.vocab_size

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self._info.stop_token_ids)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile once per distinct spec; raises GrammarError for an unusable grammar."""
        with self._lock:
            compiled = self._cache.get(spec)
            if compiled is not None:
                self._cache.move_to_end(spec)
                return compiled
        # Compile unlocked: a long schema must not stall the decode loop's cache hits.
        compiled = self._compile_uncached(spec)
        with self._lock:
            compiled = self._cache.setdefault(spec, compiled)
            if len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)
        return compiled

    def new_matcher(self, spec: GrammarSpec) -> GrammarMatcher:
        return GrammarMatcher(self.compile(spec), self.vocab_size)

    def new_masker(self) -> TokenMasker:
        return TokenMasker(self.vocab_size, self.stop_token_ids)

    def _compile_uncached(self, spec: GrammarSpec) -> CompiledGrammar:
        try:
            if spec.kind == "json_schema":
                if spec.source == ANY_JSON:
                    return self._compiler.compile_builtin_json_grammar()
                json.loads(spec.source)  # Python's message for malformed JSON is the clearer one
                return self._compiler.compile_grammar(self._json_schema_grammar(spec.source))
            if spec.kind == "regex":
                return self._compiler.compile_regex(spec.source)
            if spec.kind == "ebnf":
                return self._compiler.compile_grammar(spec.source)
            if spec.kind == "structural_tag":
                json.loads(spec.source)
                return self._compiler.compile_grammar(self._structural_tag_grammar(spec.source))
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarError(f"invalid {spec.kind}: {_reason(exc)}", param=spec.kind) from exc
        raise GrammarError(f"unknown grammar kind {spec.kind!r}", param=str(spec.kind))

    def _json_schema_grammar(self, schema: str) -> xgr.Grammar:
        grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=self._json_any_whitespace)
        text = str(grammar)
        if _BOUNDED_STRING_CHAR not in text or "basic_escape ::=" not in text:
            return grammar
        return xgr.Grammar.from_ebnf(text.replace(_BOUNDED_STRING_CHAR, _JSON_STRING_CHAR))

    def _structural_tag_grammar(self, source: str) -> xgr.Grammar:
        """xgrammar's structural tag, its JSON parts written with this engine's JSON whitespace.

        xgrammar compiles a tag's ``json_schema`` with free whitespace between tokens, which is
        not how a chat template writes JSON: a forced tool call (the gateway's tag: the call's
        JSON, then the parser's closing text) must come out exactly as the template renders it,
        so the next turn extends it token for token. Sequences, alternatives and plain JSON parts
        are therefore built here, the JSON as ``json_schema`` is; every other part is xgrammar's.
        """
        tag = xgr.Grammar.from_structural_tag(source)  # validates the whole tag, as vLLM does
        fmt = json.loads(source).get("format")
        return self._format_grammar(fmt) if _own_format(fmt) else tag

    def _format_grammar(self, fmt: dict[str, Any]) -> xgr.Grammar:
        if _plain_json(fmt):
            return self._json_schema_grammar(json.dumps(fmt["json_schema"]))
        if fmt["type"] in ("sequence", "or"):
            parts = [self._format_grammar(e) for e in fmt["elements"]]
            return (
                xgr.Grammar.concat(*parts)
                if fmt["type"] == "sequence"
                else xgr.Grammar.union(*parts)
            )
        return xgr.Grammar.from_structural_tag(
            json.dumps({"type": "structural_tag", "format": fmt})
        )


class TokenMasker:
    """Masks one decode step's logits `[B, V]` in place; keeps its bitmask between steps."""

    def __init__(self, vocab_size: int, stop_token_ids: Sequence[int] = ()) -> None:
        self.vocab_size = vocab_size
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._filler = xgr.BatchGrammarMatcher()
        # A finished request may only emit a stop token; xgrammar refuses to fill its row.
        self._stop_row = _bitmask_row(stop_token_ids, self._bitmask.shape[1])

    def apply(self, logits: torch.Tensor, matchers: Sequence[GrammarMatcher | None]) -> None:
        """Set disallowed logits to -inf; rows whose matcher is None are left untouched."""
        if logits.dim() != 2 or logits.shape[0] != len(matchers):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(matchers)} matchers")
        if logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits width {logits.shape[1]} != vocab_size {self.vocab_size}")
        live_rows: list[int] = []
        live: list[xgr.GrammarMatcher] = []
        done_rows: list[int] = []
        for row, matcher in enumerate(matchers):
            if matcher is None:
                continue
            if matcher.is_terminated():
                done_rows.append(row)
            else:
                live_rows.append(row)
                live.append(matcher._matcher)
        if not live_rows and not done_rows:
            return
        bitmask = self._rows(len(matchers))
        if live:
            self._filler.batch_fill_next_token_bitmask(live, bitmask, live_rows)
        if done_rows:
            bitmask[done_rows] = self._stop_row
        if logits.device != bitmask.device:
            bitmask = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(
            logits, bitmask, vocab_size=self.vocab_size, indices=live_rows + done_rows
        )

    def _rows(self, batch_size: int) -> torch.Tensor:
        if batch_size > self._bitmask.shape[0]:
            capacity = max(batch_size, 2 * self._bitmask.shape[0])
            self._bitmask = xgr.allocate_token_bitmask(capacity, self.vocab_size)
        return self._bitmask[:batch_size]


def _stop_ids(
    tokenizer: PreTrainedTokenizerBase, extra: Sequence[int] | None, vocab_size: int
) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = ([eos] if isinstance(eos, int) else list(eos or [])) + list(extra or [])
    return [i for i in dict.fromkeys(ids) if 0 <= i < vocab_size]


def _bitmask_row(token_ids: Sequence[int], words: int) -> torch.Tensor:
    words_u32 = [0] * words
    for token_id in token_ids:
        words_u32[token_id // 32] |= 1 << (token_id % 32)
    # int32 is xgrammar's storage type: reinterpret the unsigned words as two's complement.
    return torch.tensor(
        [w - (1 << 32) if w >= 1 << 31 else w for w in words_u32], dtype=torch.int32
    )


_JSON_KEYS = {"type", "json_schema", "style"}


def _own_format(fmt: Any) -> bool:
    """A tag format :meth:`GrammarCompiler._format_grammar` builds: plain JSON parts (no other
    option than the default ``json`` style) in sequences and alternatives, beside anything."""
    if not isinstance(fmt, dict):
        return False
    if fmt.get("type") in ("sequence", "or"):
        elements = fmt.get("elements")
        return isinstance(elements, list) and any(_own_format(e) for e in elements)
    return _plain_json(fmt)


def _plain_json(fmt: dict[str, Any]) -> bool:
    return (
        fmt.get("type") == "json_schema"
        and set(fmt) <= _JSON_KEYS
        and fmt.get("style", "json") == "json"
    )


def _reason(exc: BaseException) -> str:
    reason = _NATIVE_PREFIX.sub("", str(exc).strip()).strip()
    return reason[:_MAX_REASON_CHARS] or type(exc).__name__
