"""The one ``search()`` every front end calls (Python, CLI, HTTP, MCP).

    from funnel.serving.search import open_index
    ix = open_index("INDEX_ROOT")
    res = ix.search("what causes anemia", mode="bm25", k=10)
    print(res.summary); res.hits[0].doc_id; res.trace

``Searcher`` follows CURRENT: ``refresh()`` (called by the HTTP server between requests)
swaps in a newly published version without a restart.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
import regex

from .answers import bounds
from . import filters
from .lexical.bm25 import BM25Params
from .answers.bounds import bound_result
from .errors import ModeUnavailable, SearchError  # re-exported: their home is errors.py
from .index import IndexVersion, VersionFollower
from .lexical.retriever import BM25Retriever, Scored, explainer
from .options import check_option_values
from .result import Hit, SearchResult, summarize

if TYPE_CHECKING:
    from funnel.evaluation.trec import RunRows

log = logging.getLogger(__name__)

# A bound against abuse, not a relevance limit: BEIR ArguAna queries (whole arguments) run
# past 5,500 characters. The analyzer is linear in the text and the embedder truncates to
# its own window, so 100,000 characters cost milliseconds.
MAX_QUERY_CHARS = 100_000
MAX_K = 1000
#: Ids one ``get_documents`` call may name: an agent's handful of hits, not a corpus dump.
MAX_DOCUMENT_IDS = 20
BATCH_CELLS = 2_000_000  # search_batch (bm25): queries x depth answered per compiled call


_SENTENCE = regex.compile(r"(?<=[.!?])\s+")


#: The most ranked passages a hit may carry (``passages_per_hit``).
MAX_PASSAGES_PER_HIT = 10


def _check_summary_args(budget: Any, passages_per_hit: Any) -> tuple[int, int]:
    """``budget`` (tokens of the summary) and ``passages_per_hit``, defaulted and bounded."""
    from .answers.summary import DEFAULT_BUDGET, MAX_BUDGET, MIN_BUDGET
    if budget is None:
        budget = DEFAULT_BUDGET
    elif isinstance(budget, bool) or not isinstance(budget, int) or not MIN_BUDGET <= budget <= MAX_BUDGET:
        raise SearchError(f"budget is the most tokens of the summary: a whole number in {MIN_BUDGET}..{MAX_BUDGET}, "
                          f"got {budget!r}")
    if passages_per_hit is None:
        passages_per_hit = 1
    elif (isinstance(passages_per_hit, bool) or not isinstance(passages_per_hit, int)
          or not 1 <= passages_per_hit <= MAX_PASSAGES_PER_HIT):
        raise SearchError(f"passages_per_hit must be a whole number in 1..{MAX_PASSAGES_PER_HIT}, "
                          f"got {passages_per_hit!r}")
    return budget, passages_per_hit


def _empty_scope_note(scope: dict, note: str, searchable: bool) -> str:
    """Why a filtered or restricted search found nothing, in counts the caller may see."""
    mine = " you may read" if scope["restricted"] else ""
    if scope["filtered"] and scope["allowed"] == 0:
        return (f"The filter matched no documents: none of the {scope['visible']:,} documents{mine} passes it. "
                "Loosen the filter (its fields and values) or search without it.")
    if not searchable:
        return note
    if scope["filtered"]:
        return (f"None of the {scope['allowed']:,} documents the filter allows (of {scope['visible']:,}{mine}) "
                "matches the query; loosen the filter or rephrase the query.")
    if scope["visible"] == 0:
        return "You may read no documents in this collection."
    return f"None of the {scope['visible']:,} documents you may read matches the query."


def snippet(text: str, a: int, b: int, starts: np.ndarray, cols: np.ndarray, wanted: set[int],
            max_chars: int = 300) -> str:
    """The sentence of ``text[a:b]`` with the most distinct matched terms (the first one on
    ties), cut to ``max_chars``. ``starts``, ``cols``: where the text's query-term words start
    and which term each is (``PassageRanking.positions``, found once per search); ``wanted``:
    the columns of the hit's matched terms."""
    piece = text[a:b]
    if not piece:
        return ""
    cuts = [0] + [x for m in _SENTENCE.finditer(piece) for x in (m.start(), m.end())] + [len(piece)]
    sents = list(zip(cuts[::2], cuts[1::2]))[:200]
    counts = [0] * len(sents)
    if wanted and len(starts):
        edges = np.searchsorted(starts, a + np.asarray(sents, dtype=np.int64).ravel()).tolist()
        counts = [len(wanted.intersection(cols[lo:hi].tolist())) if hi > lo else 0
                  for lo, hi in zip(edges[::2], edges[1::2])]
    best_n = max(counts)
    x, y = sents[counts.index(best_n)]  # the first of the best
    best = piece[x:y]
    best = best or piece
    return best if len(best) <= max_chars else best[: max_chars - 1].rsplit(" ", 1)[0] + "…"


class Searcher:
    """Answers queries over an index root; see the module docstring.

    Each call works on one `VersionSearcher`, taken once at its start, so a
    concurrent ``refresh()`` never mixes two versions inside one query.

    ``kernels=False`` answers every BM25 query on the NumPy reference path, with the same
    rankings and scores: for a process that answers one query (``funnel search INDEX
    "text"``), where loading numba's compiled kernels (~0.45 s) costs more than the query.
    """

    def __init__(self, root: str, version: str | None = None, verify: str = "cached",
                 embedder=None, reranker=None, chat=None, kernels: bool = True):
        self.root = root
        self._verify = verify
        self._kernels = kernels
        self._embedder = embedder
        self._reranker = reranker
        self._chat = chat
        self._follow = VersionFollower(root, self._open, version=version)

    @property
    def _current(self) -> "VersionSearcher":
        if self._follow.closed:
            raise RuntimeError(f"this Searcher of {self.root} is closed; open the index again with "
                               "open_index(root) to search it")
        return self._follow.current

    def close(self) -> None:
        """Release the index version this searcher holds (its reader lease) now rather than when
        the searcher is garbage-collected, so retention and ``funnel gc`` may delete it once a
        newer version is published. Idempotent; searching afterwards raises RuntimeError. The
        embedder, reranker and chat model passed in belong to the caller and stay open. Also
        ``with open_index(root) as ix: ...``."""
        self._follow.close()

    def __enter__(self) -> "Searcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self, version: str) -> "VersionSearcher":
        vs = VersionSearcher(IndexVersion(self.root, version, verify=self._verify),
                             self._embedder, self._reranker, self._chat)
        vs.bm25.kernels = self._kernels
        return vs

    def __getattr__(self, name: str):
        # Everything else (search_batch, index, bm25, ...) is the current version's.
        if name.startswith("__") or name in ("_current", "_follow"):
            raise AttributeError(name)
        return getattr(self._current, name)

    def search(self, query: str, *args, **kwargs) -> SearchResult:
        """`VersionSearcher.search` on the current version, its answer within
        ``bounds.MAX_ANSWER_CHARS`` characters of document text whatever the corpus holds
        (``serving.answers.bounds``: titles, snippets, passages, fields and context; what was cut is
        listed in ``trace["bounds"]``). Every front end searches through here."""
        return bound_result(self._current.search(query, *args, **kwargs))

    @property
    def reranker(self):
        return self._reranker

    @reranker.setter
    def reranker(self, value) -> None:
        self._reranker = value
        self._current.reranker = value

    def refresh(self) -> bool:
        """Open the version CURRENT now names, if it verifies; True when it switched (never
        once closed).

        A version that fails (torn manifest, bad checksum, CURRENT outside the root) is not
        served: this keeps the current one and ``status()`` says "degraded" and why.
        """
        return self._follow.refresh()

    def status(self) -> dict:
        """``{"state": "ok" | "degraded" | "unavailable", "serving_version", "current", "pinned", "reason",
        "since"}``."""
        return self._follow.status()

    @property
    def follower(self) -> VersionFollower:
        """What keeps this searcher on CURRENT; the background scrub (``serving.frontends.scrub``)
        reports damaged versions to it."""
        return self._follow


class VersionSearcher:
    """Search over one opened index version (immutable apart from caches)."""

    def __init__(self, ix: IndexVersion, embedder=None, reranker=None, chat=None):
        from .hybrid import DenseMode, HybridConfig
        self.index = ix
        self.embedder = embedder
        self.reranker = reranker
        self.chat = chat
        self.bm25 = BM25Retriever(ix)
        self.dense_mode = DenseMode(ix, embedder)
        if ix.manifest.get("bm25_passages"):  # built with --bm25-passages: BM25 is MaxP over passages
            from .lexical.passage_bm25 import PassageBM25
            dm = self.dense_mode
            self.bm25 = PassageBM25(ix, ix.manifest["bm25_passages"], spans_of=lambda n: dm.passages().spans_of(n))
        hy = dict(ix.manifest.get("hybrid") or {})
        if "top_rank_bonus" in hy and hy["top_rank_bonus"] is not None:
            hy["top_rank_bonus"] = tuple(hy["top_rank_bonus"])
        self.hybrid_config = HybridConfig(**hy)
        from .sira import ForwardIndex, SiraConfig
        self.sira_config = SiraConfig.from_manifest(ix.manifest.get("sira"))
        self.forward = ForwardIndex(ix)  # documents' terms for feedback proposers, built on first use
        self._masks: filters.MaskCache | None = None  # filters and ACLs as masks, built on first use

    @property
    def version(self) -> str:
        return self.index.version

    def close(self) -> None:
        """Release this version's reader lease (``IndexVersion.close``)."""
        self.index.close()

    def warm(self) -> float:
        """Answer one query (the first words of the first document) in BM25 and, where the
        version has vectors, in hybrid mode, for a server about to take requests: its first
        request then does not pay for loading numba's compiled kernels and this version's
        tables (~0.5 s), nor for loading the query embedder and its first embedding (seconds
        with torch; kept in ``warm_embedder_s``, 0 without vectors). Returns the seconds taken.
        Never raises: where it fails, the server starts anyway and its first request pays."""
        t = time.perf_counter()
        self.warm_embedder_s = 0.0
        try:
            docs = self.index.docs
            first = next((s for s in range(docs.n_shards) if docs.shard_size(s)), None)
            if first is not None:
                d = docs.get(first << 32)
                words = " ".join(f"{d['title'] or ''} {d['text'] or ''}".split()[:8]) or "a"
                self.search(words, mode="bm25", k=10)
                if self.dense_mode.available:
                    e = time.perf_counter()
                    self.dense_mode.dense().provider.embed_query("warm-up")  # a query nobody asks: not cached
                    self.warm_embedder_s = time.perf_counter() - e
                    self.search(words, mode="hybrid", k=10).to_dict()  # as a front end answers it
        except Exception as e:  # noqa: BLE001 - a warm-up must not stop a server from starting
            log.warning("warm-up query on %s failed (%s: %s); the first request pays for it instead",
                        self.version, type(e).__name__, e)
        return time.perf_counter() - t

    # -- modes ---------------------------------------------------------------------------
    def modes(self) -> dict[str, Callable]:
        return {"bm25": self._run_bm25, "dense": self._run_dense, "hybrid": self._run_hybrid,
                "sira": self._run_sira}

    def _check(self, query: Any, mode: str, k: int) -> str:
        if not isinstance(query, str) or not query.strip():
            raise SearchError("empty query: pass the text to search for")
        if len(query) > MAX_QUERY_CHARS:
            raise SearchError(f"query has {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
        if mode not in self.modes():
            raise SearchError(f"unknown mode {mode!r}; choose one of {', '.join(self.modes())}")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise SearchError(f"k must be an integer between 1 and {MAX_K}, got {k!r}")
        return query.strip()

    def mode_options(self, mode: str) -> set[str]:
        """The per-query options a mode accepts (for error messages and the HTTP schema)."""
        from .hybrid import HybridConfig
        from .sira import OPTIONS as SIRA_OPTIONS
        bm25 = {"k1", "b", "length_norm"}
        return {"bm25": bm25, "dense": {"nprobe"}, "sira": bm25 | {"nprobe"} | set(SIRA_OPTIONS),
                "hybrid": bm25 | {"nprobe", "rerank", "expand"} | set(HybridConfig.__dataclass_fields__),
                }.get(mode, set()) | {"context_tokens"}

    def _check_options(self, mode: str, options: dict) -> dict:
        """``options`` checked (names for ``mode``, every value: ``options.check_option_values``)
        and converted; the one check every front end reaches, before any query runs."""
        unknown = set(options) - self.mode_options(mode)
        if unknown:
            raise SearchError(f"unknown option(s) {', '.join(sorted(unknown))} for mode {mode!r}; "
                              f"valid: {', '.join(sorted(self.mode_options(mode)))}")
        options = check_option_values(options)
        if mode == "sira":  # values too, and whether this index can run the proposer, before any query
            from .sira import prepare
            prepare(self, options)
        return options

    def default_mode(self) -> str:
        """The mode of a search that names none: ``hybrid`` where the index has vectors (the
        better ranking, and passages scored by both signals), else ``bm25``."""
        return "hybrid" if self.dense_mode.available else "bm25"

    def search(self, query: str, mode: str | None = None, k: int = 10, *, explain: bool = True,
               filter: Any = None, principal: Any = None, budget: int | None = None,
               passages_per_hit: int | None = None, offset: int = 0, fields: Any = None,
               **options) -> SearchResult:
        """Search one query; ``options`` are mode parameters (k1, b, length_norm, nprobe, ...).

        ``mode`` None is `default_mode`. ``filter`` (a JSON object or its text;
        ``serving.filters``) narrows the search to the documents it matches, in every mode,
        before ranking; ``principal`` (``serving.principals.Principal``) runs it as that
        caller: only documents its ACL lets it read. None for both: every document.

        ``summary`` is the text an agent reads (``serving.answers.summary``): the hits with their best
        passages quoted, at most ``budget`` tokens (default ``summary.DEFAULT_BUDGET``).
        Each hit cites its best passage (``passage``) and carries up to ``passages_per_hit``
        (default 1) ranked passages (``passages``), scored by ``serving.answers.passage_rank``. With
        ``explain=False`` there are no citations, and the summary lists the hits only.

        ``offset`` skips that many hits (the hits ranked ``offset + 1`` .. ``offset + k``;
        ``offset + k`` at most `MAX_K`), and ``total`` counts the matches
        (``serving.answers.paging``). ``fields`` (names, or ``"*"``) adds each hit's stored fields
        (``serving.documents``); a citation of a document with pages (a PDF) names them."""
        budget, passages_per_hit = _check_summary_args(budget, passages_per_hit)
        page = self._page(k, offset, fields, principal)
        if mode is None:
            mode = self.default_mode()
        if filter is not None or principal is not None:
            mask = self.mask(filter, principal)
            scope = self._scope(mask, filter, principal)
            with filters.scope(mask):
                res = self._search(query, mode, k, explain, budget, passages_per_hit, options, scope, page)
            if filter is not None:
                res.trace["filter"] = {"filter": filter, "documents": mask.count}
            return res
        return self._search(query, mode, k, explain, budget, passages_per_hit, options, None, page)

    def _page(self, k: Any, offset: Any, fields: Any, principal: Any) -> tuple[int, tuple | None, bool]:
        """(offset, fields, restricted) of a search, checked before it runs (``serving.answers.paging``,
        ``serving.documents``)."""
        from . import documents
        from .answers import paging
        whole_k = k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else 1  # _check judges k itself
        restricted = principal is not None and not principal.admin
        return (paging.check_offset(offset, whole_k, MAX_K),
                documents.check_fields(fields, documents.known_fields(self.index.manifest, restricted)), restricted)

    def _scope(self, mask, filter: Any, principal: Any) -> dict | None:
        """What a filtered or restricted search may say about its documents when it finds none:
        how many the filter allows and how many the caller may read (never more: a restricted
        caller hears only counts of documents it may read)."""
        restricted = principal is not None and not principal.admin
        visible = self.index.n_docs
        if restricted:
            own = self.mask(None, principal)
            visible = own.count if own is not None else visible
        allowed = mask.count if mask is not None else visible
        return {"filtered": filter is not None, "restricted": restricted, "allowed": allowed, "visible": visible}

    def _search(self, query: str, mode: str, k: int, explain: bool, budget: int, passages_per_hit: int,
                options: dict, scope: dict | None, page: tuple = (0, None, False)) -> SearchResult:
        from . import documents
        from .answers import paging
        offset, wanted, restricted = page
        query = self._check(query, mode, k)
        options = self._check_options(mode, options)
        context_tokens = options.pop("context_tokens", None)
        t0 = time.perf_counter()
        scored, trace, note, matched_fn = self.modes()[mode](query, k + offset, options)
        total = paging.total_of(self, mode, query, len(scored), k + offset, filters.current())
        scored = scored[offset:]
        trace = {"version": self.version, **trace}
        t = time.perf_counter()
        hits, ranking, texts = self._hits(query, mode, scored, matched_fn, explain, trace, passages_per_hit)
        hits = documents.hits_with(self, hits, offset, wanted, restricted)
        timings = {"hits": round((time.perf_counter() - t) * 1000, 3)}
        if context_tokens:
            trace["context"] = self._context(query, mode, trace, hits, ranking, texts, int(context_tokens))
        if not hits and scope is not None:
            note = _empty_scope_note(scope, note, bool(self.bm25.query_terms(query)) or mode == "dense")
        t = time.perf_counter()
        if explain:
            from .answers.summary import evidence_summary
            summary = evidence_summary(query, mode, hits, texts, ranking, budget, note)
        else:
            summary = summarize(query, mode, hits, note)
        timings["summary"] = round((time.perf_counter() - t) * 1000, 3)
        if explain:
            from .answers.context import approx_tokens
            trace["summary"] = {"budget": budget, "tokens": approx_tokens(summary),
                                **({"passage_signals": list(ranking.signals), "fusion": ranking.fusion}
                                   if ranking is not None else {})}
        trace["timings_ms"] = {**trace.get("timings_ms", {}), **timings,
                               "total": round((time.perf_counter() - t0) * 1000, 3)}
        return SearchResult(query, mode, summary, tuple(hits), trace, total=total, offset=offset)

    def search_batch(self, queries: Mapping[str, str], mode: str = "bm25", k: int = 100, *,
                     remove_query: bool = False, errors: dict[str, str] | None = None,
                     _sink: "_DictSink | _RowsSink | None" = None, filter: Any = None, principal: Any = None,
                     **options) -> dict[str, list[tuple[str, float]]]:
        """Answer many queries for a run file; no explanations or snippets.

        Parameters
        ----------
        queries : Mapping[str, str]
            ``{qid: text}``.
        mode, k, **options
            As for `search`; a bad mode, k or option raises `SearchError`
            before any query runs.
        remove_query : bool
            Drop the hit whose doc id equals the query id (BEIR ``ignore_identical_ids``,
            Pyserini ``--remove-query``; for sets whose queries are corpus documents, e.g.
            ArguAna, Quora). ``k + 1`` documents are retrieved, so ``k`` are still returned.
        errors : dict, optional
            Where a bad query (empty, too long, ...) goes. With a dict, it is recorded as
            ``errors[qid] = reason``, left out of the result, and the other queries are
            answered. With ``None`` (default) the first bad query raises
            `SearchError` naming its qid.
        filter, principal
            As for `search`: every query under the same filter and caller.

        Returns
        -------
        dict[str, list[tuple[str, float]]]
            ``{qid: [(doc_id, score), ...]}`` best first, for every query answered.
        """
        if filter is not None or principal is not None:
            with filters.scope(self.mask(filter, principal)):
                return self.search_batch(queries, mode, k, remove_query=remove_query, errors=errors, _sink=_sink,
                                         **options)
        if mode not in self.modes():
            raise SearchError(f"unknown mode {mode!r}; choose one of {', '.join(self.modes())}")
        options = self._check_options(mode, options)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise SearchError(f"k must be an integer between 1 and {MAX_K}, got {k!r}")
        depth = k + 1 if remove_query else k

        def checked(qid: str, q: Any) -> str | None:
            try:
                return self._check(q, mode, k)
            except ModeUnavailable:
                raise
            except SearchError as e:
                if errors is None:
                    raise SearchError(f"query {qid!r}: {e}") from None
                errors[qid] = str(e)
                return None

        def finish(qid: str, hits) -> list[tuple[str, float]]:
            if remove_query:
                hits = [h for h in hits if h[0] != qid]
            return hits[:k]

        out = _sink if _sink is not None else _DictSink(self)
        if mode == "bm25":  # the hot path of evaluation and benchmarks: arrays end to end
            self._bm25_batch(queries, depth, k, self._bm25_params(dict(options)), checked, remove_query, out)
            return out.result()
        run_mode = self.modes()[mode]
        if mode == "sira":
            from .sira import prepare
            from .sira.batch import batch_available
            sira = prepare(self, options)
            # prf / dense / their union: one compiled call; a proposer that runs per query (llm):
            # expansions in Python, scoring batched
            self._sira_batch(queries, depth, k, sira, checked, remove_query, out,
                             batch_available(self, sira) and filters.active() is None)
            return out.result()
        items = list(queries.items())
        for start in range(0, len(items), 256):
            chunk = [(qid, q) for qid, q in ((qid, checked(qid, q)) for qid, q in items[start:start + 256])
                     if q is not None]
            if not chunk:
                continue
            if mode in ("dense", "hybrid"):
                from .hybrid import prefill_query_vectors
                self._need_dense(mode)
                prefill_query_vectors(self, [q for _, q in chunk])
            for qid, q in chunk:
                scored = run_mode(q, depth, options)[0]
                out.hits(qid, finish(qid, [(self.index.docs.doc_id(s.docno), s.score) for s in scored]))
        return out.result()

    def search_batch_rows(self, queries: Mapping[str, str], mode: str = "bm25", k: int = 100, *,
                          remove_query: bool = False, errors: dict[str, str] | None = None,
                          **options) -> list["RunRows"]:
        """`search_batch`'s answers as arrays, for writing a run file
        (``evaluation.trec.write_run_rows``): a list of ``RunRows`` (qids, doc ids [n, k],
        scores [n, k], counts [n]) in query order, the same hits as `search_batch`.
        The bm25 and compiled sira paths hand over their result arrays as they are, with
        no Python object per hit but the doc id itself."""
        sink = _RowsSink(self)
        self.search_batch(queries, mode, k, remove_query=remove_query, errors=errors, _sink=sink, **options)
        return sink.result()

    def _sira_batch(self, queries: Mapping[str, str], depth: int, k: int, prep,
                    checked: Callable[[str, Any], str | None], remove_query: bool, out, compiled: bool) -> None:
        """search_batch's sira path, a chunk at a time (the dense proposer's queries embedded
        first). ``compiled``: the offline proposers' one compiled call per chunk (``sira.batch``);
        otherwise (the llm proposer, or no numba) each query is expanded as ``sira.mode.expand``
        does for a single query (proposers, DF filter), without the trace (``expand_weights``),
        and the chunk's weighted queries are scored in one compiled call
        (``BM25Retriever.search_weighted_batch``): the same hits as ``sira_arrays`` per query
        either way."""
        from .sira.batch import search_texts
        from .sira.mode import expand_weights
        qids, texts = self._valid_texts(queries, checked)
        texts = [q.strip() for q in texts]  # as ``search`` sees it (the chat model's prompt and cache key)
        step = max(1, BATCH_CELLS // depth)
        if "dense" in prep.sources:  # query vectors embedded a chunk at a time
            step = min(step, 256)
        for start in range(0, len(texts), step):
            chunk = texts[start:start + step]
            if "dense" in prep.sources:
                from .hybrid import prefill_query_vectors
                prefill_query_vectors(self, chunk)
            if compiled:
                found = search_texts(self, chunk, depth, prep)
            else:
                found = self.bm25.search_weighted_batch([expand_weights(self, q, prep) for q in chunk], depth,
                                                        prep.params)
            out.arrays(qids[start:start + step], found, k, remove_query)

    def _valid_texts(self, queries: Mapping[str, str], checked: Callable[[str, Any], str | None]
                     ) -> tuple[list[str], list[str]]:
        qids, texts = [], []
        for qid, q in queries.items():
            # The common valid case without the per-query checks' overhead; anything else goes
            # through ``checked`` (same messages). A non-blank str is ``_check``'s non-empty strip.
            if not (type(q) is str and len(q) <= MAX_QUERY_CHARS and q and not q.isspace()):
                if (q := checked(qid, q)) is None:
                    continue
            qids.append(qid)
            texts.append(q)
        return qids, texts

    def _bm25_batch(self, queries: Mapping[str, str], depth: int, k: int, params: BM25Params,
                    checked: Callable[[str, Any], str | None], remove_query: bool, out) -> None:
        """search_batch's bm25 path: every valid query scored in one compiled call
        (``BM25Retriever.search_texts``), doc ids taken in one vectorized step."""
        qids, texts = self._valid_texts(queries, checked)
        step = max(1, BATCH_CELLS // depth)  # result arrays of at most ~32 MB per compiled call
        for start in range(0, len(texts), step):
            out.arrays(qids[start:start + step], self.bm25.search_texts(texts[start:start + step], depth, params),
                       k, remove_query)

    def _hits(self, query: str, mode: str, scored: list[Scored], matched_fn, explain: bool, trace: dict,
              passages_per_hit: int = 1):
        """(hits, the passage ranking or None, docno -> text). With ``explain``, each hit cites
        its best passage and carries its ``passages_per_hit`` best (``passage_rank``)."""
        from .answers.citations import make_citation
        docs = [self.index.docs.get(s.docno) for s in scored]
        texts = {s.docno: d["text"] or "" for s, d in zip(scored, docs)}
        ranking = self.rank_passages(query, mode, trace, [(s.docno, r, d) for r, (s, d) in
                                                          enumerate(zip(scored, docs), start=1)]) \
            if explain and scored else None
        by_doc = {d.docno: i for i, d in enumerate(ranking.docs)} if ranking is not None else {}
        column = {t: c for c, t in enumerate(sorted(ranking.terms))} if ranking is not None else {}
        hits = []
        for rank, (s, doc) in enumerate(zip(scored, docs), start=1):
            detail = matched_fn(s.docno) if (explain and matched_fn) else {}
            detail.pop("passage", None)
            terms = tuple(detail.get("terms", {}))
            cites: tuple = ()
            snip = ""
            if explain:
                i = by_doc[s.docno]
                d, text = ranking.docs[i], texts[s.docno]
                cites = tuple(make_citation(text, int(d.spans[j][0]), int(d.spans[j][1]), int(j), ranking.via(d, j),
                                            ranking.score(d, j))
                              for j in d.order()[:passages_per_hit].tolist())
                if cites:
                    # The snippet is the passage's best sentence (a short document's passage is all of it).
                    c = cites[0]
                    snip = snippet(text, c.start, c.end, *ranking.positions(i),
                                   {column[t] for t in terms if t in column})
            cite = cites[0] if cites else None
            hits.append(Hit(doc_id=doc["doc_id"], rank=rank, score=round(s.score, 6), title=doc["title"],
                            snippet=snip,
                            matched_terms=terms, why=detail.get("why", ""), docno=s.docno,
                            explain=detail, passage=cite, passages=cites))
        return hits, ranking, texts

    def passage_terms(self, query: str, mode: str, trace: dict) -> dict[str, float]:
        """The weighted terms a mode scored with: SIRA's query and kept expansion terms
        (``BM25(q) + λ·BM25(e)`` as one dict), else the query's analyzed terms."""
        sira = trace.get("sira")
        if mode == "sira" and sira:
            out = dict(sira.get("query_terms") or {})
            for t, v in (sira.get("expansion_terms") or {}).items():
                out[t] = out.get(t, 0.0) + float(v["final_weight"])
            return out
        return dict(self.bm25.query_terms(query))

    def rank_passages(self, query: str, mode: str, trace: dict, docs: list[tuple[int, int, dict]]):
        """The passages of ``docs`` (``(docno, rank, stored document)``) scored by both signals
        and fused (``passage_rank.rank_passages``). The dense signal is used where the search
        embedded the query (dense, hybrid, SIRA with the dense proposer)."""
        from .answers.passage_rank import rank_passages
        qvec = None
        embedded = mode in ("dense", "hybrid") or (mode == "sira" and "dense" in (trace.get("sira") or {}).get(
            "sources", ()))
        if embedded and self.dense_mode.available and self.dense_mode.passages() is not None:
            qvec = self.dense_mode.dense().embed_query(query)
        return rank_passages(self, docs, self.passage_terms(query, mode, trace), qvec, self._bm25_params({}))

    def passage_spans(self, docno: int, text: str, window: int | None = None):
        """``(m, 2)`` character spans of a document's passages: the index's own (what was
        embedded) where it stores them, else the query-time split of ``window`` tokens
        (``citations.default_spans``)."""
        from .answers.citations import DEFAULT_WINDOW, default_spans
        stored = self.dense_mode.passages()
        return stored.spans_of(docno) if stored is not None else default_spans(text, window or DEFAULT_WINDOW)

    def citation(self, doc: dict, docno: int, terms: set[str], dense: dict | None = None,
                 window: int | None = None):
        """A hit's best passage (``citations``): ``dense`` (``DenseIndex.best_passage``, or
        ``PassageBM25.best_passage`` with ``via`` "bm25") when a list found it, else the
        passage with the most of ``terms``."""
        from .answers.citations import lexical_best, make_citation
        text = doc["text"] or ""
        if dense is not None:
            return make_citation(text, dense["start"], dense["end"], dense["ordinal"], dense.get("via", "dense"),
                                 dense["score"])
        spans = self.passage_spans(docno, text, window)
        if len(spans) == 0:
            return make_citation(text, 0, len(text), 0, "terms")
        j = lexical_best(text, spans, terms, self.index.analyzer.analyze)
        return make_citation(text, int(spans[j][0]), int(spans[j][1]), j, "terms")

    def _context(self, query: str, mode: str, trace: dict, hits: list[Hit], ranking, texts: dict[int, str],
                 budget: int) -> list[dict]:
        """The hits' passages taken by priority across documents (``passage_rank``: several of
        one document where they rank so), merged where they overlap, fitted to ``budget``
        tokens, U-shaped (context.py)."""
        from .answers.context import Passage, pack_ranked
        if ranking is None:  # a search without explanations: rank them now
            ranking = self.rank_passages(query, mode, trace, [(h.docno, h.rank, {"text": texts[h.docno]})
                                                              for h in hits]) if hits else None
        passages = []
        if ranking is not None:
            ids = {h.docno: h.doc_id for h in hits}
            for priority, i, j in ranking.pool():
                d = ranking.docs[i]
                a, b = (int(x) for x in d.spans[j])
                # The answer keeps at most MAX_PASSAGE_CHARS of a passage and MAX_ANSWER_CHARS
                # in all (bounds.py): pack no more, so a text with no token boundary (one
                # passage of megabytes) costs what the answer can show.
                b = min(b, a + bounds.MAX_PASSAGE_CHARS)
                passages.append(Passage(ids[d.docno], a, b, d.text[a:b], priority))
        # A token is at least one character: no budget above MAX_ANSWER_CHARS tokens can show more.
        budget = min(budget, bounds.MAX_ANSWER_CHARS)
        return [{"doc_id": p.doc_id, "start": p.start, "end": p.end, "score": p.score, "text": p.text}
                for p in pack_ranked(passages, budget, max_chars=bounds.MAX_ANSWER_CHARS)]

    def _bm25_params(self, options: dict) -> BM25Params:
        d = self.index.manifest.get("bm25", {})
        return BM25Params(k1=float(options.pop("k1", d.get("k1", 0.9))),
                          b=float(options.pop("b", d.get("b", 0.4))),
                          length_norm=options.pop("length_norm", d.get("length_norm", "lucene-byte4")))

    def _run_bm25(self, query: str, k: int, options: dict):
        options = dict(options)
        params = self._bm25_params(options)
        t = time.perf_counter()
        terms = self.bm25.query_terms(query)
        scored = self.bm25.search_weighted(dict(terms), k, params)
        passages = getattr(self.bm25, "best_passage", None)  # --bm25-passages (serving.lexical.passage_bm25)
        trace = {"bm25": {"k1": params.k1, "b": params.b, "length_norm": params.length_norm,
                          "query_terms": dict(terms), **({"scoring": "best passage (MaxP)"} if passages else {})},
                 "timings_ms": {"bm25": round((time.perf_counter() - t) * 1000, 3)}}
        note = ""
        if not terms:
            note = ("The query has no searchable words: every word is a stopword or punctuation "
                    "(for example 'the', 'of', 'is'). Add content words.")
        elif not scored:
            note = "None of the query's terms occur in this collection: " + ", ".join(terms)

        explain = explainer(self.bm25, dict(terms), [s.docno for s in scored], params)

        def matched(n: int) -> dict:
            ex = explain(n)
            top = sorted(ex.items(), key=lambda kv: -kv[1]["contribution"])
            why = "matched " + ", ".join(f"{t} (tf {v['tf']}, df {v['df']})" for t, v in top[:5])
            return {"terms": dict(top), "why": why + (" in its best passage" if passages is not None else "")}

        return scored, trace, note, matched

    def _need_dense(self, mode: str) -> None:
        if not self.dense_mode.available:
            raise ModeUnavailable(f"mode {mode!r} needs dense vectors, and index {self.version} was built "
                                  "without them: rebuild with `funnel build ... --dense`")

    def _run_dense(self, query: str, k: int, options: dict):
        from .hybrid import run_dense
        self._need_dense("dense")
        return run_dense(self, query, k, options)

    def _run_hybrid(self, query: str, k: int, options: dict):
        from .hybrid import run_hybrid
        self._need_dense("hybrid")
        return run_hybrid(self, query, k, options)

    def _run_sira(self, query: str, k: int, options: dict):
        from .sira import run_sira
        return run_sira(self, query, k, options)

    # -- documents and statistics ----------------------------------------------------------
    def get_document(self, doc_id: str, start: int | None = None, end: int | None = None, *,
                     from_line: int | None = None, max_lines: int | None = None, fields: Any = None,
                     principal: Any = None, max_chars: int | None = None) -> dict | None:
        """The stored document, or None; as ``principal``, None also where it may not read it
        (exactly as for a missing id).

        ``text`` is ``[start, end)`` of the document's text (default: all of it), or lines
        ``from_line`` (1-based) to ``from_line + max_lines - 1`` (each with its newline; no
        ``max_lines``: to the end), at most ``max_chars`` characters (default
        ``citations.MAX_RANGE_CHARS``); the result adds ``start``, ``end``, ``length``,
        ``line_start``, ``line_end``, ``truncated`` and ``next_start`` (see
        ``citations.text_range``). ``fields``: a list of field names, or ``"*"`` for all of
        them, added as ``fields`` (default none; ``serving.documents``). A bad range or field
        raises SearchError naming the document's length, lines or fields."""
        from . import documents
        return documents.get_document(self, doc_id, start, end, from_line=from_line, max_lines=max_lines,
                                      fields=fields, principal=principal, max_chars=max_chars)

    def get_documents(self, doc_ids: list[str] | None = None, start: int | None = None, end: int | None = None, *,
                      prefix: str | None = None, glob: str | None = None, from_line: int | None = None,
                      max_lines: int | None = None, fields: Any = None, principal: Any = None,
                      max_chars: int | None = None) -> dict:
        """Several documents in one call, all from this one version: ``{"version",
        "documents", "missing", "deferred", "max_chars"}``, and ``matched`` when named by a
        pattern.

        Named by ``doc_ids`` (at most `MAX_DOCUMENT_IDS`; a repeated one is answered
        once), or by an id ``prefix`` or ``glob`` (``fnmatch``: ``*``, ``?``, ``[...]``): the
        first `MAX_DOCUMENT_IDS` matching ids the caller may read, in id order, with
        ``matched`` saying how many match in all (page through them with
        `list_documents`). Each document is `get_document`'s answer for the same
        range and fields, in the order asked, and together their texts hold at most
        ``max_chars`` characters (default ``citations.MAX_RANGE_CHARS``, the bound of one
        ``get_document``): the document that meets the bound comes back cut (``truncated``,
        ``next_start``) and the ids after it are ``deferred``, not looked up (ask again for
        them). ``missing`` are ids this version does not have or, as ``principal``, may not
        read: the two are not told apart. A bad argument raises SearchError, as
        `get_document` does."""
        from . import documents
        return documents.get_documents(self, doc_ids, start, end, prefix=prefix, glob=glob, from_line=from_line,
                                       max_lines=max_lines, fields=fields, principal=principal,
                                       max_chars=max_chars, max_ids=MAX_DOCUMENT_IDS)

    def list_documents(self, prefix: str | None = None, *, glob: str | None = None, offset: int = 0,
                       limit: int | None = None, fields: Any = None, principal: Any = None) -> dict:
        """A page of this version's documents in id order: ``{"version", "prefix", "glob",
        "offset", "limit", "total", "next_offset", "documents": [{"doc_id", "title",
        "length"}]}``.

        Narrowed to ids that start with ``prefix`` or match ``glob``; ``offset`` (default 0)
        and ``limit`` (default ``documents.DEFAULT_LIST_LIMIT``, at most
        ``documents.MAX_LIST_LIMIT``) page through them, ``next_offset`` is the next page's
        offset (None after the last) and ``total`` counts every match. As ``principal``, only
        documents it may read are listed or counted. ``fields`` as for `get_document`."""
        from . import documents
        return documents.list_documents(self, prefix, glob=glob, offset=offset, limit=limit, fields=fields,
                                        principal=principal)

    def mask(self, filter: Any = None, principal: Any = None) -> "filters.Mask | None":
        """The `Mask` of a search with ``filter`` run as
        ``principal`` (None when neither narrows it); a SearchError for a bad filter."""
        cache = self._masks
        if cache is None:
            cache = self._masks = filters.MaskCache(filters.FieldStore(self.index))
        return cache.mask(filter, principal)

    def term_stats(self, terms: list[str], *, principal: Any = None) -> list[dict]:
        """df / idf / cf for each analyzed form of ``terms``; never passages.

        As a ``principal`` that is not an administrator, df and cf count only the documents it
        may read, ``n_docs`` is how many those are, and idf (from the global df) is left out:
        a hidden document's words are not revealed through a term's statistics."""
        from .lexical.bm25 import idf_lucene
        ix = self.index
        out = []
        if principal is not None and not principal.admin:
            mask = self.mask(None, principal) or filters.Mask(None, filters.FieldStore(ix).doc_off, True)
            for raw in terms:
                for t in ix.analyzer.analyze(raw) or [None]:
                    if t is None:
                        out.append({"term": raw, "analyzed": None, "df": 0, "cf": 0, "idf": None,
                                    "note": "stopword or no searchable characters"})
                        continue
                    df, cf = mask.df_cf(ix, ix.vocab.get(t))
                    out.append({"term": raw, "analyzed": t, "df": df, "cf": cf, "idf": None, "n_docs": mask.count})
            return out
        for raw in terms:
            for t in ix.analyzer.analyze(raw) or [None]:
                if t is None:
                    out.append({"term": raw, "analyzed": None, "df": 0, "cf": 0, "idf": None,
                                "note": "stopword or no searchable characters"})
                    continue
                g = ix.vocab.get(t)
                df = int(ix.df[g]) if g is not None else 0
                out.append({"term": raw, "analyzed": t, "df": df, "cf": int(ix.cf[g]) if g is not None else 0,
                            "idf": float(idf_lucene(df, ix.n_docs_nonempty)), "n_docs": ix.n_docs})
        return out


def open_index(root: str, **kwargs) -> Searcher:
    """Open the CURRENT version of ``root`` (see `Searcher`)."""
    return Searcher(root, **kwargs)


class _DictSink:
    """search_batch's result as ``{qid: [(doc_id, score), ...]}``."""

    def __init__(self, searcher: Searcher):
        self.searcher = searcher
        self.out: dict[str, list[tuple[str, float]]] = {}

    def arrays(self, qids: list[str], found: tuple, k: int, remove_query: bool) -> None:
        """One batch's (positions, scores, counts), ``depth`` wide (k + 1 with remove_query)."""
        pos, score, cnt = found
        # Up to k · len(queries) tuples: the cyclic GC would rescan the young ones many times
        # over while they are built (nothing here makes a cycle), so it waits until the end.
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            ids = self.searcher.bm25.doc_ids_at(pos).tolist()
            scores = score.tolist()
            for qid, n, row_ids, row_sc in zip(qids, cnt.tolist(), ids, scores):
                hits = list(zip(row_ids[:n], row_sc[:n]))
                if remove_query:
                    hits = [h for h in hits if h[0] != qid][:k]
                self.out[qid] = hits
        finally:
            if gc_was_on:
                gc.enable()

    def hits(self, qid: str, hits: list[tuple[str, float]]) -> None:
        self.out[qid] = hits

    def result(self) -> dict[str, list[tuple[str, float]]]:
        return self.out


class _IdsAt:
    """``RunRows.doc_ids`` for rows that carry positions: the doc ids at ``pos``, looked up
    only where indexed (``write_run_rows`` writes from the positions and never asks, which
    saved a Python object per hit: ~0.6 us a query at k=100)."""

    def __init__(self, lookup: Callable, pos):
        self.lookup, self.pos, self.shape = lookup, pos, pos.shape

    def __getitem__(self, key):
        return self.lookup(self.pos[key])

    def __array__(self, dtype=None, copy=None):
        ids = self.lookup(self.pos)
        return ids if dtype is None else ids.astype(dtype, copy=False)


class _RowsSink:
    """search_batch's result as ``RunRows`` parts (``search_batch_rows``)."""

    def __init__(self, searcher: Searcher):
        self.searcher = searcher
        self.parts: list = []
        self.pending: dict[str, list[tuple[str, float]]] = {}

    def arrays(self, qids: list[str], found: tuple, k: int, remove_query: bool) -> None:
        from funnel.evaluation.trec import RunRows
        self._flush()
        pos, score, cnt = found
        lookup = self.searcher.bm25.doc_ids_at
        if remove_query and len(qids):
            # The query's own document, where retrieved, leaves its row; the rest move up.
            ids = lookup(pos)
            live = np.arange(ids.shape[1])[None, :] < cnt[:, None]
            hit = np.asarray(ids == np.asarray(qids, dtype=object)[:, None], dtype=bool) & live
            if hit.any():
                order = np.argsort(hit, axis=1, kind="stable")
                score = np.take_along_axis(score, order, axis=1)
                pos = np.take_along_axis(pos, order, axis=1)
                cnt = cnt - hit.sum(axis=1)
        # The writer reads the ids from the positions: none are built unless asked for.
        self.parts.append(RunRows(list(qids), _IdsAt(lookup, pos[:, :k]), score[:, :k], np.minimum(cnt, k),
                                  pos[:, :k], self.searcher.index.docs.id_table()))

    def hits(self, qid: str, hits: list[tuple[str, float]]) -> None:
        self.pending[qid] = hits

    def _flush(self) -> None:
        if self.pending:
            from funnel.evaluation.trec import RunRows
            width = max(map(len, self.pending.values()))
            ids = np.full((len(self.pending), width), None, dtype=object)
            scores = np.zeros((len(self.pending), width))
            for i, hits in enumerate(self.pending.values()):
                for j, (d, s) in enumerate(hits):
                    ids[i, j] = d
                    scores[i, j] = s
            self.parts.append(RunRows(list(self.pending), ids, scores,
                                      np.asarray([len(h) for h in self.pending.values()], dtype=np.int64)))
            self.pending = {}

    def result(self) -> list:
        self._flush()
        return self.parts
