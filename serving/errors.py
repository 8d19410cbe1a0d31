"""The query side's error types, in a module of their own below every other serving module.

``search.py`` raises them and the modes it dispatches to (``sira/``, ``hybrid.py``) raise
them too; keeping them here lets the modes import them without importing ``search.py``
(which imports the modes). ``from funnel.serving.search import SearchError`` still works:
``search.py`` re-exports both.

The front ends map them to their protocols: ``http.py`` answers both with 400 (its
``/health`` lists a ``ModeUnavailable`` mode as not available); ``mcp.py`` returns either
as a tool error whose text is the message. `IndexDamaged` is an
``IndexFormatError``: the index, not the request, is at fault, and both front ends answer
it as they answer a version that cannot be served (HTTP 503, an MCP tool error).
"""

from __future__ import annotations

from funnel.pipelines.store.artifacts import IndexFormatError

__all__ = ["SearchError", "ModeUnavailable", "IndexDamaged", "ShardFault"]


class SearchError(ValueError):
    """Bad search input (maps to HTTP 400 / an MCP tool error)."""


class ModeUnavailable(SearchError):
    """The mode exists but this index or configuration cannot serve it."""


class IndexDamaged(IndexFormatError):
    """A file of the version being served holds a value no sound index has (a document id
    past its shard, a postings range past its array), found while answering a query: its
    bytes changed after the version was opened (``IndexVersion.damaged`` records it and
    stops serving the version). ``file``: the file's path. Maps to HTTP 503."""

    def __init__(self, message: str, file: str | None = None):
        super().__init__(message)
        self.file = file


class ShardFault(Exception):
    """Internal: an impossible value in one shard's ``file`` (relative to the version folder,
    or to the shard's folder where the raiser does not know the shard), and ``reason``.
    ``lexical.retriever.BM25Retriever`` turns it into `IndexDamaged`; it never reaches a caller."""

    def __init__(self, file: str, reason: str):
        super().__init__(f"{file} {reason}")
        self.file = file
        self.reason = reason
