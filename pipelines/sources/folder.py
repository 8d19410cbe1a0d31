"""A folder of files as a corpus: each readable file is one document, its id the file's path
relative to the folder (POSIX separators), local or remote (``s3://...``, through the same
pyarrow filesystems as the other corpora).

The build reads a folder through the corpus's chunk interface (`funnel.pipelines.sources.corpus`
dispatches here), so both engines, the reindex and the Spark statistics read folders as
they read JSONL: `plan_file_chunks` lists the folder once and cuts its readable files,
in path order, into chunks of about ``target_bytes``; `read_file_chunk` reads one
chunk's files with the reader of each type (`funnel.pipelines.formats`) on whatever
process runs it, in this process for ``--engine local`` and in a Ray task per chunk for
``--engine ray``. The rows are the same either way, because a row is a function of the
file's bytes and listing entry alone.

A chunk names its files by their positions in the sorted listing (``start``, ``end``) and
carries a checksum of their paths (``row_group``), so a worker that lists a folder which
changed after the build planned it fails with that message instead of reading other files.

What becomes of each file:
- a readable type (`funnel.pipelines.formats.READERS`): a row, or a reject with its
  reason (empty, binary, encrypted, damaged, no text layer, over `MAX_FILE_BYTES`);
- another type: skipped and counted by extension (`listing_summary`, the build's
  manifest and log);
- a hidden file or folder (a name starting with a dot: ``.git``, ``.venv``): skipped and
  counted apart, a folder once, however much it holds;
- a file or folder that ``--include``, ``--exclude`` or the folder's ``.funnelignore`` leave
  out (`funnel.pipelines.sources.selection`): skipped and counted as ``excluded``;
- a symbolic link: read only where it stays inside the folder (``--follow-links`` reads
  the others), a broken one or one that leaves the folder is a reject naming it; a file
  name that is not UTF-8 is a reject naming it escaped (`funnel.pipelines.sources.walk`).

A single document file (``--corpus manual.pdf``) is a folder of one: its id is its name.

Every row keeps its file's facts as its ``fields`` (`funnel.pipelines.sources.fields`, stored
with the document; `file_fields`): ``path``, ``size``, ``mtime`` (UTC, ISO 8601),
``format``, what its reader adds (heading offsets, PDF page count and page starts) and a
Markdown file's front matter keys. ``content_hash`` is of the title and text, so a reindex
of the folder finds added, changed and removed files by content, whatever their
modification times.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace

import pyarrow.fs as pafs

from .. import formats
from .corpus import Chunk, ChunkResult, CorpusSpec, _filesystem, validate_record
from .fields import MAX_FIELDS_BYTES
from .selection import Rules, rules_for
from .walk import LINK_COUNTS, Found, Walk, iso_mtime, select_listing, walk_local

log = logging.getLogger("funnel.build")

#: Largest file read as one document; a larger one is a reject that says so.
MAX_FILE_BYTES = 64 << 20
#: Most files in one chunk, however small they are (a chunk is the unit of parallel reading).
MAX_FILES_PER_CHUNK = 2000


@dataclass(frozen=True)
class Entry:
    """One file of the listing: id (relative POSIX path), filesystem path, size, mtime; ``why``
    is set for a file the listing itself rejects (a link out of the folder, a broken link, a
    name that is not UTF-8): a reject with that reason in its place, never read."""

    rel: str
    path: str
    size: int
    mtime: str
    why: str = ""


@dataclass(frozen=True)
class Listing:
    """A folder's files: the readable ones (and the listing's rejects) in path order, and the
    counts of the others. ``options`` are the listing options it was made with."""

    root: str
    entries: tuple[Entry, ...]
    by_type: dict
    skipped: dict
    hidden: int
    excluded: int = 0
    links: dict = field(default_factory=dict)
    bad_names: int = 0
    ignore_file: bool = False
    options: tuple = ()

    def summary(self) -> dict:
        """Counts for the manifest and the build's report."""
        return {"readable": sum(1 for e in self.entries if not e.why), "by_type": dict(sorted(self.by_type.items())),
                "skipped": sum(self.skipped.values()), "skipped_by_type": dict(sorted(self.skipped.items())),
                "hidden": self.hidden, "excluded": self.excluded,
                "links": {k: int(self.links.get(k, 0)) for k in LINK_COUNTS}, "bad_names": self.bad_names,
                "funnelignore": self.ignore_file}


#: The latest listing of each folder this process read (root -> Listing): planning lists
#: anew and replaces it; a chunk's reader reuses it while its checksum matches.
_LISTINGS: dict[str, Listing] = {}


def _type_key(rel: str) -> str:
    return formats.extension(rel) or "(no extension)"


def listing_options(spec: CorpusSpec | None) -> tuple:
    """The options of ``spec`` that decide what a folder's listing holds."""
    if spec is None:
        return ((), (), False)
    return (tuple(spec.include), tuple(spec.exclude), bool(spec.follow_links))


def list_folder(fs: pafs.FileSystem, root: str, spec: CorpusSpec | None = None) -> Listing:
    """List ``root`` recursively under ``spec``'s listing options (``include``, ``exclude``,
    ``follow_links``) and its ``.funnelignore``, and remember the listing for this process's
    chunk reads. A ``root`` that is one file is a listing of that file, its name its id."""
    root = root.rstrip("/") or "/"
    include, exclude, follow = options = listing_options(spec)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:  # a single document: a folder of one
        walk = Walk()
        name = root.rsplit("/", 1)[-1]
        if isinstance(fs, pafs.LocalFileSystem):
            s = os.stat(root)
            walk.files.append(Found(name, root, int(s.st_size), iso_mtime(s.st_mtime_ns)))
        else:
            walk = select_listing([info], root.rsplit("/", 1)[0], Rules())
        ignore = False
    else:
        rules = rules_for(fs, root, include, exclude)
        ignore = bool(rules.ignore)
        if isinstance(fs, pafs.LocalFileSystem):
            walk = walk_local(root, rules, follow_links=follow)
        else:
            walk = select_listing(fs.get_file_info(pafs.FileSelector(root, recursive=True)), root, rules)
    entries, by_type, skipped = [], Counter(), Counter()
    for f in walk.files:
        if formats.readable(f.rel):
            entries.append(Entry(f.rel, f.path, f.size, f.mtime))
            by_type[_type_key(f.rel)] += 1
        else:
            skipped[_type_key(f.rel)] += 1
    if walk.special:
        skipped["(not a regular file)"] += walk.special
    entries.extend(Entry(rel, path, 0, "", why=why) for rel, path, why in walk.rejects)
    entries.sort(key=lambda e: e.rel)
    listing = Listing(root, tuple(entries), dict(by_type), dict(skipped), walk.hidden, walk.excluded,
                      dict(walk.links), walk.bad_names, ignore, options)
    _LISTINGS[root] = listing
    if walk.rejects:
        log.warning("folder %s: %d entries not read (%s); their reasons are in the build's rejects.jsonl",
                    root, len(walk.rejects), _describe(Counter(_listing_reject_kind(r[2]) for r in walk.rejects)))
    return listing


def _listing_reject_kind(reason: str) -> str:
    for key, kind in (("outside the corpus folder", "links outside the folder"), ("broken symbolic", "broken links"),
                      ("not valid UTF-8", "names not UTF-8")):
        if key in reason:
            return kind
    return "unreadable folders"


def _describe(counts: dict, top: int = 8) -> str:
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{k} {v}" for k, v in items[:top])
    return text + (f", {len(items) - top} more types" if len(items) > top else "")


def resolve_folder(fs: pafs.FileSystem, root: str, source: str, spec: CorpusSpec | None = None) -> list[str]:
    """The readable files of a folder corpus (filesystem paths, in id order).

    Raises a ValueError naming the readable types when the folder has none, and an
    ImportError naming the extra when the library of one of its file types is missing.
    """
    listing = list_folder(fs, root, spec)
    if not listing.entries:
        found = (f"{sum(listing.skipped.values())} files of other types ({_describe(listing.skipped)})"
                 if listing.skipped else "no files")
        left = [f"{n} {what}" for n, what in ((listing.hidden, "hidden files or folders"),
                                              (listing.excluded, "excluded by --include, --exclude or .funnelignore"))
                if n]
        raise ValueError(f"no corpus files in folder {source!r}: found {found}"
                         f"{(' and ' + ', '.join(left)) if left else ''}. A folder corpus "
                         f"holds files of these types: {', '.join(sorted(formats.READERS))}; other corpora are "
                         "a BEIR folder (corpus.jsonl), *.jsonl or *.parquet")
    formats.require(listing.by_type)
    return [e.path for e in listing.entries]


def listed_bytes(files: list[str]) -> int:
    """Total size of these files of the latest listing (no stat call per file, which on S3
    is a request per file)."""
    want = set(files)
    return sum(e.size for listing in _LISTINGS.values() for e in listing.entries if e.path in want)


def _checksum(entries) -> int:
    crc = 0
    for e in entries:
        crc = zlib.crc32(e.rel.encode("utf-8") + b"\n", crc)
    return crc


def plan_file_chunks(spec, files: list[str], target_bytes: int) -> list:
    """Cut the listed readable files into chunks of about ``target_bytes`` (and at most
    `MAX_FILES_PER_CHUNK` files); logs what the folder holds."""
    fs, root = _filesystem(spec.path)
    root = root.rstrip("/")
    listing = _LISTINGS.get(root)
    if listing is None or listing.options != listing_options(spec) or [e.path for e in listing.entries] != list(files):
        listing = list_folder(fs, root, spec)
    s = listing.summary()
    log.info("folder %s: %d files to read (%s); %d skipped, of other types (%s); %d hidden skipped; %d excluded; "
             "links: %s", spec.path, s["readable"], _describe(s["by_type"]), s["skipped"],
             _describe(s["skipped_by_type"]) or "none", s["hidden"], s["excluded"],
             ", ".join(f"{v} {k}" for k, v in s["links"].items()))
    chunks, start, size = [], 0, 0
    entries = listing.entries
    for i, e in enumerate(entries):
        if i > start and (size + e.size > target_bytes or i - start >= MAX_FILES_PER_CHUNK):
            chunks.append(Chunk(len(chunks), root, "files", start=start, end=i,
                                row_group=_checksum(entries[start:i])))
            start, size = i, 0
        size += e.size
    if start < len(entries):
        chunks.append(Chunk(len(chunks), root, "files", start=start, end=len(entries),
                            row_group=_checksum(entries[start:])))
    return chunks


def listing_summary(chunks: list) -> dict | None:
    """The folder's counts (readable by type, skipped by type, hidden) when ``chunks`` were
    planned from a folder of files; None for any other corpus."""
    if not chunks or chunks[0].kind != "files":
        return None
    listing = _LISTINGS.get(chunks[0].path)
    return listing.summary() if listing is not None else None


def _chunk_entries(chunk, spec) -> tuple[Entry, ...]:
    listing = _LISTINGS.get(chunk.path)
    if listing is not None and listing.options != listing_options(spec):
        listing = None
    for attempt in range(2):
        if listing is not None:
            entries = listing.entries[chunk.start:chunk.end]
            if len(entries) == chunk.end - chunk.start and _checksum(entries) == chunk.row_group:
                return entries
        if attempt == 0:
            fs, _ = _filesystem(spec.path)
            listing = list_folder(fs, chunk.path, spec)
    raise RuntimeError(f"folder {spec.path!r} changed while it was read: files {chunk.start + 1}-{chunk.end} of the "
                       "listing are not the ones the build planned (files were added or removed); run it again")


def read_file(fs: pafs.FileSystem, entry: Entry, spec: CorpusSpec) -> tuple[dict | None, str | None]:
    """(row, None) for a file read as a document, (None, reason) for a reject: the row passes
    the checks of every corpus row (`validate_record` under ``spec``'s bounds and
    declared fields), its fields being `file_fields`."""
    if entry.size > MAX_FILE_BYTES:
        return None, (f"file of {_size(entry.size)} is over the {_size(MAX_FILE_BYTES)} bound of one document "
                      "(funnel.pipelines.sources.folder.MAX_FILE_BYTES); split it")
    try:
        data = _read_bytes(fs, entry.path, MAX_FILE_BYTES + 1)
    except OSError as e:
        return None, f"cannot read the file: {e}"
    if len(data) > MAX_FILE_BYTES:
        return None, f"file grew over the {_size(MAX_FILE_BYTES)} bound of one document while it was read"
    reader = formats.reader_for(entry.rel)
    try:
        doc = reader.read(data, entry.rel)
    except formats.UnreadableFile as e:
        return None, str(e)
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001 - a library failing on one odd file rejects that file, never the build
        return None, f"{reader.name} reader failed: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
    title = doc.title or entry.rel.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    obj = {"_id": entry.rel, "title": title, "text": doc.text, "metadata": file_fields(entry, reader, doc)}
    return validate_record(obj, replace(spec, id_field="_id", title_field="title", text_field="text"))


def _read_bytes(fs: pafs.FileSystem, path: str, limit: int) -> bytes:
    """Up to ``limit`` bytes of a listed file. A local one is opened without following a
    symbolic link (the listing resolved links to their targets' real paths, so a path that is
    a link now was made one after the listing: an error, not another file's bytes)."""
    if not isinstance(fs, pafs.LocalFileSystem):
        with fs.open_input_file(path) as f:
            return f.read(limit)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is no longer a regular file")
        return f.read(limit)


def file_fields(entry: Entry, reader: formats.Reader, doc: formats.Document) -> dict:
    """A file's fields (`funnel.pipelines.sources.fields`): its front matter's keys, then its
    path, size, mtime, format and what its reader found (headings, page starts).

    A front matter key that one of those (or ``_id``, ``title``, ``text``) takes is kept as
    ``front_matter_<key>``; a string ``title`` is the document's title. The whole stays under
    the row's fields bound by trimming the heading list, then by dropping the page starts
    (a PDF page is still the count of form feeds before an offset, plus one)."""
    own = {"path": entry.rel, "size": entry.size, "mtime": entry.mtime, "format": reader.module}
    facts = {k: v for k, v in doc.metadata.items() if k != "front_matter"}
    out: dict = {}
    for key, value in (doc.metadata.get("front_matter") or {}).items():
        if key == "title" and isinstance(value, str):
            continue  # it is the document's title
        taken = key in own or key in facts or key in ("_id", "title", "text", "metadata")
        out[f"front_matter_{key}" if taken else key] = value
    out.update(own)
    out.update(facts)
    budget = MAX_FIELDS_BYTES * 3 // 4
    if _json_size(out) > budget and out.get("headings"):
        heads = out["headings"]
        while heads and _json_size(out) > budget:
            heads = heads[:len(heads) // 2]
            out["headings"] = heads
        out["headings_truncated"] = True
    if _json_size(out) > budget and "page_starts" in out:
        del out["page_starts"]
        out["page_starts_omitted"] = True
    return out


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _json_size(value) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def read_file_chunk(chunk, spec):
    """Read one chunk's files: its rows (``doc_id``, ``title``, ``text``, ``content_hash``,
    ``fields``, ``chunk``, ``line`` = the file's place in the chunk) and rejects (``path``,
    ``doc_id``, ``reason``); ``lines`` is its file count, so a reject's line in the build's
    rejects.jsonl is the file's place in the folder's listing."""
    fs, _ = _filesystem(spec.path)
    out = ChunkResult()
    entries = _chunk_entries(chunk, spec)
    out.lines = len(entries)
    for i, entry in enumerate(entries, start=1):
        rec, reason = (None, entry.why) if entry.why else read_file(fs, entry, spec)
        if rec is None:
            out.rejects.append({"chunk": chunk.index, "line": i, "path": entry.path, "doc_id": entry.rel,
                                "reason": reason})
            continue
        rec["chunk"] = chunk.index
        rec["line"] = i
        out.rows.append(rec)
    return out


def read_folder(path: str, target_bytes: int = 4 << 20, **options) -> tuple[list[dict], list[dict]]:
    """(rows, rejects) of every file of a folder corpus, read in this process in id order;
    for tools and tests (a build reads the same chunks through its engine). ``options``:
    `CorpusSpec`'s listing options (``include``, ``exclude``, ``follow_links``)."""
    from .corpus import plan_chunks
    spec = CorpusSpec(path=path, format="files", **options)
    rows, rejects = [], []
    for chunk in plan_chunks(spec, target_bytes=target_bytes):
        res = read_file_chunk(chunk, spec)
        rows.extend(res.rows)
        rejects.extend(res.rejects)
    return rows, rejects
