"""Corpus input that once stopped or misled a build (issue 37, items 4 and 7): each case goes
through ``build`` (or the ``funnel`` CLI) on both engines and ends either in a published index
whose rejects say why, or in an error that names the problem and leaves the root clean.

Compressed files are written with Python's gzip and pyarrow's zstd codec (standard zstd
frames, which the ``zstd`` tool reads too).
"""

from __future__ import annotations

import gzip
import json
import os

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl

from funnel.jobs.build_index import BuildError, build, corpus_bytes
from funnel.pipelines.store.artifacts import LOCK, gc, read_current
from funnel.pipelines.sources.corpus import (COMPRESSED_MAX_CHUNKS, CorpusError, CorpusSpec, _read_compressed,
                                     plan_chunks)
from funnel.serving.search import open_index

GOOD = [{"_id": f"d{i}", "title": f"Note {i}", "text": f"apples and pears, note number {i}"} for i in range(12)]
GOOD[5]["text"] = "bananas are yellow"


@pytest.fixture(params=["local", "ray"])
def engine(request) -> str:
    """Both build engines must treat bad input the same way."""
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return request.param


def _build(corpus: str, root, engine: str, **kw):
    return build(corpus, str(root), shards=2, engine=engine, progress_seconds=0, **kw)


def _rejects(rep) -> list[dict]:
    with open(rep.rejects_path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _root_files(root) -> list[str]:
    """What a failed build left in the root besides the root's own lock file."""
    return sorted(n for n in os.listdir(root) if n != LOCK) if os.path.isdir(root) else []


# -- item 4: one row too deep or too big is one reject -------------------------------------------


def test_a_deeply_nested_row_is_one_reject_and_the_rest_publish(engine, tmp_path):
    deep = '{"_id": "deep", "text": "fine text", "meta": ' + "[" * 5000 + "]" * 5000 + "}"
    deep_array = "[" * 5000 + "]" * 5000  # a row that is not even an object
    rows = [json.dumps(r) for r in GOOD[:6]] + [deep] + [json.dumps(r) for r in GOOD[6:]] + [deep_array]
    rep = _build(write_jsonl(tmp_path / "c.jsonl", rows), tmp_path / "ix", engine)
    assert (rep.n_docs, rep.n_rejects) == (len(GOOD), 2)
    first, second = _rejects(rep)
    assert first["line"] == 7 and first["path"].endswith("c.jsonl")
    assert first["reason"] == "field 'meta' nests more than 64 levels deep, over the limit (max_depth, --max-depth)"
    assert second["line"] == len(GOOD) + 2 and "the row nests more than 64 levels deep" in second["reason"]
    assert open_index(str(tmp_path / "ix")).search("bananas", k=1).hits[0].doc_id == "d5"


def test_depth_is_counted_outside_strings_and_up_to_the_limit(tmp_path):
    """Brackets inside a string are text; a value exactly at the limit is accepted."""
    at_limit = {"_id": "ok", "text": "[[[[" * 100, "meta": json.loads("[" * 64 + "]" * 64)}
    over = {"_id": "over", "text": "x", "meta": {"a": json.loads("[" * 64 + "]" * 64)}}
    spec = CorpusSpec(write_jsonl(tmp_path / "c.jsonl", [at_limit, over]))
    rows, rejects = [], []
    for c in plan_chunks(spec):
        from funnel.pipelines.sources.corpus import read_chunk
        res = read_chunk(c, spec)
        rows += res.rows
        rejects += res.rejects
    assert [r["doc_id"] for r in rows] == ["ok"]
    assert [(r["line"], r["reason"].split(" nests")[0]) for r in rejects] == [(2, "field 'meta'")]


def test_an_oversized_field_or_row_is_one_reject_in_jsonl_and_parquet(engine, tmp_path):
    limits = {"max_field_bytes": 1000, "max_row_bytes": 1500}
    rows = [dict(r) for r in GOOD]
    rows[2]["text"] = "x" * 1200
    rows[3]["extra"] = "z" * 1200                                  # a field funnel does not index
    rows[4]["title"], rows[4]["text"] = "t" * 900, "u" * 900       # each field fits, the row does not
    rep = _build(write_jsonl(tmp_path / "c.jsonl", rows), tmp_path / "ix", engine, limits=limits)
    assert (rep.n_docs, rep.n_rejects) == (len(GOOD) - 3, 3)
    got = {r["line"]: r["reason"] for r in _rejects(rep)}
    assert got[3] == ("field 'text' is 1,200 bytes, over the limit of 1,000 bytes per field "
                      "(max_field_bytes, --max-field-mib)")
    assert got[4].startswith("field 'extra' is 1,200 bytes, over the limit of 1,000 bytes")
    assert got[5].startswith("the row is ") and "over the limit of 1,500 bytes per row" in got[5]

    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in ("_id", "title", "text")} for r in rows]),
                   tmp_path / "c.parquet", row_group_size=5)
    rep = _build(str(tmp_path / "c.parquet"), tmp_path / "ixp", engine, limits=limits)
    got = {r["line"]: r["reason"] for r in _rejects(rep)}
    assert sorted(got) == [3, 5] and got[3].startswith("field 'text' is 1,200 bytes")
    assert got[5] == "the row is 1,802 bytes, over the limit of 1,500 bytes per row (max_row_bytes, --max-row-mib)"


def test_the_limits_are_cli_flags_and_are_checked(tmp_path, capsys):
    from funnel.serving.frontends.cli import main
    rows = [dict(r) for r in GOOD]
    rows[0]["text"] = "x" * 3000
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    root = str(tmp_path / "ix")
    assert main(["build", "--corpus", corpus, "--out", root, "--engine", "local", "--progress-seconds", "0",
                 "--max-field-mib", "0.002"]) == 0
    ix = open_index(root)
    assert ix.index.n_docs == len(GOOD) - 1 and ix.search("bananas", k=1).hits[0].doc_id == "d5"
    assert main(["build", "--corpus", corpus, "--out", root, "--engine", "local", "--max-depth", "0"]) == 2
    assert "--max-depth" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"max_row_bytes \(--max-row-mib\) must be a positive"):
        CorpusSpec(corpus, max_row_bytes=0)


# -- item 7: compressed JSONL is read -------------------------------------------------------------


def _zstd(data: bytes) -> bytes:
    return pa.Codec("zstd").compress(data, asbytes=True)


def test_gzip_and_zstd_corpora_build_the_same_index_as_plain_jsonl(engine, tmp_path):
    rows = [json.dumps(r) for r in GOOD[:7]] + ["{not json"] + [json.dumps(r) for r in GOOD[7:]]
    plain = write_jsonl(tmp_path / "c.jsonl", rows)
    data = open(plain, "rb").read()
    beir = tmp_path / "beir"
    beir.mkdir()
    (beir / "corpus.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c.jsonl.zst").write_bytes(_zstd(data))
    # Two gzip members: what `cat a.gz b.gz` or a parallel gzip writes.
    half = data.index(b"\n", len(data) // 2) + 1
    (tmp_path / "two.jsonl.gz").write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))

    want = _build(plain, tmp_path / "ix-plain", engine, chunk_bytes=200)
    fingerprint = json.load(open(tmp_path / "ix-plain" / want.version / "manifest.json"))["corpus"]["fingerprint"]
    for name, corpus in [("gz", str(beir)), ("zst", str(tmp_path / "c.jsonl.zst")),
                         ("two", str(tmp_path / "two.jsonl.gz"))]:
        rep = _build(corpus, tmp_path / f"ix-{name}", engine, chunk_bytes=200)
        assert (rep.n_docs, rep.n_rejects) == (len(GOOD), 1), name
        assert [(r["line"], r["reason"][:12]) for r in _rejects(rep)] == [(8, "invalid JSON")], name
        m = json.load(open(tmp_path / f"ix-{name}" / rep.version / "manifest.json"))
        assert m["corpus"]["fingerprint"] == fingerprint, name
        assert rep.engine["corpus_bytes"] == len(data), name  # decompressed bytes choose shards and engine
        assert open_index(str(tmp_path / f"ix-{name}")).search("bananas", k=1).hits[0].doc_id == "d5"


def test_compressed_chunks_cover_the_text_once_and_are_bounded(tmp_path):
    data = b"".join(json.dumps({"_id": f"d{i}", "text": "w " * (i % 7)}).encode() + b"\n" for i in range(400))
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(data))
    for target, n_chunks in [(64, COMPRESSED_MAX_CHUNKS), (len(data) // 3, 3), (1 << 30, 1)]:
        spec = CorpusSpec(str(tmp_path / "c.jsonl.gz"))
        chunks = plan_chunks(spec, target_bytes=target)
        assert len(chunks) == n_chunks and all(c.compression == "gzip" for c in chunks)
        parts = [_read_compressed(pafs.LocalFileSystem(), c) for c in chunks]
        assert b"".join(parts) == data and all(p.endswith(b"\n") for p in parts)
    assert corpus_bytes(spec) == len(data)


def test_damaged_or_unread_compression_is_a_clear_error(tmp_path):
    data = b"".join(json.dumps(r).encode() + b"\n" for r in GOOD)
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(data)[:-12])
    with pytest.raises(CorpusError, match=r"cannot decompress .*cut.jsonl.gz \(gzip\).*gzip -t"):
        build(str(tmp_path / "cut.jsonl.gz"), str(tmp_path / "ix"), engine="local")
    (tmp_path / "c.jsonl.xz").write_bytes(b"\xfd7zXZ\x00" + b"\x00" * 30)
    with pytest.raises(CorpusError, match="is xz-compressed, which funnel does not read.*gzip or zstd"):
        build(str(tmp_path / "c.jsonl.xz"), str(tmp_path / "ix"), engine="local")
    assert _root_files(tmp_path / "ix") == []


# -- item 7: an empty corpus, a wrong Parquet schema -----------------------------------------------


@pytest.mark.parametrize("content", ["", "\n  \n\n"], ids=["empty", "blank-lines"])
def test_an_empty_corpus_says_it_has_no_rows(engine, tmp_path, content):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(content)
    root = tmp_path / "ix"
    with pytest.raises((CorpusError, BuildError)) as e:
        _build(str(corpus), root, engine)
    msg = str(e.value)
    assert msg.startswith(f"the corpus {corpus} has no rows") and "rejected" not in msg
    assert '{"_id": "d1", "title": "A title", "text": "The text."}' in msg  # what a row looks like
    assert _root_files(root) == [] and read_current(str(root)) is None


def test_a_parquet_file_with_the_wrong_schema_names_the_columns(tmp_path, capsys):
    from funnel.serving.frontends.cli import main
    pq.write_table(pa.table({"doc": ["a", "b"], "body": ["x", "y"]}), tmp_path / "w.parquet")
    with pytest.raises(CorpusError) as e:
        build(str(tmp_path / "w.parquet"), str(tmp_path / "ix"), engine="local")
    assert str(e.value) == (
        f"Parquet file {tmp_path / 'w.parquet'} lacks an id column (one of '_id', 'id', 'docid', 'doc_id'; or "
        "name it with --id-field) and the text column 'text' (--text-field); its columns: 'doc' (string), "
        "'body' (string). Name the columns with --id-field, --title-field and --text-field, or rename them")
    # Naming the columns is the fix the message gives.
    rep = build(str(tmp_path / "w.parquet"), str(tmp_path / "ix"), engine="local", id_field="doc",
                text_field="body", progress_seconds=0)
    assert (rep.n_docs, rep.n_rejects) == (2, 0)

    pq.write_table(pa.table({"id": [1, 2], "text": ["x", "y"]}), tmp_path / "ints.parquet")
    assert main(["build", "--corpus", str(tmp_path / "ints.parquet"), "--out", str(tmp_path / "ix2"),
                 "--engine", "local"]) == 2
    err = capsys.readouterr().err
    assert "column 'id' holds int64" in err and "cast it to string" in err and "rejected" not in err
    assert _root_files(tmp_path / "ix2") == []


# -- item 7: what a failed build leaves in the root -------------------------------------------------


def test_only_an_all_rejected_build_keeps_its_reasons_where_the_error_says_and_gc_removes_them(engine, tmp_path):
    root = tmp_path / "ix"
    bad = write_jsonl(tmp_path / "bad.jsonl", ["[1, 2]", '{"_id": "x"}', "{oops"])
    with pytest.raises(BuildError) as e:
        _build(bad, root, engine)
    msg = str(e.value)
    assert "all 3 rows were rejected (the first, line 1: row is a JSON list, expected an object)" in msg
    kept = _root_files(root)
    assert len(kept) == 1 and kept[0].startswith("rejects-") and str(root / kept[0]) in msg
    assert len(open(root / kept[0]).readlines()) == 3
    rep = gc(str(root))
    assert [p for p, _ in rep.removed] == [str(root / kept[0])] and _root_files(root) == []

    # Failures found before a row is read leave nothing at all.
    (tmp_path / "empty.jsonl").write_text("")
    pq.write_table(pa.table({"doc": ["a"]}), tmp_path / "w.parquet")
    for corpus in (tmp_path / "empty.jsonl", tmp_path / "w.parquet"):
        with pytest.raises(CorpusError):
            _build(str(corpus), root, engine)
        assert _root_files(root) == []
