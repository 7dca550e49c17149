"""Thin entry points for the seed article commands."""
