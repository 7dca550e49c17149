"""Built-in metrics plugins (later issues)."""
