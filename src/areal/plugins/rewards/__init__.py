"""Built-in rewards: rule and verifier functions (exact match, math answer)."""
