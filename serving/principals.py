"""Who is calling: principals, groups, and the tokens file the servers read them from.

    funnel serve INDEX_ROOT --tokens tokens.json [--token ADMIN_TOKEN]
    funnel mcp INDEX_ROOT --transport streamable-http --tokens tokens.json

``tokens.json`` maps the sha256 (hex) of each token to the principal it authenticates::

    {"5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8":
         {"principal": "alice", "groups": ["eng", "oncall"]}}

(``printf %s TOKEN | sha256sum`` gives the key), so the file holds no token itself. It is
read again when its modification time or size changes, at most once a second, without a
restart: a removed line stops authenticating at once; a file that no longer parses (or
nests deeper than ``MAX_DEPTH`` levels, measured before parsing: ``serving/frontends/safejson.py``)
keeps the last good mapping and logs why, and at start is refused with a ValueError. The single ``--token`` authenticates an administrator,
who sees every document. A request is searched as its principal: it sees a document that is
public or whose ``acl`` names the principal or one of its groups (``serving/filters.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass

from .frontends.safejson import check_depth

log = logging.getLogger(__name__)

#: Seconds between two checks of the tokens file's stat.
RELOAD_CHECK_S = 1.0
MAX_NAME_CHARS = 256
#: JSON levels a tokens file may nest: its own shape takes 3 ({digest: {"groups": [...]}}).
MAX_DEPTH = 16


@dataclass(frozen=True)
class Principal:
    """A caller: its name, its groups, and whether it is an administrator (sees everything)."""

    name: str
    groups: tuple[str, ...] = ()
    admin: bool = False

    def names(self) -> tuple[str, ...]:
        """The names an ``acl`` may list to let this principal read a document."""
        return (self.name, *self.groups)

    def key(self) -> tuple:
        return (self.name, tuple(sorted(set(self.groups))), self.admin)


#: The single ``--token`` of ``funnel serve`` / ``funnel mcp``.
ADMIN = Principal("admin", (), admin=True)


def principal(name: str, groups=(), admin: bool = False) -> Principal:
    """A `Principal`, its name and groups checked (non-empty strings)."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS:
        raise ValueError(f"a principal is a non-empty name of at most {MAX_NAME_CHARS} characters, got {name!r}")
    if isinstance(groups, str) or not all(isinstance(g, str) and g.strip() for g in groups):
        raise ValueError(f"principal {name!r}: groups must be a list of non-empty names, got {groups!r}")
    return Principal(name, tuple(groups), admin)


def token_digest(token: str) -> str:
    """The key of ``token`` in a tokens file: its sha256, hex."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_tokens(data: object, where: str) -> dict[str, Principal]:
    """A tokens file's JSON as {sha256 hex: Principal}; a ValueError naming the bad entry."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a tokens file is a JSON object mapping sha256(token) hex to "
                         '{"principal": NAME, "groups": [...]}')
    out = {}
    for digest, entry in data.items():
        d = str(digest).lower()
        if len(d) != 64 or any(c not in "0123456789abcdef" for c in d):
            raise ValueError(f"{where}: key {str(digest)[:20]!r}… is not a sha256 hex digest (64 hex characters; "
                             "printf %s TOKEN | sha256sum)")
        if not isinstance(entry, dict) or "principal" not in entry:
            raise ValueError(f"{where}: entry {d[:12]}… must be an object with \"principal\" "
                             "(and optional \"groups\")")
        groups = entry.get("groups") or []
        if not isinstance(groups, list):
            raise ValueError(f"{where}: entry {d[:12]}…: \"groups\" must be a list of names, got "
                             f"{type(groups).__name__}")
        try:
            out[d] = principal(entry["principal"], tuple(groups))
        except ValueError as e:
            raise ValueError(f"{where}: entry {d[:12]}…: {e}") from None
    return out


class TokenFile:
    """The principals of a tokens file, read again when the file changes (see the module
    docstring). `lookup` is safe from many threads."""

    def __init__(self, path: str, check_s: float = RELOAD_CHECK_S):
        self.path = os.path.abspath(path)
        self.check_s = check_s
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stat: tuple | None = None
        self._checked = 0.0
        self._table = self._read()  # a bad file at start is an error, not an empty table

    def _read(self) -> dict[str, Principal]:
        st = os.stat(self.path)
        with open(self.path, "rb") as f:
            raw = f.read()
        check_depth(raw, MAX_DEPTH, f"{self.path}: the tokens file (a JSON object of sha256 hex to "
                                    '{"principal": NAME, "groups": [...]})')
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, too many digits
            raise ValueError(f"{self.path}: not valid JSON ({e})") from None
        table = parse_tokens(data, self.path)
        self._stat = (st.st_mtime_ns, st.st_size, st.st_ino)
        return table

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.check_s:
            return
        with self._lock:
            if now - self._checked < self.check_s:
                return
            self._checked = now
            try:
                st = os.stat(self.path)
                if (st.st_mtime_ns, st.st_size, st.st_ino) == self._stat:
                    return
                self._table = self._read()
                self.error = None
                log.info("tokens file %s reloaded: %d principals", self.path, len(self._table))
            except Exception as e:  # noqa: BLE001 - whatever the file holds, the last good mapping serves on
                why = str(e) if isinstance(e, (OSError, ValueError)) else f"{type(e).__name__}: {e}"
                if why != self.error:
                    log.error("tokens file %s could not be reloaded; keeping the last good one: %s", self.path, why)
                self.error = why

    def lookup(self, token: str) -> Principal | None:
        """The principal ``token`` authenticates, or None."""
        self._maybe_reload()
        # Looked up by digest: the lookup's timing can only tell about sha256 values, which do
        # not help anyone guess a token.
        return self._table.get(token_digest(token))

    def __len__(self) -> int:
        return len(self._table)


class AsPrincipal:
    """A searcher bound to one principal: ``search``, ``search_batch``, ``get_document``,
    ``get_documents``, ``list_documents`` and ``term_stats`` run as it
    (``as_principal(open_index(root), principal("alice", ["eng"]))``). The same guarantees as the servers give their callers; in-process code that holds the
    searcher itself can still read everything, as the CLI does."""

    def __init__(self, searcher, who: Principal):
        self._searcher = searcher
        self.principal = who

    def search(self, query: str, mode: str = "bm25", k: int = 10, **kwargs):
        return self._searcher.search(query, mode, k, principal=self.principal, **kwargs)

    def search_batch(self, queries, mode: str = "bm25", k: int = 100, **kwargs):
        return self._searcher.search_batch(queries, mode, k, principal=self.principal, **kwargs)

    def get_document(self, doc_id: str, *args, **kwargs) -> dict | None:
        return self._searcher.get_document(doc_id, *args, principal=self.principal, **kwargs)

    def get_documents(self, doc_ids: list[str] | None = None, *args, **kwargs) -> dict:
        return self._searcher.get_documents(doc_ids, *args, principal=self.principal, **kwargs)

    def list_documents(self, *args, **kwargs) -> dict:
        return self._searcher.list_documents(*args, principal=self.principal, **kwargs)

    def term_stats(self, terms: list[str]) -> list[dict]:
        return self._searcher.term_stats(terms, principal=self.principal)


def as_principal(searcher, who: Principal) -> AsPrincipal:
    """``searcher`` bound to ``who`` (`AsPrincipal`)."""
    return AsPrincipal(searcher, who)
