"""Reading and validating a corpus: BEIR directories, JSONL and Parquet, local or remote.

The corpus is split into *chunks* (byte ranges of a JSONL file aligned to line starts, or
Parquet row groups) so that workers read in parallel and the driver never holds the
corpus. Every row is validated; a bad row becomes a *reject* with its file, line and
reason, never silently dropped. A document's ``content_hash`` (sha256 of title and text)
keys caches and reindexing diffs.

Every row is bounded (`CorpusSpec` ``max_depth``, ``max_field_bytes``,
``max_row_bytes``): a row too deep or too big is one reject naming the field and the
limit, checked on the raw line before it is parsed, so no single row can stop a build.

JSONL may be compressed (gzip, zstd, bz2: ``corpus.jsonl.gz``, ``*.jsonl.zst``), recognised
by the file's first bytes. A compressed file is planned in one streaming pass that finds
line-aligned offsets in its decompressed text; a reader decompresses from the file's start
and skips to its chunk, so a compressed file gets at most ``COMPRESSED_MAX_CHUNKS`` chunks.
A big corpus reads faster as several compressed files (each is planned on its own), or
uncompressed.

A corpus that cannot be indexed as given (no rows, a Parquet file without the needed
columns, a compression funnel does not read) is a `CorpusError` at planning time,
before any file is written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.fs as pafs

log = logging.getLogger(__name__)

FORMATS = ("auto", "beir", "jsonl", "parquet", "files")  # files: a folder of documents (pipelines.sources.folder)
DEFAULT_ID_FIELDS = ("_id", "id", "docid", "doc_id")

from .limits import DEFAULT_MAX_DEPTH, DEFAULT_MAX_FIELD_BYTES, DEFAULT_MAX_ROW_BYTES, MAX_DEPTH_CAP  # noqa: F401

#: Compressed JSONL, recognised by the file's first bytes (its magic number), read through
#: pyarrow's codecs; the name endings a corpus folder's compressed JSONL files are found by.
CODECS = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bz2"}
#: Compressions recognised only to say so (pyarrow has no stream codec for them).
UNREAD_CODECS = {b"\xfd7zXZ\x00": "xz", b"\x04\x22\x4d\x18": "lz4", b"PK\x03\x04": "zip"}
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd", ".bz2")
JSONL_SUFFIXES = tuple(base + c for base in (".jsonl", ".json") for c in ("",) + COMPRESSED_SUFFIXES)
#: Chunks per compressed file: each reader decompresses from the file's start up to its chunk,
#: so a file decompresses (n + 1) / 2 times over in all; 16 keeps that under 9 while a large
#: file still reads in parallel.
COMPRESSED_MAX_CHUNKS = 16


class CorpusError(ValueError):
    """The corpus cannot be indexed as given: the message says what is wrong and what to do."""


@dataclass(frozen=True)
class CorpusSpec:
    """Where the corpus is and how to read its rows.

    ``id_field`` None means: the first of ``_id``, ``id``, ``docid``, ``doc_id`` present.
    ``max_depth``, ``max_field_bytes`` and ``max_row_bytes`` bound every row (a row over one
    is a reject naming the field and the limit).

    ``include``, ``exclude`` (``.gitignore`` patterns) and ``follow_links`` say which files of
    a folder of documents are read (`funnel.pipelines.sources.selection`,
    `funnel.pipelines.sources.walk`); they are recorded in the manifest with the rest of the
    spec, so a reindex lists the folder as its build did.
    """

    path: str
    format: str = "auto"
    id_field: str | None = None
    title_field: str = "title"
    text_field: str = "text"
    max_depth: int = DEFAULT_MAX_DEPTH
    max_field_bytes: int = DEFAULT_MAX_FIELD_BYTES
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
    #: Filterable fields declared at build, {name: type} (``pipelines.sources.fields``); None: inferred.
    fields: dict | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    #: Read symbolic links that leave the corpus folder (off: they are skipped and rejected).
    follow_links: bool = False

    def __post_init__(self):
        if self.include or self.exclude:  # a manifest's lists, or flags: tuples, each pattern checked
            from .selection import normalize_patterns
            inc, exc = normalize_patterns(self.include, self.exclude)
            object.__setattr__(self, "include", inc)
            object.__setattr__(self, "exclude", exc)
        else:
            object.__setattr__(self, "include", ())
            object.__setattr__(self, "exclude", ())
        if not isinstance(self.follow_links, bool):
            raise ValueError(f"follow_links (--follow-links) must be true or false, got {self.follow_links!r}")
        if self.format not in FORMATS:
            raise ValueError(f"unknown corpus format {self.format!r}; choose one of {', '.join(FORMATS)}")
        if not (isinstance(self.max_depth, int) and 1 <= self.max_depth <= MAX_DEPTH_CAP):
            raise ValueError(f"max_depth (--max-depth) must be an integer from 1 to {MAX_DEPTH_CAP} "
                             f"(deeper JSON is beyond what Python's parser handles safely), got {self.max_depth!r}")
        for name, flag in (("max_field_bytes", "--max-field-mib"), ("max_row_bytes", "--max-row-mib")):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} ({flag}) must be a positive number of bytes, got {v!r}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Chunk:
    """A unit of parallel reading: a byte range of a JSONL file or one Parquet row group."""

    index: int
    path: str
    kind: str  # "jsonl" | "parquet" | "files" (files start:end of a folder's listing; pipelines.sources.folder)
    start: int = 0          # JSONL: byte offsets, in the decompressed text of a compressed file
    end: int = 0
    row_group: int = 0
    compression: str = ""   # JSONL: "" or a pyarrow codec name (CODECS)

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


def _all_files(fs: pafs.FileSystem, root: str, spec: CorpusSpec) -> list[str]:
    """Every file under the folder ``root``, sorted; a local folder walked without leaving it
    (links out of it skipped unless ``spec.follow_links``, loops ended: `.walk`)."""
    if not isinstance(fs, pafs.LocalFileSystem):
        sel = pafs.FileSelector(root, recursive=True)
        return sorted(f.path for f in fs.get_file_info(sel) if f.type == pafs.FileType.File)
    from .selection import Rules
    from .walk import walk_local
    walk = walk_local(root, Rules(), follow_links=spec.follow_links, skip_hidden=False)
    for rel, _, why in walk.rejects[:5]:  # a data folder's rows have no place for these: said here
        log.warning("corpus folder %s: %s not read: %s", spec.path, rel, why)
    if len(walk.rejects) > 5:
        log.warning("corpus folder %s: %d more entries not read (links, names)", spec.path, len(walk.rejects) - 5)
    return sorted(f.path for f in walk.files)


def _looks_like_jsonl(head: bytes) -> bool:
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{")


def single_file_format(fs: pafs.FileSystem, path: str) -> str:
    """The format of a corpus that is one file, by its name and first bytes: ``parquet``,
    ``jsonl`` (also compressed, or a ``.txt`` of JSON objects), or ``files`` for one document
    (Markdown, text, HTML, PDF: a folder of one). A `CorpusError` for a file that is
    none of them, naming what is read."""
    from ..formats import READERS, extension, readable
    name = path.rsplit("/", 1)[-1].lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(JSONL_SUFFIXES) or ".jsonl." in name or ".json." in name:
        return "jsonl"  # rows.jsonl.xz too: compression_of names the compressions funnel cannot read
    with fs.open_input_stream(path, compression=None) as f:
        head = f.read(4096)
    if head.startswith(b"PAR1"):
        return "parquet"
    if any(head.startswith(m) for m in CODECS):
        return "jsonl"  # compressed JSONL under another name (a .zip is not: it is a .docx as often)
    if readable(name):
        return "jsonl" if extension(name) in (".txt", ".text") and _looks_like_jsonl(head) else "files"
    if _looks_like_jsonl(head) or not head.strip():
        return "jsonl"
    raise CorpusError(f"cannot tell what {path} holds: a corpus file is JSONL (.jsonl, .json; compressed .jsonl.gz, "
                      f".jsonl.zst, .jsonl.bz2), Parquet (.parquet), or one document "
                      f"({', '.join(sorted(READERS))}), and {name!r} looks like none of them. Rename it, or say "
                      "which it is with --format jsonl or --format parquet")


def resolve_files(spec: CorpusSpec) -> tuple[pafs.FileSystem, list[str], str]:
    """Find the files of a corpus and its format. Raises a clear error for a bad path."""
    fs, root = _filesystem(spec.path)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(
            f"corpus path {spec.path!r} does not exist; pass a BEIR directory (with corpus.jsonl), "
            "a .jsonl file (or .jsonl.gz, .jsonl.zst), a .parquet file/directory, or a folder of documents")
    fmt = spec.format
    if info.type == pafs.FileType.Directory:
        if fmt in ("auto", "beir"):
            for name in ("corpus.jsonl",) + tuple("corpus.jsonl" + c for c in COMPRESSED_SUFFIXES):
                beir = root.rstrip("/") + "/" + name
                if fs.get_file_info(beir).type == pafs.FileType.File:
                    return fs, [beir], "jsonl"
        files = _all_files(fs, root, spec)
        pq_files = [f for f in files if f.endswith(".parquet")]
        jl_files = [f for f in files if f.endswith(JSONL_SUFFIXES)]
        if fmt == "auto":
            # A folder of documents often holds a stray package.json or manifest.json: under
            # auto only .jsonl files make a JSONL corpus, and a folder that mixes data files
            # with documents is ambiguous, so it names both and asks for --format.
            from ..formats import readable
            jl_files = [f for f in jl_files if ".jsonl" in f.rsplit("/", 1)[-1]]
            docs = [f for f in files if readable(f)
                    and not any(part.startswith(".") for part in f[len(root):].split("/"))]
            if docs and (pq_files or jl_files):
                raise ValueError(
                    f"corpus directory {spec.path!r} holds both data files ({len(pq_files)} Parquet, "
                    f"{len(jl_files)} JSONL) and {len(docs)} document files (Markdown, text, HTML, PDF): "
                    "pass --format parquet, --format jsonl or --format files to say which is the corpus")
        if fmt in ("auto", "parquet") and pq_files:
            return fs, pq_files, "parquet"
        if fmt in ("auto", "jsonl") and jl_files:
            return fs, jl_files, "jsonl"
        if fmt in ("auto", "files"):  # a folder of Markdown, text, HTML, PDF files: pipelines.sources.folder
            from .folder import resolve_folder
            return fs, resolve_folder(fs, root, spec.path, spec), "files"
        raise ValueError(
            f"no corpus files in directory {spec.path!r}: expected corpus.jsonl (BEIR; or corpus.jsonl.gz, "
            ".zst), *.jsonl (or *.jsonl.gz, .zst) or *.parquet")
    if fmt == "auto":
        fmt = single_file_format(fs, root)
    if fmt == "beir":
        fmt = "jsonl"
    if fmt == "files":  # one document (manual.pdf, notes.md): a folder of one, its name its id
        from .folder import resolve_folder
        from ..formats import READERS, readable
        if not readable(root):
            raise CorpusError(f"--format files reads documents ({', '.join(sorted(READERS))}), and {spec.path!r} is "
                              "none of them: pass a folder of documents, or a document file")
        return fs, resolve_folder(fs, root, spec.path, spec), "files"
    return fs, [root], fmt


def row_example(spec: CorpusSpec) -> str:
    """What a row of ``spec``'s corpus looks like, for error messages."""
    id_name = spec.id_field or "_id"
    return (f"one JSON object per line, e.g. {{{json.dumps(id_name)}: \"d1\", {json.dumps(spec.title_field)}: "
            f"\"A title\", {json.dumps(spec.text_field)}: \"The text.\"}}; or Parquet with those columns")


def empty_corpus_message(spec: CorpusSpec) -> str:
    """The error for a corpus without a single row: its path and what a row looks like."""
    return (f"the corpus {spec.path} has no rows: nothing to index. A corpus holds {row_example(spec)} "
            f"(the id may be any of {', '.join(DEFAULT_ID_FIELDS)}, or name it with --id-field)")


def compression_of(fs: pafs.FileSystem, path: str) -> str:
    """The codec a JSONL file is compressed with (a key of ``CODECS``' values), or "" for plain
    text, from its first bytes; a `CorpusError` for a compression funnel does not read."""
    with fs.open_input_stream(path, compression=None) as f:  # the default guesses by the name
        head = f.read(8)
    for magic, name in UNREAD_CODECS.items():
        if head.startswith(magic):
            raise CorpusError(f"{path} is {name}-compressed, which funnel does not read: decompress it, or "
                              "recompress it with gzip or zstd (.jsonl.gz, .jsonl.zst), and build again")
    for magic, name in CODECS.items():
        if head.startswith(magic):
            if not pa.Codec.is_available(name):
                raise CorpusError(f"{path} is {name}-compressed and this pyarrow was built without {name}: "
                                  "decompress it first, or install a pyarrow with that codec")
            return name
    return ""


def _damaged(path: str, codec: str, e: Exception) -> CorpusError:
    tool = {"gzip": "gzip -t", "zstd": "zstd -t", "bz2": "bzip2 -t"}[codec]
    return CorpusError(f"cannot decompress {path} ({codec}): {e}. The file is damaged or truncated; "
                       f"check it with `{tool} {path}` and copy it again")


#: Decompressed sizes found while planning, by (path, size, mtime): corpus_bytes asks again.
_text_sizes: dict[tuple, int] = {}


def _plan_compressed(fs: pafs.FileSystem, path: str, codec: str, target_bytes: int) -> list[tuple[int, int]]:
    """(start, end) offsets in the decompressed text of ``path``, aligned to line starts, about
    ``target_bytes`` each and at most ``COMPRESSED_MAX_CHUNKS``: one streaming pass."""
    cuts, pos, want = [], 0, target_bytes
    try:
        with fs.open_input_stream(path, compression=codec) as f:
            while True:
                buf = f.read(1 << 20)
                if not buf:
                    break
                while want < pos + len(buf):
                    nl = buf.find(b"\n", max(0, want - pos))
                    if nl < 0:
                        break
                    cuts.append(pos + nl + 1)
                    want = cuts[-1] + target_bytes
                pos += len(buf)
    except OSError as e:
        raise _damaged(path, codec, e) from None
    info = fs.get_file_info(path)
    _text_sizes[(path, info.size, info.mtime_ns)] = pos
    cuts = [c for c in cuts if c < pos]
    if len(cuts) + 1 > COMPRESSED_MAX_CHUNKS:
        step = -(-(len(cuts) + 1) // COMPRESSED_MAX_CHUNKS)
        cuts = cuts[step - 1::step]
    bounds = [0] + cuts + [pos]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def jsonl_text_bytes(fs: pafs.FileSystem, path: str) -> int:
    """Bytes of a JSONL file's text: its size, or a compressed file's decompressed size."""
    info = fs.get_file_info(path)
    codec = compression_of(fs, path)
    if not codec:
        return int(info.size or 0)
    key = (path, info.size, info.mtime_ns)
    if key not in _text_sizes:
        _plan_compressed(fs, path, codec, 1 << 62)
    return _text_sizes[key]


def _string_like(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)
            or getattr(pa.types, "is_string_view", lambda _: False)(t))


def parquet_columns(schema: pa.Schema, spec: CorpusSpec) -> list[str]:
    """The columns a Parquet corpus is read from (id candidates, title, text), in file order."""
    want = {spec.id_field} if spec.id_field else set(DEFAULT_ID_FIELDS)
    want |= {spec.title_field, spec.text_field}
    return [n for n in schema.names if n in want]


def check_parquet_schema(path: str, schema: pa.Schema, spec: CorpusSpec) -> None:
    """A `CorpusError` naming the missing or mistyped columns, and the columns found,
    where every row of the file would be rejected for its schema."""
    names = schema.names
    missing = []
    if spec.id_field is not None and spec.id_field not in names:
        missing.append(f"the id column {spec.id_field!r} (--id-field)")
    if spec.id_field is None and not any(n in names for n in DEFAULT_ID_FIELDS):
        missing.append(f"an id column (one of {', '.join(map(repr, DEFAULT_ID_FIELDS))}; or name it with --id-field)")
    if spec.text_field not in names:
        missing.append(f"the text column {spec.text_field!r} (--text-field)")
    found = ", ".join(f"{n!r} ({schema.field(n).type})" for n in names) or "none"
    if missing:
        raise CorpusError(f"Parquet file {path} lacks {' and '.join(missing)}; its columns: {found}. Name the "
                          "columns with --id-field, --title-field and --text-field, or rename them")
    for n in parquet_columns(schema, spec):
        if not _string_like(schema.field(n).type):
            raise CorpusError(f"Parquet file {path}: column {n!r} holds {schema.field(n).type}, but ids, titles "
                              f"and texts are read as strings; cast it to string (e.g. pyarrow "
                              f"table.cast), or name another column; its columns: {found}")


def plan_chunks(spec: CorpusSpec, target_bytes: int = 16 << 20) -> list[Chunk]:
    """Split the corpus into chunks of about ``target_bytes`` without reading it whole.

    A compressed JSONL file is read once here, streaming, to find its line-aligned chunk
    offsets. A `CorpusError` if the corpus has no rows or a Parquet file lacks the
    columns it needs.
    """
    fs, files, fmt = resolve_files(spec)
    if fmt == "files":
        from .folder import plan_file_chunks
        return plan_file_chunks(spec, files, target_bytes)
    if spec.include or spec.exclude:
        raise CorpusError(f"--include and --exclude choose the files of a folder of documents, and {spec.path} is "
                          f"read as {fmt}: drop them, or pass --format files if the folder holds documents")
    chunks: list[Chunk] = []
    rows = 0
    for path in files:
        if fmt == "parquet":
            import pyarrow.parquet as pq
            with fs.open_input_file(path) as f:
                pf = pq.ParquetFile(f)
                check_parquet_schema(path, pf.schema_arrow, spec)
                n_groups = pf.num_row_groups
                rows += pf.metadata.num_rows
            for g in range(n_groups):
                chunks.append(Chunk(len(chunks), path, "parquet", row_group=g))
            continue
        codec = compression_of(fs, path)
        if codec:
            for start, end in _plan_compressed(fs, path, codec, target_bytes):
                chunks.append(Chunk(len(chunks), path, "jsonl", start=start, end=end, compression=codec))
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
    if not chunks or (fmt == "parquet" and rows == 0):
        raise CorpusError(empty_corpus_message(spec))
    return chunks


def _pick_id_field(obj: dict, spec: CorpusSpec) -> str | None:
    if spec.id_field is not None:
        return spec.id_field
    for name in DEFAULT_ID_FIELDS:
        if name in obj:
            return name
    return None


#: The structural tokens of JSON text (strings whole, so brackets inside them do not count).
_JSON_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:]')


def _too_deep(raw: bytes, limit: int) -> str | None:
    """Why the JSON line ``raw`` nests a field deeper than ``limit`` containers, or None.

    A line with at most ``limit`` + 1 opening brackets cannot (the row's own braces are one);
    only a line with more is scanned, token by token, in C-speed regex steps.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit + 1:
        return None
    depth, last, key = 0, None, None
    for m in _JSON_TOKENS.finditer(raw):
        c = raw[m.start()]
        if c == 0x22:  # a string: at depth 1 it may be the key of the field that follows
            if depth == 1:
                last = m.group()
        elif c == 0x3A:  # ':'
            if depth == 1:
                key = last
        elif c in (0x5B, 0x7B):  # '[' '{'
            depth += 1
            if depth > limit + 1:
                if key is None:
                    return f"the row nests more than {limit} levels deep, over the limit (max_depth, --max-depth)"
                try:
                    name = json.loads(key)
                except ValueError:
                    name = key[1:-1].decode("utf-8", "replace")
                return (f"field {_printable_id(name)!r} nests more than {limit} levels deep, over the limit "
                        "(max_depth, --max-depth)")
        else:
            depth -= 1
    return None


def _over_field(name: str, n: int, spec: CorpusSpec) -> str:
    return (f"field {_printable_id(name)!r} is {n:,} bytes, over the limit of {spec.max_field_bytes:,} bytes "
            "per field (max_field_bytes, --max-field-mib)")


def _over_row(n: int, spec: CorpusSpec) -> str:
    return (f"the row is {n:,} bytes, over the limit of {spec.max_row_bytes:,} bytes per row "
            "(max_row_bytes, --max-row-mib)")


def _value_bytes(v: Any) -> int:
    """A field value's size as JSON text (strings as UTF-8)."""
    if isinstance(v, str):
        return len(v.encode("utf-8", "surrogatepass"))
    return len(json.dumps(v))


def validate_record(obj: Any, spec: CorpusSpec, row_bytes: int = 0) -> tuple[dict | None, str | None]:
    """Return (record, None) for a good row, (None, reason) for a bad one.

    ``row_bytes`` is the row's raw size where it has one (a JSONL line): above
    ``max_field_bytes`` every field of the row is measured, not only id, title and text.
    """
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
        id_b = doc_id.encode("utf-8")
    except UnicodeEncodeError:
        return None, next(r for r in (_not_utf8(doc_id, id_field), _not_utf8(title, spec.title_field),
                                      _not_utf8(text, spec.text_field)) if r)
    for name, b in ((id_field, id_b), (spec.title_field, title_b), (spec.text_field, text_b)):
        if len(b) > spec.max_field_bytes:
            return None, _over_field(name, len(b), spec)
    if row_bytes > spec.max_field_bytes:
        for name, v in obj.items():
            if name not in (id_field, spec.title_field, spec.text_field) and _value_bytes(v) > spec.max_field_bytes:
                return None, _over_field(name, _value_bytes(v), spec)
    if len(id_b) + len(title_b) + len(text_b) > spec.max_row_bytes:
        return None, _over_row(len(id_b) + len(title_b) + len(text_b), spec)
    from .fields import row_fields  # every other field, kept as JSON; declared types checked
    fields, why = row_fields(obj, (id_field, spec.title_field, spec.text_field), spec.fields)
    if why is not None:
        return None, why
    return {"doc_id": doc_id, "title": title, "text": text,
            "content_hash": content_hash(title_b, text_b), "fields": fields}, None


def _read_compressed(fs: pafs.FileSystem, chunk: Chunk) -> bytes:
    """Bytes ``start:end`` of a compressed file's decompressed text (decompressed from its start)."""
    try:
        with fs.open_input_stream(chunk.path, compression=chunk.compression) as f:
            left = chunk.start
            while left > 0:
                skipped = len(f.read(min(left, 16 << 20)))
                if not skipped:
                    break
                left -= skipped
            return f.read(chunk.end - chunk.start)
    except OSError as e:
        raise _damaged(chunk.path, chunk.compression, e) from None


def read_chunk(chunk: Chunk, spec: CorpusSpec) -> ChunkResult:
    """Parse and validate one chunk. Rows carry ``chunk`` and ``line`` (1-based in the chunk)."""
    if chunk.kind == "files":
        from .folder import read_file_chunk
        return read_file_chunk(chunk, spec)
    fs, _ = _filesystem(spec.path)
    out = ChunkResult()
    if chunk.kind == "parquet":
        import pyarrow.parquet as pq
        with fs.open_input_file(chunk.path) as f:
            pf = pq.ParquetFile(f)
            # The columns a document is made of, and the others whose type a field can hold
            # (pipelines.sources.fields): no column of another type is converted.
            from .fields import parquet_field_columns
            table = pf.read_row_group(chunk.row_group, columns=parquet_columns(pf.schema_arrow, spec)
                                      + parquet_field_columns(pf.schema_arrow, parquet_columns(pf.schema_arrow, spec)))
        for i, obj in enumerate(table.to_pylist(), start=1):
            _accept(out, obj, spec, chunk, i)
        out.lines = table.num_rows
        return out
    if chunk.compression:
        data = _read_compressed(fs, chunk)
    else:
        with fs.open_input_file(chunk.path) as f:
            f.seek(chunk.start)
            data = f.read(chunk.end - chunk.start)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out.lines = len(lines)

    def reject(i: int, raw: bytes, reason: str) -> None:
        out.rejects.append({"chunk": chunk.index, "line": i, "path": chunk.path, "reason": reason,
                            "raw": raw[:200].decode("utf-8", "replace")})

    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue  # blank lines are not records
        # Bounds first, on the raw bytes: a row over one is never parsed.
        why = _over_row(len(raw), spec) if len(raw) > spec.max_row_bytes else _too_deep(raw, spec.max_depth)
        if why:
            reject(i, raw, why)
            continue
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            reject(i, raw, f"invalid JSON: {e.msg if hasattr(e, 'msg') else e}")
            continue
        except RecursionError:  # not reached within MAX_DEPTH_CAP; a backstop all the same
            reject(i, raw, f"the row nests too deeply to parse (limit {spec.max_depth}; max_depth, --max-depth)")
            continue
        _accept(out, obj, spec, chunk, i, row_bytes=len(raw))
    return out


def _accept(out: ChunkResult, obj: Any, spec: CorpusSpec, chunk: Chunk, line: int, row_bytes: int = 0) -> None:
    rec, reason = validate_record(obj, spec, row_bytes)
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
