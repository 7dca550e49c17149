"""Errors a command raises for mistakes the user can fix; ``areal`` shows them as one line."""

from __future__ import annotations


class CLIError(Exception):
    """A user error (bad path, unknown name, conflicting options).

    The CLI prints ``error: <message>`` to stderr and exits with code 1; the traceback is shown
    only with ``--debug`` or ``AREAL_DEBUG=1``, because it is noise for someone who mistyped.
    """
