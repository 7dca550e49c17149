"""Built-in losses plugins (later issues)."""
