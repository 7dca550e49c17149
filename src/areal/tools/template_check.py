"""Is the policy's chat template prefix-stable across turns?

The gateway merges the turns of an episode into one training sequence only when the next prompt
extends the previous prompt + output token for token (docs/architecture.md, "The data path"). A
template that rewrites earlier turns (Qwen3's drops earlier reasoning, some stamp today's date)
silently turns every multi-turn episode into one sample per turn: more prefill, more samples, and
credit assignment that no longer sees the whole episode. This renders a conversation, extends it
by one assistant + user turn, renders again, and reports where the earlier tokens changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from areal.core import trajectory
from areal.core.trajectory import extends

CONTEXT_TOKENS = 12  # how many tokens of text to show on each side of a break

# One ordinary turn with reasoning, then the turn that extends it: the first assistant message is
# the last one when the earlier render is made, the way the engine produced it.
CONVERSATION: tuple[dict[str, Any], ...] = (
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "<think>\n12 + 30 = 42.\n</think>\n\nThe answer is 42."},
)
EXTENSION: tuple[dict[str, Any], ...] = ({"role": "user", "content": "And 42 + 8?"},)


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer this check uses."""

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any: ...

    def encode(self, *args: Any, **kwargs: Any) -> Any: ...

    def decode(self, *args: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class PrefixReport:
    """The outcome: ``break_index`` is None when the earlier tokens are all unchanged."""

    earlier_tokens: int
    later_tokens: int
    break_index: int | None = None
    shared_text: str = ""  # decoded tokens just before the break (the same in both renders)
    earlier_text: str = ""  # decoded tokens from the break on, in the earlier render
    later_text: str = ""  # and in the later one

    @property
    def stable(self) -> bool:
        return self.break_index is None


def render_ids(
    tokenizer: ChatTokenizer, messages: list[dict[str, Any]], *, prompt: bool
) -> list[int]:
    """Token ids the gateway would see (render to text, encode without extra specials)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
    return list(tokenizer.encode(str(text), add_special_tokens=False))


def check_prefix_stability(
    tokenizer: ChatTokenizer,
    conversation: tuple[dict[str, Any], ...] = CONVERSATION,
    extension: tuple[dict[str, Any], ...] = EXTENSION,
) -> PrefixReport:
    """Compare the conversation's tokens with the first tokens of the extended conversation."""
    earlier = render_ids(tokenizer, list(conversation), prompt=False)
    later = render_ids(tokenizer, [*conversation, *extension], prompt=True)
    index = first_difference(earlier, later)
    if index is None:
        return PrefixReport(len(earlier), len(later))
    lo = max(0, index - CONTEXT_TOKENS)
    return PrefixReport(
        len(earlier),
        len(later),
        break_index=index,
        shared_text=str(tokenizer.decode(earlier[lo:index])),
        earlier_text=str(tokenizer.decode(earlier[index : index + CONTEXT_TOKENS])),
        later_text=str(tokenizer.decode(later[index : index + CONTEXT_TOKENS])),
    )


def first_difference(earlier: list[int], later: list[int]) -> int | None:
    """The first index where ``later`` stops extending ``earlier``; None if it extends it."""
    return None if extends(earlier, later) else trajectory.first_difference(earlier, later)
