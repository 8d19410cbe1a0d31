"""The query side's error types, in a module of their own below every other serving module.

``search.py`` raises them and the modes it dispatches to (``sira/``, ``hybrid.py``) raise
them too; keeping them here lets the modes import them without importing ``search.py``
(which imports the modes). ``from funnel.serving.search import SearchError`` still works:
``search.py`` re-exports both.

The front ends map them to their protocols: ``http.py`` answers both with 400 (its
``/health`` lists a ``ModeUnavailable`` mode as not available); ``mcp.py`` returns either
as a tool error whose text is the message.
"""

from __future__ import annotations

__all__ = ["SearchError", "ModeUnavailable"]


class SearchError(ValueError):
    """Bad search input (maps to HTTP 400 / an MCP tool error)."""


class ModeUnavailable(SearchError):
    """The mode exists but this index or configuration cannot serve it."""
