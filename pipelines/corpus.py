"""Reading and validating a corpus: BEIR directories, JSONL and Parquet, local or remote.

The corpus is split into *chunks* (byte ranges of a JSONL file aligned to line starts, or
Parquet row groups) so that workers read in parallel and the driver never holds the
corpus. Every row is validated; a bad row becomes a *reject* with its file, line and
reason, never silently dropped. A document's ``content_hash`` (sha256 of title and text)
keys caches and reindexing diffs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import pyarrow.fs as pafs

log = logging.getLogger(__name__)

FORMATS = ("auto", "beir", "jsonl", "parquet")
DEFAULT_ID_FIELDS = ("_id", "id", "docid", "doc_id")


@dataclass(frozen=True)
class CorpusSpec:
    """Where the corpus is and how to read its rows.

    ``id_field`` None means: the first of ``_id``, ``id``, ``docid``, ``doc_id`` present.
    """

    path: str
    format: str = "auto"
    id_field: str | None = None
    title_field: str = "title"
    text_field: str = "text"

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"unknown corpus format {self.format!r}; choose one of {', '.join(FORMATS)}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Chunk:
    """A unit of parallel reading: a byte range of a JSONL file or one Parquet row group."""

    index: int
    path: str
    kind: str  # "jsonl" | "parquet"
    start: int = 0
    end: int = 0
    row_group: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ChunkResult:
    rows: list[dict] = field(default_factory=list)
    rejects: list[dict] = field(default_factory=list)
    lines: int = 0


def content_hash(title: str | bytes, text: str | bytes) -> str:
    """sha256 of the document's content, 32 hex chars; the key of every per-document cache.

    Takes the strings or their UTF-8 bytes (``validate_record`` encodes once, to check them).
    """
    h = hashlib.sha256()
    h.update(title if isinstance(title, bytes) else title.encode("utf-8"))
    h.update(b"\x1f")
    h.update(text if isinstance(text, bytes) else text.encode("utf-8"))
    return h.hexdigest()[:32]


def _not_utf8(value: str, name: str) -> str | None:
    """Why ``value`` cannot be stored as UTF-8 (a lone surrogate, which JSON's \\uD800 escapes
    allow), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"field {name!r} holds a lone surrogate ({value[e.start]!r} at character {e.start}), "
                "which is not valid Unicode text")
    return None


def _printable_id(doc_id: object) -> str | None:
    """A reject's doc_id that can be written as UTF-8 (lone surrogates shown as \\udXXX escapes)."""
    if not isinstance(doc_id, str):
        return None
    return doc_id.encode("utf-8", "backslashreplace").decode("utf-8")


def shard_of(doc_id: str, n_shards: int) -> int:
    """Hash partitioning: a stable function of the id alone (crc32), so reindexing keeps shards."""
    return zlib.crc32(doc_id.encode("utf-8")) % n_shards


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    import os
    return pafs.LocalFileSystem(), os.path.abspath(path)


def resolve_files(spec: CorpusSpec) -> tuple[pafs.FileSystem, list[str], str]:
    """Find the files of a corpus and its format. Raises a clear error for a bad path."""
    fs, root = _filesystem(spec.path)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(
            f"corpus path {spec.path!r} does not exist; pass a BEIR directory (with corpus.jsonl), "
            "a .jsonl file or a .parquet file/directory")
    fmt = spec.format
    if info.type == pafs.FileType.Directory:
        beir = root.rstrip("/") + "/corpus.jsonl"
        if fmt in ("auto", "beir") and fs.get_file_info(beir).type == pafs.FileType.File:
            return fs, [beir], "jsonl"
        sel = pafs.FileSelector(root, recursive=True)
        files = sorted(f.path for f in fs.get_file_info(sel) if f.type == pafs.FileType.File)
        pq_files = [f for f in files if f.endswith(".parquet")]
        jl_files = [f for f in files if f.endswith((".jsonl", ".json"))]
        if fmt in ("auto", "parquet") and pq_files:
            return fs, pq_files, "parquet"
        if fmt in ("auto", "jsonl") and jl_files:
            return fs, jl_files, "jsonl"
        raise ValueError(
            f"no corpus files in directory {spec.path!r}: expected corpus.jsonl (BEIR), *.jsonl or *.parquet")
    if fmt == "auto":
        fmt = "parquet" if root.endswith(".parquet") else "jsonl"
    if fmt == "beir":
        fmt = "jsonl"
    return fs, [root], fmt


def plan_chunks(spec: CorpusSpec, target_bytes: int = 16 << 20) -> list[Chunk]:
    """Split the corpus into chunks of about ``target_bytes`` without reading it whole."""
    fs, files, fmt = resolve_files(spec)
    chunks: list[Chunk] = []
    for path in files:
        if fmt == "parquet":
            import pyarrow.parquet as pq
            with fs.open_input_file(path) as f:
                n_groups = pq.ParquetFile(f).num_row_groups
            for g in range(n_groups):
                chunks.append(Chunk(len(chunks), path, "parquet", row_group=g))
            continue
        size = fs.get_file_info(path).size
        start = 0
        with fs.open_input_file(path) as f:
            while start < size:
                end = min(size, start + target_bytes)
                if end < size:
                    # Move the boundary to just after the next newline.
                    f.seek(end)
                    while True:
                        buf = f.read(1 << 16)
                        if not buf:
                            end = size
                            break
                        nl = buf.find(b"\n")
                        if nl >= 0:
                            end += nl + 1
                            break
                        end += len(buf)
                chunks.append(Chunk(len(chunks), path, "jsonl", start=start, end=end))
                start = end
    return chunks


def _pick_id_field(obj: dict, spec: CorpusSpec) -> str | None:
    if spec.id_field is not None:
        return spec.id_field
    for name in DEFAULT_ID_FIELDS:
        if name in obj:
            return name
    return None


def validate_record(obj: Any, spec: CorpusSpec) -> tuple[dict | None, str | None]:
    """Return (record, None) for a good row, (None, reason) for a bad one."""
    if not isinstance(obj, dict):
        return None, f"row is a JSON {type(obj).__name__}, expected an object"
    id_field = _pick_id_field(obj, spec)
    if id_field is None or obj.get(id_field) is None:
        want = spec.id_field or "/".join(DEFAULT_ID_FIELDS)
        return None, f"missing id field ({want})"
    doc_id = obj[id_field]
    if not isinstance(doc_id, str):
        return None, f"field {id_field!r} is {type(doc_id).__name__}, expected a string"
    if not doc_id.strip():
        return None, f"empty id in field {id_field!r}"
    title = obj.get(spec.title_field, "")
    if title is None:
        title = ""
    if not isinstance(title, str):
        return None, f"field {spec.title_field!r} is {type(title).__name__}, expected a string"
    text = obj.get(spec.text_field)
    if text is None:
        return None, f"missing text field {spec.text_field!r}"
    if not isinstance(text, str):
        return None, f"field {spec.text_field!r} is {type(text).__name__}, expected a string"
    if not text.strip() and not title.strip():
        return None, f"empty text in field {spec.text_field!r}"
    try:
        title_b, text_b = title.encode("utf-8"), text.encode("utf-8")
        doc_id.encode("utf-8")
    except UnicodeEncodeError:
        return None, next(r for r in (_not_utf8(doc_id, id_field), _not_utf8(title, spec.title_field),
                                      _not_utf8(text, spec.text_field)) if r)
    return {"doc_id": doc_id, "title": title, "text": text,
            "content_hash": content_hash(title_b, text_b)}, None


def read_chunk(chunk: Chunk, spec: CorpusSpec) -> ChunkResult:
    """Parse and validate one chunk. Rows carry ``chunk`` and ``line`` (1-based in the chunk)."""
    fs, _ = _filesystem(spec.path)
    out = ChunkResult()
    if chunk.kind == "parquet":
        import pyarrow.parquet as pq
        with fs.open_input_file(chunk.path) as f:
            table = pq.ParquetFile(f).read_row_group(chunk.row_group)
        for i, obj in enumerate(table.to_pylist(), start=1):
            _accept(out, obj, spec, chunk, i)
        out.lines = table.num_rows
        return out
    with fs.open_input_file(chunk.path) as f:
        f.seek(chunk.start)
        data = f.read(chunk.end - chunk.start)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out.lines = len(lines)
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue  # blank lines are not records
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            out.rejects.append({"chunk": chunk.index, "line": i, "path": chunk.path,
                                "reason": f"invalid JSON: {e.msg if hasattr(e, 'msg') else e}",
                                "raw": raw[:200].decode("utf-8", "replace")})
            continue
        _accept(out, obj, spec, chunk, i)
    return out


def _accept(out: ChunkResult, obj: Any, spec: CorpusSpec, chunk: Chunk, line: int) -> None:
    rec, reason = validate_record(obj, spec)
    if rec is None:
        doc_id = obj.get(_pick_id_field(obj, spec) or "_id") if isinstance(obj, dict) else None
        out.rejects.append({"chunk": chunk.index, "line": line, "path": chunk.path,
                            "doc_id": _printable_id(doc_id), "reason": reason})
        return
    rec["chunk"] = chunk.index
    rec["line"] = line
    out.rows.append(rec)


def iter_documents(spec: CorpusSpec) -> Iterator[dict]:
    """Stream valid documents in corpus order (no Ray; for tests and small tools)."""
    for chunk in plan_chunks(spec):
        yield from read_chunk(chunk, spec).rows
