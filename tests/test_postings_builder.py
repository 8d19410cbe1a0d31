"""``PostingsBuilder.add_text`` (what the build inverts documents with: word -> term ids once,
a pending id stream turned into postings by NumPy, the postings placed run by run at
``finish``) and ``add(analyzer.analyze(text))`` against a plain Python inversion of the
token lists: the same terms, df, cf, CSR arrays and document lengths, with texts that take
the whole-text analysis, empty and stopword-only documents, stream flushes in the middle,
the two methods mixed, and the placement a few postings at a time."""

from __future__ import annotations

import numpy as np
import pytest

from funnel.pipelines.lexical import postings
from funnel.pipelines.lexical.analysis import Analyzer
from funnel.pipelines.lexical.postings import PostingsBuilder


def _texts(n=400, seed=3):
    rng = np.random.default_rng(seed)
    words = [f"w{i:03d}" for i in range(150)] + ["The", "of", "running", "runs", "Dr.", "U.S.A.", "x-ray", "it's",
                                                  "naïve", "café", "ÅNGSTRÖM", "3.14", "e-mail", "a"]
    out = []
    for i in range(n):
        k = int(rng.integers(0, 40))
        toks = rng.choice(words, size=k, p=None)
        seps = rng.choice([" ", "  ", "\n", "\t", ", ", "-", "/"], size=k)
        out.append("".join(t + s for t, s in zip(toks, seps)))
    # whole-text analysis (a combining mark next to whitespace), empty, stopwords only, one word
    out += ["e\u0301 te\u0301 \u0301x", "", "   ", "the of a and", "w001", "naïve café " * 5]
    return out


def _same(a, b):
    return (a.terms == b.terms and all(np.array_equal(getattr(a, f), getattr(b, f))
                                       for f in ("df", "cf", "indptr", "docs", "tfs", "doclen")))


def _reference(texts, analyzer):
    """The postings of ``texts`` inverted in plain Python (no builder code)."""
    rows, lens = {}, []
    for d, t in enumerate(texts):
        toks = analyzer.analyze(t)
        lens.append(len(toks))
        for tok in toks:
            rows[(tok, d)] = rows.get((tok, d), 0) + 1
    terms = sorted({tok for tok, _ in rows})
    keys = sorted(rows)
    df = np.array([sum(1 for tok, _ in keys if tok == t) for t in terms], dtype=np.int64)
    cf = np.array([sum(n for (tok, _), n in rows.items() if tok == t) for t in terms], dtype=np.int64)
    return postings.ShardPostings(terms, df, cf, np.concatenate([[0], np.cumsum(df)]).astype(np.int64),
                                  np.array([d for _, d in keys], dtype=np.int32),
                                  postings.narrow_tfs(np.array([rows[k] for k in keys], dtype=np.int32)),
                                  np.array(lens, dtype=np.int32))


def _added(texts, analyzer):
    b = PostingsBuilder()
    for t in texts:
        b.add(analyzer.analyze(t))
    return b.finish()


@pytest.mark.parametrize("stream_tokens", [7, 1000, 1 << 22])
def test_add_text_equals_adding_the_analyzed_tokens(monkeypatch, stream_tokens):
    monkeypatch.setattr(PostingsBuilder, "STREAM_TOKENS", stream_tokens)
    texts = _texts()
    assert any(Analyzer().split_words(t) is None for t in texts)  # the whole-text path is taken
    want = _reference(texts, Analyzer())
    b = PostingsBuilder()
    a = Analyzer()
    for t in texts:
        b.add_text(t, a)
    assert _same(b.finish(), want)
    # the two methods mixed: documents keep their order and ids
    b, a = PostingsBuilder(), Analyzer()
    for i, t in enumerate(texts):
        if i % 3:
            b.add_text(t, a)
        else:
            b.add(a.analyze(t))
    assert _same(b.finish(), want)
    assert _same(_added(texts, Analyzer()), want)  # add alone


@pytest.mark.parametrize("place", [1, 5, 1 << 22])
def test_runs_placed_a_few_postings_at_a_time_give_the_same_arrays(monkeypatch, place):
    """``finish`` moves the postings run by run (``_Placement.place``), ``PLACE_POSTINGS`` at a time:
    one, a few, or all at once, with small and large stream chunks, the plain inversion's
    arrays every time."""
    monkeypatch.setattr(postings, "PLACE_POSTINGS", place)
    texts = _texts(seed=9)
    want = _reference(texts, Analyzer())
    for stream in (13, 1 << 22):
        monkeypatch.setattr(PostingsBuilder, "STREAM_TOKENS", stream)
        got = _added(texts, Analyzer())
        assert _same(got, want)
    assert got.docs.dtype == np.int32 and got.tfs.dtype == np.uint16  # narrowed as tfs.npy stores them
    assert postings.build_postings([["a", "b", "a"], [], ["b"]]).docs.tolist() == [0, 0, 2]


def test_inverting_a_shard_does_not_import_numba(tmp_path):
    """A shard's inversion (``index_shard_docs``, what a Ray shard worker runs) never imports
    numba: ~160 MiB a worker (its import and first kernel) that the build's peak, two shard
    workers at once on two cores, no longer holds. Run in a fresh interpreter."""
    import subprocess
    import sys
    code = f"""
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
from funnel.pipelines.lexical.shard import index_shard_docs
os.makedirs({str(tmp_path)!r} + "/docs")
rows = {{"title": ["t" + str(i) for i in range(300)], "text": ["alpha beta w" + str(i % 17) for i in range(300)]}}
pq.write_table(pa.table(rows), {str(tmp_path)!r} + "/docs/shard-0000.parquet", row_group_size=64)
s = index_shard_docs(0, {str(tmp_path)!r})
assert s["n_docs_nonempty"] == 300, s
print(sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "llvmlite")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert (tmp_path / "lexical" / "shard-0000" / "docs.npy").exists()


def test_a_tf_above_uint16_keeps_int32_tfs(monkeypatch):
    """``finish`` narrows tfs to uint16 before it places them only where every tf fits: a document
    repeating a term 70,000 times keeps int32 tfs, with the same postings either way."""
    docs = [["a"] * 70_000 + ["b"], ["b", "c"], ["a", "c", "c"]]
    got = postings.build_postings(docs)
    assert got.tfs.dtype == np.int32 and got.tfs.tolist() == [70_000, 1, 1, 1, 1, 2]
    assert got.docs.tolist() == [0, 2, 0, 1, 1, 2] and got.cf.tolist() == [70_001, 2, 3]
    monkeypatch.setattr(postings, "PLACE_POSTINGS", 1)
    assert _same(postings.build_postings(docs), got)


@pytest.mark.parametrize("place", [3, 1 << 20])
def test_finish_to_writes_the_files_write_shard_writes(monkeypatch, tmp_path, place):
    """``finish_to`` (the build's: the placed postings streamed to the shard's files) writes
    byte for byte what ``write_shard(finish())`` writes, and returns the same postings, its
    documents and tfs mapped from the files; a tf above 65,535 keeps int32 tfs there too."""
    monkeypatch.setattr(postings, "PLACE_POSTINGS", place)
    a = Analyzer()
    for texts in (_texts(seed=5), ["big " * 70_000 + "small", "small other", ""]):
        b1, b2 = PostingsBuilder(), PostingsBuilder()
        for t in texts:
            b1.add_text(t, a)
            b2.add_text(t, a)
        want = b1.finish()
        postings.write_shard(str(tmp_path / "a"), want)
        got = b2.finish_to(str(tmp_path / "b"))
        assert _same(got, want) and _same(got, _reference(texts, a))
        assert isinstance(got.docs, np.memmap)
        names = sorted(p.name for p in (tmp_path / "a").iterdir())
        assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
        assert names == ["doclen.npy", "docs.npy", "indptr.npy", "terms.parquet", "tfs.npy"]
        for n in names:
            assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes(), n
    assert np.load(tmp_path / "b" / "tfs.npy").dtype == np.int32
