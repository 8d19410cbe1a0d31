"""Passages: each document split into windows the embedder reads whole.

Why: an embedder reads a fixed window (all-MiniLM-L6-v2: 256 word pieces, ~190 words) and
silently drops the rest, so a long document embedded whole is ranked by its opening. Split
into passages, embedded one by one and scored by the best one (MaxP; Dai & Callan, SIGIR
2019), every part of it can be found (DESIGN.md, "Long documents").

How a document is split (`split_spans`, pure, on the token spans of its text):

* **Window**: at most ``budget`` of the embedder's own tokens of text per passage, where
  ``budget`` is the model's maximum sequence length less its special tokens, the document
  prompt and the title (every passage is embedded as ``title + "\\n" + passage``, the way a
  whole document is).
* **Short documents**: text of at most ``split_above`` windows (default
  `DEFAULT_SPLIT_ABOVE`: 4, ~750 words for MiniLM) is one passage ``[0, len(text))``,
  embedded as exactly the string a whole document was embedded as before passages, under
  the same cache key (the document's content hash); the embedder reads its first window, as
  before. Why not split everything longer than one window: 71% of SciFact's abstracts are
  (mean 335 word pieces), and splitting them moved SciFact's dense NDCG@10 from 0.6451 to
  0.6569, its default SIRA from 0.6925 to 0.6895: collections of abstracts would no longer
  rank as they did. At 4 windows 11 of SciFact's 5,183 documents are split.
* **Windows**: full windows from the start, each cut depending only on the text before it (so
  an edit re-splits only the passages around it, and the others keep their cache keys); the
  last two windows share what is left equally (no two-word tail whose cosine is noise).
* **Cuts at boundaries**: near each window's end the cut goes to the strongest nearby
  boundary: a paragraph or heading, then a sentence end, a line break, a space; a stronger
  boundary may be further away (`REACH`). Never more than ``budget`` tokens.
* **Overlap**: the next passage starts about ``overlap`` (default 15%) of a window before
  the cut, at a sentence start where one is near, so a sentence cut by the window is whole
  in one of the two passages.

Offsets are characters of the document's ``text`` field (the title is not part of them):
``text[char_start:char_end]`` is the passage, what a citation quotes and
``get_document(id, start, end)`` returns. Passages cover the text: the first starts at 0,
the last ends at ``len(text)``, each starts where or before the previous one ends.

Tokens come from the embedder's tokenizer (`HFTokenSpans`: the Hugging Face fast
tokenizer of a sentence-transformers model, fed in pieces so a huge document never makes one
huge call); an endpoint whose tokenizer is unknown is counted with `regex_token_spans`
(words and punctuation marks, about what a word-piece tokenizer makes of English).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

__all__ = ["PassageSettings", "Splitter", "split_spans", "regex_token_spans", "HFTokenSpans",
           "passage_key", "passage_input", "line_span", "make_splitter", "splitter_spec", "splitter_from_spec",
           "split_batch", "embed_passages", "passages_manifest", "settings_from_manifest", "write_passages",
           "read_passages", "PASSAGE_COLUMNS", "DEFAULT_OVERLAP", "DEFAULT_SPLIT_ABOVE", "REACH"]

DEFAULT_OVERLAP = 0.15
#: Documents of at most this many windows of text are embedded whole (see the module docstring).
DEFAULT_SPLIT_ABOVE = 4.0
#: Window for an embedder whose tokenizer is unknown (an OpenAI-compatible endpoint), in
#: `regex_token_spans` tokens; ``--passage-tokens`` overrides it.
DEFAULT_ENDPOINT_WINDOW = 256
#: Strength of the break before a token: what lies between it and the token before.
PARAGRAPH, SENTENCE, LINE, SPACE, NONE = 4, 3, 2, 1, 0
#: How far from a window's ideal end (a fraction of the window) a cut of each strength may
#: move: a paragraph end a quarter of a window early beats a space at the exact end.
REACH = {PARAGRAPH: 0.3, SENTENCE: 0.2, LINE: 0.1, SPACE: 0.1, NONE: 0.0}
#: Text handed to the tokenizer in one call, cut at whitespace: memory per call stays bounded
#: whatever a document's length (a 25,000-word document is ~150,000 characters).
TOKENIZE_PIECE_CHARS = 20_000
#: A title may take at most this fraction of the window; beyond it the embedder truncates the
#: passage's end (a rare corpus with titles as long as documents).
MAX_TITLE_FRACTION = 0.5
#: The columns of ``passages/shard-NNNN.parquet``: one row per passage, sorted by
#: (local_id, ordinal); row r is FAISS id ``shard << 32 | r`` in ``dense/``.
PASSAGE_COLUMNS = ("local_id", "ordinal", "char_start", "char_end")

_WORDISH = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")


@dataclass(frozen=True)
class PassageSettings:
    """How the build splits documents (the manifest's ``dense.passages`` records them).

    Parameters
    ----------
    enabled : bool
        False embeds each document whole, as one vector (the embedder reads its first window).
    overlap : float
        Fraction of a window repeated at the start of the next passage, in [0, 0.5).
    window : int, optional
        Tokens per passage, special tokens included; default: the model's maximum sequence
        length (sentence-transformers), `DEFAULT_ENDPOINT_WINDOW` for an endpoint.
    split_above : float
        A document of at most this many windows of text is one passage (embedded whole, its
        first window read); 1 splits every document the embedder would truncate.
    """

    enabled: bool = True
    overlap: float = DEFAULT_OVERLAP
    window: int | None = None
    split_above: float = DEFAULT_SPLIT_ABOVE

    def __post_init__(self):
        if not 0 <= self.overlap < 0.5:
            raise ValueError(f"passage overlap must be in [0, 0.5), got {self.overlap}")
        if not self.split_above >= 1:
            raise ValueError(f"passage split_above must be >= 1 window, got {self.split_above}")
        if self.window is not None and int(self.window) < 16:
            raise ValueError(f"passage window must be >= 16 tokens, got {self.window}")

    def to_dict(self) -> dict:
        return asdict(self)


# -- tokens ------------------------------------------------------------------------------


def regex_token_spans(text: str) -> np.ndarray:
    """``(n, 2)`` character spans of words and punctuation marks (a tokenizer-free count)."""
    spans = [m.span() for m in _WORDISH.finditer(text)]
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)


def _pieces(text: str, size: int) -> list[tuple[int, int]]:
    """``text`` as consecutive ranges of about ``size`` characters, each cut after whitespace
    (a word-piece tokenizer splits on whitespace first, so the pieces tokenize as the whole)."""
    out, a, n = [], 0, len(text)
    while n - a > size:
        b = a + size
        while b > a and not text[b - 1].isspace():
            b -= 1
        if b == a:  # no whitespace in the piece: cut anyway (one word split in two)
            b = a + size
        out.append((a, b))
        a = b
    out.append((a, n))
    return out


class HFTokenSpans:
    """Token spans from a Hugging Face fast tokenizer (``tokenizers.Tokenizer.to_str()``), no
    special tokens, no truncation: ``spans(text)`` and ``count(text)``."""

    def __init__(self, tokenizer_json: str):
        import tokenizers
        self.tok = tokenizers.Tokenizer.from_str(tokenizer_json)  # our own copy, to configure
        self.tok.no_truncation()
        self.tok.no_padding()

    def spans(self, text: str) -> np.ndarray:
        parts = []
        pieces = _pieces(text, TOKENIZE_PIECE_CHARS)
        for (a, _), enc in zip(pieces, self.tok.encode_batch([text[a:b] for a, b in pieces],
                                                             add_special_tokens=False)):
            off = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
            if len(off):
                parts.append(off + a)
        return np.vstack(parts) if parts else np.zeros((0, 2), dtype=np.int64)

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids) if text else 0


# -- where to cut ------------------------------------------------------------------------


def _strength(text: str, spans, c: int) -> int:
    """Strength of the break before token ``c`` (0 < c < len(spans)); ``spans`` as lists."""
    gap_a, gap_b = spans[c - 1][1], spans[c][0]
    if gap_b <= gap_a:
        return NONE  # inside a word (word pieces) or punctuation attached to it
    gap = text[gap_a:gap_b]
    if "\n" in gap and (_BLANK_LINE.search(gap) or text.startswith("#", gap_b)):
        return PARAGRAPH
    if not gap.isspace():
        return SPACE  # characters the tokenizer dropped (controls, ...): at least a separator
    if text[gap_a - 1] in ".!?" or (text[gap_a - 1] in "\"')]" and gap_a >= 2 and text[gap_a - 2] in ".!?"):
        return SENTENCE
    return LINE if "\n" in gap else SPACE


def _best_cut(text: str, spans: list, lo: int, hi: int, target: int, window: int) -> int:
    """The token before which to cut, in ``[lo, hi]``: the strongest break within its
    `REACH` of ``target``, the one nearest ``target`` among equals (the later on a tie)."""
    best, best_key = target, None
    for c in range(lo, hi + 1):
        s = _strength(text, spans, c)
        if abs(c - target) > REACH[s] * window and c != target:
            continue
        key = (s, -abs(c - target), c)
        if best_key is None or key > best_key:
            best, best_key = c, key
    return best


def _best_start(text: str, spans: list, lo: int, hi: int, target: int) -> int:
    """Where the next passage starts, in ``[lo, hi]``: a sentence (or stronger) start nearest
    ``target``, else the word start nearest it (never inside a word where a word starts in
    range), else ``target``."""
    best, best_key = target, None
    for c in range(lo, hi + 1):
        s = _strength(text, spans, c)
        if s < SPACE:
            continue
        key = (s if s >= SENTENCE else SPACE, -abs(c - target), c)
        if best_key is None or key > best_key:
            best, best_key = c, key
    return best


def split_spans(text: str, spans: np.ndarray, budget: int, overlap: float = DEFAULT_OVERLAP,
                whole: int | None = None) -> list[tuple[int, int]]:
    """Split ``text`` into passages of at most ``budget`` tokens; ``[(char_start, char_end)]``.

    Parameters
    ----------
    text : str
        The document's text.
    spans : np.ndarray
        ``(n, 2)`` character spans of its tokens, in order (`HFTokenSpans`,
        `regex_token_spans`).
    budget : int
        Most tokens of text in one passage (>= 1).
    overlap : float
        Fraction of ``budget`` the next passage repeats, in [0, 0.5).
    whole : int, optional
        A text of at most this many tokens is one passage even when it exceeds ``budget``.

    Returns
    -------
    list of (int, int)
        One ``(0, len(text))`` when the text fits (or is ``whole``); otherwise passages in order whose union
        is ``[0, len(text))``: each ends at the start of the first token it leaves out, the
        next starts at a token at or before that.
    """
    budget = int(budget)
    if budget < 1:
        raise ValueError(f"passage budget must be >= 1 token, got {budget}")
    if not 0 <= overlap < 0.5:
        raise ValueError(f"passage overlap must be in [0, 0.5), got {overlap}")
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    n = len(spans)
    if n <= max(budget, whole or 0):
        return [(0, len(text))]
    ov = min(int(round(overlap * budget)), budget - 1)
    spans = spans.tolist()  # read token by token below: list indexing is ~10x numpy's
    out: list[tuple[int, int]] = []
    a = 0
    while True:
        start = 0 if a == 0 else int(spans[a][0])
        rem = n - a
        if rem <= budget:
            out.append((start, len(text)))
            return out
        # Full windows while more than two are left, so a cut depends on the text before it
        # and an edit moves only the cuts near it; the last two windows share the rest equally.
        size = budget if rem > 2 * budget - ov else math.ceil((rem + ov) / 2)
        reach = int(REACH[PARAGRAPH] * size)
        target = a + size
        lo, hi = max(a + 1, target - reach), min(a + budget, n - 1, target + reach)
        c = _best_cut(text, spans, lo, hi, min(target, hi), size)
        out.append((start, int(spans[c][0])))
        if ov == 0:
            a = c
            continue
        t = c - ov
        a = _best_start(text, spans, max(a + 1, t - ov // 2), min(c - 1, t + ov // 2), max(a + 1, t))


# -- the splitter of an embedder ---------------------------------------------------------


def passage_input(title: str | None, body: str) -> str:
    """What the embedder reads for a passage: ``title + "\\n" + body`` (the way a whole
    document is embedded; without a title column, the body)."""
    return body if title is None else f"{title}\n{body}"


def passage_key(doc_hash: str, title: str | None, text: str, start: int, end: int) -> str:
    """The embedding-cache key of a passage: the document's content hash when the passage is
    the whole text (the key of its vector before passages existed), else 32 hex digits of
    sha256 over the passage's title and text. Content only: an edited document finds the
    vectors of every passage whose text it kept."""
    if start == 0 and end == len(text):
        return doc_hash
    h = hashlib.sha256(b"passage\x1f")
    h.update((title or "").encode("utf-8"))
    h.update(b"\x1f")
    h.update(text[start:end].encode("utf-8"))
    return h.hexdigest()[:32]


class Splitter:
    """Splits documents for one embedder: ``splitter(title, text) -> [(start, end), ...]``.

    Parameters
    ----------
    spans : callable
        ``text -> (n, 2)`` token spans.
    count : callable
        ``text -> number of tokens`` (for the title and the prompt).
    window : int
        The embedder's window, special tokens included.
    specials : int
        Special tokens the embedder adds ([CLS], [SEP]).
    prompt : str
        The document prompt prepended to every input.
    overlap : float
    tokenizer : str
        A name for the manifest (``hf:<model>`` or ``regex``).
    """

    def __init__(self, spans: Callable[[str], np.ndarray], count: Callable[[str], int], window: int,
                 specials: int = 0, prompt: str = "", overlap: float = DEFAULT_OVERLAP, tokenizer: str = "regex",
                 split_above: float = 1.0):
        self.spans, self.count = spans, count
        self.window, self.specials, self.overlap = int(window), int(specials), float(overlap)
        self.split_above = float(split_above)
        self.prompt_tokens = count(prompt) if prompt else 0
        self.tokenizer = tokenizer
        if self.window - self.specials - self.prompt_tokens < 8:
            raise ValueError(f"passage window {self.window} leaves no room for text after {self.specials} special "
                             f"and {self.prompt_tokens} prompt tokens: pass a larger --passage-tokens")

    def budget(self, title: str | None) -> int:
        """Tokens of text per passage for a document with this title."""
        room = self.window - self.specials - self.prompt_tokens
        title_tokens = self.count(title) if title else 0
        return max(room - title_tokens, int(room * (1 - MAX_TITLE_FRACTION)))

    def __call__(self, title: str | None, text: str) -> list[tuple[int, int]]:
        budget = self.budget(title)
        return split_spans(text, self.spans(text), budget, self.overlap, whole=int(self.split_above * budget))


def splitter_spec(provider, settings: PassageSettings) -> dict:
    """What a `Splitter` for ``provider`` needs, as plain data a Ray task can receive:
    the embedder's own tokenizer (serialised) and window where it has one
    (sentence-transformers), `regex_token_spans` and `DEFAULT_ENDPOINT_WINDOW`
    otherwise (an endpoint)."""
    model = getattr(provider, "model", None)
    tok = getattr(model, "tokenizer", None)
    backend = getattr(tok, "backend_tokenizer", None)
    prompt = getattr(provider, "document_prompt", "") or ""
    own = getattr(provider, "splitter_tokenizer", None)  # onnxruntime's: the same tokenizer, exported
    if own is not None:
        tokenizer_json, limit, specials = own()
        return {"tokenizer": f"hf:{getattr(provider, 'name', 'model')}", "tokenizer_json": tokenizer_json,
                "window": min(int(settings.window), limit) if settings.window else limit, "specials": specials,
                "prompt": prompt, "overlap": settings.overlap, "split_above": settings.split_above}
    if backend is not None:
        limit = int(getattr(model, "max_seq_length", None) or getattr(tok, "model_max_length", 512))
        return {"tokenizer": f"hf:{getattr(provider, 'name', 'model')}", "tokenizer_json": backend.to_str(),
                "window": min(int(settings.window), limit) if settings.window else limit,
                "specials": int(tok.num_special_tokens_to_add(pair=False)), "prompt": prompt,
                "overlap": settings.overlap, "split_above": settings.split_above}
    return {"tokenizer": "regex", "window": int(settings.window or DEFAULT_ENDPOINT_WINDOW), "specials": 0,
            "prompt": prompt, "overlap": settings.overlap, "split_above": settings.split_above}


_SPLITTERS: dict[str, Splitter] = {}  # per process: a Ray worker builds each tokenizer once


def splitter_from_spec(spec: dict) -> Splitter:
    """The `Splitter` a `splitter_spec` describes (cached in this process)."""
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    sp = _SPLITTERS.get(key)
    if sp is None:
        if spec.get("tokenizer_json"):
            hf = HFTokenSpans(spec["tokenizer_json"])
            spans, count = hf.spans, hf.count
        else:
            spans, count = regex_token_spans, lambda t: len(regex_token_spans(t))
        sp = Splitter(spans, count, spec["window"], spec["specials"], spec["prompt"], spec["overlap"],
                      spec["tokenizer"], spec.get("split_above", DEFAULT_SPLIT_ABOVE))
        if len(_SPLITTERS) >= 8:
            _SPLITTERS.clear()
        _SPLITTERS[key] = sp
    return sp


def make_splitter(provider, settings: PassageSettings) -> Splitter:
    """The `Splitter` of an embedding provider (`splitter_spec`)."""
    return splitter_from_spec(splitter_spec(provider, settings))


def passages_manifest(spec: dict, n_docs: int | None = None) -> dict:
    """The manifest's ``dense.passages`` section for a `splitter_spec`: how documents
    were split (enough to split the same way again: ``settings_from_manifest``) and where
    the spans are."""
    return {"tokenizer": spec["tokenizer"], "window": int(spec["window"]), "special_tokens": int(spec["specials"]),
            "overlap": float(spec["overlap"]), "split_above": float(spec.get("split_above", DEFAULT_SPLIT_ABOVE)),
            "title": "prepended to every passage",
            "spans": "passages/shard-NNNN.parquet: local_id, ordinal, char_start, char_end (characters of text)",
            "ids": "FAISS ids are docnos, one vector per passage, rows in (local_id, ordinal) order",
            "n_docs": None if n_docs is None else int(n_docs)}


def settings_from_manifest(section: dict | None) -> PassageSettings:
    """The `PassageSettings` an index's ``dense.passages`` section was built with
    (disabled when it has none: documents were embedded whole)."""
    if not section:
        return PassageSettings(enabled=False)
    return PassageSettings(enabled=True, overlap=float(section["overlap"]), window=int(section["window"]),
                           split_above=float(section.get("split_above", DEFAULT_SPLIT_ABOVE)))


#: Columns `split_batch` adds to the rows it returns, one row per passage.
SPLIT_COLUMNS = ("ordinal", "char_start", "char_end")


def split_batch(batch: dict, spec: dict) -> dict:
    """Ray Data ``map_batches`` function: a batch of documents -> a batch of their passages.

    Each output row is one passage, shaped like a document for the embedder: ``text`` is the
    passage's text, ``title`` the document's (every passage is embedded with it) and
    ``content_hash`` the passage's cache key (`passage_key`), so ``EmbedBatch`` and
    its cache need not know about passages. Every other column (``shard``, ``local_id``)
    is repeated per passage, and ``ordinal``, ``char_start``, ``char_end`` are added.
    """
    splitter = splitter_from_spec(spec)
    texts = _as_str_list(batch["text"])
    titles = _as_str_list(batch["title"]) if "title" in batch else None
    hashes = _as_str_list(batch["content_hash"]) if "content_hash" in batch else None
    rows, ordinals, starts, ends, bodies, keys = [], [], [], [], [], []
    for i, text in enumerate(texts):
        title = titles[i] if titles is not None else None
        for o, (a, b) in enumerate(splitter(title, text)):
            rows.append(i)
            ordinals.append(o)
            starts.append(a)
            ends.append(b)
            bodies.append(text[a:b])
            if hashes is not None:
                keys.append(passage_key(hashes[i], title, text, a, b))
    take = np.asarray(rows, dtype=np.int64)
    out = {c: np.asarray(v)[take] for c, v in batch.items() if c not in ("text", "content_hash")}
    out["text"] = np.asarray(bodies, dtype=object)
    if hashes is not None:
        out["content_hash"] = np.asarray(keys, dtype=object)
    out["ordinal"] = np.asarray(ordinals, dtype=np.int64)
    out["char_start"] = np.asarray(starts, dtype=np.int64)
    out["char_end"] = np.asarray(ends, dtype=np.int64)
    return out


def embed_passages(embed, spec: dict, batch: dict, batch_size: int, progress=None) -> tuple[np.ndarray, np.ndarray]:
    """Split a batch of documents (`split_batch`) and run ``embed`` (an ``EmbedBatch``)
    on its passages ``batch_size`` at a time, so memory follows the batch size however long a
    document is. Returns (vectors ``(m, dim)``, rows ``(4, m)``: local id, ordinal,
    char_start, char_end); the in-process build and reindex share it. ``progress(passages,
    documents)`` is called after each ``batch_size`` passages with how many were embedded and
    how many documents they finished (their last passage among them)."""
    split = split_batch(batch, spec)
    vecs, rows = [], []
    n = len(split["text"])
    last = np.ones(n, dtype=bool)  # a passage is its document's last where the next one starts another
    if n > 1:
        last[:-1] = split["ordinal"][1:] == 0
    for j in range(0, n, batch_size):
        out = embed({c: v[j:j + batch_size] for c, v in split.items()})
        if progress is not None:
            progress(len(out["embedding"]), int(last[j:j + batch_size].sum()))
        vecs.append(out["embedding"])
        rows.append(np.stack([np.asarray(out[c], dtype=np.int64)
                              for c in ("local_id", "ordinal", "char_start", "char_end")]))
    if not vecs:
        return np.zeros((0, 0), np.float32), np.zeros((4, 0), np.int64)
    return np.vstack(vecs), np.hstack(rows)


def _as_str_list(col) -> list[str]:
    return ["" if v is None else (v.decode() if isinstance(v, bytes) else str(v)) for v in col]


# -- citations ---------------------------------------------------------------------------


def line_span(text: str, start: int, end: int) -> tuple[int, int]:
    """1-based first and last line of ``text[start:end]`` (a trailing newline does not start
    a line of the passage)."""
    first = text.count("\n", 0, start) + 1
    last = end
    while last > start and text[last - 1] in "\r\n":
        last -= 1
    return first, first + text.count("\n", start, last)


# -- storage -----------------------------------------------------------------------------


def write_passages(path: str, local_ids, ordinals, starts, ends) -> int:
    """Write one shard's ``passages/shard-NNNN.parquet`` (rows in the order given; the caller
    sorts them by local id and ordinal). Returns the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..store.artifacts import DOCS_ROW_GROUP
    cols = {"local_id": pa.array(np.asarray(local_ids, dtype=np.int32)),
            "ordinal": pa.array(np.asarray(ordinals, dtype=np.int32)),
            "char_start": pa.array(np.asarray(starts, dtype=np.int64)),
            "char_end": pa.array(np.asarray(ends, dtype=np.int64))}
    table = pa.table(cols)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    pq.write_table(table, tmp, row_group_size=64 * DOCS_ROW_GROUP)
    os.replace(tmp, path)
    return table.num_rows


def read_passages(path: str) -> dict[str, np.ndarray]:
    """One shard's passages as NumPy arrays (`PASSAGE_COLUMNS`)."""
    import pyarrow.parquet as pq
    # ParquetFile, not read_table: read_table imports pyarrow.dataset and with it pandas,
    # ~0.4 s of a one-query process that opens a dense index's passages.
    with pq.ParquetFile(path) as f:
        t = f.read(columns=list(PASSAGE_COLUMNS))
    return {c: _to_numpy(t.column(c)) for c in PASSAGE_COLUMNS}


def _to_numpy(column) -> np.ndarray:
    """An integer column without nulls as a NumPy array, read from its Arrow buffers: pyarrow's
    ``to_numpy`` imports pandas (~0.3 s of a one-query process); anything else goes through it."""
    import pyarrow as pa
    if column.null_count == 0 and pa.types.is_integer(column.type):
        dtype = np.dtype(column.type.to_pandas_dtype())
        parts = [np.frombuffer(c.buffers()[1], dtype=dtype, count=len(c), offset=c.offset * dtype.itemsize)
                 for c in column.chunks if len(c)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return column.to_numpy()


def doc_pointers(local_ids: np.ndarray, n_docs: int) -> np.ndarray:
    """``ptr`` with the passages of local id ``i`` at rows ``ptr[i]:ptr[i + 1]`` (rows sorted
    by local id)."""
    return np.searchsorted(np.asarray(local_ids), np.arange(n_docs + 1), side="left").astype(np.int64)


def check_passages(local_ids: Sequence[int], ordinals: Sequence[int]) -> None:
    """Raise ``ValueError`` unless the rows are sorted by (local id, ordinal) with each
    document's ordinals 0, 1, 2, ... (a passage delivered twice or lost is a broken build)."""
    loc, o = np.asarray(local_ids, dtype=np.int64), np.asarray(ordinals, dtype=np.int64)
    if not len(loc):
        return
    new_doc = np.concatenate([[True], loc[1:] != loc[:-1]])
    if (np.diff(loc) < 0).any():
        raise ValueError("passages are not sorted by local id")
    expect = np.arange(len(loc)) - np.maximum.accumulate(np.where(new_doc, np.arange(len(loc)), 0))
    if not np.array_equal(o, expect):
        bad = int(loc[np.flatnonzero(o != expect)[0]])
        raise ValueError(f"document with local id {bad}: its passages arrived twice or not at all; rebuild")
