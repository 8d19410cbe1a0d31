"""``lexical/vocab.arrow``: the terms table (term, df, cf) that serving reads instead of
``stats.duckdb``, so a search process need not import DuckDB. Built and reindexed versions
carry it equal to the DuckDB table; an index built before it opens from DuckDB to the same
vocabulary and rankings; a damaged file is an IndexFormatError naming it."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pytest

from funnel.jobs.build_index import build
from funnel.pipelines.store.artifacts import IndexFormatError, load_manifest, write_manifest
from funnel.pipelines.lexical.stats import VOCAB, Vocabulary, load_vocabulary, read_terms, read_vocabulary
from funnel.serving.search import open_index

from conftest import write_jsonl

QUERY = "quick brown foxes"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vocab")
    words = "quick brown fox jumps over lazy dog running runners ran cats cat's naïve café".split()
    rows = [{"_id": f"d{i:03d}", "title": f"doc {i}", "text": " ".join(words[j % len(words)] for j in range(i, i + 3 + i % 7))}
            for i in range(60)]
    root = str(tmp / "ix")
    build(write_jsonl(tmp / "corpus.jsonl", rows), root, shards=2, engine="local")
    with open(os.path.join(root, "CURRENT")) as f:
        return root, os.path.join(root, f.read().strip())


def test_the_build_writes_the_duckdb_terms_table_as_an_arrow_file(built):
    _, vdir = built
    terms, df, cf = load_vocabulary(os.path.join(vdir, "stats.duckdb"))
    got_terms, got_df, got_cf = read_vocabulary(vdir, len(terms))
    assert got_terms == terms.tolist() and got_terms == sorted(got_terms) and "café" in got_terms
    assert np.array_equal(got_df, df) and np.array_equal(got_cf, cf)
    assert got_df.flags.writeable and got_cf.flags.writeable
    assert VOCAB in load_manifest(vdir)["files"]  # hashed and verified like every file


def test_a_search_process_does_not_import_duckdb(built):
    """What the file is for: `funnel search` on a built index answers without DuckDB (nor
    pyarrow.compute, which only sorting the ids at build, or for an old index, needs)."""
    import subprocess
    import sys
    root, _ = built
    code = ("import sys; from funnel.serving.frontends.cli import main; "
            f"rc = main(['search', {root!r}, {QUERY!r}, '--k', '3']); "
            "print('DUCKDB', 'duckdb' in sys.modules, 'pyarrow.compute' in sys.modules, rc, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "DUCKDB False False 0" in p.stderr, p.stdout[-2000:] + p.stderr[-2000:]


def test_the_served_vocabulary_finds_every_term_and_holds_no_string_a_term(built):
    """Serving looks terms up in `Vocabulary` (the Arrow column and sorted hashes), not a dict
    of every term: each stored term is found at its row, anything else is not, and nothing
    in it is a Python object a term."""
    root, vdir = built
    terms, _, _ = read_terms(vdir)
    v = Vocabulary(terms)
    words = terms.to_pylist()
    assert len(v) == len(words) and list(v) == words and dict(v.items()) == {t: i for i, t in enumerate(words)}
    assert all(v.get(t) == i and v[t] == i and t in v for i, t in enumerate(words))
    for absent in ["", "zzzz", words[0] + "x", words[-1][:-1] + "\U0010ffff", "\ud800", b"fox", 7, None]:
        assert v.get(absent) is None and v.get(absent, -1) == -1 and absent not in v
    with pytest.raises(KeyError):
        v["not a term"]
    assert v == Vocabulary(pa.chunked_array([terms[:3], terms[3:]])) and v != Vocabulary(terms[1:])
    held = [x for x in vars(v).values() if isinstance(x, (list, dict, tuple, set))]
    assert not held
    with open_index(root) as ix:
        assert isinstance(ix.index.vocab, Vocabulary) and ix.index.vocab == v


def test_terms_whose_keys_collide_are_told_apart_by_their_bytes():
    """Every term under one key (a stand-in for a 64-bit hash collision): each is still found
    at its own id, by comparing its bytes, and a term absent is not."""
    class Colliding(Vocabulary):
        key = staticmethod(lambda t: 42)
    words = ["alpha", "beta", "café", "gamma", "naïve"]
    v = Colliding(pa.array(words))
    assert [v.get(t) for t in words] == [0, 1, 2, 3, 4] and v.get("delta") is None and v.get("caf") is None
    assert Vocabulary(pa.array([], pa.string())).get("x") is None
    with pytest.raises(ValueError, match="array of strings"):
        Vocabulary(pa.array([1, 2]))


def _copy(root: str, dest) -> tuple[str, str]:
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns(".readers", ".verified", ".lock"))
    with open(os.path.join(dest, "CURRENT")) as f:
        return str(dest), os.path.join(str(dest), f.read().strip())


def test_an_index_without_the_file_reads_duckdb_to_the_same_rankings(built, tmp_path):
    root, _ = built
    old_root, old = _copy(root, tmp_path / "old")
    os.remove(os.path.join(old, VOCAB))
    m = load_manifest(old)
    del m["files"][VOCAB]
    write_manifest(old, m)
    with open_index(root) as a, open_index(old_root, verify="full") as b:
        assert a.index.vocab == b.index.vocab and np.array_equal(a.index.df, b.index.df)
        want = [(h.doc_id, h.score) for h in a.search(QUERY, k=10).hits]
        assert want and want == [(h.doc_id, h.score) for h in b.search(QUERY, k=10).hits]


@pytest.mark.parametrize("damage, says", [("short", "expected 1 rows of|expected .* rows of"),
                                          ("not-arrow", "is not an Arrow file"),
                                          ("schema", r"\(term string, df int64, cf int64\)")])
def test_a_damaged_vocabulary_file_names_it(built, tmp_path, damage, says):
    root, vdir = built
    bad_root, bad = _copy(root, tmp_path / "bad")
    path = os.path.join(bad, VOCAB)
    if damage == "not-arrow":
        with open(path, "wb") as f:
            f.write(b"not an arrow file")
    else:
        t = pa.table({"term": ["a"], "df": [1], "cf": [1]}) if damage == "short" \
            else pa.table({"term": ["a"] * 3, "df": [1.0] * 3})
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
            w.write_table(t)
    with pytest.raises(ValueError, match=says):
        read_vocabulary(bad, load_manifest(bad)["collection"]["n_terms"])
    with pytest.raises(IndexFormatError, match=r"vocab\.arrow"):
        open_index(bad_root, verify="none")
