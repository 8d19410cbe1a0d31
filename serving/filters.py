"""Metadata filters and access control: one boolean mask over the documents, for every mode.

A search may carry a *filter* (the same JSON in Python, HTTP, MCP and the CLI) and run as a
*principal* (``serving/principals.py``). Both become one `Mask`: which global document
positions (shards concatenated in docno order) the search may return or read. It is built
here, once per search, from the index's field columns (``pipelines/sources/fields.py``, memory-mapped
per shard, evaluated with vectorized NumPy), and every mode receives the same one:

* BM25 (``serving/lexical/masked.py``) never lets a disallowed document into its top k, and scores
  the allowed ones exactly as unfiltered BM25 does (same floats, same tie-break): pre-
  filtering, so a selective filter never starves top-k.
* Dense asks FAISS for allowed ids only (an ID selector inside the IVF scan).
* Hybrid fuses the two filtered lists; rerank, snippets and context read filtered hits.
* SIRA draws its feedback documents from filtered retrievals, and its DF evidence (which
  expansion terms exist and how common they are) from allowed documents only
  (`Mask.df`), so no expansion term comes from a document the caller cannot read.

The mask travels down through a context variable (`scope` / `current`), set by
``VersionSearcher.search`` around the mode it runs, so a retrieval made anywhere inside a
filtered search (a SIRA proposer, a hybrid expansion, a new mode) is filtered without being
told; the retrievers read it at the one place each asks FAISS or the postings.

Filter language (a JSON object; several keys in one object are ANDed)::

    {"kind": "runbook"}                         equality (a keyword_list: contains it)
    {"kind": {"in": ["runbook", "howto"]}}      one of
    {"year": {"gte": 2020, "lt": 2025}}         ranges on numbers and dates (ISO 8601 strings)
    {"tags": {"any": ["billing", "auth"]}}      lists: at least one of / {"all": [...]}: every one
    {"owner": {"exists": true}}                 present (not null)
    {"path": {"prefix": "docs/advanced/"}}      keywords and lists: a value starting with it
    {"doc_id": {"prefix": "runbooks/"}}         the document id itself: eq, in, prefix
    {"and": [F, ...]}, {"or": [F, ...]}, {"not": F}

An unknown field, an operator that does not apply to a field's type, or a value of the wrong
type is a `SearchError` naming the field and its type (HTTP 400, an MCP tool error);
never a silently empty result. A filter has at most ``MAX_NODES`` conditions, ``MAX_DEPTH``
levels and ``MAX_VALUES`` values in one list; as text (the CLI's ``--filter``) at most
``MAX_FILTER_CHARS`` characters, its JSON nesting measured before it is parsed
(``serving/frontends/safejson.py``: Python's parser would raise RecursionError near 1,000 levels). A
number is one a float holds (an integer of 310 digits or more is refused, not an OverflowError).

Access control: a document's ``acl`` lists the principals and groups that may read it; one
without ``acl`` is public (or private, ``funnel build --acl-absent private``). A principal's
mask (`acl_allow`) is ANDed with any filter; an administrator (the single ``--token``)
and local callers (no principal) see everything. Collection statistics (df, avgdl, hence idf
and scores) stay global, as in Elasticsearch's document-level security; every df a
principal is *shown* (term_stats, explanations, SIRA's trace) is counted over the documents
it may read (`Mask.df`), so no response names how many hidden documents hold a word.
"""

from __future__ import annotations

import contextvars
import json
import math
import os
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from funnel.pipelines.sources.fields import (ACL_FIELD, DATE_MISSING, MAX_KEYWORD_CHARS, column_files, parse_date,
                                     shard_dir)

from .errors import SearchError
from .frontends.safejson import nesting_depth

MAX_NODES = 256
MAX_DEPTH = 8
MAX_VALUES = 1024
#: A filter given as text: characters, and JSON levels (a filter of MAX_DEPTH levels takes
#: about twice as many: {"and": [{...}]} is two per level). Both far above any real filter.
MAX_FILTER_CHARS = 1 << 20
MAX_FILTER_JSON_DEPTH = 4 * MAX_DEPTH
#: Masks kept per index version (filter x principal): a byte per document each, and for a dense
#: search filtered inside FAISS a bitmap (a bit per document).
MASK_CACHE = 16

#: The document id, filterable as if it were a field (unless the index has a field of that name).
DOC_ID_FIELD = "doc_id"

_OPS = {
    "keyword": ("eq", "in", "prefix", "exists"),
    "keyword_list": ("eq", "in", "any", "all", "prefix", "exists"),
    "doc_id": ("eq", "in", "prefix"),
    "number": ("eq", "in", "gte", "gt", "lte", "lt", "exists"),
    "date": ("eq", "in", "gte", "gt", "lte", "lt", "exists"),
    "bool": ("eq", "exists"),
}
_VALUE_OF = {"keyword": "a string", "keyword_list": "a string", "doc_id": "a string", "number": "a number",
             "date": "an ISO 8601 date string (2025-06-01 or 2025-06-01T12:00:00Z)", "bool": "true or false"}


# -- the mask ---------------------------------------------------------------------------------

class Mask:
    """Which documents a search may return or read: ``allow`` (bool, one per global position),
    or None for every document.

    ``restricted``: the search runs as a principal that is not an administrator, so every df
    it is shown is counted over the allowed documents (`df`)."""

    def __init__(self, allow: np.ndarray | None, doc_off: np.ndarray, restricted: bool = False):
        self.allow = allow
        self.doc_off = doc_off
        self.restricted = restricted
        self.count = int(doc_off[-1]) if allow is None else int(np.count_nonzero(allow))
        self._lock = threading.Lock()
        self._u8: np.ndarray | None = None
        self._ids: dict[int, np.ndarray] = {}
        self._df: dict[int, int] = {}
        self._selector = None

    @property
    def everything(self) -> bool:
        return self.allow is None

    def u8(self) -> np.ndarray:
        """``allow`` as uint8 (the kernels' form)."""
        if self._u8 is None:
            self._u8 = self.allow.view(np.uint8)
        return self._u8

    def allowed_ids(self, shard: int) -> np.ndarray:
        """Local ids (int32, ascending) of the shard's allowed documents."""
        got = self._ids.get(shard)
        if got is None:
            lo, hi = int(self.doc_off[shard]), int(self.doc_off[shard + 1])
            got = np.flatnonzero(self.allow[lo:hi]).astype(np.int32)
            self._ids[shard] = got
        return got

    def allows_docno(self, docno: int) -> bool:
        """Whether the document ``docno`` (``shard << 32 | local``) may be returned or read."""
        return self.allow is None or bool(self.allows_docnos(np.array([docno], dtype=np.int64))[0])

    def allows_docnos(self, docnos: np.ndarray) -> np.ndarray:
        """`allows_docno` over an array (bool, one per docno; padding ids -1 and ids
        outside the index are False)."""
        docnos = np.asarray(docnos, dtype=np.int64)
        if self.allow is None:
            return docnos >= 0
        n_shards = len(self.doc_off) - 1
        shard = docnos >> 32
        local = docnos & 0xFFFFFFFF
        ok = (docnos >= 0) & (shard < n_shards)
        s = np.where(ok, shard, 0)
        pos = self.doc_off[s] + local
        ok &= pos < self.doc_off[s + 1]
        out = np.zeros(len(docnos), dtype=bool)
        out[ok] = self.allow[pos[ok]]
        return out

    def faiss_selectors(self, shards: list[int]) -> list:
        """One FAISS ``IDSelector`` per dense shard index, in order (``shards[i]``: the BM25
        shard whose docnos ``shard << 32 | local`` index i holds), admitting the allowed
        documents. Built once per mask and shard list.

        A bitmap of the shard's documents (a bit each: 125 KB per million) rather than a hash
        set of ids: FAISS tests every list entry it scans, and at 1M documents with a tenth
        allowed the hash set's cache misses made the filtered search 1.11x the unfiltered one,
        the bitmap 0.66x. ``IDSelectorBitmap`` tests bit ``id`` counted from its base pointer,
        and shard s's ids start at ``s << 32``: its base is the shard's bits less ``s << 29``
        bytes, behind an ``IDSelectorAnd`` whose ``IDSelectorRange`` of shard s's ids is tested
        first, so no other id ever reaches the bitmap."""
        key = tuple(shards)
        if self._selector is None or self._selector[0] != key:
            import faiss
            sels = [self._shard_selector(faiss, int(s)) for s in shards]
            self._selector = (key, sels)
        return self._selector[1]

    def _shard_selector(self, faiss, s: int):
        if not 0 <= s < len(self.doc_off) - 1:
            return faiss.IDSelectorRange(0, 0)  # a shard this mask does not know: nothing
        lo, hi = int(self.doc_off[s]), int(self.doc_off[s + 1])
        bits = np.packbits(self.allow[lo:hi], bitorder="little")
        base = bits.ctypes.data - (s << 29)
        if base <= 0 or len(bits) == 0:  # (no address to offset from): a hash set of the ids
            ids = np.ascontiguousarray((np.int64(s) << 32) | np.flatnonzero(self.allow[lo:hi]).astype(np.int64))
            sel = faiss.IDSelectorBatch(len(ids), faiss.swig_ptr(ids))
            sel._ids = ids  # the arrays and wrapped selectors live as long as their wrapper
            return sel
        bitmap = faiss.IDSelectorBitmap((s << 29) + len(bits), faiss.cast_integer_to_uint8_ptr(base))
        in_shard = faiss.IDSelectorRange(s << 32, (s + 1) << 32)
        sel = faiss.IDSelectorAnd(in_shard, bitmap)
        sel._keep = (bits, bitmap, in_shard)
        return sel

    def df(self, index, gids: np.ndarray) -> np.ndarray:
        """How many allowed documents hold each global term id (cached per mask)."""
        gids = np.asarray(gids, dtype=np.int64).reshape(-1)
        if self.allow is None:
            return np.asarray(index.df)[gids].astype(np.int64)
        out = np.zeros(len(gids), dtype=np.int64)
        todo = []
        for i, g in enumerate(gids.tolist()):
            got = self._df.get(g)
            if got is None:
                todo.append(i)
            else:
                out[i] = got
        if todo:
            want = gids[todo]
            for s, shard in enumerate(index.shards):
                lo = int(self.doc_off[s])
                local = shard.local_terms(want)
                for j, li in zip(todo, local.tolist()):
                    if li >= 0:
                        d = shard.term_docs(li)
                        out[j] += int(np.count_nonzero(self.allow[lo + d.astype(np.int64)]))
            with self._lock:
                for j in todo:
                    self._df[int(gids[j])] = int(out[j])
        return out

    def df_cf(self, index, g: int | None) -> tuple[int, int]:
        """(documents, occurrences) of global term ``g`` among the allowed documents."""
        if g is None:
            return 0, 0
        if self.allow is None:
            return int(index.df[g]), int(index.cf[g])
        df = cf = 0
        want = np.asarray([g], dtype=np.int64)
        for s, shard in enumerate(index.shards):
            li = int(shard.local_terms(want)[0])
            if li >= 0:
                d, tfs = shard.term_postings(li)
                ok = self.allow[int(self.doc_off[s]) + d.astype(np.int64)]
                df += int(np.count_nonzero(ok))
                cf += int(np.asarray(tfs)[ok].sum())
        return df, cf

    def df_of(self, index, term: str) -> int:
        g = index.vocab.get(term)
        return 0 if g is None else int(self.df(index, np.asarray([g]))[0])


_CURRENT: contextvars.ContextVar[Mask | None] = contextvars.ContextVar("funnel_filter_mask", default=None)


@contextmanager
def scope(mask: Mask | None) -> Iterator[None]:
    """Every retrieval inside this block answers under ``mask`` (None: unfiltered)."""
    token = _CURRENT.set(mask)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> Mask | None:
    """The mask of the search running in this context, or None."""
    return _CURRENT.get()


def active() -> Mask | None:
    """`current` when it leaves some document out (else None: nothing to filter)."""
    m = _CURRENT.get()
    return None if m is None or m.allow is None else m


def restricted() -> Mask | None:
    """`current` when the caller is a principal whose dfs are counted over what it may read."""
    m = _CURRENT.get()
    return m if m is not None and m.restricted else None


# -- the columns ------------------------------------------------------------------------------

class FieldStore:
    """An index version's filterable field columns (``fields/shard-NNNN/``), memory-mapped on
    first use; ``schema`` is ``{name: type}`` (empty for an index without fields)."""

    def __init__(self, ix):
        self.dir = ix.dir
        section = ix.manifest.get("fields") or {}
        self.schema: dict[str, str] = dict(section.get("schema") or {})
        self.acl_absent: str = section.get("acl_absent", "public")
        self.doc_off = np.cumsum([0] + [s.n_docs for s in ix.shards]).astype(np.int64)
        self.n_shards = len(ix.shards)
        self.docs = ix.docs  # doc_id conditions (DOC_ID_FIELD) read the ids
        self._cols: dict[tuple[int, str], dict] = {}
        self._lock = threading.Lock()

    def column(self, shard: int, name: str) -> dict:
        """One shard's column of ``name``: its arrays by suffix, ``vocab`` and ``at`` (value →
        code) for keywords, ``doc_of`` (each list entry's document) for lists."""
        key = (shard, name)
        got = self._cols.get(key)
        if got is not None:
            return got
        ftype = self.schema[name]
        d = shard_dir(self.dir, shard)
        col: dict[str, Any] = {}
        for fname in column_files(name, ftype):
            path = os.path.join(d, fname)
            suffix = fname[len(name) + 1:].split(".")[0]
            if fname.endswith(".json"):
                with open(path) as f:
                    col["vocab"] = json.load(f)
                col["at"] = {v: i for i, v in enumerate(col["vocab"])}
            else:
                col[suffix] = np.load(path, mmap_mode="r")
        if ftype == "keyword_list":
            n = len(col["present"])
            col["doc_of"] = np.repeat(np.arange(n, dtype=np.int32), np.diff(np.asarray(col["ptr"])))
        with self._lock:
            self._cols[key] = col
        return col

    def shard_size(self, shard: int) -> int:
        return int(self.doc_off[shard + 1] - self.doc_off[shard])


# -- parsing ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cond:
    """One condition on one field: ``op`` of ``_OPS[ftype]`` with its normalized value(s)."""

    field: str
    ftype: str
    op: str
    value: Any


def _fields_listed(schema: dict[str, str]) -> str:
    shown = [f"{n} ({t})" for n, t in sorted(schema.items()) if n != ACL_FIELD]
    if DOC_ID_FIELD not in schema:
        shown.append(f"{DOC_ID_FIELD} (the document id: {', '.join(_OPS['doc_id'])})")
    return ", ".join(shown)


def _shown(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 128:
        return f"an integer of about {v.bit_length() * 0.30103:.0f} digits"  # str() refuses 4,300+
    try:
        s = json.dumps(v, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):  # nested too deep to show, or a huge int inside
        return f"a {type(v).__name__} nested too deep to show"
    return s if len(s) <= 60 else s[:59] + "…"


def _value(name: str, ftype: str, op: str, v: Any) -> Any:
    """``v`` normalized for a condition on a field of ``ftype``, or a SearchError."""
    bad = SearchError(f"filter field {name!r} is a {ftype} field: {op!r} takes {_VALUE_OF[ftype]}, "
                      f"got {_shown(v)}")
    if ftype in ("keyword", "keyword_list", "doc_id"):
        if not isinstance(v, str):
            raise bad
        if len(v) > MAX_KEYWORD_CHARS:
            raise SearchError(f"filter field {name!r}: a value of {len(v)} characters; at most {MAX_KEYWORD_CHARS}")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise SearchError(f"filter field {name!r}: a value holds a lone surrogate, which is not text") from None
        return v
    if ftype == "number":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad
        try:
            x = float(v)
        except OverflowError:  # an integer beyond a float's range (309 digits and up)
            raise SearchError(f"filter field {name!r}: {op!r} got {_shown(v)}, beyond the range of a number "
                              "(at most about 1.8e308 in absolute value)") from None
        if not math.isfinite(x):
            raise bad
        return x
    if ftype == "date":
        us = parse_date(v)
        if us is None:
            raise bad
        return us
    if not isinstance(v, bool):
        raise bad
    return v


class _Parser:
    def __init__(self, schema: dict[str, str], allow_acl: bool):
        self.schema = schema
        self.allow_acl = allow_acl
        self.nodes = 0

    def count(self) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise SearchError(f"the filter has more than {MAX_NODES} conditions; simplify it")

    def node(self, obj: Any, depth: int) -> tuple:
        if depth > MAX_DEPTH:
            raise SearchError(f"the filter nests more than {MAX_DEPTH} levels deep; simplify it")
        if not isinstance(obj, dict) or not obj:
            raise SearchError(f"a filter is a non-empty JSON object, e.g. {{\"kind\": \"runbook\"}}; got {_shown(obj)}")
        parts = []
        for key, val in obj.items():
            if key in ("and", "or"):
                if not isinstance(val, list) or not val:
                    raise SearchError(f"filter {key!r} takes a non-empty list of filters, got {_shown(val)}")
                if len(val) > MAX_VALUES:
                    raise SearchError(f"filter {key!r} lists {len(val)} filters; at most {MAX_VALUES}")
                self.count()
                parts.append((key, tuple(self.node(x, depth + 1) for x in val)))
            elif key == "not":
                self.count()
                parts.append(("not", self.node(val, depth + 1)))
            else:
                parts.extend(self.field(key, val))
        return parts[0] if len(parts) == 1 else ("and", tuple(parts))

    def field(self, name: str, val: Any) -> list[tuple]:
        ftype = self.schema.get(name) or ("doc_id" if name == DOC_ID_FIELD else None)
        if ftype is None or (name == ACL_FIELD and not self.allow_acl):
            raise SearchError(f"unknown filter field {name!r}; filterable fields: {_fields_listed(self.schema)}")
        ops = _OPS[ftype]
        if not isinstance(val, dict):
            self.count()
            return [("cond", Cond(name, ftype, "eq", _value(name, ftype, "eq", val)))]
        if not val:
            raise SearchError(f"filter field {name!r}: an empty object; use one of {', '.join(ops)}")
        out = []
        for op, v in val.items():
            self.count()
            if op not in ops:
                raise SearchError(f"filter field {name!r} is a {ftype} field: operator {op!r} does not apply; "
                                  f"use one of {', '.join(ops)}")
            if op == "exists":
                if not isinstance(v, bool):
                    raise SearchError(f"filter field {name!r}: 'exists' takes true or false, got {_shown(v)}")
                out.append(("cond", Cond(name, ftype, op, v)))
            elif op in ("in", "any", "all"):
                if not isinstance(v, list) or not v:
                    raise SearchError(f"filter field {name!r}: {op!r} takes a non-empty list of "
                                      f"{_VALUE_OF[ftype]} values, got {_shown(v)}")
                if len(v) > MAX_VALUES:
                    raise SearchError(f"filter field {name!r}: {op!r} lists {len(v)} values; at most {MAX_VALUES}")
                out.append(("cond", Cond(name, ftype, op, tuple(_value(name, ftype, op, x) for x in v))))
            else:
                out.append(("cond", Cond(name, ftype, op, _value(name, ftype, op, v))))
        return out


def parse_filter(obj: Any, schema: dict[str, str], allow_acl: bool = False) -> tuple:
    """The filter ``obj`` checked against ``schema`` as a tree of ``("and"|"or", children)``,
    ``("not", child)`` and ``("cond", Cond)``; a SearchError naming what is wrong. ``acl`` is
    a field only for ``allow_acl`` (administrators and local callers)."""
    if isinstance(obj, str):
        obj = loads_filter(obj)
    return _Parser(schema, allow_acl).node(obj, 1)


def loads_filter(text: str) -> Any:
    """A filter's JSON text parsed, once it is known to be bounded: at most
    `MAX_FILTER_CHARS` characters and `MAX_FILTER_JSON_DEPTH` levels, measured
    before parsing; a SearchError naming the bound, or what is not JSON, otherwise."""
    if len(text) > MAX_FILTER_CHARS:
        raise SearchError(f"the filter has {len(text):,} characters; at most {MAX_FILTER_CHARS:,}")
    depth = nesting_depth(text, MAX_FILTER_JSON_DEPTH)
    if depth > MAX_FILTER_JSON_DEPTH:
        raise SearchError(f"the filter nests {depth:,} JSON levels deep; a filter takes at most {MAX_DEPTH} "
                          "levels of and/or/not: simplify it")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SearchError(f"the filter is not valid JSON ({e.msg} at character {e.pos}); e.g. "
                          "{\"kind\": \"runbook\"}") from None
    except ValueError as e:  # an integer of over 4,300 digits
        raise SearchError(f"the filter is not valid JSON: {e}") from None


# -- evaluation -------------------------------------------------------------------------------

def _prefix_codes(vocab: list[str], prefix: str) -> tuple[int, int]:
    """``[lo, hi)``: the codes of a keyword column's values that start with ``prefix`` (its
    vocabulary is sorted, so they are one run)."""
    import bisect
    n = len(prefix)
    lo = bisect.bisect_left(vocab, prefix)
    return lo, lo + bisect.bisect_right(range(lo, len(vocab)), prefix, key=lambda j: vocab[j][:n])


def _eval_doc_id(c: Cond, store: FieldStore, s: int) -> np.ndarray:
    """A condition on the document id, over shard ``s``: ids looked up (``eq``, ``in``) or
    the run of sorted ids that starts with the prefix (``DocStore.id_range``)."""
    lo, hi = int(store.doc_off[s]), int(store.doc_off[s + 1])
    out = np.zeros(hi - lo, dtype=bool)
    if c.op == "prefix":
        a, b = store.docs.id_range(c.value)
        pos = store.docs.sorted_positions()[a:b]
        pos = pos[(pos >= lo) & (pos < hi)]
    else:
        pos = store.docs.positions_of((c.value,) if c.op == "eq" else c.value, lo, hi)
    out[pos - lo] = True
    return out


def _eval_cond(c: Cond, store: FieldStore, s: int) -> np.ndarray:
    if c.ftype == "doc_id":
        return _eval_doc_id(c, store, s)
    col = store.column(s, c.field)
    n = store.shard_size(s)
    if c.ftype == "keyword":
        codes = np.asarray(col["codes"])
        if c.op == "exists":
            out = codes >= 0
            return out if c.value else ~out
        if c.op == "prefix":
            a, b = _prefix_codes(col["vocab"], c.value)
            return (codes >= a) & (codes < b)
        vals = (c.value,) if c.op == "eq" else c.value
        want = [col["at"][v] for v in vals if v in col["at"]]
        if not want:
            return np.zeros(n, dtype=bool)
        return codes == want[0] if len(want) == 1 else np.isin(codes, want)
    if c.ftype == "keyword_list":
        if c.op == "exists":
            out = np.asarray(col["present"]).astype(bool)
            return out if c.value else ~out
        if c.op == "prefix":
            a, b = _prefix_codes(col["vocab"], c.value)
            codes = np.asarray(col["codes"])
            out = np.zeros(n, dtype=bool)
            out[col["doc_of"][(codes >= a) & (codes < b)]] = True
            return out
        vals = (c.value,) if c.op == "eq" else c.value
        want = sorted({col["at"][v] for v in vals if v in col["at"]})
        out = np.zeros(n, dtype=bool)
        if c.op == "all" and len(want) < len(set(vals)):
            return out  # a value no document of this shard has
        if not want:
            return out
        codes = np.asarray(col["codes"])
        hit = codes == want[0] if len(want) == 1 else np.isin(codes, want)
        docs = col["doc_of"][hit]
        if c.op == "all":  # each document lists a code once: count the wanted ones it holds
            return np.bincount(docs, minlength=n) == len(want)
        out[docs] = True
        return out
    if c.ftype == "bool":
        v = np.asarray(col["bool"])
        if c.op == "exists":
            return (v >= 0) if c.value else (v < 0)
        return v == int(c.value)
    v = np.asarray(col["f8"] if c.ftype == "number" else col["date"])
    present = ~np.isnan(v) if c.ftype == "number" else v != DATE_MISSING
    if c.op == "exists":
        return present if c.value else ~present
    if c.op == "in":
        return np.isin(v, np.asarray(c.value, dtype=v.dtype)) & present
    x = c.value
    out = {"eq": lambda: v == x, "gte": lambda: v >= x, "gt": lambda: v > x,
           "lte": lambda: v <= x, "lt": lambda: v < x}[c.op]()
    return out & present


def _eval(node: tuple, store: FieldStore, s: int) -> np.ndarray:
    kind = node[0]
    if kind == "cond":
        return _eval_cond(node[1], store, s)
    if kind == "not":
        return ~_eval(node[1], store, s)
    parts = iter(node[1])
    out = _eval(next(parts), store, s).copy()
    for child in parts:
        if kind == "and":
            if not out.any():
                break
            out &= _eval(child, store, s)
        else:
            out |= _eval(child, store, s)
    return out


def evaluate(node: tuple, store: FieldStore) -> np.ndarray:
    """The parsed filter as one bool array over global positions."""
    if store.n_shards == 0:
        return np.zeros(0, dtype=bool)
    return np.concatenate([_eval(node, store, s) for s in range(store.n_shards)])


def acl_allow(store: FieldStore, names: tuple[str, ...]) -> np.ndarray | None:
    """The documents readable by a principal known by ``names`` (its own and its groups'):
    public ones, and those whose ``acl`` names one of them. None: every document (an index
    without ACLs whose absent ``acl`` means public)."""
    if ACL_FIELD not in store.schema:
        if store.acl_absent == "public":
            return None
        return np.zeros(int(store.doc_off[-1]), dtype=bool)
    parts = []
    for s in range(store.n_shards):
        col = store.column(s, ACL_FIELD)
        n = store.shard_size(s)
        out = ~np.asarray(col["present"]).astype(bool) if store.acl_absent == "public" else np.zeros(n, dtype=bool)
        want = [col["at"][x] for x in names if x in col["at"]]
        if want:
            hit = np.isin(np.asarray(col["codes"]), want)
            out[col["doc_of"][hit]] = True
        parts.append(out)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


class MaskCache:
    """Masks of one index version, by (filter, principal): a filter an agent repeats, or a
    principal's ACL, is evaluated once (bounded LRU, ``MASK_CACHE`` entries)."""

    def __init__(self, store: FieldStore):
        self.store = store
        self._masks: OrderedDict[tuple, Mask] = OrderedDict()
        self._acl: OrderedDict[tuple, np.ndarray | None] = OrderedDict()
        self._lock = threading.Lock()

    def _get(self, cache: OrderedDict, key, make):
        with self._lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        value = make()
        with self._lock:
            cache[key] = value
            while len(cache) > MASK_CACHE:
                cache.popitem(last=False)
        return value

    def mask(self, filter: Any, principal) -> Mask | None:
        """The mask of a search with ``filter`` (JSON object or text, or None) run as
        ``principal`` (None or an administrator: every document); None when neither narrows."""
        restricted = principal is not None and not principal.admin
        if filter is None and not restricted:
            return None
        node = None
        if filter is not None:
            node = parse_filter(filter, self.store.schema, allow_acl=not restricted)
        fkey = None if node is None else repr(node)
        pkey = principal.key() if restricted else None

        def make() -> Mask:
            allow = None
            if restricted:
                allow = self._get(self._acl, pkey, lambda: acl_allow(self.store, principal.names()))
            if node is not None:
                f = evaluate(node, self.store)
                allow = f if allow is None else (allow & f)
            return Mask(allow, self.store.doc_off, restricted)

        return self._get(self._masks, (fkey, pkey), make)
