"""Built-in trainer plugins (later issues)."""
