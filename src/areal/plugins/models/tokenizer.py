"""The embedded default model's tokenizer: a small byte-level BPE trained here, in code.

The embedded default must run with no download at all, so its tokenizer is trained at build time on
a corpus this module generates deterministically (fixed word list, templates, a seeded LCG). The
result is an ordinary Hugging Face tokenizer directory, so every consumer (the trainer, the embedded
engine, the gateway, SGLang) loads it with `AutoTokenizer.from_pretrained` like any other model.

Byte-level BPE with no normalizer means any text, in any script, decodes back exactly.

Special tokens take the first ids, in the order of `SPECIAL_TOKENS` (id == index), mirroring the
relative order of Qwen2.5's `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`. The ChatML markers are
*special* (dropped by `decode(skip_special_tokens=True)`); the tool and think markers are plain
added tokens, one id each but kept in decoded text, so a tool-call parser still sees them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
TOOL_CALL_TOKENS = ("<tool_call>", "</tool_call>")
TOOL_RESPONSE_TOKENS = ("<tool_response>", "</tool_response>")
THINK_TOKENS = ("<think>", "</think>")

# Order fixes the ids: SPECIAL_TOKENS[i] has id i. Append only; never reorder.
SPECIAL_TOKENS: tuple[str, ...] = (
    PAD_TOKEN,
    IM_START_TOKEN,
    EOS_TOKEN,
    *TOOL_CALL_TOKENS,
    *TOOL_RESPONSE_TOKENS,
    *THINK_TOKENS,
)
# Only these are special in the HF sense (skipped when decoding with skip_special_tokens).
_CONTROL_TOKENS = frozenset({PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN})

PAD_TOKEN_ID = SPECIAL_TOKENS.index(PAD_TOKEN)  # 0
IM_START_TOKEN_ID = SPECIAL_TOKENS.index(IM_START_TOKEN)  # 1
EOS_TOKEN_ID = SPECIAL_TOKENS.index(EOS_TOKEN)  # 2

DEFAULT_VOCAB_SIZE = 4096
DEFAULT_MODEL_MAX_LENGTH = 32768
_MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # every byte plus the special tokens

# Pieces BPE may merge within: a contraction, an optionally space-led run of letters (with their
# combining marks), one digit (so numbers stay digit by digit), an optionally space-led run of
# punctuation, line breaks with the spaces before them, then leftover spaces.
_SPLIT_PATTERN = (
    r"(?i:'(?:[sdmt]|ll|ve|re))"
    r"| ?[\p{L}\p{M}]+"
    r"|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


def special_token_ids() -> dict[str, int]:
    """Token → id for every special token; the same for every vocab size and every build."""
    return {token: index for index, token in enumerate(SPECIAL_TOKENS)}


def chat_template() -> str:
    """The ChatML template (Jinja) shipped in `tokenizer_config.json`."""
    return resources.files(__package__).joinpath("chat_template.jinja").read_text(encoding="utf-8")


def build_tokenizer(
    out_dir: str | Path,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
) -> None:
    """Train the tokenizer and write a Hugging Face tokenizer directory to `out_dir`.

    `len(tokenizer)` never exceeds `vocab_size`, so a model whose embedding has `vocab_size` rows
    covers every id. Two builds with the same arguments write byte-identical files.
    """
    if vocab_size < _MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be at least {_MIN_VOCAB_SIZE}, got {vocab_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train(vocab_size)
    (out / "tokenizer.json").write_text(_tokenizer_json(tokenizer), encoding="utf-8")
    _write_json(out / "tokenizer_config.json", _tokenizer_config(model_max_length))
    _write_json(out / "special_tokens_map.json", _special_tokens_map())


def _train(vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[_added_token(token) for token in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus_without_special_tokens(), trainer=trainer)
    return tokenizer


def _added_token(token: str) -> AddedToken:
    return AddedToken(
        token,
        single_word=False,
        lstrip=False,
        rstrip=False,
        normalized=False,
        special=token in _CONTROL_TOKENS,
    )


def _tokenizer_json(tokenizer: Tokenizer) -> str:
    """Serialise, restoring which added tokens are special (the trainer marks them all special)."""
    data = json.loads(tokenizer.to_str())
    for entry in data["added_tokens"]:
        entry["special"] = entry["content"] in _CONTROL_TOKENS
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


def _tokenizer_config(model_max_length: int) -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(index): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": token in _CONTROL_TOKENS,
            }
            for index, token in enumerate(SPECIAL_TOKENS)
        },
        "additional_special_tokens": [IM_START_TOKEN, EOS_TOKEN],
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "right",
        "split_special_tokens": False,
        "chat_template": chat_template(),
    }


def _special_tokens_map() -> dict[str, object]:
    return {
        "additional_special_tokens": [IM_START_TOKEN, EOS_TOKEN],
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
    }


def _write_json(path: Path, data: dict[str, object]) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


# --- training corpus -------------------------------------------------------------------------

_SPECIAL_SPLIT = re.compile("|".join(re.escape(token) for token in SPECIAL_TOKENS))

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "it",
    "you",
    "that",
    "he",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "I",
    "his",
    "they",
    "be",
    "at",
    "one",
    "have",
    "this",
    "from",
    "or",
    "had",
    "by",
    "word",
    "but",
    "what",
    "some",
    "we",
    "can",
    "out",
    "other",
    "were",
    "all",
    "there",
    "when",
    "up",
    "use",
    "your",
    "how",
    "said",
    "an",
    "each",
    "she",
    "which",
    "do",
    "their",
    "time",
    "if",
    "will",
    "way",
    "about",
    "many",
    "then",
    "them",
    "write",
    "would",
    "like",
    "so",
    "these",
    "her",
    "long",
    "make",
    "thing",
    "see",
    "him",
    "two",
    "has",
    "look",
    "more",
    "day",
    "could",
    "go",
    "come",
    "did",
    "number",
    "sound",
    "no",
    "most",
    "people",
    "my",
    "over",
    "know",
    "water",
    "than",
    "call",
    "first",
    "who",
    "may",
    "down",
    "side",
    "been",
    "now",
    "find",
    "any",
    "new",
    "work",
    "part",
    "take",
    "get",
    "place",
    "made",
    "live",
    "where",
    "after",
    "back",
    "little",
    "only",
    "round",
    "man",
    "year",
    "came",
    "show",
    "every",
    "good",
    "me",
    "give",
    "our",
    "under",
    "name",
    "very",
    "through",
    "just",
    "form",
    "sentence",
    "great",
    "think",
    "say",
    "help",
    "low",
    "line",
    "differ",
    "turn",
    "cause",
    "much",
    "mean",
    "before",
    "move",
    "right",
    "boy",
    "old",
    "too",
    "same",
    "tell",
    "does",
    "set",
    "three",
    "want",
    "air",
    "well",
    "also",
    "play",
    "small",
    "end",
    "put",
    "home",
    "read",
    "hand",
    "port",
    "large",
    "spell",
    "add",
    "even",
    "land",
    "here",
    "must",
    "big",
    "high",
    "such",
    "follow",
    "act",
    "why",
    "ask",
    "men",
    "change",
    "went",
    "light",
    "kind",
    "off",
    "need",
    "house",
    "picture",
    "try",
    "us",
    "again",
    "animal",
    "point",
    "mother",
    "world",
    "near",
    "build",
    "self",
    "earth",
    "father",
    "head",
    "stand",
    "own",
    "page",
    "should",
    "country",
    "found",
    "answer",
    "school",
    "grow",
    "study",
    "still",
    "learn",
    "plant",
    "cover",
    "food",
    "sun",
    "four",
    "between",
    "state",
    "keep",
    "eye",
    "never",
    "last",
    "let",
    "thought",
    "city",
    "tree",
    "cross",
    "farm",
    "hard",
    "start",
    "might",
    "story",
    "saw",
    "far",
    "sea",
    "draw",
    "left",
    "late",
    "run",
    "while",
    "press",
    "close",
    "night",
    "real",
    "life",
    "few",
    "north",
    "open",
    "seem",
    "together",
    "next",
    "white",
    "children",
    "begin",
    "got",
    "walk",
    "example",
    "ease",
    "paper",
    "group",
    "always",
    "music",
    "those",
    "both",
    "mark",
    "often",
    "letter",
    "until",
    "mile",
    "river",
    "car",
    "feet",
    "care",
    "second",
    "book",
    "carry",
    "took",
    "science",
    "eat",
    "room",
    "friend",
    "began",
    "idea",
    "fish",
    "mountain",
    "stop",
    "once",
    "base",
    "hear",
    "horse",
    "cut",
    "sure",
    "watch",
    "color",
    "face",
    "wood",
    "main",
    "enough",
    "plain",
    "girl",
    "usual",
    "young",
    "ready",
    "above",
    "ever",
    "red",
    "list",
    "though",
    "feel",
    "talk",
    "bird",
    "soon",
    "body",
    "dog",
    "family",
    "direct",
    "pose",
    "leave",
    "song",
    "measure",
    "door",
    "product",
    "black",
    "short",
    "numeral",
    "class",
    "wind",
    "question",
    "happen",
    "complete",
    "ship",
    "area",
    "half",
    "rock",
    "order",
    "fire",
    "south",
    "problem",
    "piece",
    "told",
    "knew",
    "pass",
    "since",
    "top",
    "whole",
    "king",
    "space",
    "heard",
    "best",
    "hour",
    "better",
    "true",
    "during",
    "hundred",
    "five",
    "remember",
    "step",
    "early",
    "hold",
    "west",
    "ground",
    "interest",
    "reach",
    "fast",
    "verb",
    "sing",
    "listen",
    "six",
    "table",
    "travel",
    "less",
    "morning",
    "ten",
    "simple",
    "several",
    "vowel",
    "toward",
    "war",
    "lay",
    "against",
    "pattern",
    "slow",
    "center",
    "love",
    "person",
    "money",
    "serve",
    "appear",
    "road",
    "map",
    "rain",
    "rule",
    "govern",
    "pull",
    "cold",
    "notice",
    "voice",
    "unit",
    "power",
    "town",
    "fine",
    "certain",
    "fly",
    "fall",
    "lead",
    "cry",
    "dark",
    "machine",
    "note",
    "wait",
    "plan",
    "figure",
    "star",
    "box",
    "noun",
    "field",
    "rest",
    "correct",
    "able",
    "pound",
    "done",
    "beauty",
    "drive",
    "stood",
    "contain",
    "front",
    "teach",
    "week",
    "final",
    "gave",
    "green",
    "quick",
    "develop",
    "ocean",
    "warm",
    "free",
    "minute",
    "strong",
    "special",
    "mind",
    "behind",
    "clear",
    "tail",
    "produce",
    "fact",
    "street",
    "inch",
    "multiply",
    "nothing",
    "course",
    "stay",
    "wheel",
    "full",
    "force",
    "blue",
    "object",
    "decide",
    "surface",
    "deep",
    "moon",
    "island",
    "foot",
    "system",
    "busy",
    "test",
    "record",
    "boat",
    "common",
    "gold",
    "possible",
    "plane",
    "stead",
    "dry",
    "wonder",
    "laugh",
    "thousand",
    "ago",
    "ran",
    "check",
    "game",
    "shape",
    "equate",
    "miss",
    "brought",
    "heat",
    "snow",
    "tire",
    "bring",
    "yes",
    "distant",
    "fill",
    "east",
    "paint",
    "language",
    "among",
    "weather",
    "agent",
    "model",
    "reward",
    "policy",
    "train",
    "step",
    "batch",
    "token",
    "search",
    "result",
    "file",
    "error",
    "value",
    "return",
    "function",
    "request",
    "response",
    "server",
    "client",
    "update",
    "version",
    "data",
    "query",
    "tool",
    "answer",
    "reason",
    "check",
    "math",
    "sum",
]

_SUFFIXES = ("", "", "", "", "", "s", "s", "ed", "ing", "er", "ly", "'s")

_NAMES = [
    "Alice",
    "Bob",
    "Carol",
    "Dave",
    "Erin",
    "Frank",
    "Grace",
    "Heidi",
    "Ivan",
    "Judy",
    "Mallory",
    "Niaj",
    "Olivia",
    "Peggy",
    "Rupert",
    "Sybil",
    "Trent",
    "Victor",
    "Walter",
    "Paris",
    "London",
    "Tokyo",
    "Berlin",
    "Madrid",
    "Rome",
    "Cairo",
    "Lima",
    "Oslo",
    "Seoul",
    "Sydney",
    "Toronto",
]

_FOREIGN = [
    "café",
    "naïve",
    "über",
    "straße",
    "façade",
    "niño",
    "señor",
    "crème",
    "déjà",
    "garçon",
    "Ångström",
    "smörgåsbord",
    "Привет",
    "мир",
    "спасибо",
    "こんにちは",
    "日本語",
    "ありがとう",
    "你好",
    "世界",
    "中文",
    "谢谢",
    "안녕하세요",
    "مرحبا",
    "שלום",
    "नमस्ते",
    "γειά",
    "σου",
    "✓",
    "→",
    "←",
    "≤",
    "≥",
    "±",
    "×",
    "÷",
    "π",
    "∑",
    "∞",
    "€",
    "£",
    "¥",
    "°",
    "•",
    "…",
    "—",
    "–",
    "“",
    "”",
    "‘",
    "’",
    "😀",
    "🚀",
    "👍",
    "🎉",
    "❤️",
    "🤖",
]

_KEYS = ("id", "name", "type", "value", "city", "query", "count", "items", "status", "ok", "path")
_TOOLS = ("get_weather", "search_web", "run_python", "read_file", "calculator", "send_email")
_SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a careful math tutor. Think step by step.",
    "Answer briefly and use the tools when they help.",
)


class _Lcg:
    """A seeded 64-bit LCG: the corpus must not depend on `random`'s algorithm or the Python build."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def below(self, n: int) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return (self.state >> 33) % n

    def pick(self, items: tuple[str, ...] | list[str]) -> str:
        return items[self.below(len(items))]

    def word(self) -> str:
        """A word, sometimes inflected or capitalised, so common word forms earn their own tokens."""
        word = self.pick(_WORDS) + self.pick(_SUFFIXES)
        return word.capitalize() if self.below(8) == 0 else word

    def words(self, low: int, high: int) -> str:
        return " ".join(self.word() for _ in range(low + self.below(high - low + 1)))


def _corpus_without_special_tokens() -> Iterator[str]:
    """Special tokens get their ids up front; text around them is all BPE should learn from."""
    for text in _corpus():
        for piece in _SPECIAL_SPLIT.split(text):
            if piece:
                yield piece


def _corpus(samples: int = 2500) -> Iterator[str]:
    rng = _Lcg(seed=20250501)
    makers = (_prose, _prose, _numbers, _json_snippet, _code, _chat, _foreign)
    for index in range(samples):
        yield makers[index % len(makers)](rng)


def _prose(rng: _Lcg) -> str:
    first = rng.words(4, 12).capitalize()
    return (
        f"{first}, {rng.pick(_NAMES)} said. {rng.words(3, 10).capitalize()}? {rng.words(5, 14)}.\n"
    )


def _numbers(rng: _Lcg) -> str:
    a, b = rng.below(1000), rng.below(1000)
    return (
        f"{a} + {b} = {a + b}\n{a} * {b} = {a * b}\n"
        f"{rng.below(100)}.{rng.below(100):02d}% of {rng.below(10**6)} is about {rng.below(10**4)}.\n"
        f"On 20{rng.below(30):02d}-{1 + rng.below(12):02d}-{1 + rng.below(28):02d} at "
        f"{rng.below(24):02d}:{rng.below(60):02d}, the answer was \\boxed{{{a - b}}}.\n"
    )


def _json_value(rng: _Lcg, depth: int = 0) -> object:
    kind = rng.below(6 if depth < 2 else 4)
    if kind == 0:
        return rng.below(10**5)
    if kind == 1:
        return rng.words(1, 4)
    if kind == 2:
        return (True, False, None)[rng.below(3)]
    if kind == 3:
        return rng.below(1000) / 8
    if kind == 4:
        return [_json_value(rng, depth + 1) for _ in range(1 + rng.below(3))]
    return {rng.pick(_KEYS): _json_value(rng, depth + 1) for _ in range(1 + rng.below(3))}


def _json_snippet(rng: _Lcg) -> str:
    data = {rng.pick(_KEYS): _json_value(rng) for _ in range(1 + rng.below(4))}
    indent = (None, 2, 4)[rng.below(3)]
    return json.dumps(data, indent=indent, ensure_ascii=rng.below(2) == 0) + "\n"


def _code(rng: _Lcg) -> str:
    name, arg, other = rng.pick(_WORDS), rng.pick(_WORDS), rng.pick(_WORDS)
    value = rng.below(100)
    snippets = (
        f"def {name}_{arg}({arg}: int, {other}: str = None) -> int:\n"
        f'    """Return the {name} of {arg}."""\n'
        f"    if {arg} > {value}:\n        return {arg} - {value}\n"
        f"    for i in range(len({other})):\n        {arg} += i\n    return {arg}\n",
        f"class {name.capitalize()}{arg.capitalize()}:\n    def __init__(self):\n"
        f"        self.{other} = []\n        self.count = {value}\n",
        f"const {name} = ({arg}) => {{\n  return {arg}.map((x) => x * {value});\n}};\n",
        f"$ python -m {name}.{arg} --{other} {value} && echo ok\n",
        f"if ({arg} != null && {arg}.length >= {value}) {{ console.log(`{name}`); }}\n",
        f"SELECT {arg}, COUNT(*) FROM {name} WHERE {other} = '{value}' GROUP BY {arg};\n",
    )
    return rng.pick(snippets)


def _chat(rng: _Lcg) -> str:
    tool = rng.pick(_TOOLS)
    args = {rng.pick(_KEYS): _json_value(rng, depth=2) for _ in range(1 + rng.below(2))}
    call = json.dumps({"name": tool, "arguments": args}, ensure_ascii=False)
    result = json.dumps({"result": _json_value(rng, depth=1)}, ensure_ascii=False)
    return (
        f"<|im_start|>system\n{rng.pick(_SYSTEM_PROMPTS)}<|im_end|>\n"
        f"<|im_start|>user\n{rng.words(4, 12).capitalize()}?<|im_end|>\n"
        f"<|im_start|>assistant\n<think>\n{rng.words(5, 15)}.\n</think>\n\n"
        f"<tool_call>\n{call}\n</tool_call><|im_end|>\n"
        f"<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n"
        f"<|im_start|>assistant\nThe answer is {rng.words(2, 6)}.<|im_end|>\n"
    )


def _foreign(rng: _Lcg) -> str:
    return " ".join(rng.pick(_FOREIGN) for _ in range(3 + rng.below(8))) + "\n"
