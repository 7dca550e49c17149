"""What ``gateway.log`` and the gateway's error messages hide: a known secret whole, any piece of
it of 12 characters or more (providers echo part of a key they refuse), and key-shaped strings."""

from __future__ import annotations

from areal.host.redact import redact

KEY = "tk-live-0123456789abcdefXYZ"


def test_a_whole_secret_is_hidden() -> None:
    assert redact(f"refused key {KEY}.", (KEY,)) == "refused key ***."


def test_a_piece_of_twelve_or_more_is_hidden() -> None:
    assert redact("key 0123456789ab... is invalid", (KEY,)) == "key ***... is invalid"
    assert redact("ends in 3456789abcdefXYZ", (KEY,)) == "ends in ***"  # 16 characters
    assert redact("ends in 789abcdefXYZ", (KEY,)) == "ends in ***"  # 12: hidden
    assert redact("ends in 89abcdefXYZ", (KEY,)) == "ends in 89abcdefXYZ"  # 11: kept
    # Two pieces far apart are two redactions; the text between them stays.
    assert redact("tk-live-0123 / 56789abcdefX", (KEY,)) == "*** / ***"


def test_key_shaped_strings_are_hidden_without_being_known() -> None:
    assert redact("Authorization: Bearer abcdef123456") == "Authorization: Bearer ***"
    assert redact("sk-proj-abcdefgh") == "sk-***"


def test_text_without_secrets_is_unchanged() -> None:
    text = "upstream 500: internal error, try again"
    assert redact(text, (KEY, "")) == text
