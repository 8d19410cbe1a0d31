"""Read and write the evaluation files: TREC runs, qrels and BEIR queries.

Why: every evaluation in funnel (metrics, paired comparison, answer coverage) works on
plain files, so that a run from funnel, Pyserini/Anserini or any other system can be
compared without an index. The formats are:

* **TREC run**: one line per retrieved document, ``qid Q0 docid rank score tag``
  (whitespace separated). trec_eval ignores the ``rank`` column and re-sorts each query
  by ``score`` descending, breaking ties by ``docid`` in *descending* string order; every
  figure funnel prints follows that order by default (`ranked_docids`).
  `write_run` writes ranks 1..n in funnel's own order (ties by ``docid``
  ascending, Anserini's rule) and the exact scores, so trec_eval on the file and
  `funnel.evaluation.metrics.evaluate` on the run in memory print the same figure.
* **qrels**: BEIR ``qrels/<split>.tsv`` (``query-id<TAB>corpus-id<TAB>score`` with a
  header line) or TREC qrels (``qid 0 docid rel``). Relevance is an integer grade;
  a document is relevant when its grade is >= 1 (trec_eval's default).
* **queries**: BEIR ``queries.jsonl`` (``{"_id", "text", "metadata"?}`` per line), or a
  ``qid<TAB>text`` file.

Files ending in ``.gz`` are read and written gzip-compressed. Malformed lines raise a
``ValueError`` that names the file, the line number and the expected format.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

import numpy as np

if TYPE_CHECKING:
    from . import runbytes  # imported where a run is written: it loads numba (~0.2 s)

logger = logging.getLogger(__name__)

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]

PathLike = str | os.PathLike[str]

_BEIR_QRELS_HEADER = ("query-id", "corpus-id", "score")


def open_text(path: PathLike, mode: str = "r") -> TextIO:
    """Open ``path`` as UTF-8 text, through gzip when it ends in ``.gz``."""
    if str(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, mode + "b"), encoding="utf-8")
    return open(path, mode, encoding="utf-8", newline="\n" if "w" in mode else None)


@contextlib.contextmanager
def published_text(path: PathLike) -> Iterator[TextIO]:
    """A file opened for writing with `open_text` that appears at ``path`` whole or not
    at all: it is written beside ``path`` under a hidden temporary name and renamed over it
    once closed, so a run cut short (an error, a full disk, a kill) leaves any earlier file
    there as it was and no partial one. A path that is not a plain file (``/dev/stdout``, a
    pipe, a symlink) is written in place."""
    path = os.fspath(path)
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
        with open_text(path, "w") as f:
            yield f
        return
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp" + (".gz" if path.endswith(".gz") else ""))
    try:
        with open_text(tmp, "w") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, stripped_line)`` for the non-blank lines of ``path``."""
    with open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            line = line.strip()
            if line:
                yield lineno, line


TIE_ORDERS = ("trec_eval", "rank")


def check_ties(ties: str) -> str:
    """Validate a tie-order name (see `ranked_docids`); returns it."""
    if ties not in TIE_ORDERS:
        raise ValueError(f"unknown tie order {ties!r}; choose one of {', '.join(TIE_ORDERS)}")
    return ties


def ranked_docids(scores: Mapping[str, float], k: int | None = None, ties: str = "trec_eval") -> list[str]:
    """Doc ids of one query in ranking order, optionally cut at ``k``.

    Parameters
    ----------
    scores : Mapping[str, float]
        ``{docid: score}`` for one query.
    k : int, optional
        Keep only the first ``k`` documents.
    ties : {"trec_eval", "rank"}
        ``"trec_eval"`` (default): score descending, ties by docid *descending*, the order
        trec_eval (``form_res_rels.c``: ``strcmp(d2, d1)``) evaluates, so every cut agrees
        with the published figures. ``"rank"``: score descending, ties by docid ascending,
        the order funnel (and Anserini) rank in and `write_run` writes.

    Returns
    -------
    list[str]
    """
    if check_ties(ties) == "trec_eval":
        # Python compares str by code point, which for UTF-8 is strcmp's byte order.
        order = sorted(scores.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    else:
        order = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    docids = [d for d, _ in order]
    return docids if k is None else docids[:k]


def read_run(path: PathLike) -> Run:
    """Read a TREC run file (plain or ``.gz``).

    Parameters
    ----------
    path : str or PathLike
        File with lines ``qid Q0 docid rank score tag``.

    Returns
    -------
    dict[str, dict[str, float]]
        ``{qid: {docid: score}}``; the rank column is ignored, as trec_eval does.

    Raises
    ------
    ValueError
        A line without 6 columns, a non-numeric score, or the same (qid, docid) twice.
    """
    run: Run = {}
    for lineno, line in _lines(path):
        parts = line.split()
        if len(parts) != 6:
            raise ValueError(
                f"{path}:{lineno}: expected 6 columns 'qid Q0 docid rank score tag', "
                f"got {len(parts)}: {line!r}; is this a TREC run file?"
            )
        qid, _, docid, _, score_s, _ = parts
        try:
            score = float(score_s)
        except ValueError:
            raise ValueError(
                f"{path}:{lineno}: score {score_s!r} is not a number (column 5 of "
                f"'qid Q0 docid rank score tag')"
            ) from None
        docs = run.setdefault(qid, {})
        if docid in docs:
            raise ValueError(
                f"{path}:{lineno}: document {docid!r} appears twice for query {qid!r}; "
                "a run lists each document once per query, deduplicate the run"
            )
        docs[docid] = score
    logger.debug("read run %s: %d queries", path, len(run))
    return run


TIEBREAK_DECIMALS = 4
TIEBREAK_STEP = 1e-6


def tiebreak(docs: Mapping[str, float]) -> dict[str, float]:
    """Scores of one query as Anserini writes them: no exact ties left.

    Anserini's ``ScoreTiesAdjusterReranker`` (behind every Pyserini BEIR figure) rounds each
    score to 4 decimals, orders by rounded score descending and docid ascending, and lowers
    the i-th document of a group of equal rounded scores by ``i · 1e-6`` (4.6189, 4.618899,
    ...). trec_eval re-sorts exact ties by docid *descending*; a run with no exact ties is
    evaluated in the order it was written. Writing runs this way is what makes trec_eval of
    funnel's run file print the published figure (NFCorpus BM25 NDCG@10 0.3218; with the raw
    scores, whose exact ties trec_eval re-sorts by docid descending, it prints 0.3206).

    Parameters
    ----------
    docs : Mapping[str, float]
        ``{docid: score}`` for one query.

    Returns
    -------
    dict[str, float]
        ``{docid: adjusted score}`` in ranking order, rounded to 6 decimals so the values
        survive a round trip through a run file unchanged.
    """
    rounded = sorted(((round(float(s), TIEBREAK_DECIMALS), d) for d, s in docs.items()),
                     key=lambda sd: (-sd[0], sd[1]))
    out: dict[str, float] = {}
    prev, dup = None, 0
    for score, docid in rounded:
        dup = dup + 1 if score == prev else 0
        prev = score
        out[docid] = round(score - dup * TIEBREAK_STEP, 6)
    return out


def tiebreak_run(run: Mapping[str, Mapping[str, float]]) -> Run:
    """`tiebreak` applied to every query of a run."""
    return {qid: tiebreak(docs) for qid, docs in run.items()}


# Modes whose published reference runs come from Anserini (Lucene BM25, and SIRA's weighted
# BM25 call). Dense and hybrid references (BEIR, MTEB) evaluate the raw float scores.
ANSERINI_MODES = frozenset({"bm25", "sira"})


def run_as_written(run: Mapping[str, Mapping[str, float]], mode: str) -> Run:
    """The run as funnel writes it for ``mode``: Anserini's `tiebreak` for the lexical
    modes, the exact scores for the others. Evaluating this is evaluating the file."""
    if mode in ANSERINI_MODES:
        return tiebreak_run(run)
    return {qid: {d: float(s) for d, s in docs.items()} for qid, docs in run.items()}


def write_run(path: PathLike, run: Mapping[str, Mapping[str, float]], tag: str) -> None:
    """Write ``run`` as a TREC run file (gzip-compressed when ``path`` ends in ``.gz``).

    Parameters
    ----------
    path : str or PathLike
        Output file; its parent directory must exist.
    run : Mapping[str, Mapping[str, float]]
        ``{qid: {docid: score}}``; queries are written in the mapping's order.
    tag : str
        The run tag (last column); no whitespace.

    Notes
    -----
    Ranks are 1-based, by score descending, ties by docid ascending (funnel's order;
    trec_eval ignores the rank column). Scores are written with ``repr``, never rounded,
    so that `read_run` gives back exactly the same floats: the file has exactly the
    ties the run in memory has, and evaluates to the same figures. The file appears whole
    or not at all (`published_text`).
    """
    if not tag or _BAD_ID.search(tag):
        raise ValueError(f"run tag {tag!r} must be non-empty without whitespace; use e.g. 'funnel-bm25'")
    with published_text(path) as f:
        for qid, docs in run.items():
            # One regex over the query's ids concatenated: one C call per query instead of a
            # Python step per character (write_run was a third of a CLI batch run).
            if not qid or "" in docs or _BAD_ID.search("".join((str(qid), *map(str, docs)))):
                bad = next(d for d in (qid, *docs) if not d or _BAD_ID.search(str(d)))
                raise ValueError(f"query {qid!r}: id {bad!r} is empty or contains whitespace, "
                                 "which a TREC run cannot represent")
            if any(map(math.isnan, docs.values())):
                bad = next(d for d, s in docs.items() if math.isnan(s))
                raise ValueError(f"query {qid!r}, document {bad!r}: score is NaN; fix the scorer")
            ordered = sorted(docs.items(), key=_run_order)
            f.write("".join([f"{qid} Q0 {d} {r} {float(s)!r} {tag}\n"
                             for r, (d, s) in enumerate(ordered, start=1)]))


def _run_order(kv: tuple[str, float]) -> tuple[float, str]:
    return (-kv[1], kv[0])


class RunRows(NamedTuple):
    """Part of a run as arrays: query ``qids[i]``'s hits are ``doc_ids[i, :counts[i]]``
    (str) with ``scores[i, :counts[i]]``, best first (entries past ``counts[i]`` are
    padding). What ``Searcher.search_batch_rows`` returns and `write_run_rows` writes.
    ``positions`` and ``names`` (an index's ``runbytes.IdTable``), where given, are where the
    ids come from: the doc ids at ``positions`` in ``names``; the tie-broken lines are then
    written straight from them (``runbytes.write_rows``)."""

    qids: list[str]
    doc_ids: np.ndarray
    scores: np.ndarray
    counts: np.ndarray
    positions: np.ndarray | None = None
    names: runbytes.IdTable | None = None


def _round_like_python(x: np.ndarray, decimals: int) -> np.ndarray:
    """``round(v, decimals)`` of every element, bit for bit.

    ``rint(x·10^d) / 10^d`` is Python's correctly rounded result wherever ``x·10^d`` is
    not within rounding error of a half-integer (the integer is then the same, and both
    sides end in one correctly rounded division or conversion of that integer over 10^d);
    the few elements near a half, or too large for that margin, go through ``round``."""
    scale = 10.0 ** decimals
    y = x * scale
    out = np.rint(y) / scale
    risky = (np.abs(y - np.floor(y) - 0.5) < 1e-6) | ~(np.abs(y) < 1e12)
    if risky.any():
        out[risky] = [round(v, decimals) for v in x[risky].tolist()]
    return out


def _sort_rows(ids: np.ndarray, scores: np.ndarray, valid: np.ndarray) -> None:
    """Put each row in run order (score descending, docid ascending) in place; rows already
    in that order are only checked, in bulk. A row whose scores are in order but not its ties
    (the tie-break's rounding to 4 decimals makes new ties: ~1 row in 10 on SciFact at
    k=100) has only its runs of equal scores sorted."""
    nxt = valid[:, 1:]
    eq = (scores[:, :-1] == scores[:, 1:]) & nxt
    bad = (scores[:, :-1] < scores[:, 1:]) & nxt
    r, c = np.nonzero(eq)
    if len(r):
        bad[r, c] |= np.asarray(ids[r, c] > ids[r, c + 1], dtype=bool)
    for i in np.flatnonzero(bad.any(axis=1)).tolist():
        n = int(valid[i].sum())
        row = scores[i, :n]
        if not (row[:-1] < row[1:]).any():  # scores in order (tie-breaking's rounding keeps
            # them so): only runs of equal scores need their ids sorted
            starts = np.flatnonzero(np.concatenate(([True], row[1:] != row[:-1]))).tolist() + [n]
            for a, b in zip(starts, starts[1:]):
                if b - a > 1:
                    ids[i, a:b] = sorted(ids[i, a:b].tolist())
            continue
        pairs = sorted(zip(ids[i, :n].tolist(), row.tolist()), key=_run_order)
        ids[i, :n] = [d for d, _ in pairs]
        scores[i, :n] = [s for _, s in pairs]


def _tiebreak_rows(ids: np.ndarray, scores: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """`tiebreak` of every row at once (rows already in run order on return)."""
    s = _round_like_python(scores, TIEBREAK_DECIMALS)
    _sort_rows(ids, s, valid)
    col = np.broadcast_to(np.arange(s.shape[1]), s.shape)
    same = np.zeros(s.shape, dtype=bool)
    same[:, 1:] = (s[:, 1:] == s[:, :-1]) & valid[:, 1:]
    start = np.maximum.accumulate(np.where(same, 0, col), axis=1)
    return _round_like_python(s - (col - start) * TIEBREAK_STEP, 6)


def write_run_rows(path: PathLike, parts: Iterable[RunRows], tag: str, *, tiebreak: bool) -> int:
    """Write a run given as `RunRows` parts: the same bytes as
    ``write_run(path, run_as_written(run, mode), tag)`` for the same hits, with
    ``tiebreak`` for the modes written the Anserini way (`ANSERINI_MODES`). Returns
    the number of queries written. The file appears whole or not at all (`published_text`).

    Whole arrays at a time instead of a Python step per hit (the dict path spent about five
    times the retrieval's time in tie-breaking and formatting at k=100): scores rounded
    in bulk (`_round_like_python`), row order checked in bulk, and each part
    formatted by one ``%`` over all of its lines, or, where the tie-broken scores and ASCII
    ids allow it, by one compiled pass that writes the same bytes
    (`funnel.evaluation.runbytes.part_bytes`).
    """
    from . import runbytes
    if not tag or _BAD_ID.search(tag):
        raise ValueError(f"run tag {tag!r} must be non-empty without whitespace; use e.g. 'funnel-bm25'")
    written = 0
    with published_text(path) as f:
        for part in parts:
            qids = [str(q) for q in part.qids]
            shape = np.shape(part.doc_ids)
            counts = np.asarray(part.counts, dtype=np.int64)
            if len(shape) != 2 or np.shape(part.scores) != shape or counts.shape != (len(qids),) \
                    or shape[0] != len(qids):
                raise ValueError(f"run rows: doc_ids {shape}, scores {np.shape(part.scores)}, counts "
                                 f"{counts.shape} and {len(qids)} qids do not match")
            n = 0
            if tiebreak and part.names is not None and np.shape(part.positions) == shape:
                # straight from the positions: tie-break and lines in one compiled pass
                f.flush()  # ASCII, so the same bytes as through the text layer
                n = runbytes.write_rows(f.buffer.write, qids, part.positions, part.scores, counts, part.names, tag)
                written += n
                if n == len(qids):
                    continue
            # the general way (from the row the compiled pass left, if any)
            qids, counts = qids[n:], counts[n:]
            ids = np.array(part.doc_ids[n:], dtype=object)  # copies: rows are reordered in place
            scores = np.array(part.scores[n:], dtype=np.float64)
            valid = np.arange(ids.shape[1])[None, :] < counts[:, None]
            if tiebreak and not np.isnan(scores[valid]).any():  # the compiled formatter, where it applies
                done = ids.copy()
                b = runbytes.part_bytes(qids, done, _tiebreak_rows(done, scores, valid), valid, counts, tag)
                if b is not None:
                    f.flush()  # ASCII, so the same bytes as through the text layer
                    f.buffer.write(b)
                    written += len(qids)
                    continue
            flat_ids = [str(d) for d in ids[valid].tolist()]
            if "" in qids or "" in flat_ids or _BAD_ID.search("".join(qids + flat_ids)):
                bad = next(d for d in qids + flat_ids if not d or _BAD_ID.search(d))
                raise ValueError(f"id {bad!r} is empty or contains whitespace, which a TREC run "
                                 "cannot represent")
            if np.isnan(scores[valid]).any():
                i, j = map(int, np.argwhere(np.isnan(scores) & valid)[0])
                raise ValueError(f"query {qids[i]!r}, document {ids[i, j]!r}: score is NaN; fix the scorer")
            if tiebreak:
                scores = _tiebreak_rows(ids, scores, valid)
            _sort_rows(ids, scores, valid)
            n = int(valid.sum())
            cells: list[Any] = [None] * (5 * n)
            cells[0::5] = np.repeat(np.asarray(qids, dtype=object), counts).tolist()
            cells[1::5] = ids[valid].tolist()
            cells[2::5] = (np.broadcast_to(np.arange(1, ids.shape[1] + 1), ids.shape)[valid]).tolist()
            cells[3::5] = scores[valid].tolist()
            cells[4::5] = [tag] * n
            step = 5 * 65536  # lines per write: bounded memory for huge parts
            for a in range(0, len(cells), step):
                chunk = cells[a:a + step]
                f.write(("%s Q0 %s %d %r %s\n" * (len(chunk) // 5)) % tuple(chunk))
            written += len(qids)
    return written


_BAD_ID = re.compile(r"\s")


def _parse_grade(value: str, path: PathLike, lineno: int) -> int:
    try:
        grade = float(value)
    except ValueError:
        grade = math.nan
    if not math.isfinite(grade) or grade != int(grade):
        raise ValueError(f"{path}:{lineno}: relevance {value!r} is not an integer grade")
    return int(grade)


def read_qrels(path: PathLike) -> Qrels:
    """Read relevance judgements in BEIR tsv or TREC qrels format.

    Parameters
    ----------
    path : str or PathLike
        BEIR ``query-id corpus-id score`` (header line optional) or TREC
        ``qid iter docid rel``; the format is detected from the first line.

    Returns
    -------
    dict[str, dict[str, int]]
        ``{qid: {docid: grade}}``, including grade-0 judgements.

    Raises
    ------
    ValueError
        A line with the wrong number of columns, a non-integer grade, or the same
        (qid, docid) judged twice with different grades.
    """
    qrels: Qrels = {}
    ncols: int | None = None
    for lineno, line in _lines(path):
        parts = line.split()
        if ncols is None:
            if tuple(p.lower() for p in parts) == _BEIR_QRELS_HEADER:
                ncols = 3
                continue
            if len(parts) not in (3, 4):
                raise ValueError(
                    f"{path}:{lineno}: cannot tell the qrels format from {line!r}; expected "
                    "BEIR 'query-id corpus-id score' or TREC 'qid 0 docid rel'"
                )
            ncols = len(parts)
        if len(parts) != ncols:
            fmt = "BEIR 'query-id corpus-id score'" if ncols == 3 else "TREC 'qid 0 docid rel'"
            raise ValueError(f"{path}:{lineno}: expected {ncols} columns ({fmt}), got {len(parts)}: {line!r}")
        qid, docid, grade_s = (parts[0], parts[1], parts[2]) if ncols == 3 else (parts[0], parts[2], parts[3])
        grade = _parse_grade(grade_s, path, lineno)
        docs = qrels.setdefault(qid, {})
        if docs.get(docid, grade) != grade:
            raise ValueError(
                f"{path}:{lineno}: query {qid!r} document {docid!r} judged {docs[docid]} "
                f"and {grade}; keep one judgement per pair"
            )
        docs[docid] = grade
    if ncols is None:
        raise ValueError(f"{path}: no judgements found; is it the right qrels file?")
    return qrels


def read_query_records(path: PathLike) -> dict[str, dict[str, Any]]:
    """Read a BEIR ``queries.jsonl`` keeping every field.

    Returns
    -------
    dict[str, dict]
        ``{qid: record}`` where ``record`` is the parsed JSON object
        (``_id``, ``text`` and, when present, ``metadata``).
    """
    records: dict[str, dict[str, Any]] = {}
    for lineno, line in _lines(path):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}:{lineno}: not valid JSON ({exc.msg}); expected one query object per line"
            ) from None
        if not isinstance(rec, dict) or "_id" not in rec or not isinstance(rec.get("text"), str):
            raise ValueError(f"{path}:{lineno}: a query needs '_id' and a string 'text', got {line[:120]!r}")
        qid = str(rec["_id"])
        if qid in records:
            raise ValueError(f"{path}:{lineno}: query id {qid!r} appears twice")
        records[qid] = rec
    return records


def read_queries(path: PathLike) -> dict[str, str]:
    """Read queries as ``{qid: text}``.

    Parameters
    ----------
    path : str or PathLike
        BEIR ``queries.jsonl`` (plain or ``.gz``), or a ``qid<TAB>text`` file (``.tsv``).

    Returns
    -------
    dict[str, str]
        Query text by id; metadata is dropped (see `read_query_records`).
    """
    name = str(path).removesuffix(".gz")
    if name.endswith((".tsv", ".txt")):
        queries: dict[str, str] = {}
        for lineno, line in _lines(path):
            qid, sep, text = line.partition("\t")
            if not sep:
                raise ValueError(f"{path}:{lineno}: expected 'qid<TAB>text', got {line[:120]!r}")
            queries[qid] = text.strip()
        return queries
    return {qid: rec["text"] for qid, rec in read_query_records(path).items()}
