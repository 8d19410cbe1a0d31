"""Structural invariants of an index version's arrays, checked when it is opened.

The compiled BM25 kernels (``serving.kernels``) read the memory-mapped postings through
raw pointers: a document id past the shard, an ``indptr`` running past ``docs``, or a
tf of 0 would make them read or write outside their arrays. They compare each such value
as they read it (``kernels``, "Damaged files"), which keeps a query safe from bytes that
change while a version is served; but a checksum only catches damage where the file was
hashed (under ``verify="cached"`` a flip that leaves a file's stat unchanged is not
re-hashed at open), so every open also checks what the kernels rely on, whatever the
checksums said, and refuses the version with an `IndexFormatError` naming the file
and the broken invariant. When a query finds an impossible value, ``IndexVersion.damaged``
runs these checks again on the shard to name it precisely.

Each check is a vectorized NumPy pass over an array the kernels read anyway (a max read
as unsigned covers both bounds of a range; the order check compares ``_CHUNK`` postings
at a time), so they cost about two reads of ``docs.npy`` and one of ``tfs.npy`` and no
allocation proportional to the postings; ``bench/bench_scrub.py`` measures them.

What is checked, per shard (``pipelines.lexical.postings`` describes the files):

- ``indptr``: one more entry than ``term_gid``, starting at 0, ending at ``len(docs)``,
  never decreasing;
- ``docs``/``tfs``: the same length; every document id within [0, shard documents);
  every tf at least 1; document ids ascending within each term (the kernels gallop
  and bisect over them);
- ``doclen``: one entry per document of the shard's ``docs/shard-NNNN.parquet``, none
  negative;
- ``term_gid``: strictly increasing global term ids within the vocabulary;
- ``term_max_tf`` / ``term_min_dl`` (where present): one per term, within the tf and
  length ranges the length tables are sized for;
- stored block maxima (where present): ``block_start`` one more than the terms, starting
  at 0, each term holding exactly ceil(postings / block) blocks, ending at the length of
  ``block_max`` and ``block_last``; ``term_max`` one per term, ``term_kth`` one per term
  and kept rank;
- stored impacts (where present): ``impacts.npy`` of the dtype ``impacts.json`` names, one
  per posting: uint16 levels, each at least 1 (a level stands for level / 65,535, a BM25 factor
  ``tf / (tf + denom)`` rounded up; a 0 would list a document twice in the exhaustive
  kernels' touched list), or, from builds before the levels, float32 factors in (0, 1] (a NaN
  or a stray value would silently drop documents from the exhaustive kernels' candidates);

and for the version: the shards' documents add up to the manifest's ``n_docs``, the
``docs/ids.arrow`` ranks lie within [0, n_docs), and its doc_id strings are well formed.
An IVF-PQ dense index (re-scored from its float vectors) gets `check_dense_vectors`.
"""

from __future__ import annotations

import json
import os

import numpy as np

from funnel.pipelines.store.artifacts import IndexFormatError

#: Postings per step of the ascending-ids check: its temporary booleans stay in cache
#: (100K synthetic documents, 12M postings: 3 ms a shard in steps of 1M, 7 ms in one step).
_CHUNK = 1 << 20
_HINT = ("the index version is damaged; run `funnel verify INDEX_ROOT` to find every damaged file, "
         "and rebuild the index (funnel build ...)")


def _fail(version_dir: str, rel: str, what: str) -> IndexFormatError:
    """The error naming ``rel``; ``file`` and ``reason`` on it say the same for a caller that
    records them (``IndexVersion.damaged``)."""
    e = IndexFormatError(f"{os.path.join(version_dir, rel)}: {what}; {_HINT}")
    e.file, e.reason = rel, what
    return e


def _vector(version_dir: str, rel: str, a, kinds: str = "iu") -> np.ndarray:
    """``a`` as a plain 1-D ndarray of an integer (or ``kinds``) dtype, or an error naming ``rel``."""
    a = np.asarray(a)
    if a.ndim != 1 or a.dtype.kind not in kinds:
        raise _fail(version_dir, rel, f"holds a {a.ndim}-D array of {a.dtype}, expected a 1-D array of "
                                      f"{'integers' if kinds == 'iu' else 'numbers'}")
    return a


def _in_range(version_dir: str, rel: str, a: np.ndarray, lo: int, hi: int | None, what: str) -> None:
    """Every value of ``a`` in [lo, hi) (``hi`` None: no upper bound); one pass over ``a``."""
    if len(a) == 0:
        return
    if lo == 0 and hi is not None and a.dtype.kind in "iu":  # as unsigned, a negative value is huge
        if int(a.view(a.dtype.str.replace("i", "u")).max()) < hi:
            return
    elif int(a.min()) >= lo and (hi is None or int(a.max()) < hi):
        return
    mn, mx = int(a.min()), int(a.max())
    bad = mn if mn < lo else mx
    where = int(np.flatnonzero(a == bad)[0])
    bound = f"outside [{lo}, {hi})" if hi is not None else f"below {lo}"
    raise _fail(version_dir, rel, f"holds {what} {bad} at position {where}, {bound}")


def _offsets(version_dir: str, rel: str, ptr: np.ndarray, n_items: int, end: int, what: str) -> None:
    """``ptr`` is a CSR offsets array over ``n_items`` items into an array of ``end`` entries."""
    if len(ptr) != n_items + 1:
        raise _fail(version_dir, rel, f"has {len(ptr)} entries, expected {n_items + 1} (one more than the {what})")
    if ptr[0] != 0 or ptr[-1] != end:
        raise _fail(version_dir, rel, f"runs from {int(ptr[0])} to {int(ptr[-1])}, expected 0 to {end}")
    if n_items and int(np.diff(ptr).min()) < 0:
        i = int(np.flatnonzero(np.diff(ptr) < 0)[0])
        raise _fail(version_dir, rel, f"decreases at entry {i + 1} ({int(ptr[i])} then {int(ptr[i + 1])})")


def _ascending_within(version_dir: str, rel: str, docs: np.ndarray, indptr: np.ndarray) -> None:
    """Document ids strictly ascending inside each term's postings (``indptr`` already checked).

    ``drop[i]``: ``docs[i + 1] <= docs[i]``, cleared where ``i + 1`` starts a term; a chunk
    of ``_CHUNK`` postings at a time (one boolean each)."""
    starts = np.asarray(indptr[1:-1])  # where a term's postings begin: a drop is fine there
    starts = starts[(starts > 0) & (starts < len(docs))] - 1
    for lo in range(0, len(docs) - 1, _CHUNK):
        hi = min(lo + _CHUNK, len(docs) - 1)
        drop = docs[lo + 1:hi + 1] <= docs[lo:hi]
        a, b = np.searchsorted(starts, (lo, hi))
        drop[starts[a:b] - lo] = False
        if drop.any():
            j = lo + 1 + int(np.argmax(drop))
            t = int(np.searchsorted(indptr, j, side="right")) - 1
            raise _fail(version_dir, rel, f"lists document {int(docs[j])} after {int(docs[j - 1])} in term "
                                          f"{t}'s postings (position {j}): ids must ascend within a term")


def check_shard(version_dir: str, shard_rel: str, arrays: dict[str, np.ndarray], n_docs: int, n_terms: int,
                blocks: tuple[dict, tuple[np.ndarray, ...]] | None = None,
                impacts: tuple[dict, np.ndarray] | None = None) -> None:
    """Refuse a shard whose arrays break an invariant the kernels rely on (module docstring).

    Parameters
    ----------
    version_dir, shard_rel
        The version folder and the shard's folder inside it (``lexical/shard-NNNN``), for
        the messages.
    arrays
        ``pipelines.lexical.postings.load_shard``'s arrays.
    n_docs
        The shard's documents by its ``docs/shard-NNNN.parquet``.
    n_terms
        Terms in the version's vocabulary.
    blocks
        ``load_block_maxima``'s (key, arrays), or None.
    impacts
        ``load_impacts``'s (key, array), or None.

    Raises
    ------
    IndexFormatError
        Naming the file and what is wrong with it.
    """
    def rel(name: str) -> str:
        return f"{shard_rel}/{name}.npy"

    a = {name: _vector(version_dir, rel(name), arr) for name, arr in arrays.items()}
    indptr, doclen, gid = a["indptr"], a["doclen"], a["term_gid"]
    n_local = len(gid)
    if len(doclen) != n_docs:
        raise _fail(version_dir, rel("doclen"), f"has {len(doclen)} document lengths, but the shard's "
                                                f"documents file holds {n_docs} documents")
    _in_range(version_dir, rel("doclen"), doclen, 0, None, "a document length")
    if "docs" in a:
        docs, tfs = a["docs"], a["tfs"]
        _offsets(version_dir, rel("indptr"), indptr, n_local, len(docs), "shard's terms (term_gid.npy)")
        if len(tfs) != len(docs):
            raise _fail(version_dir, rel("tfs"), f"has {len(tfs)} entries, docs.npy has {len(docs)}: one tf per "
                                                 "posting")
        _in_range(version_dir, rel("docs"), docs, 0, n_docs, "document id")
        _ascending_within(version_dir, rel("docs"), docs, indptr)
        _in_range(version_dir, rel("tfs"), tfs, 1, None, "term frequency")
        n_postings = len(docs)
    else:  # packed postings (serving/lexical/packed.py): the block table here, each block as it is decoded
        from .lexical.packed import PACKED_KEY, check_packed
        shard_dir = os.path.join(version_dir, shard_rel)
        try:
            with open(os.path.join(shard_dir, PACKED_KEY), encoding="utf-8") as f:
                n_postings = int(json.load(f)["postings"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise _fail(version_dir, f"{shard_rel}/{PACKED_KEY}", f"cannot be read ({type(e).__name__}: {e})") from None
        _offsets(version_dir, rel("indptr"), indptr, n_local, n_postings, "shard's terms (term_gid.npy)")
        bad = check_packed(shard_dir, shard_rel, indptr, n_docs)
        if bad is not None:
            raise _fail(version_dir, *bad)
    _in_range(version_dir, rel("term_gid"), gid, 0, n_terms, "global term id")
    if n_local > 1 and int(np.diff(gid.astype(np.int64)).min()) <= 0:
        i = int(np.flatnonzero(np.diff(gid.astype(np.int64)) <= 0)[0])
        raise _fail(version_dir, rel("term_gid"), f"does not increase at entry {i + 1} "
                                                  f"({int(gid[i])} then {int(gid[i + 1])})")
    max_dl = int(doclen.max(initial=0))
    for name, lo, hi in (("term_max_tf", 0, None), ("term_min_dl", 0, max_dl + 1)):
        if name in a:
            if len(a[name]) != n_local:
                raise _fail(version_dir, rel(name), f"has {len(a[name])} entries, expected one per term ({n_local})")
            _in_range(version_dir, rel(name), a[name], lo, hi, "a bound")
    if blocks is not None:
        _check_blocks(version_dir, shard_rel, blocks, indptr)
    if impacts is not None:
        _check_impacts(version_dir, shard_rel, impacts, n_postings)


def _check_impacts(version_dir: str, shard_rel: str, impacts: tuple[dict, np.ndarray], n_postings: int) -> None:
    from funnel.pipelines.lexical.postings import IMPACT_FILE
    rel = f"{shard_rel}/{IMPACT_FILE}"
    key, imp = impacts
    want = key.get("dtype") if isinstance(key, dict) else None
    if want not in ("uint16", "uint8", "float32"):
        raise _fail(version_dir, f"{shard_rel}/impacts.json", f"names dtype {want!r}, expected 'uint16' "
                                                               "(or 'float32' from an older build)")
    imp = _vector(version_dir, rel, imp, "iuf")
    if imp.dtype != np.dtype(want):
        raise _fail(version_dir, rel, f"holds {imp.dtype}, expected {want} (impacts.json)")
    if len(imp) != n_postings:
        raise _fail(version_dir, rel, f"has {len(imp)} entries, docs.npy has {n_postings}: one impact per posting")
    if want != "float32":
        if len(imp) and int(imp.min()) < 1:  # a level stands for level / levels: every impact is above 0
            bad = int(np.argmin(imp))
            raise _fail(version_dir, rel, f"holds level 0 at position {bad}: every impact level is at least 1")
        return
    if len(imp) and not (float(imp.min()) > 0.0 and float(imp.max()) <= 1.0):  # NaN fails both
        bad = np.flatnonzero(~((imp > 0) & (imp <= 1)))[0]
        raise _fail(version_dir, rel, f"holds impact {float(imp[bad])} at position {int(bad)}, outside (0, 1]")


def _check_blocks(version_dir: str, shard_rel: str, blocks: tuple[dict, tuple[np.ndarray, ...]],
                  indptr: np.ndarray) -> None:
    from funnel.pipelines.lexical.postings import BLOCK_FILES, BLOCK_KEY_FILE
    key, arrays = blocks
    rels = [f"{shard_rel}/{n}" for n in BLOCK_FILES]
    size = key.get("block") if isinstance(key, dict) else None
    kth = key.get("kth") if isinstance(key, dict) else None
    if not isinstance(size, int) or size < 1 or not isinstance(kth, list):
        raise _fail(version_dir, f"{shard_rel}/{BLOCK_KEY_FILE}", "does not name a block size and kept ranks")
    bstart, bmax, tmax, tkth, blast = (_vector(version_dir, r, x, "iu" if i in (0, 4) else "iuf")
                                       for i, (r, x) in enumerate(zip(rels, arrays)))
    n_local = len(indptr) - 1
    _offsets(version_dir, rels[0], bstart, n_local, len(bmax), "shard's terms")
    want = (np.diff(indptr) + size - 1) // size
    got = np.diff(bstart)
    if not np.array_equal(got, want):
        t = int(np.flatnonzero(got != want)[0])
        raise _fail(version_dir, rels[0], f"gives term {t} {int(got[t])} blocks for {int(indptr[t + 1] - indptr[t])} "
                                          f"postings, expected {int(want[t])} of {size}")
    if len(blast) != len(bmax):
        raise _fail(version_dir, rels[4], f"has {len(blast)} entries, block_max.npy has {len(bmax)}: one per block")
    if len(tmax) != n_local:
        raise _fail(version_dir, rels[2], f"has {len(tmax)} entries, expected one per term ({n_local})")
    if len(tkth) != n_local * len(kth):
        raise _fail(version_dir, rels[3], f"has {len(tkth)} entries, expected {n_local * len(kth)} "
                                          f"({len(kth)} per term)")


def check_doc_ids(version_dir: str, rel: str, ids, rank: np.ndarray, n_docs: int) -> None:
    """``docs/ids.arrow``: ranks within [0, n_docs), doc_id strings whose offsets stay inside
    their data (``validate(full=True)``), one of each per document."""
    import pyarrow as pa
    rank = _vector(version_dir, rel, rank)
    if len(rank) != n_docs:
        raise _fail(version_dir, rel, f"has {len(rank)} ranks, expected one per document ({n_docs})")
    _in_range(version_dir, rel, rank, 0, n_docs, "a rank")
    if ids is not None:
        try:
            ids.validate(full=True)
        except (pa.ArrowException, ValueError) as e:
            raise _fail(version_dir, rel, f"holds malformed doc_id strings ({e})") from e


def check_dense_vectors(version_dir: str, dense_rel: str, shard: dict, emb: np.ndarray, ids: np.ndarray,
                        dim: int) -> None:
    """The float vectors an IVF-PQ index re-scores from (``serving.dense``, ``ExactScorer``):
    ``emb-NNNN.npy`` float32 ``(count, dim)``, and ``ids-NNNN.npy`` one int64 docno per row,
    all of this shard, ascending (a document's rows are found by bisection, and a row past
    the vectors would fail a query rather than the open).

    Raises
    ------
    IndexFormatError
        Naming the file and what is wrong with it.
    """
    s, count = int(shard["shard"]), int(shard["count"])
    emb_rel = f"{dense_rel}/{shard.get('embeddings', f'emb-{s:04d}.npy')}"
    ids_rel = f"{dense_rel}/{shard.get('ids', f'ids-{s:04d}.npy')}"
    if emb.ndim != 2 or emb.dtype != np.float32 or emb.shape != (count, dim):
        raise _fail(version_dir, emb_rel, f"holds a {emb.dtype} array of shape {emb.shape}, expected float32 "
                                          f"({count}, {dim}): one vector per row of the shard's index")
    ids = _vector(version_dir, ids_rel, ids)
    if len(ids) != count:
        raise _fail(version_dir, ids_rel, f"has {len(ids)} ids, expected one per vector ({count})")
    if count:
        _in_range(version_dir, ids_rel, ids, s << 32, (s + 1) << 32, f"a docno of another shard than {s}:")
        if count > 1 and int(np.diff(ids).min()) < 0:
            i = int(np.flatnonzero(np.diff(ids) < 0)[0])
            raise _fail(version_dir, ids_rel, f"does not ascend at entry {i + 1} ({int(ids[i])} then "
                                              f"{int(ids[i + 1])}): a document's rows must be contiguous")
