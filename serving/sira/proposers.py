"""Proposers: where SIRA's expansion vocabulary comes from.

Every proposer is a function ``(ProposalContext) -> list[Proposal]``; a proposal is a
phrase with a weight in (0, 1] (1 = the proposer's strongest) and its provenance.

* ``prf``   RM3 terms of the top ``fb_docs`` BM25 documents (pseudo-relevance feedback).
* ``dense`` the same feedback over the dense retriever's top ``fb_docs`` documents, each
  term's weight multiplied by its idf (discriminative: the dense neighbours share generic
  vocabulary that RM3 alone would rank first). Needs an index built with ``--dense``. Where
  the index has passages, each document feeds back its best passage (the one its dense
  score came from), not all of a long document's vocabulary.
* ``llm``   an expected-evidence sketch from the configured chat model: up to ten phrases
  a relevant document would contain and the query lacks, never the answer.
* ``union`` is not a function here: the mode runs every available proposer.

The DF filter (``dffilter``) then decides which proposals count.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .feedback import rm3_from_rows, select_terms
from .space import best_passages, space

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Proposal:
    """One proposed phrase. Read-only by convention (not frozen: see ``Verdict``)."""

    phrase: str                        # as proposed: an index term (prf, dense) or LLM text
    source: str                        # the proposer's name
    weight: float                      # in (0, 1]; 1 is the source's strongest proposal
    tokens: tuple[str, ...] | None = None   # analyzed tokens, when the source already has them
    evidence: str = ""                 # why the source proposed it


@dataclass
class ProposalContext:
    """What a proposer may look at: the searcher, the query, and the mode's settings."""

    searcher: Any                      # a VersionSearcher: bm25, dense_mode, forward, chat, index
    query: str
    query_terms: dict[str, float]
    config: Any                        # the resolved SiraConfig
    params: Any                        # BM25Params of this query
    nprobe: int | None = None
    timings: dict[str, float] = field(default_factory=dict)


def _feedback(ctx: ProposalContext, source: str, docnos, doc_weights, use_idf: bool,
              rows: tuple | None = None) -> list[Proposal]:
    """RM3 terms of the feedback units: the units' forward-index rows in the search's lexical
    space (``space``: documents, or passages of an index with passage BM25), or ``rows``
    (term ids, tfs, owner, lengths: see `passage_rows`)."""
    sp = space(ctx.searcher)
    ix, fwd, cfg = sp.index, sp.forward, ctx.config
    if len(docnos) == 0:
        return []
    if rows is None:
        uniq, weights, ndocs = fwd.rm3_weights(docnos, doc_weights)
    else:
        g, tf, owner, dl = rows
        w = np.maximum(np.asarray(doc_weights, dtype=np.float64), 0.0)
        scale = np.divide(w, dl, out=np.zeros_like(w), where=dl > 0)
        uniq, weights, ndocs = rm3_from_rows(g, tf * scale[owner])
    if len(uniq) == 0:
        return []
    mask = sp.mask  # a filtered search: DF evidence from the allowed documents (passages) only
    if mask is None:
        eligible = (ix.df[uniq] <= cfg.tau * ix.n_docs) & ~fwd.short[uniq]
    else:  # a term's df among them is at most its global df: count only where that decides
        ceiling = cfg.tau * mask.count
        eligible = ~fwd.short[uniq]
        over = np.flatnonzero(eligible & (np.asarray(ix.df)[uniq] > ceiling))
        if len(over):
            eligible[over] = mask.df(ix, uniq[over]) <= ceiling
    qg = np.array([g for t in ctx.query_terms if (g := ix.vocab.get(t)) is not None], dtype=np.int64)
    if len(qg):  # never propose the query's own terms
        at = np.minimum(np.searchsorted(uniq, qg), len(uniq) - 1)
        eligible[at[uniq[at] == qg]] = False
    pos, w = select_terms(uniq, weights, eligible, cfg.fb_terms, ix.idf[uniq] if use_idf else None)
    terms = fwd.terms
    return [Proposal(terms[uniq[p]], source, float(x), (terms[uniq[p]],),
                     f"in {int(ndocs[p])} of {len(docnos)} feedback docs")
            for p, x in zip(pos.tolist(), w.tolist())]


def propose_prf(ctx: ProposalContext) -> list[Proposal]:
    """RM3 terms of the top ``fb_docs`` BM25 documents (weights: their BM25 scores); with
    passage BM25, of each one's best passage (``space``)."""
    docnos, scores = ctx.searcher.bm25.search_arrays(ctx.query_terms, ctx.config.fb_docs, ctx.params)
    if space(ctx.searcher).passages:
        units = best_passages(ctx.searcher, docnos, ctx.query_terms, ctx.params)
        keep = units >= 0
        return _feedback(ctx, "prf", units[keep], np.asarray(scores)[keep], use_idf=False)
    return _feedback(ctx, "prf", docnos, scores, use_idf=False)


def propose_dense(ctx: ProposalContext) -> list[Proposal]:
    """idf-weighted RM3 terms of the dense retriever's top ``fb_docs`` documents (their best
    passages, where the index has passages)."""
    t = time.perf_counter()
    hits = ctx.searcher.dense_mode.search(ctx.query, ctx.config.fb_docs, ctx.nprobe)
    ctx.timings["dense"] = round((time.perf_counter() - t) * 1000, 3)
    docnos = [h.docno for h in hits]
    if space(ctx.searcher).passages:  # each document's best dense passage, as the passage index has it
        units = dense_best_units(ctx.searcher, ctx.query, docnos)
        keep = units >= 0
        return _feedback(ctx, "dense", units[keep], np.asarray([h.score for h in hits])[keep], use_idf=True)
    return _feedback(ctx, "dense", docnos, [h.score for h in hits], use_idf=True,
                     rows=passage_rows(ctx.searcher, ctx.query, docnos))


def dense_best_units(searcher, query: str, docnos) -> np.ndarray:
    """The passage-index docno of each document's best dense passage (-1 where it has none)."""
    stored, bm = searcher.dense_mode.passages(), searcher.bm25
    qv = searcher.dense_mode.dense().embed_query(query)
    out = np.full(len(docnos), -1, dtype=np.int64)
    for i, n in enumerate(docnos):
        best = stored.best(qv, n) if stored is not None else None
        pdn = bm.passage_docnos(n)
        if best is not None and best["ordinal"] < len(pdn):
            out[i] = pdn[best["ordinal"]]
    return out


def passage_feedback(searcher) -> bool:
    """True when the dense proposer feeds back passages: the index stores some document as
    more than one passage (a one-passage document's forward-index row is its passage)."""
    stored = searcher.dense_mode.passages()
    return stored is not None and stored.max_per_doc > 1


def passage_rows(searcher, query: str, docnos) -> tuple | None:
    """The dense proposer's feedback units: each document's best passage for ``query``
    (``DenseIndex.best_passage``), analyzed with its title as the document was;
    (term ids, tfs, owner, lengths) for `rm3_from_rows`, or None where
    every document is one passage (`passage_feedback`: their rows are the units)."""
    if not len(docnos) or not passage_feedback(searcher):
        return None
    ix, fwd, stored = searcher.index, searcher.forward, searcher.dense_mode.passages()
    qv = searcher.dense_mode.dense().embed_query(query)
    gs, tfs, owners = [], [], []
    dl = np.zeros(len(docnos))
    for i, n in enumerate(docnos):
        if stored.count(n) <= 1:
            g, tf = fwd.row(n)
        else:
            best = stored.best(qv, n)
            doc = ix.docs.get(n)
            text = (doc["text"] or "")[best["start"]:best["end"]]
            terms = ix.analyzer.analyze(f"{doc['title']}\n{text}" if doc["title"] else text)
            g, tf = np.unique(np.asarray([x for t in terms if (x := ix.vocab.get(t)) is not None], dtype=np.int64),
                              return_counts=True)
        tf = np.asarray(tf, dtype=np.float64)
        gs.append(np.asarray(g, dtype=np.int64))
        tfs.append(tf)
        owners.append(np.full(len(g), i, dtype=np.int64))
        dl[i] = tf.sum()
    return np.concatenate(gs), np.concatenate(tfs), np.concatenate(owners), dl


# -- the LLM's expected-evidence sketch ----------------------------------------------------

#: Bump when the prompt or schema changes: it is part of the cache key.
SKETCH_PROMPT_VERSION = 1
SKETCH_MAX_PHRASES = 10
SKETCH_MAX_CHARS = 40
SKETCH_SYSTEM = ("You help a search engine find evidence. Given a search query, list words and short "
                 "phrases that a relevant document would contain but the query does not: technical "
                 "terms, synonyms, abbreviations, names of related concepts. Never state the answer "
                 "and never repeat the query's words.")
SKETCH_USER = ("Query: {query}\n\nList up to {n} phrases of 1 to {max_n} words that a document "
               "answering this query would use.")


def sketch_schema(n: int = SKETCH_MAX_PHRASES, max_chars: int = SKETCH_MAX_CHARS) -> dict:
    """JSON Schema of the sketch: ``{"keywords": [str (1..max_chars), ... (1..n)]}``."""
    return {"type": "object", "additionalProperties": False, "required": ["keywords"],
            "properties": {"keywords": {"type": "array", "minItems": 1, "maxItems": n,
                                        "items": {"type": "string", "minLength": 1,
                                                  "maxLength": max_chars}}}}


def _sketch_cache():
    from ..chat import ExpansionCache
    global _CACHE
    if _CACHE is None:
        _CACHE = ExpansionCache()
    return _CACHE


_CACHE = None


def evidence_sketch(chat, query: str, max_n: int, n: int = SKETCH_MAX_PHRASES, cache=None,
                    max_chars: int = SKETCH_MAX_CHARS) -> list[str]:
    """Up to ``n`` phrases of 1..``max_n`` words the evidence would use.

    The prompt asks for 1..``max_n`` words; a longer phrase is kept whole (the DF filter
    looks at its 1..max_n windows and it contributes its unigrams). Whitespace is
    normalized, case-insensitive duplicates and phrases without a word character dropped.
    Cached by ``(chat.model, SKETCH_PROMPT_VERSION, query, max_n, n)`` in ``cache``
    (default: a process-wide LRU). Raises `funnel.serving.chat.ChatError` when the
    model fails.
    """
    cache = _sketch_cache() if cache is None else cache
    key = (chat.model, SKETCH_PROMPT_VERSION, query, max_n, n)
    if (hit := cache.get(key)) is not None:
        return list(hit)
    messages = [{"role": "system", "content": SKETCH_SYSTEM},
                {"role": "user", "content": SKETCH_USER.format(query=query, n=n, max_n=max_n)}]
    answer = chat.complete_json(messages, sketch_schema(n, max_chars), max_tokens=n * (max_chars + 8) + 16,
                                schema_name="evidence_sketch")
    out, seen = [], set()
    for p in answer.get("keywords", []):
        phrase = " ".join(str(p).split())
        k = tuple(re.findall(r"\w+", phrase.casefold()))
        if k and k not in seen:
            seen.add(k)
            out.append(phrase)
    cache.put(key, tuple(out[:n]))
    return out[:n]


def propose_llm(ctx: ProposalContext) -> list[Proposal]:
    """The chat model's expected-evidence sketch; every phrase weighs 1."""
    t = time.perf_counter()
    try:
        phrases = evidence_sketch(ctx.searcher.chat, ctx.query, ctx.config.max_n)
    finally:
        ctx.timings["llm"] = round((time.perf_counter() - t) * 1000, 3)
    evidence = f"expected-evidence sketch by {getattr(ctx.searcher.chat, 'model', 'chat model')}"
    return [Proposal(p, "llm", 1.0, None, evidence) for p in phrases]


#: The proposer functions by name; ``union`` runs every one that is available.
PROPOSERS: dict[str, Callable[[ProposalContext], list[Proposal]]] = {
    "prf": propose_prf, "dense": propose_dense, "llm": propose_llm}


