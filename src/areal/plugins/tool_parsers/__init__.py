"""Built-in tool-call parsers, one per chat-template family."""
