"""Built-in rewards plugins (later issues)."""
