"""Dense and hybrid modes: the wide-then-narrow funnel over the lexical and dense lists.

    hybrid(q) = [rerank + position blend]( fuse( BM25 top-N, dense top-N ) )[:k]  (+ context pack)

Fusion is the convex mix of min-max normalized scores (alpha 0.55 on BM25) by default, or
RRF (k=60 with qmd's top-rank bonus) with ``fusion="rrf"``; every constant comes from the
index manifest's ``hybrid`` section or the query's options. Convex is the default because it
measured better than RRF on every collection tried, two that nobody here tuned on included
(figures: bench/RESULTS.md; docs/retrieval-modes.md). The explain trace of each hit is the
``Fused``/``Blended`` object that scored it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from .fusion import BLEND_TIERS, RRF_K, TOP_RANK_BONUS, convex, position_blend, rrf
from .lexical.retriever import Scored, explainer

log = logging.getLogger(__name__)

FUSIONS = ("rrf", "convex")


@dataclass(frozen=True)
class HybridConfig:
    """Hybrid parameters; choose them on train/dev data, never on test."""

    fusion: str = "convex"
    candidates: int = 100        # depth of each list
    rrf_k: float = RRF_K
    bm25_weight: float = 1.0
    dense_weight: float = 1.0
    top_rank_bonus: tuple[float, float] | None = TOP_RANK_BONUS
    alpha: float = 0.55          # convex: weight of BM25 (DESIGN.md: chosen on SciFact train)
    rerank_depth: int = 40       # fused candidates the reranker re-reads (each its best passage)
    chunk_tokens: int = 256      # passage window where the index stores no passages (--passages off)
    blend_tiers: tuple = BLEND_TIERS  # ((last fused rank, retrieval weight), ..., (None, w))

    @classmethod
    def from_options(cls, base: "HybridConfig", options: dict) -> "HybridConfig":
        kw = {f: options.pop(f) for f in list(options) if f in cls.__dataclass_fields__}
        if "blend_tiers" in kw:
            kw["blend_tiers"] = tuple((None if r is None else int(r), float(w)) for r, w in kw["blend_tiers"])
        if "top_rank_bonus" in kw and kw["top_rank_bonus"] in (None, False, 0, "none"):
            kw["top_rank_bonus"] = None
        elif "top_rank_bonus" in kw:
            kw["top_rank_bonus"] = tuple(kw["top_rank_bonus"])
        cfg = cls(**{**base.__dict__, **kw})
        if cfg.fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {cfg.fusion!r}; choose one of {', '.join(FUSIONS)}")
        if not 1 <= cfg.candidates <= 1000:
            raise ValueError(f"candidates must be in 1..1000, got {cfg.candidates}")
        return cfg


class DenseMode:
    """Opens the dense index of a version lazily, with a query-time provider matching it."""

    def __init__(self, index, embedder=None):
        self.index = index
        self.embedder = embedder
        self._dense = None
        self._passages = None
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return bool(self.index.manifest.get("dense"))

    def passages(self):
        """The version's stored passages (``dense.Passages``: spans and vectors), opened
        without the embedding model; None for an index without (BM25 only, or built with
        ``--passages off``)."""
        m = self.index.manifest.get("dense") or {}
        if not m.get("passages"):
            return None
        if self._passages is None:
            with self._lock:
                if self._passages is None:
                    if self._dense is not None:
                        self._passages = self._dense.passages
                    else:
                        from .dense import Passages, shard_entries
                        shards = shard_entries(m)
                        self._passages = Passages.open(self.index.dir, shards, [int(sh["count"]) for sh in shards])
        return self._passages

    def dense(self):
        if self._dense is None:
            with self._lock:
                if self._dense is None:
                    import os

                    from funnel.pipelines.dense.embed import make_provider

                    from .dense import DenseIndex, query_spec
                    m = self.index.manifest["dense"]
                    provider = self.embedder
                    if provider is None:  # onnxruntime where it can (no torch import): dense.query_spec
                        provider = make_provider(query_spec(m["fingerprint"]))
                    self._dense = DenseIndex.open(os.path.join(self.index.dir, "dense"), m, provider,
                                                  passages=self._passages)
                    self._passages = self._dense.passages
        return self._dense

    def search(self, query: str, k: int, nprobe: int | None = None) -> list[Scored]:
        return [Scored(n, s) for n, s in self.dense().search(query, k, nprobe)]


def fuse(cfg: HybridConfig, bm25: list[Scored], dense: list[Scored], extra: dict | None = None):
    """The fused list (``Fused`` objects keyed by docno), best first.

    ``extra`` holds the lists of LLM query expansions; with them present the original
    query's lists weigh 2 (DESIGN.md, after qmd), each expansion list 1 (RRF only).
    """
    if cfg.fusion == "rrf":
        boost = 2.0 if extra else 1.0
        lists = {"bm25": [s.docno for s in bm25], "dense": [s.docno for s in dense]}
        weights = {"bm25": boost * cfg.bm25_weight, "dense": boost * cfg.dense_weight}
        for name, lst in (extra or {}).items():
            lists[name] = [s.docno for s in lst]
            weights[name] = 1.0
        return rrf(lists, k=cfg.rrf_k, weights=weights, top_rank_bonus=cfg.top_rank_bonus)
    boost = 2.0 if extra else 1.0
    scores = {"bm25": {s.docno: s.score for s in bm25}, "dense": {s.docno: s.score for s in dense}}
    weights = {"bm25": boost * cfg.alpha, "dense": boost * (1.0 - cfg.alpha)}
    for name, lst in (extra or {}).items():
        scores[name] = {s.docno: s.score for s in lst}
        weights[name] = cfg.alpha if name.startswith("bm25") else 1.0 - cfg.alpha
    return convex(scores, weights=weights)


def _expansions(searcher, query: str, n: int) -> list[str]:
    if searcher.chat is None:
        raise ValueError("expand needs a chat model: open_index(root, chat=ChatProvider(base_url=..., "
                         "model=...)) (any OpenAI-compatible endpoint, e.g. serving.chat.LocalLlamaServer)")
    from .chat import ChatError, expand_query
    try:
        return expand_query(searcher.chat, query, n=n)
    except ChatError as e:  # the search still answers, without expansions
        log.warning("query expansion failed, searching without it: %s", e)
        return []


def rerank(reranker, query: str, fused, passage_text, cfg: HybridConfig):
    """Rerank the best passage of each of the top ``rerank_depth`` fused docs
    (``passage_text(docno)``, the passage the hit cites); blend by position."""
    head = fused[:cfg.rerank_depth]
    chunks = [passage_text(f.key) for f in head]
    scored = reranker.rerank(query, chunks, top_n=len(chunks))
    scores = {head[i].key: float(s) for i, s in scored}
    return position_blend(fused, scores, tiers=cfg.blend_tiers)


def run_hybrid(searcher, query: str, k: int, options: dict):
    """Mode function for ``Searcher``: (scored, trace, note, explain_fn)."""
    options = dict(options)
    cfg = HybridConfig.from_options(searcher.hybrid_config, options)
    nprobe = options.pop("nprobe", None)
    params = searcher._bm25_params(options)
    timings = {}
    expand = int(options.pop("expand", 0) or 0)
    t = time.perf_counter()
    terms = dict(searcher.bm25.query_terms(query))
    bm = searcher.bm25.search_weighted(terms, cfg.candidates, params)
    timings["bm25"] = _ms(t)
    t = time.perf_counter()
    dn = searcher.dense_mode.search(query, cfg.candidates, nprobe)
    timings["dense"] = _ms(t)
    expansions: list[str] = []
    extra: dict[str, list[Scored]] = {}
    if expand:
        t = time.perf_counter()
        expansions = _expansions(searcher, query, expand)
        for i, e in enumerate(expansions, start=1):
            extra[f"bm25:x{i}"] = searcher.bm25.search_weighted(dict(searcher.bm25.query_terms(e)),
                                                                cfg.candidates, params)
            extra[f"dense:x{i}"] = searcher.dense_mode.search(e, cfg.candidates, nprobe)
        timings["expansion"] = _ms(t)
    t = time.perf_counter()
    fused = fuse(cfg, bm, dn, extra)
    timings["fusion"] = _ms(t)
    final = fused
    reranked = False
    in_dense = {s.docno for s in dn}

    def best_passage(n: int) -> dict | None:
        """The passage of a document the dense list found that its score came from."""
        return searcher.dense_mode.dense().best_passage(query, n) if n in in_dense else None

    def passage_text(n: int) -> str:
        doc = searcher.index.docs.get(n)
        cite = searcher.citation(doc, n, set(terms), best_passage(n), window=cfg.chunk_tokens)
        return f"{doc['title']}\n{cite.text}" if doc["title"] else cite.text

    if searcher.reranker is not None and options.pop("rerank", True):
        t = time.perf_counter()
        final = rerank(searcher.reranker, query, fused, passage_text, cfg)
        timings["rerank"] = _ms(t)
        reranked = True
    by_key = {f.key: f for f in final[:k]}
    scored = [Scored(f.key, f.score) for f in final[:k]]
    trace = {"hybrid": {**{k_: v for k_, v in cfg.__dict__.items()}, "reranker":
                        getattr(searcher.reranker, "name", None) if reranked else None,
                        "bm25_hits": len(bm), "dense_hits": len(dn), "expansions": expansions},
             "timings_ms": timings}

    lexical = explainer(searcher.bm25, terms, [s.docno for s in scored], params)

    def explain(n: int) -> dict:
        ex = by_key[n].explain()
        lex = lexical(n)
        ranks = ex.get("ranks") or {}
        parts = [f"{lst} rank {r}" for lst, r in sorted(ranks.items(), key=lambda kv: kv[1])]
        why = ("; ".join(parts) if parts else f"fused rank {ex.get('fused_rank')}")
        if lex:
            why += " — matched " + ", ".join(list(lex)[:5])
        if ex.get("rerank_score") is not None:
            why += f"; rerank {ex['rerank_score']:.3f}"
        return {"terms": lex, "why": why, "fusion": ex}

    return scored, trace, "", explain


def run_dense(searcher, query: str, k: int, options: dict):
    t = time.perf_counter()
    scored = searcher.dense_mode.search(query, k, options.get("nprobe"))
    trace = {"dense": {"model": searcher.index.manifest["dense"]["fingerprint"]["model"],
                       "nprobe": options.get("nprobe") or searcher.index.manifest["dense"].get("nprobe")},
             "timings_ms": {"dense": _ms(t)}}

    def explain(n: int) -> dict:
        s = next((x.score for x in scored if x.docno == n), None)
        return {"why": f"semantic similarity {s:.3f} (cosine, {trace['dense']['model']})", "terms": {}}

    return scored, trace, "", explain


def _ms(t: float) -> float:
    return round((time.perf_counter() - t) * 1000, 3)


def prefill_query_vectors(searcher, texts: list[str]) -> None:
    """Embed many queries in one model call and seed the dense index's query cache."""
    d = searcher.dense_mode.dense()
    todo = [t for t in dict.fromkeys(texts) if t not in d._cache]
    if not todo:
        return
    encode = getattr(d.provider, "_encode", None)
    prompt = getattr(d.provider, "query_prompt", "")
    vecs = encode([prompt + t for t in todo]) if encode else [d.provider.embed_query(t) for t in todo]
    with d._lock:
        for t, v in zip(todo, vecs):
            d._cache[t] = np.asarray(v, dtype=np.float32)
        while len(d._cache) > max(d.cache_size, len(todo)):
            d._cache.popitem(last=False)
