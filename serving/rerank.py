"""Second-stage rerankers: one ``RerankProvider`` interface, three implementations.

The funnel (DESIGN.md "Hybrid retrieval", step 4): the top 30-40 fused candidates go to
``RerankProvider.rerank(query, documents, top_n) -> [(index, score), ...]``, best first,
where ``index`` points into ``documents``. Hybrid search hands each candidate's best
passage (its citation: ``serving/answers/citations.py``), not the whole document;
`best_chunk` finds the best window of a text that has no passages.

* `CrossEncoderReranker` — a local sentence-transformers ``CrossEncoder``. No
  pretrained cross-encoder ships offline here (no PyPI package carries one), so it needs a
  local model folder.
* `HTTPReranker` — a rerank service: Cohere / Jina ``POST /v1/rerank``
  (``{"model", "query", "documents", "top_n"}`` -> ``{"results": [{"index",
  "relevance_score"}]}``) or Hugging Face TEI ``POST /rerank`` (``{"query", "texts"}`` ->
  ``[{"index", "score"}]``).
* `BiEncoderReranker` — a fallback that re-scores the candidates by cosine
  ``q·d / (|q| |d|)`` with any embedding provider (``embed_query``, ``embed_documents``).

`make_reranker` builds one from a spec string; its error message is generated from
the registry of forms.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

logger = logging.getLogger(__name__)

#: Environment variable an ``http`` spec reads its API key from.
API_KEY_ENV = "FUNNEL_RERANK_API_KEY"
#: HTTP statuses worth retrying (rate limit, transient server errors).
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class RerankError(RuntimeError):
    """A reranker could not be loaded or did not answer as expected."""


@runtime_checkable
class RerankProvider(Protocol):
    """What the searcher needs from a second stage."""

    name: str

    def rerank(self, query: str, documents: list[str],
               top_n: int | None = None) -> list[tuple[int, float]]:
        """``(index into documents, score)`` pairs, best first, at most ``top_n``."""
        ...

    def fingerprint(self) -> str:
        """A stable string naming the model and settings, recorded with results."""
        ...


def _fingerprint(name: str, params: dict[str, Any]) -> str:
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return f"{name}:{hashlib.sha256(blob).hexdigest()[:16]}"


def _top_pairs(pairs: Iterable[tuple[int, float]], top_n: int | None) -> list[tuple[int, float]]:
    # Best first; equal scores keep document order.
    ordered = sorted(pairs, key=lambda p: (-p[1], p[0]))
    return ordered if top_n is None else ordered[:max(0, int(top_n))]


def _top(scores: Iterable[float], top_n: int | None) -> list[tuple[int, float]]:
    return _top_pairs([(i, float(s)) for i, s in enumerate(scores)], top_n)


# --------------------------------------------------------------------------- local models


class CrossEncoderReranker:
    """A local sentence-transformers ``CrossEncoder`` scoring (query, document) pairs.

    Parameters
    ----------
    model
        A local model folder (or a hub name when ``local_files_only=False`` and the hub is
        reachable).
    batch_size, max_length, device
        Passed to ``CrossEncoder`` / ``predict``.
    local_files_only
        True by default: model hubs are unreachable here, and a hub lookup would fail late.
    """

    name = "cross-encoder"

    def __init__(self, model: str, batch_size: int = 32, max_length: int | None = 512,
                 device: str | None = None, local_files_only: bool = True):
        self.model_name = model
        self.batch_size = batch_size
        self.max_length = max_length
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise ImportError("CrossEncoderReranker needs sentence-transformers: "
                              "pip install sentence-transformers") from exc
        try:
            self._model = CrossEncoder(model, max_length=max_length, device=device,
                                       local_files_only=local_files_only)
        except Exception as exc:
            raise RerankError(
                f"could not load cross-encoder {model!r}: {exc}. No pretrained "
                "cross-encoder ships offline with funnel (no PyPI package carries one). "
                "Point at a local model folder ('cross-encoder:/path/to/model'), or use a "
                "rerank service ('http:http://host:port#model-name', Cohere/Jina/TEI), or "
                "the 'biencoder' fallback.") from exc

    def rerank(self, query: str, documents: list[str],
               top_n: int | None = None) -> list[tuple[int, float]]:
        if not documents:
            return []
        scores = self._model.predict([(query, d) for d in documents],
                                     batch_size=self.batch_size, show_progress_bar=False,
                                     convert_to_numpy=True)
        return _top(np.asarray(scores, dtype=np.float64).reshape(len(documents), -1)[:, 0],
                    top_n)

    def fingerprint(self) -> str:
        return _fingerprint(self.name, {"model": os.path.abspath(self.model_name)
                                        if os.path.exists(self.model_name) else self.model_name,
                                        "max_length": self.max_length})


class BiEncoderReranker:
    """Re-score candidates by cosine similarity with an embedding provider.

    A weak second stage (the same kind of model as the dense list) but always available
    offline. ``provider`` needs ``embed_query(text) -> (d,)`` and
    ``embed_documents(texts) -> (n, d)``; a ``fingerprint()`` is used when present.
    """

    name = "biencoder"

    def __init__(self, provider: Any, eps: float = 1e-12):
        for attr in ("embed_query", "embed_documents"):
            if not callable(getattr(provider, attr, None)):
                raise TypeError(f"BiEncoderReranker needs a provider with {attr}(); "
                                f"{type(provider).__name__} has none")
        self.provider = provider
        self.eps = eps

    def rerank(self, query: str, documents: list[str],
               top_n: int | None = None) -> list[tuple[int, float]]:
        if not documents:
            return []
        q = np.asarray(self.provider.embed_query(query), dtype=np.float64).reshape(-1)
        d = np.asarray(self.provider.embed_documents(list(documents)), dtype=np.float64)
        if d.shape != (len(documents), q.shape[0]):
            raise RerankError(f"embed_documents returned shape {d.shape}; expected "
                              f"({len(documents)}, {q.shape[0]}) to match embed_query")
        cos = d @ q / np.maximum(np.linalg.norm(d, axis=1) * np.linalg.norm(q), self.eps)
        return _top(cos, top_n)

    def fingerprint(self) -> str:
        fp = getattr(self.provider, "fingerprint", None)
        inner = fp() if callable(fp) else type(self.provider).__name__
        return f"{self.name}:{inner}"


# --------------------------------------------------------------------------- HTTP services


@dataclass(frozen=True)
class HTTPStyle:
    """One rerank wire protocol: endpoint path, request builder, response parser."""

    path: str
    request: Callable[[str, str, list[str], int | None], dict]
    parse: Callable[[Any], list[tuple[int, float]]]


def _cohere_request(model: str, query: str, documents: list[str], top_n: int | None) -> dict:
    return {"model": model, "query": query, "documents": documents,
            "top_n": len(documents) if top_n is None else top_n}


def _cohere_parse(body: Any) -> list[tuple[int, float]]:
    return [(int(r["index"]), float(r["relevance_score"])) for r in body["results"]]


def _tei_request(model: str, query: str, documents: list[str], top_n: int | None) -> dict:
    return {"query": query, "texts": documents}


def _tei_parse(body: Any) -> list[tuple[int, float]]:
    return [(int(r["index"]), float(r["score"])) for r in body]


#: Wire protocols by name; the error message is generated from the keys.
HTTP_STYLES: dict[str, HTTPStyle] = {
    "cohere": HTTPStyle("/v1/rerank", _cohere_request, _cohere_parse),
    "jina": HTTPStyle("/v1/rerank", _cohere_request, _cohere_parse),
    "tei": HTTPStyle("/rerank", _tei_request, _tei_parse),
}


def _endpoint(base_url: str, path: str) -> str:
    base = base_url.rstrip("/")
    if base.endswith("/rerank"):
        return base  # the full endpoint was given
    if base.endswith("/v1") and path.startswith("/v1/"):
        return base + path[3:]
    return base + path


class HTTPReranker:
    """A rerank service over HTTP (Cohere, Jina, Voyage-compatible, or TEI).

    Parameters
    ----------
    base_url
        Service root (``http://127.0.0.1:8080``); ``/v1/rerank`` or ``/rerank`` is appended
        unless the URL already ends with ``/rerank``.
    model
        Model name sent to Cohere/Jina-style services (TEI serves one model).
    api_key
        Sent as ``Authorization: Bearer ...`` when given.
    style
        One of ``HTTP_STYLES``: "cohere", "jina", "tei".
    timeout, retries, backoff
        Seconds per request; extra attempts after a transport error or a 408/429/5xx;
        the sleep before retry i is ``backoff · 2**i``.
    client
        An ``httpx.Client`` to use instead of a new one (its own headers and timeout
        apply; ``api_key`` and ``timeout`` are then ignored).
    """

    name = "http"

    def __init__(self, base_url: str, model: str = "", api_key: str | None = None,
                 style: str = "cohere", timeout: float = 30.0, retries: int = 2,
                 backoff: float = 0.5, client: Any = None):
        if style not in HTTP_STYLES:
            raise ValueError(f"unknown rerank HTTP style {style!r}; choose one of "
                             f"{', '.join(HTTP_STYLES)}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        import httpx

        self.base_url, self.model, self.style = base_url, model, style
        self.url = _endpoint(base_url, HTTP_STYLES[style].path)
        self.retries, self.backoff = int(retries), float(backoff)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.Client(timeout=timeout, headers=headers)

    def _post(self, payload: dict) -> Any:
        import httpx

        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                resp = self._client.post(self.url, json=payload)
            except httpx.TransportError as exc:
                if last:
                    raise RerankError(f"rerank service {self.url} unreachable after "
                                      f"{attempt + 1} attempt(s): {exc}; is it running?") from exc
                logger.warning("rerank request to %s failed (%s); retrying", self.url, exc)
            else:
                if resp.status_code < 400:
                    return resp.json()
                if resp.status_code not in RETRY_STATUSES or last:
                    raise RerankError(
                        f"rerank service {self.url} answered HTTP {resp.status_code}: "
                        f"{resp.text[:300]!r}; check the URL, model name, API key and "
                        f"style (sent the {self.style!r} request shape)")
                logger.warning("rerank service %s answered HTTP %d; retrying", self.url,
                               resp.status_code)
            time.sleep(self.backoff * 2 ** attempt)
        raise AssertionError("unreachable")  # the loop returns or raises

    def rerank(self, query: str, documents: list[str],
               top_n: int | None = None) -> list[tuple[int, float]]:
        if not documents:
            return []
        style = HTTP_STYLES[self.style]
        body = self._post(style.request(self.model, query, list(documents), top_n))
        try:
            pairs = style.parse(body)
        except (KeyError, TypeError, ValueError) as exc:
            raise RerankError(f"rerank service {self.url} returned a body that is not the "
                              f"{self.style!r} shape: {str(body)[:300]}; pick the right "
                              f"style ({', '.join(HTTP_STYLES)})") from exc
        bad = [(i, s) for i, s in pairs if not 0 <= i < len(documents) or not math.isfinite(s)]
        if bad:
            raise RerankError(f"rerank service {self.url} returned invalid (index, score) "
                              f"pairs {bad[:5]} for {len(documents)} documents")
        return _top_pairs(pairs, top_n)

    def fingerprint(self) -> str:
        return f"{self.name}-{self.style}:{self.model}@{self.url}"

    def close(self) -> None:
        self._client.close()


# --------------------------------------------------------------------------- chunks


_WORD = re.compile(r"\S+")


def best_chunk(query_terms: set[str], text: str, analyzer_fn: Callable[[str], list[str]],
               chunk_tokens: int = 256, stride: int = 128) -> tuple[int, int, str]:
    """The window of a long document that matches the query best, to rerank instead of it.

    Windows of ``chunk_tokens`` whitespace tokens start every ``stride`` tokens (the last
    one is aligned to the end of the text). A window's score is (distinct query terms
    matched, total matching tokens), compared in that order; the earliest window wins ties.
    ``analyzer_fn`` maps raw text to index terms (the index's analyzer, e.g.
    ``Analyzer().analyze``) so that ``query_terms`` are compared as analyzed terms.

    Returns
    -------
    (start, end, text)
        Character offsets into ``text`` and ``text[start:end]``.
    """
    if chunk_tokens < 1 or stride < 1:
        raise ValueError(f"chunk_tokens and stride must be >= 1, got {chunk_tokens}, {stride}")
    spans = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    if len(spans) <= chunk_tokens:
        return 0, len(text), text
    terms = sorted(query_terms)
    col = {t: j for j, t in enumerate(terms)}
    cache: dict[str, list[int]] = {}
    match = np.zeros((len(spans) + 1, max(1, len(terms))), dtype=np.int64)
    for i, (a, b) in enumerate(spans):
        tok = text[a:b]
        if tok not in cache:
            cache[tok] = sorted({col[t] for t in analyzer_fn(tok) if t in col})
        match[i + 1, cache[tok]] = 1
    cum = match.cumsum(axis=0)
    n = len(spans)
    starts = list(range(0, n - chunk_tokens + 1, stride))
    if starts[-1] != n - chunk_tokens:
        starts.append(n - chunk_tokens)
    s = np.asarray(starts)
    counts = cum[s + chunk_tokens] - cum[s]
    distinct, total = (counts > 0).sum(axis=1), counts.sum(axis=1)
    best = int(np.lexsort((s, -total, -distinct))[0])
    a, b = spans[starts[best]][0], spans[starts[best] + chunk_tokens - 1][1]
    return a, b, text[a:b]


# --------------------------------------------------------------------------- registry


def _make_none(arg: str, **_: Any) -> None:
    return None


def _make_cross_encoder(arg: str, **kw: Any) -> CrossEncoderReranker:
    if not arg:
        raise ValueError("'cross-encoder:' needs a model path, e.g. cross-encoder:/models/ce")
    return CrossEncoderReranker(arg, **kw)


def _make_http(arg: str, style: str = "cohere", **kw: Any) -> HTTPReranker:
    url, _, model = arg.partition("#")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"rerank URL must start with http:// or https://, got {url!r}")
    kw.setdefault("api_key", os.environ.get(API_KEY_ENV))
    return HTTPReranker(url, model, style=style, **kw)


def _make_biencoder(arg: str, embedder: Any = None, **_: Any) -> BiEncoderReranker:
    if embedder is None:
        raise ValueError("'biencoder' reranks with the dense retriever's embedder: pass "
                         "make_reranker('biencoder', embedder=...)")
    return BiEncoderReranker(embedder)


#: Spec prefix -> (form shown in errors, builder). Errors list the forms from here.
RERANKER_SPECS: dict[str, tuple[str, Callable[..., RerankProvider | None]]] = {
    "none": ("none", _make_none),
    "cross-encoder": ("cross-encoder:PATH", _make_cross_encoder),
    "http": ("http:URL#MODEL (Cohere shape)", _make_http),
    **{f"http+{s}": (f"http+{s}:URL#MODEL", lambda a, _s=s, **kw: _make_http(a, _s, **kw))
       for s in HTTP_STYLES},
    "biencoder": ("biencoder", _make_biencoder),
}


def make_reranker(spec: str | None, embedder: Any = None, **kwargs: Any) -> RerankProvider | None:
    """Build a reranker from a spec string; ``None``/``"none"``/``""`` give None.

    Forms: ``none``, ``cross-encoder:PATH``, ``http:URL#MODEL`` (Cohere/Jina shape),
    ``http+STYLE:URL#MODEL`` for each of ``HTTP_STYLES``, ``biencoder`` (needs
    ``embedder=``). An ``http`` spec reads its API key from ``$FUNNEL_RERANK_API_KEY``.
    Extra ``kwargs`` go to the reranker's constructor.
    """
    if spec is None or not spec.strip():
        return None
    kind, _, arg = spec.strip().partition(":")
    if kind not in RERANKER_SPECS:
        forms = ", ".join(form for form, _ in RERANKER_SPECS.values())
        raise ValueError(f"unknown reranker spec {spec!r}; use one of: {forms}")
    builder = RERANKER_SPECS[kind][1]
    if kind == "biencoder":
        return builder(arg, embedder=embedder, **kwargs)
    return builder(arg, **kwargs)
