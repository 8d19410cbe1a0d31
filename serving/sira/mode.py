"""``mode="sira"``: propose vocabulary, DF-filter it, score with one weighted BM25 call.

    score(d) = BM25(q, d) + λ · BM25(e, d)        (DESIGN.md "SIRA retrieval")

q holds the query's analyzed terms (weight = count), e the kept expansion terms (weight =
the proposer's weight in (0, 1], the largest over the phrases that brought the term).
Both share idf, k1, b and document lengths, and BM25 is linear in the term weights, so one
``search_weighted`` call scores the sum in one pass over the postings: the query's terms
first, then the expansion terms (``then=``), which is the order the compiled batch path
(``batch.py``) adds them in. Each hit's explanation is the per-term contributions of the
merged {term: weight} dict (`weighted_query`), split into query and expansion terms.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ModeUnavailable, SearchError
from .dffilter import MAX_N_RANGE, Verdict, df_filter
from .proposers import PROPOSERS, Proposal, ProposalContext
from .space import Space, space

log = logging.getLogger(__name__)

#: Values of the ``proposer`` option. ``auto``: ``llm`` when a chat model is configured,
#: else the offline proposer chosen on train/dev (``SiraConfig.offline_proposer``).
PROPOSER_CHOICES = ("auto", "prf", "dense", "llm", "union")
OFFLINE_PROPOSERS = ("prf", "dense", "union")
#: The per-query options of the mode (besides BM25's k1, b, length_norm and dense's nprobe).
OPTIONS = ("proposer", "lambda", "tau", "max_n", "fb_docs", "fb_terms")
LAMBDA_MAX = 100.0
FB_MAX = 100


def _error(msg: str) -> Exception:
    return SearchError(msg)


def _number(name: str, value: Any, lo: float, hi: float, integer: bool, lo_open: bool = False):
    bad = _error(f"{name} must be {'an integer' if integer else 'a number'} in "
                 f"{'(' if lo_open else '['}{lo:g}, {hi:g}], got {value!r}")
    if isinstance(value, bool):
        raise bad
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise bad from None
    if not math.isfinite(x) or x > hi or x < lo or (lo_open and x == lo) or (integer and not x.is_integer()):
        raise bad
    return int(x) if integer else x


@dataclass(frozen=True)
class SiraConfig:
    """SIRA settings; an index's manifest ``sira`` section overrides these defaults and
    a query's options override both.

    The defaults were chosen on SciFact train and NFCorpus dev qrels only
    (``bench/bench_sira.py --select``): τ, fb_docs and fb_terms shared by the proposers
    (the setting with the largest summed gain over BM25 where no proposer loses on either
    set; 0.1/10/10 are also Anserini's RM3 defaults), then λ per proposer. Mean NDCG@10
    gain over BM25 there: dense +0.023, union +0.020, prf +0.010, hence ``dense`` as the
    offline proposer (``prf`` on an index without vectors). ``llm``'s λ 0.2 was chosen
    with the local SmolLM2-135M on the first 100 queries of each selection set (+0.004).
    """

    proposer: str = "auto"
    offline_proposer: str = "dense"
    tau: float = 0.1
    max_n: int = 1
    fb_docs: int = 10
    fb_terms: int = 10
    #: λ per proposer; the query's ``lambda`` option overrides it.
    lambdas: tuple[tuple[str, float], ...] = (("prf", 0.1), ("dense", 0.3), ("llm", 0.2), ("union", 0.2))
    lam: float | None = None

    def lambda_for(self, proposer: str) -> float:
        return self.lam if self.lam is not None else dict(self.lambdas)[proposer]

    @classmethod
    def from_manifest(cls, section: dict | None) -> "SiraConfig":
        section = dict(section or {})
        if isinstance(section.get("lambdas"), dict):
            section["lambdas"] = tuple({**dict(cls.lambdas), **section["lambdas"]}.items())
        unknown = set(section) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"manifest sira section: unknown key(s) {', '.join(sorted(unknown))}; "
                             f"valid: {', '.join(cls.__dataclass_fields__)}")
        cfg = cls(**section)
        if cfg.offline_proposer not in OFFLINE_PROPOSERS:
            raise ValueError(f"manifest sira section: offline_proposer {cfg.offline_proposer!r}; "
                             f"choose one of {', '.join(OFFLINE_PROPOSERS)}")
        missing = set(PROPOSER_CHOICES) - {"auto"} - set(dict(cfg.lambdas))
        if missing:
            raise ValueError(f"manifest sira section: lambdas lacks {', '.join(sorted(missing))}")
        return cfg

    @classmethod
    def from_options(cls, base: "SiraConfig", options: dict) -> "SiraConfig":
        """``base`` with the SIRA options popped from ``options``, each validated."""
        kw: dict[str, Any] = {}
        if "proposer" in options:
            p = options.pop("proposer")
            if p not in PROPOSER_CHOICES:
                raise _error(f"unknown proposer {p!r}; choose one of {', '.join(PROPOSER_CHOICES)}")
            kw["proposer"] = p
        if "lambda" in options:
            kw["lam"] = _number("lambda", options.pop("lambda"), 0.0, LAMBDA_MAX, False)
        if "tau" in options:
            kw["tau"] = _number("tau", options.pop("tau"), 0.0, 1.0, False, lo_open=True)
        if "max_n" in options:
            kw["max_n"] = _number("max_n", options.pop("max_n"), *MAX_N_RANGE, True)
        for name in ("fb_docs", "fb_terms"):
            if name in options:
                kw[name] = _number(name, options.pop(name), 1, FB_MAX, True)
        return replace(base, **kw)


def resolve_proposer(cfg: SiraConfig, dense_available: bool, chat_available: bool) -> tuple[str, list[str], str]:
    """(proposer, the sources it runs, a note for the reader) for this index and setup."""
    p, note = cfg.proposer, ""
    if p == "auto":
        if chat_available:
            return "llm", ["llm"], ""
        p = cfg.offline_proposer
        note = f"no chat model configured: offline proposer {p!r} (chosen on train/dev data)"
        if p == "dense" and not dense_available:
            p, note = "prf", note + "; the index has no vectors, so 'prf'"
    if p == "dense" and not dense_available:
        raise ModeUnavailable("SIRA proposer 'dense' needs dense vectors, and this index was built without "
                              "them: rebuild with `funnel build ... --dense`, or use proposer 'prf'")
    if p == "llm" and not chat_available:
        raise ModeUnavailable("SIRA proposer 'llm' needs a chat model: open_index(root, chat=ChatProvider("
                              "base_url=..., model=...)) (any OpenAI-compatible endpoint, or "
                              "serving.chat.LocalLlamaServer); or use proposer 'auto', 'prf', 'dense' or 'union'")
    if p == "union":
        return p, ["prf"] + (["dense"] if dense_available else []) + (["llm"] if chat_available else []), note
    return p, [p], note


def filter_proposals(proposals: list[Proposal], query_terms, sp: Space, cfg: SiraConfig) -> list[Verdict]:
    """The DF filter's verdict on each proposal, against the term statistics of the search's
    lexical space (``space``: documents, or passages where BM25 scores passages)."""
    index = sp.index
    vocab, df, analyze = index.vocab, index.df, index.analyzer.analyze
    qset = set(query_terms)
    mask = sp.mask  # a filtered search: df and N over the allowed documents (passages) only

    def df_of(key: str) -> int:
        g = vocab.get(key)
        return 0 if g is None else int(df[g])

    if mask is not None:
        def df_of(key: str) -> int:  # noqa: F811 - the filtered search's count
            return mask.df_of(index, key)

    return [df_filter(p.tokens if p.tokens is not None else analyze(p.phrase), qset, df_of,
                      index.n_docs if mask is None else mask.count, cfg.tau, cfg.max_n) for p in proposals]


def expansion_terms(proposals: list[Proposal], verdicts: list[Verdict]) -> dict[str, tuple[float, tuple[str, ...]]]:
    """{term: (weight, sources)} over kept proposals; a term's weight is the largest of
    the proposals that brought it (agreeing sources do not add up)."""
    out: dict[str, tuple[float, tuple[str, ...]]] = {}
    for p, v in zip(proposals, verdicts):
        if not v.kept:
            continue
        for t in v.terms:
            w, src = out.get(t, (0.0, ()))
            out[t] = (max(w, p.weight), src if p.source in src else src + (p.source,))
    return out


def weighted_query(query_terms: dict[str, float], expansion: dict[str, float], lam: float) -> dict[str, float]:
    """One {term: weight} dict whose BM25 score is ``BM25(q) + lam · BM25(e)`` (linearity)."""
    out = dict(query_terms)
    for t, w in expansion.items():
        out[t] = out.get(t, 0.0) + lam * w
    return out


def _ms(t: float) -> float:
    return round((time.perf_counter() - t) * 1000, 3)


@dataclass(frozen=True)
class Prepared:
    """A query's (or a batch's) settings, validated and resolved once."""

    config: SiraConfig
    params: Any                  # BM25Params
    nprobe: int | None
    proposer: str
    sources: tuple[str, ...]
    note: str


def prepare(searcher, options: dict) -> Prepared:
    """Validate ``options`` and resolve the proposer for this index and chat setup."""
    options = dict(options)
    cfg = SiraConfig.from_options(searcher.sira_config, options)
    nprobe = options.pop("nprobe", None)
    params = searcher._bm25_params(options)
    proposer, sources, note = resolve_proposer(cfg, searcher.dense_mode.available, searcher.chat is not None)
    return Prepared(cfg, params, nprobe, proposer, tuple(sources), note)


@dataclass
class Expansion:
    """Everything one query's expansion decided: the weighted query and why."""

    query_terms: dict[str, float]
    proposals: list[Proposal]
    verdicts: list[Verdict]
    terms: dict[str, tuple[float, tuple[str, ...]]]
    weights: dict[str, float]          # q and e merged (the trace, explanations)
    query_weights: dict[str, float]    # scored first: the query's terms (an expansion weight folded in)
    expansion_weights: dict[str, float]  # then: λ · weight of each expansion term not in the query
    proposer: str
    lam: float
    note: str
    llm_error: str | None
    timings: dict[str, float]


def _propose(searcher, query: str, qterms: dict[str, float], prep: Prepared
             ) -> tuple[list[Proposal], str, str, str | None, dict[str, float]]:
    """(proposals, the proposer that made them, note, llm error, the proposers' timings).
    A failing chat model is not an error: the offline proposer answers instead."""
    from ..chat import ChatError
    ctx = ProposalContext(searcher, query, qterms, prep.config, prep.params, prep.nprobe)
    proposer, note, llm_error = prep.proposer, prep.note, None
    proposals: list[Proposal] = []
    for src in prep.sources:
        try:
            proposals += PROPOSERS[src](ctx)
        except ChatError as e:  # the search still answers, with the offline proposer
            llm_error = str(e)
            log.warning("SIRA llm proposer failed, going on without it: %s", e)
            if proposer == "llm":
                fallback, fb_sources, _ = resolve_proposer(replace(prep.config, proposer="auto"),
                                                           searcher.dense_mode.available, False)
                note = f"the chat model failed ({e}); used offline proposer {fallback!r} instead"
                proposer = fallback
                for s2 in fb_sources:
                    proposals += PROPOSERS[s2](ctx)
    return proposals, proposer, note, llm_error, ctx.timings


def split_weights(qterms: dict[str, float], expansion: dict[str, tuple[float, tuple[str, ...]]],
                  lam: float) -> tuple[dict[str, float], dict[str, float]]:
    """``weighted_query(qterms, e, lam)`` (``e``: `expansion_terms`' weights) as the two
    groups ``search_weighted`` scores: the query's terms (an expansion weight folded in),
    then the new terms, in ``expansion``'s order."""
    first, then = dict(qterms), {}
    for t, (w, _) in expansion.items():
        if t in first:
            first[t] += lam * w
        else:
            then[t] = 0.0 + lam * w
    return first, then


def expand(searcher, query: str, prep: Prepared) -> Expansion:
    """Propose, DF-filter and merge: the one {term: weight} dict SIRA scores with."""
    t0 = time.perf_counter()
    qterms = dict(searcher.bm25.query_terms(query))
    proposals, proposer, note, llm_error, ptimes = _propose(searcher, query, qterms, prep)
    t_prop = _ms(t0)
    t = time.perf_counter()
    verdicts = filter_proposals(proposals, qterms, space(searcher), prep.config)
    exp = expansion_terms(proposals, verdicts)
    lam = prep.config.lambda_for(proposer)
    first, then = split_weights(qterms, exp, lam)
    weights = {**first, **then}  # = weighted_query(qterms, e, lam): the merged dict, same order
    timings = {**ptimes, "propose": t_prop, "filter": _ms(t)}
    return Expansion(qterms, proposals, verdicts, exp, weights, first, then, proposer, lam, note, llm_error,
                     timings)


def expand_weights(searcher, query: str, prep: Prepared) -> tuple[dict[str, float], dict[str, float]]:
    """`expand`'s ``(query_weights, expansion_weights)`` without its trace: the batch
    path's per-query step (~5 µs a query less)."""
    qterms = dict(searcher.bm25.query_terms(query))
    proposals, proposer, *_ = _propose(searcher, query, qterms, prep)
    verdicts = filter_proposals(proposals, qterms, space(searcher), prep.config)
    return split_weights(qterms, expansion_terms(proposals, verdicts), prep.config.lambda_for(proposer))


def sira_arrays(searcher, query: str, k: int, prep: Prepared):
    """(docnos, scores) of the top ``k``: the batch path, no trace or explanations."""
    x = expand(searcher, query, prep)
    return searcher.bm25.search_arrays(x.query_weights, k, prep.params, x.expansion_weights)


def run_sira(searcher, query: str, k: int, options: dict):
    """Mode function for ``Searcher``: (scored, trace, note, explain_fn)."""
    prep = prepare(searcher, options)
    x = expand(searcher, query, prep)
    t = time.perf_counter()
    scored = searcher.bm25.search_weighted(x.query_weights, k, prep.params, x.expansion_weights)
    timings = {**x.timings, "bm25": _ms(t)}
    cfg, params, qterms, exp, lam = prep.config, prep.params, x.query_terms, x.terms, x.lam
    trace = {"sira": {
        "proposer": x.proposer, "requested": cfg.proposer, "sources": list(prep.sources), "lambda": lam,
        "tau": cfg.tau, "tau_n": cfg.tau * space(searcher).n, "df_over": "passages" if space(searcher).passages
        else "documents", "max_n": cfg.max_n, "fb_docs": cfg.fb_docs,
        "fb_terms": cfg.fb_terms, "k1": params.k1, "b": params.b, "length_norm": params.length_norm,
        "note": x.note, "query_terms": qterms,
        "proposals": [{"phrase": p.phrase, "source": p.source, "weight": p.weight, "evidence": p.evidence,
                       "kept": v.kept, "reason": v.reason, "df": v.df, "terms": list(v.terms)}
                      for p, v in zip(x.proposals, x.verdicts)],
        "expansion_terms": {t_: {"weight": w, "final_weight": lam * w, "sources": list(s)}
                            for t_, (w, s) in exp.items()},
        **({"llm_error": x.llm_error} if x.llm_error else {})},
        "timings_ms": timings}
    if not qterms and not exp:
        msg = ("The query has no searchable words: every word is a stopword or punctuation "
               "(for example 'the', 'of', 'is'). Add content words.")
    elif not scored:
        msg = "None of the query's terms occur in this collection: " + ", ".join(qterms)
    elif not exp:
        msg = "SIRA kept no expansion terms for this query (see trace.sira.proposals); this is plain BM25."
    else:
        msg = ""
    note = x.note
    note_text = " ".join(m for m in (msg, note[:1].upper() + note[1:] + "." if note else "") if m)

    def explain(n: int) -> dict:
        ex = searcher.bm25.explain(x.weights, n, params)
        terms = {}
        for t_, v in sorted(ex.items(), key=lambda kv: -kv[1]["contribution"]):
            role = "query" if t_ in qterms else "expansion"
            terms[t_] = {**v, "role": role, **({"sources": list(exp[t_][1])} if t_ in exp else {})}
        q_parts = [f"{t_} (tf {v['tf']})" for t_, v in terms.items() if v["role"] == "query"]
        e_parts = [f"{t_} (tf {v['tf']}, {'+'.join(v['sources'])})" for t_, v in terms.items()
                   if v["role"] == "expansion"]
        why = "; ".join(w for w in (("query terms " + ", ".join(q_parts[:5])) if q_parts else "",
                                    ("expansion terms " + ", ".join(e_parts[:5])) if e_parts else "") if w)
        return {"terms": terms, "why": why or "no term matched",
                "query_terms": [t_ for t_, v in terms.items() if v["role"] == "query"],
                "expansion_terms": [t_ for t_, v in terms.items() if v["role"] == "expansion"]}

    return scored, trace, note_text, explain
