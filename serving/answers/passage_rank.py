"""Passages ranked as passages: every passage of a search's hits scored by both signals, fused.

DESIGN.md "The result an agent gets": the evidence an agent reads is a passage, and a long
document can hold one answering passage among fifty. So each passage of each hit is scored
on its own, by up to two signals:

* **dense**: the cosine of the query vector and the passage's stored vector (an index built
  with ``--dense`` and passages), where the search embedded the query anyway (modes dense
  and hybrid, SIRA's dense proposer). A bm25 search never embeds the query for this: that
  would cost more than the search.
* **lexical**: BM25 of the mode's weighted query terms (SIRA: query and kept expansion terms)

  - ``bm25``: over the passage index of an index built with ``--bm25-passages``, with its
    statistics (N passages, df over passages, avgdl of passages): exactly the score that
    index gives the passage, so a passage-BM25 hit cites the passage its MaxP score came from
    (`bm25_of_docnos`);
  - ``terms``: otherwise over the passage's text (`text_bm25`): tf counted in the
    passage's words, the index's idf, ``dl`` the passage's whitespace words and ``avgdl``
    their mean over the candidate passages.

The two lists are fused as the index's hybrid fusion fuses documents (``convex`` with its
``alpha`` on the lexical list, or ``rrf`` with its ``rrf_k``; no top-rank bonus), over all
the candidate passages together. A hit cites its best fused passage (first on ties), and
returns up to ``passages_per_hit`` of them as inner hits. The evidence text and the packed
context take passages across documents by **priority**: the reciprocal-rank fusion of the
passage's rank in the pool and its document's rank, ``1/(60 + pool rank) + 1/(60 + hit
rank)``, so the best passage of the third document can come before the second passage of
the first, and a strong document is not drowned by a lucky passage of a weak one.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ShardFault
from ..fusion import RRF_K, convex_arrays, ranks_of, rrf_arrays

#: Priority smoothing constant (RRF's k) for a passage's pool rank and its document's rank.
PRIORITY_K = RRF_K


@dataclass
class DocPassages:
    """The scored passages of one hit: spans ``(m, 2)`` in order, each signal's scores."""

    docno: int
    rank: int                    # the hit's rank, 1-based
    text: str
    spans: np.ndarray
    dense: np.ndarray | None     # cosine per passage; None without passage vectors or query vector
    lexical: np.ndarray          # BM25 per passage (0: no query term)
    fused: np.ndarray = field(default=None)      # the configured fusion, over the whole pool
    priority: np.ndarray = field(default=None)   # place in the budget (module docstring)
    positions: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)  # PassageRanking.positions
    position_lists: tuple[list[int], list[int]] | None = field(default=None, repr=False)  # the same, as lists

    def order(self) -> np.ndarray:
        """Passage indices, best fused first (first on ties)."""
        return np.lexsort((np.arange(len(self.spans)), -self.fused))


@dataclass
class PassageRanking:
    """Every hit's passages (``docs``, in hit order) and how they were scored."""

    docs: list[DocPassages]
    signals: tuple[str, ...]     # e.g. ("dense", "bm25"); the lexical one is "bm25" or "terms"
    fusion: str
    terms: dict[str, float]      # term -> w·idf (what a matched word of it is worth)
    analyze: Callable[[str], list[str]]
    _worth: list[float] | None = field(default=None, repr=False)  # w·idf per column of sorted(terms)

    def via(self, d: DocPassages, j: int) -> str:
        """The signals that ranked passage ``j`` of ``d``: "dense+bm25", "dense", "terms", ...
        (a passage without a query term has no lexical score; one without either, "terms")."""
        lexical = self.signals[-1]
        if d.dense is None:
            return lexical
        return f"dense+{lexical}" if d.lexical[j] > 0 else "dense"

    def score(self, d: DocPassages, j: int) -> float:
        """Passage ``j``'s fused score where two signals ranked it, else its one signal's score."""
        if d.dense is None:
            return float(d.lexical[j])
        if d.lexical[j] <= 0:
            return float(d.dense[j])
        return float(d.fused[j])

    def pool(self) -> list[tuple[float, int, int]]:
        """``(priority, doc index, passage index)`` of every candidate passage, best first
        (ties: the better hit, then the earlier passage)."""
        out = [(float(p), i, j) for i, d in enumerate(self.docs) for j, p in enumerate(d.priority)]
        out.sort(key=lambda x: (-x[0], x[1], x[2]))
        return out

    def positions(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(character offsets, ascending; term columns) of the query-term words of document
        ``i``'s whole text, found once per search (the passage ranking's text BM25 found them
        already; a dense or passage-BM25 ranking finds them here, on first use)."""
        d = self.docs[i]
        if d.positions is None:
            starts, cols, _ = term_positions(d.text, self.terms, self.analyze)
            d.positions = (starts, cols)
        return d.positions

    def term_positions(self, i: int) -> tuple[list[int], list[int], list[float]]:
        """`positions` of document ``i`` as lists (character offsets, ascending; term columns)
        and w·idf per column: what a quote's few units are scored from, where a list and
        ``bisect`` cost less than NumPy calls."""
        d = self.docs[i]
        if d.position_lists is None:
            starts, cols = self.positions(i)
            d.position_lists = (starts.tolist(), cols.tolist())
        if self._worth is None:
            self._worth = [float(self.terms[t]) for t in sorted(self.terms)]
        return (*d.position_lists, self._worth)


# --------------------------------------------------------------------------- kernels


def prefixes(terms) -> tuple[str, ...]:
    """What a word must contain to analyze to one of ``terms``: each term's first three
    characters (two for a term of three or fewer). The stemmer changes a word's end, not its
    first three characters once the stem has four or more (checked over every word of
    SciFact, NFCorpus and the package READMEs: the exceptions are a two-letter stem, "eyed"
    -> "ei"); a run of ideographs is one word but several terms, so the prefix is looked for
    anywhere in a word."""
    return tuple(sorted({t[:3] if len(t) >= 4 else t[:2] for t in terms if t}))


_WORD = re.compile(r"\w+")


def _candidates(text: str, terms) -> list[tuple[int, str]]:
    """(start, word) of each word of ``text`` that holds one of `prefixes`, in order:
    found with ``str.find`` in the lower-cased text (a few hundred thousand characters a
    millisecond), or word by word where lower-casing changes the text's length."""
    low = text.lower()
    if len(low) != len(text):
        # Offsets in the lower-cased text would not be the text's ("İ" lower-cases to two
        # characters): test each word itself, with the same notion of a word as below.
        # (Matched case-insensitively as the analyzer lower-cases: "İstanbul" holds "ist".)
        pre = prefixes(terms)
        if not pre:
            return []
        inside = re.compile("|".join(re.escape(p) for p in pre), re.IGNORECASE)
        return [(m.start(), m.group()) for m in _WORD.finditer(text) if inside.search(m.group())]
    starts = set()
    for p in prefixes(terms):
        i = low.find(p)
        while i >= 0:
            s = i
            while s > 0 and (low[s - 1].isalnum() or low[s - 1] == "_"):
                s -= 1
            starts.add(s)
            i = low.find(p, i + 1)
    out = []
    for s in sorted(starts):
        m = _WORD.match(text, s)
        if m:
            out.append((s, m.group()))
    return out


def term_positions(text: str, terms: dict[str, float] | set[str], analyze: Callable[[str], list[str]]
                   ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(start offsets, term columns, term names) of the words of ``text`` that analyze to one of
    ``terms`` (analyzed index terms), a word counting once per term it yields. Only the words
    that hold a term's `prefixes` are analyzed, so a long document is not analyzed word
    by word."""
    starts, cols, names = term_position_lists(text, terms, analyze)
    return np.asarray(starts, dtype=np.int64), np.asarray(cols, dtype=np.int64), names


def term_position_lists(text: str, terms: dict[str, float] | set[str], analyze: Callable[[str], list[str]]
                        ) -> tuple[list[int], list[int], list[str]]:
    """`term_positions` as Python lists (what it builds them from)."""
    names = sorted(terms)
    if not names or not text:
        return [], [], names
    cols = {t: j for j, t in enumerate(names)}
    seen: dict[str, list[int]] = {}
    starts, hit_cols = [], []
    for start, w in _candidates(text, names):
        got = seen.get(w)
        if got is None:
            got = seen[w] = [cols[t] for t in dict.fromkeys(analyze(w)) if t in cols]
        for c in got:
            starts.append(start)
            hit_cols.append(c)
    return starts, hit_cols, names


def text_tf(text: str, spans: np.ndarray, terms: dict[str, float], analyze: Callable[[str], list[str]],
            positions: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(tf ``(m, t)`` of each term in each passage, dl ``(m,)`` in whitespace words, term names).
    A word counts for every passage its start falls in (an overlap's words count twice).
    ``positions``: the text's ``term_positions`` (offsets ascending, columns), if found already."""
    names = sorted(terms)
    starts, cols = positions if positions is not None else term_positions(text, terms, analyze)[:2]
    m = len(spans)
    tf = np.zeros((m, len(names)))
    if len(starts):
        lo = np.searchsorted(starts, spans[:, 0], side="left")
        hi = np.searchsorted(starts, spans[:, 1], side="left")
        for j in range(m):
            if hi[j] > lo[j]:
                tf[j] = np.bincount(cols[lo[j]:hi[j]], minlength=len(names))
    dl = np.asarray([len(text[a:b].split()) for a, b in spans.tolist()], dtype=np.float64)
    return tf, dl, names


def text_bm25(tf: np.ndarray, dl: np.ndarray, w_idf: np.ndarray, avgdl: float, k1: float, b: float) -> np.ndarray:
    """``Σ_t w_t·idf_t · tf / (tf + k1·(1 − b + b·dl/avgdl))`` per passage (Lucene's BM25, as
    ``serving.lexical.bm25``), with ``dl`` and ``avgdl`` in words of the passages."""
    if tf.size == 0:
        return np.zeros(len(dl))
    denom = k1 * (1 - b + b * dl / max(avgdl, 1e-9))
    with np.errstate(invalid="ignore", divide="ignore"):
        part = np.where(tf > 0, tf / (tf + denom[:, None]), 0.0)
    return part @ w_idf


def bm25_of_docnos(retriever, terms: dict[str, float], docnos: np.ndarray, params) -> np.ndarray:
    """BM25 of ``terms`` for the given documents of ``retriever``'s index, vectorized per shard
    and term; the formula of ``BM25Retriever.explain`` (its statistics, lengths and params)."""
    docnos = np.asarray(docnos, dtype=np.int64)
    out = np.zeros(len(docnos))
    gids, ws, _ = retriever.weights(terms)
    if len(gids) == 0 or len(docnos) == 0:
        return out
    ix = retriever.index
    shard = docnos >> 32
    local = docnos & 0xFFFFFFFF
    for s in np.unique(shard).tolist():
        sel = np.flatnonzero(shard == s)
        sh, loc = ix.shards[s], local[sel]
        dl = np.asarray(sh.lengths(params))[loc]
        denom = params.k1 * (1 - params.b + params.b * dl / ix.avgdl)
        try:
            tfs = sh.term_freqs(gids, loc).astype(np.float64)  # one postings search per term
        except ShardFault as e:
            raise retriever.fault_error(e) from None
        for w, tf in zip(ws.tolist(), tfs):
            with np.errstate(invalid="ignore", divide="ignore"):  # k1 = 0: 0 / 0 where tf is 0
                out[sel] += np.where(tf > 0, w * tf / (tf + denom), 0.0)
    return out


def fuse(docs: list[DocPassages], fusion: str, alpha: float, rrf_k: float) -> None:
    """Fill each document's ``fused`` and ``priority`` over the pool of all their passages."""
    if not docs:
        return
    sizes = [len(d.spans) for d in docs]
    lex = np.concatenate([d.lexical for d in docs]) if sum(sizes) else np.zeros(0)
    lex = np.where(lex > 0, lex, np.nan)  # a passage without a query term is not in the lexical list
    lists = {"lexical": lex}
    if any(d.dense is not None for d in docs):
        lists["dense"] = np.concatenate([d.dense if d.dense is not None else np.full(len(d.spans), np.nan)
                                         for d in docs])
    if fusion == "rrf":
        fused = rrf_arrays({n: ranks_of(v) for n, v in lists.items()}, k=rrf_k)
    else:
        fused = convex_arrays(lists, {"lexical": alpha, "dense": 1.0 - alpha} if "dense" in lists
                              else {"lexical": 1.0})
    pool_rank = ranks_of(fused)
    doc_rank = np.repeat([d.rank for d in docs], sizes)
    priority = 1.0 / (PRIORITY_K + pool_rank) + 1.0 / (PRIORITY_K + doc_rank)
    at = 0
    for d, m in zip(docs, sizes):
        d.fused, d.priority = fused[at:at + m], priority[at:at + m]
        at += m


# --------------------------------------------------------------------------- public API


def rank_passages(searcher, docs: list[tuple[int, int, dict]], terms: dict[str, float],
                  query_vector: np.ndarray | None, params) -> PassageRanking:
    """Score and fuse the passages of ``docs`` (``(docno, hit rank, stored document)``).

    Parameters
    ----------
    searcher
        The ``VersionSearcher`` (its passages, vectors, BM25 and hybrid settings).
    terms
        The mode's weighted query terms (analyzed index terms).
    query_vector
        The query's embedding where the search made one, else None (no dense signal).
    params
        BM25 parameters of the lexical signal.
    """
    stored = searcher.dense_mode.passages()
    passage_bm25 = getattr(searcher.bm25, "passage_docnos", None)  # --bm25-passages
    dense_ok = query_vector is not None and stored is not None
    out: list[DocPassages] = []
    tfs: list[tuple[np.ndarray, np.ndarray] | None] = []
    names = sorted(terms)
    # One word (a \w+ run) at a time: the analyzer's cached per-word terms are what its
    # analyze() gives such a word, without building a token list per call.
    analyzer = searcher.index.analyzer
    analyze = getattr(analyzer, "word_terms", analyzer.analyze)
    for n, rank, doc in docs:
        text = doc["text"] or ""
        spans = np.asarray(searcher.passage_spans(n, text), dtype=np.int64).reshape(-1, 2)
        if len(spans) == 0:
            spans = np.asarray([[0, len(text)]], dtype=np.int64)
        dense = None
        if dense_ok:
            s, a, b = stored.rows(n)
            if b - a == len(spans):
                dense = np.asarray(stored.emb[s][a:b], dtype=np.float32) @ np.asarray(query_vector, dtype=np.float32)
                dense = dense.astype(np.float64)
        if passage_bm25 is not None:
            lexical = bm25_of_docnos(searcher.bm25.inner, terms, passage_bm25(n), params)
            if len(lexical) != len(spans):  # a document the passage index splits otherwise: text
                lexical = None
        else:
            lexical = None
        positions = lists = None
        if lexical is None:
            lists = term_position_lists(text, terms, analyze)[:2]  # kept: the evidence text scores quotes from them
            positions = (np.asarray(lists[0], dtype=np.int64), np.asarray(lists[1], dtype=np.int64))
            tf, dl, _ = text_tf(text, spans, terms, analyze, positions)
            tfs.append((tf, dl))
            lexical = np.zeros(len(spans))
        else:
            tfs.append(None)
        out.append(DocPassages(n, rank, text, spans, dense, lexical, positions=positions, position_lists=lists))
    lex = searcher.bm25 if hasattr(searcher.bm25, "weights") else searcher.bm25.inner
    _, ws, kept = lex.weights(terms)
    worth = dict.fromkeys(names, 0.0) | dict(zip(kept, ws.tolist()))  # term -> w·idf
    if any(t is not None for t in tfs):  # text BM25: avgdl over the candidate passages
        w_idf = np.asarray([worth[t] for t in names], dtype=np.float64)
        dls = np.concatenate([t[1] for t in tfs if t is not None])
        avgdl = float(dls.mean()) if len(dls) else 1.0
        for d, t in zip(out, tfs):
            if t is not None:
                d.lexical = text_bm25(t[0], t[1], w_idf, avgdl, params.k1, params.b)
    cfg = searcher.hybrid_config
    fuse(out, cfg.fusion, cfg.alpha, cfg.rrf_k)
    lexical_name = "bm25" if passage_bm25 is not None and all(t is None for t in tfs) else "terms"
    signals = (("dense",) if any(d.dense is not None for d in out) else ()) + (lexical_name,)
    return PassageRanking(out, signals, cfg.fusion, worth, analyze)


_PARAGRAPH = re.compile(r"\n[ \t\f]*\n")
# A sentence end (a mark, closing quotes or brackets, then whitespace) or a line break. Written
# to start with one character class, which the regex engine scans for ~3x faster than it tries
# the two alternatives ``[.!?]["')\]]*(?=\s)|\n`` at every character (the same matches).
_SENTENCE_OR_LINE = re.compile(r"[\n.!?](?:(?<=\n)|[\"')\]]*(?=\s))")


#: How far a passage's range is widened to the sentences it cuts, at most, in characters.
SENTENCE_REACH = 400


def sentence_bounds(text: str, a: int, b: int, reach: int = SENTENCE_REACH) -> tuple[int, int]:
    """``[a, b)`` widened to the start of the sentence (or line) ``a`` falls in and the end of
    the one ``b`` falls in, each by at most ``reach`` characters (a passage window starts and
    ends mid-sentence; a quote should not)."""
    lo = max(0, a - reach)
    ends = [m.end() for m in _SENTENCE_OR_LINE.finditer(text, lo, a)]
    a2 = ends[-1] if ends else (0 if lo == 0 else a)
    while a2 < a and text[a2].isspace():
        a2 += 1
    if 0 < b < len(text):
        m = _SENTENCE_OR_LINE.search(text, b - 1, min(len(text), b + reach))
        b = max(b, m.end()) if m else b
    return a2, b


def units(text: str, a: int, b: int) -> list[tuple[int, int, int]]:
    """``text[a:b]`` as sentences and lines: ``(start, end, paragraph)``, whitespace trimmed;
    ``paragraph`` counts the blank lines (or form feeds) before the unit within the range."""
    cuts = {a, b}
    for m in _SENTENCE_OR_LINE.finditer(text, a, b):  # a sentence ends after its mark, a line before its break
        cuts.add(m.start() if text[m.start()] == "\n" else m.end())
    breaks = [m.start() for m in _PARAGRAPH.finditer(text, a, b)]
    edges = sorted(cuts)
    out = []
    for x, y in zip(edges, edges[1:]):
        while x < y and text[x].isspace():  # what str.strip strips, without copying the unit
            x += 1
        while y > x and text[y - 1].isspace():
            y -= 1
        if y > x:
            out.append((x, y, bisect.bisect_right(breaks, x)))
    return out
