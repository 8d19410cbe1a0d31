"""SIRA corpus side: an LLM proposes the search vocabulary a document lacks; the DF filter
keeps the rare phrases; the kept ones are appended to the document's indexed tokens.

Pure (no Ray). The pieces, in the order the build uses them (``jobs/local_engine.run_enrich``):

* `build_messages` / `PROMPT_VERSION`: task-aware prompts asking for up to
  ``MAX_PHRASES`` phrases of 1..max_n words, answered as JSON ``{"keywords": [...]}``
  (the reference code's shape, DESIGN.md "SIRA retrieval").
* `EnrichClient`: one OpenAI-compatible ``/v1/chat/completions`` call per document
  with a timeout, retries with exponential backoff on transport errors, 429 and 5xx, and
  `parse_keywords`, which accepts clean JSON, JSON after chatty reasoning, code
  fences and plain lists of lines. A reply it cannot read is a failure, never a guess.
* `EnrichmentCache`: phrases keyed by (content hash, model, prompt id), in
  append-only JSONL segments under the same cache root as the embedding cache. Only
  successful answers are stored, so a rebuild asks the LLM only about new, edited or
  previously failed documents.
* `propose_documents`: bounded concurrency (a thread pool: the calls wait on the
  endpoint, which batches them: vLLM/TGI on a GPU cluster, llama.cpp locally).
* `filter_phrase`: keep a phrase if some window of 1..max_n of its analyzed tokens
  has ``df <= tau·N`` in the UN-enriched corpus (no lower bound: enrichment may add new
  words). N-gram windows are counted on the corpus text by `ngram_doc_freq`.
* `injection_terms`: a kept phrase's unigrams plus its n-grams as atomic terms under
  `funnel.serving.sira.dffilter.ngram_key` (the key the query side looks up).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Sequence

log = logging.getLogger(__name__)

#: Bump whenever a prompt, the schema or the parsing changes: it is part of the cache key.
PROMPT_VERSION = "sira-enrich-3"
#: Phrases asked for and kept per document (the reference asks for at most 10).
MAX_PHRASES = 10
#: Longest phrase accepted from the model, in characters.
MAX_PHRASE_CHARS = 80
#: Characters per phrase the answer's JSON schema allows, per word of max_n: it bounds what
#: a small model can ramble inside one string (SmolLM2 otherwise fills 256 tokens with one
#: hyphenated run), so the grammar-constrained JSON closes within ``max_tokens``.
SCHEMA_CHARS_PER_WORD = 20
#: What a phrase must look like: it starts with a letter (any script) and holds no quote.
#: SmolLM2-135M otherwise answers ``"..."`` (copied from the prompt) for most documents:
#: 14 of 16 SciFact documents came back empty without it, 0 of 16 with it (sira-enrich-3).
#: llama.cpp's grammar converter takes no ``\s``/``\d`` in classes, hence the spelled-out set.
#: The pattern carries the length bound too: with a pattern the converter ignores maxLength.
PHRASE_PATTERN = "^[^ 0-9.,;:!?'\"(){{}}<>/*#-][^\"]{{1,{rest}}}$"
#: Document characters sent to the model (SmolLM2's 2,048-token context holds ~2,000).
DOC_CHARS = 2000
MAX_N_RANGE = (1, 3)

_SYSTEM = ("You are a search expert. You suggest the words people type into a search engine. "
           "Answer with JSON only.")
#: What the searcher is after, per task (``--enrich-task``).
TASKS = {
    "general": "a person searching for this document",
    "qa": "a person asking a question that this document answers",
    "factcheck": "a fact-checker verifying a claim that this document supports or refutes; "
                 "name and disambiguate every entity it mentions (aliases, abbreviations, full names)",
    "argument": "a person looking for arguments for or against the position this text takes",
    "duplicate": "a person asking the same question in different words",
    "citation": "an author looking for a paper to cite for this work",
}
_USER = ("Document:\n{doc}\n\nList up to {k} search phrases of 1 to {max_n} words that {who} would "
         "use, but that do not appear in the document: synonyms, abbreviations, full names, "
         "category terms, everyday wording. Answer as JSON: {{\"keywords\": [\"...\", ...]}}")


def build_messages(title: str, text: str, task: str = "general", max_n: int = 2) -> list[dict]:
    """The chat messages asking for one document's missing search vocabulary."""
    if task not in TASKS:
        raise ValueError(f"unknown enrichment task {task!r}; choose one of {', '.join(TASKS)}")
    doc = f"{title}\n{text}" if title else text
    return [{"role": "system", "content": _SYSTEM},
            {"role": "user", "content": _USER.format(doc=doc[:DOC_CHARS], k=MAX_PHRASES, max_n=max_n,
                                                     who=TASKS[task])}]


def keywords_schema(max_n: int = 2) -> dict:
    """JSON Schema of the answer, sent as ``response_format`` (SmolLM2 rambles without it);
    a phrase may hold ``SCHEMA_CHARS_PER_WORD · max_n`` characters."""
    chars = min(MAX_PHRASE_CHARS, SCHEMA_CHARS_PER_WORD * max_n)
    return {"type": "object", "additionalProperties": False, "required": ["keywords"],
            "properties": {"keywords": {"type": "array", "maxItems": MAX_PHRASES,
                                        "items": {"type": "string", "minLength": 2,
                                                  "maxLength": chars,
                                                  "pattern": PHRASE_PATTERN.format(rest=chars - 1)}}}}


@dataclass(frozen=True)
class EnrichSettings:
    """What the enrichment stage needs; no live handles (the client is made from it)."""

    base_url: str
    model: str
    task: str = "general"
    tau: float = 0.1
    max_n: int = 2
    concurrency: int = 4
    timeout: float = 60.0
    retries: int = 2
    backoff: float = 0.5
    max_tokens: int = 160          # 10 phrases within the schema fit in ~150 tokens
    structured: bool = True       # send response_format json_schema
    api_key: str | None = None

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"unknown enrichment task {self.task!r}; choose one of {', '.join(TASKS)}")
        if not MAX_N_RANGE[0] <= self.max_n <= MAX_N_RANGE[1]:
            raise ValueError(f"--enrich-max-n must be in {MAX_N_RANGE[0]}..{MAX_N_RANGE[1]}, got {self.max_n}")
        if not 0 < self.tau <= 1:
            raise ValueError(f"--enrich-tau must be in (0, 1], got {self.tau}")
        if self.concurrency < 1 or self.retries < 0 or self.timeout <= 0:
            raise ValueError("enrichment needs concurrency >= 1, retries >= 0 and timeout > 0")

    @property
    def prompt_id(self) -> str:
        """The prompt version as the cache and the manifest see it: version, task and max_n."""
        return f"{PROMPT_VERSION}/{self.task}/max_n={self.max_n}"

    def describe(self) -> dict:
        d = asdict(self)
        d.pop("api_key")
        return {**d, "prompt_version": PROMPT_VERSION, "prompt_id": self.prompt_id}


# --- parsing ----------------------------------------------------------------------------

_FENCE = re.compile(r"```(?:json)?", re.IGNORECASE)
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+(.+?)\s*$")
_LABEL = re.compile(r"^\s*(?:keywords|phrases|search phrases)\s*:\s*(.+)$", re.IGNORECASE)


def _keywords_of(value) -> list | None:
    if isinstance(value, dict):
        for key in ("keywords", "phrases", "queries"):
            if isinstance(value.get(key), list):
                return value[key]
        return None
    return value if isinstance(value, list) else None


_OPEN_LIST = re.compile(r'"(?:keywords|phrases|queries)"\s*:\s*\[')


def _truncated_list(text: str) -> list[str] | None:
    """The complete strings of a ``{"keywords": ["a", "b", "c...`` reply cut off by
    ``max_tokens``; None when the text holds no such opening or no complete string."""
    m = _OPEN_LIST.search(text)
    if m is None:
        return None
    decoder, pos, out = json.JSONDecoder(), m.end(), []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return out or None
        if not isinstance(value, str):
            return out or None
        out.append(value)


def parse_keywords(content: str) -> list[str]:
    """The phrases in a model's reply, cleaned (`clean_phrases`).

    Tried in order: the whole reply as JSON; the last JSON object or list with keywords
    inside chatty text or code fences; the complete strings of a keyword list cut off by
    ``max_tokens``; bulleted/numbered lines; a ``Keywords: a, b`` line.

    Raises
    ------
    ValueError
        Nothing readable: an empty reply, or text without JSON or a list.
    """
    text = _FENCE.sub(" ", content or "").strip()
    if not text:
        raise ValueError("empty reply")
    try:
        got = _keywords_of(json.loads(text))
        if got is not None:
            return clean_phrases(got)
    except json.JSONDecodeError:
        pass
    decoder, found = json.JSONDecoder(), None
    for m in re.finditer(r"[{\[]", text):
        try:
            value, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        got = _keywords_of(value)
        if got is not None and (isinstance(value, dict) or all(isinstance(x, str) for x in got)):
            found = got  # the last one wins: reasoning first, then the answer
    if found is not None:
        return clean_phrases(found)
    cut = _truncated_list(text)
    if cut is not None:
        return clean_phrases(cut)
    lines = [m.group(1) for line in text.splitlines() if (m := _BULLET.match(line))]
    if lines:
        return clean_phrases(lines)
    for line in text.splitlines():
        if m := _LABEL.match(line):
            return clean_phrases(m.group(1).split(","))
    raise ValueError(f"no keywords found in the reply: {text[:120]!r}")


def clean_phrases(items: Iterable) -> list[str]:
    """Strings only, quotes and whitespace trimmed, case-insensitive duplicates and
    over-long phrases dropped, at most ``MAX_PHRASES``."""
    out, seen = [], set()
    for x in items:
        if not isinstance(x, str):
            continue
        p = " ".join(x.strip().strip("\"'`").split())
        if not re.search(r"\w", p) or len(p) > MAX_PHRASE_CHARS or p.casefold() in seen:
            continue
        seen.add(p.casefold())
        out.append(p)
        if len(out) == MAX_PHRASES:
            break
    return out


# --- the client -------------------------------------------------------------------------


class EnrichError(RuntimeError):
    """One document's enrichment failed (after retries); the document stays unenriched."""


class EnrichClient:
    """Asks an OpenAI-compatible chat endpoint for one document's phrases.

    Retries (``settings.retries`` times, sleeping ``backoff·2^i`` plus jitter) on timeouts,
    connection errors, 429 and 5xx; a 400 naming ``response_format`` switches to plain
    prompting once. Replies are read by `parse_keywords`; an unreadable reply is not
    retried (at temperature 0 the model would repeat it) but fails the document.
    """

    def __init__(self, settings: EnrichSettings):
        try:
            from openai import OpenAI
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise ImportError("enrichment needs the openai client: pip install openai") from exc
        self.settings = settings
        self._structured = settings.structured
        self._client = OpenAI(base_url=settings.base_url, timeout=settings.timeout, max_retries=0,
                              api_key=settings.api_key or os.environ.get("OPENAI_API_KEY") or "none")

    def _request(self, messages: list[dict]) -> str:
        s = self.settings
        kw = {"model": s.model, "messages": messages, "temperature": 0.0, "seed": 0, "max_tokens": s.max_tokens}
        if self._structured:
            kw["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "keywords", "schema": keywords_schema(s.max_n), "strict": True}}
        resp = self._client.chat.completions.create(**kw)
        if not resp.choices:
            return ""
        return resp.choices[0].message.content or ""

    def propose(self, title: str, text: str) -> list[str]:
        import openai

        s = self.settings
        messages = build_messages(title, text, s.task, s.max_n)
        last: Exception | None = None
        for attempt in range(s.retries + 1):
            if attempt:
                time.sleep(s.backoff * (2 ** (attempt - 1)) * (1 + random.random() / 2))
            try:
                content = self._request(messages)
            except openai.BadRequestError as exc:
                if self._structured and "response_format" in str(exc):
                    log.warning("%s rejects response_format json_schema; prompting for plain JSON", s.base_url)
                    self._structured = False
                    return self.propose(title, text)
                raise EnrichError(f"rejected by the endpoint: {exc}") from exc
            except (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError,
                    openai.InternalServerError) as exc:
                last = exc
                continue
            except openai.APIError as exc:
                raise EnrichError(f"endpoint error: {exc}") from exc
            try:
                return parse_keywords(content)
            except ValueError as exc:
                raise EnrichError(str(exc)) from None
        kind = "timed out" if isinstance(last, openai.APITimeoutError) else "failed"
        raise EnrichError(f"{kind} after {s.retries + 1} attempts: {type(last).__name__}: {last}")


# --- the cache --------------------------------------------------------------------------


def default_cache_root() -> str:
    """``$FUNNEL_CACHE/enrichment``, beside the embedding cache (``$FUNNEL_CACHE/embeddings``)."""
    from .dense.embed import default_cache_root as embed_root
    return os.path.join(os.path.dirname(embed_root()), "enrichment")


class EnrichmentCache:
    """Phrases per content hash for one (model, prompt id), on local disk.

    ``root/<16 hex of sha256(model, prompt id)>/`` holds ``fingerprint.json`` and segments
    ``seg-<time>-<pid>-<rand>.jsonl`` (one ``{"h": hash, "phrases": [...]}`` a line),
    each written to a temporary name and renamed, so readers see whole segments only and
    concurrent builds may write at once. Keyed by content, never by document id, so an
    edited document is asked again.
    """

    def __init__(self, root: str | None, model: str, prompt_id: str):
        self.root = root or default_cache_root()
        self.fingerprint = {"model": model, "prompt_id": prompt_id}
        key = hashlib.sha256(json.dumps(self.fingerprint, sort_keys=True).encode()).hexdigest()[:16]
        self.dir = os.path.join(self.root, key)
        os.makedirs(self.dir, exist_ok=True)
        fp = os.path.join(self.dir, "fingerprint.json")
        if not os.path.exists(fp):
            self._write_atomic(fp, json.dumps(self.fingerprint, sort_keys=True))
        self._lock = threading.Lock()
        self._data: dict[str, list[str]] = {}
        self._seen: set[str] = set()

    @staticmethod
    def _write_atomic(path: str, text: str) -> None:
        tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _refresh(self) -> None:
        for name in sorted(os.listdir(self.dir)):
            if not name.endswith(".jsonl") or name in self._seen:
                continue
            self._seen.add(name)
            try:
                with open(os.path.join(self.dir, name), encoding="utf-8") as f:
                    for line in f:
                        row = json.loads(line)
                        self._data.setdefault(row["h"], row["phrases"])
            except FileNotFoundError:
                continue  # compacted meanwhile; its rows are in the new segment
            except (ValueError, KeyError) as e:  # never fail a build on a damaged cache file
                log.warning("enrichment cache: skipping unreadable segment %s (%s)", name, e)

    def __len__(self) -> int:
        with self._lock:
            self._refresh()
            return len(self._data)

    def get_many(self, hashes: Sequence[str]) -> dict[str, list[str]]:
        with self._lock:
            self._refresh()
            return {h: self._data[h] for h in hashes if h in self._data}

    def put_many(self, items: dict[str, list[str]]) -> int:
        """Store phrases for hashes not yet cached; returns how many were written."""
        with self._lock:
            self._refresh()
            new = {h: p for h, p in items.items() if h not in self._data}
            if new:
                name = f"seg-{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
                self._write_atomic(os.path.join(self.dir, name), "".join(
                    json.dumps({"h": h, "phrases": p}, ensure_ascii=False) + "\n" for h, p in new.items()))
                self._seen.add(name)
                self._data.update(new)
            return len(new)

    def compact(self) -> int:
        """Merge all segments into one; returns how many were merged."""
        with self._lock:
            self._refresh()
            old = sorted(self._seen)
            if len(old) < 2:
                return 0
            name = f"seg-{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
            self._write_atomic(os.path.join(self.dir, name), "".join(
                json.dumps({"h": h, "phrases": p}, ensure_ascii=False) + "\n" for h, p in self._data.items()))
            self._seen.add(name)
            for n in old:
                try:
                    os.remove(os.path.join(self.dir, n))
                except FileNotFoundError:
                    pass
            return len(old)


# --- proposing for many documents -------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One document's answer: ``status`` is ``cached``, ``enriched`` or ``failed``."""

    status: str
    phrases: tuple[str, ...] = ()
    error: str = ""


def propose_documents(docs: Sequence[tuple[str, str, str]], propose: Callable[[str, str], list[str]],
                      cache: EnrichmentCache | None = None, concurrency: int = 4,
                      progress: Callable[[int, bool], None] | None = None,
                      flush_every: int = 64) -> list[Outcome]:
    """Phrases for each ``(content_hash, title, text)``, in order; never raises for a document.

    Cached hashes are answered from ``cache`` (``progress(n, True)`` once, before any call);
    the rest go to ``propose`` with at most ``concurrency`` calls in flight
    (``progress(1, False)`` per answer or failure). Successes are written to the cache every
    ``flush_every`` answers (a killed build keeps most of its work); a document whose call
    raises comes back ``failed`` with the error and is not cached.
    """
    hashes = [d[0] for d in docs]
    cached = cache.get_many(hashes) if cache is not None else {}
    out: list[Outcome | None] = [Outcome("cached", tuple(cached[h])) if h in cached else None for h in hashes]
    todo = [i for i, o in enumerate(out) if o is None]
    if progress is not None and len(todo) < len(out):
        progress(len(out) - len(todo), True)
    first: dict[str, int] = {}
    for i in todo:  # the same content twice in a corpus: ask once
        first.setdefault(hashes[i], i)
    pending: dict[str, list[str]] = {}
    lock = threading.Lock()

    def one(i: int) -> Outcome:
        _, title, text = docs[i]
        try:
            phrases = propose(title, text)
        except Exception as exc:  # EnrichError, or anything a custom proposer raises
            log.debug("enrichment failed for %s: %s", hashes[i], exc)
            return Outcome("failed", (), str(exc)[:300])
        if cache is not None:
            with lock:
                pending[hashes[i]] = phrases
                flush = len(pending) >= flush_every
                batch = dict(pending) if flush else {}
                if flush:
                    pending.clear()
            if batch:
                cache.put_many(batch)
        return Outcome("enriched", tuple(phrases))

    unique = sorted(set(first.values()))
    if unique:
        with ThreadPoolExecutor(max_workers=min(concurrency, len(unique))) as pool:
            for i, o in zip(unique, pool.map(one, unique)):
                out[i] = o
                if progress is not None:
                    progress(1, False)
    if cache is not None and pending:
        cache.put_many(pending)
    for i in todo:
        if out[i] is None:
            o = out[first[hashes[i]]]
            out[i] = o if o.status == "failed" else Outcome("enriched", o.phrases)
    return out  # type: ignore[return-value]


# --- the DF filter and injection --------------------------------------------------------


def windows(tokens: Sequence[str], max_n: int) -> list[str]:
    """Vocabulary keys of every 1..max_n window, shortest first (n-grams via ``ngram_key``)."""
    from funnel.serving.sira.dffilter import ngram_key, sub_ngrams
    return [w[0] if len(w) == 1 else ngram_key(w) for w in sub_ngrams(tokens, max_n)]


def ngram_doc_freq(token_lists: Iterable[Sequence[str]], keys: set[str], max_n: int) -> Counter:
    """How many documents contain each n-gram key of ``keys`` (n = 2..max_n) in their text."""
    from funnel.serving.sira.dffilter import ngram_key
    df: Counter = Counter()
    if max_n < 2 or not keys:
        return df
    for toks in token_lists:
        found = set()
        for n in range(2, max_n + 1):
            for i in range(len(toks) - n + 1):
                k = ngram_key(toks[i:i + n])
                if k in keys:
                    found.add(k)
        df.update(found)
    return df


@dataclass(frozen=True)
class PhraseVerdict:
    kept: bool
    reason: str
    df: int | None        # df of the rarest window (None: no searchable words)
    tokens: tuple[str, ...] = ()


def filter_phrase(tokens: Sequence[str], df_of: Callable[[str], int], n_docs: int, tau: float,
                  max_n: int) -> PhraseVerdict:
    """Keep a phrase if some window of 1..max_n analyzed tokens has ``df <= tau·N``.

    ``df_of`` answers from the un-enriched corpus (0 for a word or n-gram it lacks, which
    passes: there is no lower bound on the corpus side, DESIGN.md "SIRA retrieval").
    """
    if not tokens:
        return PhraseVerdict(False, "no searchable words (stopwords or punctuation only)", None)
    keys = windows(tokens, max_n)
    rarest_key = min(keys, key=lambda k: df_of(k))
    rarest = int(df_of(rarest_key))
    ceiling = tau * n_docs
    if rarest > ceiling:
        return PhraseVerdict(False, f"too common: rarest window {rarest_key!r} df {rarest} > tau*N = {ceiling:g}",
                             rarest, tuple(tokens))
    why = "new to the corpus" if rarest == 0 else f"df {rarest} <= tau*N = {ceiling:g}"
    return PhraseVerdict(True, f"kept: {rarest_key!r} {why}", rarest, tuple(tokens))


def injection_terms(tokens: Sequence[str], max_n: int) -> list[str]:
    """The terms a kept phrase appends to its document: its unigrams, then its 2..max_n
    windows as atomic n-gram terms. Each adds 1 to the document's length, as the
    reference appends the expansion after the document's end."""
    return windows(tokens, max_n)


# --- the audit table and the report -----------------------------------------------------

AUDIT_SCHEMA = "enrichment(doc_id VARCHAR, phrase VARCHAR, kept BOOLEAN, reason VARCHAR, df BIGINT)"
DOCS_SCHEMA = "enrichment_docs(doc_id VARCHAR, status VARCHAR, n_phrases INTEGER, n_kept INTEGER, error VARCHAR)"


def write_audit(db_path: str, audit_files: list[str], doc_files: list[str]) -> None:
    """Add ``enrichment`` (one row per proposed phrase) and ``enrichment_docs`` (one row per
    document: cached / enriched / failed, with the error) to ``stats.duckdb`` from the
    stage's per-shard Parquet files."""
    import duckdb
    con = duckdb.connect(db_path)
    try:
        for table, files in (("enrichment", audit_files), ("enrichment_docs", doc_files)):
            schema = AUDIT_SCHEMA if table == "enrichment" else DOCS_SCHEMA
            con.execute(f"DROP TABLE IF EXISTS {table}")
            con.execute(f"CREATE TABLE {schema}")
            if files:
                con.execute(f"INSERT INTO {table} SELECT * FROM read_parquet(?)", [files])
        con.execute("CHECKPOINT")
    finally:
        con.close()


def enrichment_report(version_dir: str, top: int = 20, examples: int = 5) -> dict:
    """What enrichment did to one index version: the manifest's counts, the most frequent
    injected (kept) phrases, failures by reason and a few enriched documents."""
    import duckdb
    with open(os.path.join(version_dir, "manifest.json")) as f:
        section = json.load(f).get("enrichment")
    if not section:
        raise ValueError(f"{version_dir} was built without --enrich: there is no enrichment to report")
    con = duckdb.connect(os.path.join(version_dir, "stats.duckdb"), read_only=True)
    try:
        q = con.execute
        top_terms = q("SELECT lower(phrase) p, COUNT(*) n FROM enrichment WHERE kept GROUP BY p "
                      "ORDER BY n DESC, p LIMIT ?", [top]).fetchall()
        rejected = q("SELECT split_part(reason, ':', 1) r, COUNT(*) n FROM enrichment WHERE NOT kept "
                     "GROUP BY r ORDER BY n DESC").fetchall()
        failures = q("SELECT error, COUNT(*) n FROM enrichment_docs WHERE status = 'failed' GROUP BY error "
                     "ORDER BY n DESC LIMIT ?", [top]).fetchall()
        ex_ids = [r[0] for r in q("SELECT doc_id FROM enrichment_docs WHERE n_kept > 0 ORDER BY doc_id LIMIT ?",
                                  [examples]).fetchall()]
        ex = [{"doc_id": d, "phrases": [{"phrase": p, "kept": k, "reason": r, "df": df} for p, k, r, df in
                                        q("SELECT phrase, kept, reason, df FROM enrichment WHERE doc_id = ?",
                                          [d]).fetchall()]} for d in ex_ids]
    finally:
        con.close()
    return {"version": os.path.basename(os.path.normpath(version_dir)), "settings": section,
            "top_kept": [{"phrase": p, "docs": n} for p, n in top_terms],
            "rejected_by_reason": [{"reason": r, "phrases": n} for r, n in rejected],
            "failures": [{"error": e, "docs": n} for e, n in failures], "examples": ex}


def format_report(rep: dict) -> str:
    """`enrichment_report` as text for the terminal."""
    s, c = rep["settings"], rep["settings"].get("counts", {})
    lines = [f"{rep['version']}: enriched with {s.get('model')} ({s.get('prompt_id')}), tau {s.get('tau')}, "
             f"max_n {s.get('max_n')}",
             f"  documents: {c.get('documents', 0)}: {c.get('enriched', 0)} asked, {c.get('cached', 0)} from the "
             f"cache, {c.get('failed', 0)} failed (left unenriched), {c.get('with_kept', 0)} gained terms",
             f"  phrases: {c.get('phrases_proposed', 0)} proposed, {c.get('phrases_kept', 0)} kept, "
             f"{c.get('phrases_rejected', 0)} rejected; {c.get('terms_injected', 0)} terms injected"]
    if rep["top_kept"]:
        lines.append("  most frequent injected phrases:")
        lines += [f"    {t['docs']:6d}  {t['phrase']}" for t in rep["top_kept"]]
    if rep["rejected_by_reason"]:
        lines.append("  rejected: " + ", ".join(f"{r['reason']} {r['phrases']}" for r in rep["rejected_by_reason"]))
    if rep["failures"]:
        lines.append("  failures:")
        lines += [f"    {f['docs']:6d}  {f['error'][:100]}" for f in rep["failures"]]
    for e in rep["examples"]:
        lines.append(f"  example {e['doc_id']}:")
        lines += [f"    {'+' if p['kept'] else '-'} {p['phrase']!r} (df {p['df']}; {p['reason']})" for p in e["phrases"]]
    return "\n".join(lines)
