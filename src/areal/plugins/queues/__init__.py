"""Built-in queues plugins (later issues)."""
