"""The agent gateway (issue on the gateway)."""
