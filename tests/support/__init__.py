"""What the tests share, importable as ``support`` (``pythonpath = ["tests"]`` in pyproject).

One way to wait (:func:`eventually`), one in-process gateway, one set of HTTP helpers: a helper
written twice is a helper missing. Nothing here is a test; nothing here knows a test's module.
"""

from support.wait import eventually, eventually_async

__all__ = ["eventually", "eventually_async"]
