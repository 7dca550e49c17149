"""Agent adapters (issue on adapters)."""
