"""Incremental reindexing: the reindexed version is the full build's, file for file and run for run.

Corpus A is built; corpus B changes, adds and deletes a few documents (and moves one, and
has different bad rows); ``reindex`` of A's index to B must publish what ``build`` of B
publishes: the same files (sha256) but the DuckDB file (compared by its tables), the
same collection statistics, and the same TREC run.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funnel.evaluation.trec import tiebreak_run, write_run
from funnel.jobs.build_index import BuildError, build
from funnel.jobs.reindex import reindex
from funnel.pipelines.store.artifacts import LOCK, VERIFIED, IndexFormatError, list_versions, load_manifest, read_current
from funnel.pipelines.lexical.postings import build_postings
from funnel.pipelines.store.reindex import diff_documents, merge_postings
from funnel.serving.search import open_index

from conftest import write_jsonl

QUERIES = {f"q{i}": q for i, q in enumerate([
    "parse command line arguments", "compress a file with gzip", "thread lock release",
    "random number generator seed", "json encode python object", "temporary directory",
    "regular expression match group", "send an email message header", "sqlite database cursor",
    "http request headers", "decimal rounding precision", "path of the current working directory",
    "iterate over combinations", "queue get block timeout", "unicode normalize string", "revised edition"])}
N_A, N_EACH = 360, 4   # corpus A's documents; changed, added and deleted in B


# -- tier 1: the merge against the obvious rebuild -------------------------------------------


def _postings_equal(a, b) -> None:
    assert a.terms == b.terms
    for name in ("df", "cf", "indptr", "docs", "tfs", "doclen"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


docs_st = st.lists(st.lists(st.sampled_from(list("abcdefghij") + ["é", "z9", "Ω"]), max_size=8),
                   max_size=12)


@settings(max_examples=150, deadline=None)
@given(old=docs_st, data=st.data())
def test_merge_equals_a_rebuild_of_the_new_documents(old, data):
    """Any keep/change/delete/add and reordering: merged postings == build_postings of the new docs."""
    old_ids = [f"d{i}" for i in range(len(old))]
    new = []  # (id, tokens)
    for i, toks in enumerate(old):
        fate = data.draw(st.sampled_from(["keep", "change", "delete"]))
        if fate == "keep":
            new.append((old_ids[i], toks))
        elif fate == "change":
            new.append((old_ids[i], data.draw(docs_st.map(lambda d: d[0] if d else []))))
    for j, toks in enumerate(data.draw(docs_st)):
        new.append((f"n{j}", toks))
    new = data.draw(st.permutations(new))
    h = lambda toks: "|".join(toks) + "#"  # noqa: E731  (a content hash stand-in)
    reuse, fresh, counts = diff_documents([d for d, _ in new], [h(t) for _, t in new], old_ids, [h(t) for t in old])
    assert counts["unchanged"] + counts["changed"] + counts["deleted"] == len(old)
    live = build_postings(old)
    arrays = {"indptr": live.indptr, "docs": live.docs, "tfs": live.tfs, "doclen": live.doclen}
    merged = merge_postings(np.asarray(live.terms, dtype=object), arrays, reuse, len(new), fresh,
                            [new[j][1] for j in fresh.tolist()])
    _postings_equal(merged, build_postings([t for _, t in new]))


def test_diff_counts():
    reuse, fresh, counts = diff_documents(["a", "b", "x"], ["1", "9", "5"], ["a", "b", "c"], ["1", "2", "3"])
    assert counts == {"unchanged": 1, "fields_changed": 0, "changed": 1, "added": 1, "deleted": 1}
    assert reuse.tolist() == [0, -1, -1] and fresh.tolist() == [1, 2]


# -- corpora ---------------------------------------------------------------------------------


def _docs(demo_corpus: str) -> list[dict]:
    with open(demo_corpus) as f:
        return [json.loads(line) for line in f]


def _corpora(docs: list[dict], folder, tag: str) -> tuple[str, str, dict]:
    """Corpus A (N_A documents, one bad row, one duplicate id) and corpus B: N_EACH changed,
    N_EACH added, N_EACH deleted, one document moved to the end, other bad rows."""
    a_docs, extra = docs[:N_A], docs[N_A:N_A + N_EACH]
    changed = {a_docs[i]["_id"] for i in range(5, 5 + 7 * N_EACH, 7)}
    deleted = {a_docs[i]["_id"] for i in range(50, 50 + 9 * N_EACH, 9)} - changed
    assert len(changed) == len(deleted) == N_EACH
    rows_a = list(a_docs)
    rows_a.insert(10, '{"_id": "broken", "text": ')
    rows_a.insert(20, {"_id": a_docs[3]["_id"], "title": "dup", "text": "a duplicate id"})
    rows_b = []
    for d in a_docs:
        if d["_id"] in deleted:
            continue
        if d["_id"] in changed:  # unique text: no embedding cache holds it yet
            d = {**d, "text": d["text"] + f" Revised edition {tag} {d['_id']}."}
        rows_b.append(d)
    rows_b.append(rows_b.pop(2))  # moved: its local id changes, its content does not
    rows_b += [{**d, "text": d["text"] + f" New {tag}."} for d in extra]
    rows_b.insert(15, {"_id": "", "text": "empty id"})
    rows_b.append({"_id": a_docs[40]["_id"], "title": "dup", "text": "a later duplicate"})
    a = write_jsonl(folder / "a.jsonl", rows_a)
    b = write_jsonl(folder / "b.jsonl", rows_b)
    return a, b, {"changed": changed, "deleted": deleted, "added": {d["_id"] for d in extra}}


def _version(root: str) -> str:
    return os.path.join(root, read_current(root))


def _tables(db: str) -> dict:
    con = duckdb.connect(db, read_only=True)
    try:
        return {t: con.sql(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ("terms", "collection", "shards")}
    finally:
        con.close()


def _run_file(root: str, path: str, mode: str = "bm25") -> bytes:
    run = open_index(root).search_batch(QUERIES, mode=mode, k=100)
    write_run(path, tiebreak_run({q: dict(h) for q, h in run.items()}), tag="t")
    with open(path, "rb") as f:
        return f.read()


def assert_same_index(reindexed: str, full: str, tmp_path, modes=("bm25",)) -> None:
    """Every file equal by sha256 (stats.duckdb by its tables), same statistics, same runs."""
    va, vb = _version(reindexed), _version(full)
    ma, mb = load_manifest(va), load_manifest(vb)
    fa, fb = dict(ma["files"]), dict(mb["files"])
    assert fa.pop("stats.duckdb") and fb.pop("stats.duckdb")  # DuckDB's file bytes are not deterministic
    assert fa == fb
    assert _tables(os.path.join(va, "stats.duckdb")) == _tables(os.path.join(vb, "stats.duckdb"))
    for key in ("collection", "shards", "analyzer", "bm25"):
        assert ma[key] == mb[key], key
    for key in ("fingerprint", "n_docs", "n_rejects"):
        assert ma["corpus"][key] == mb["corpus"][key], key
    with open(os.path.join(va, "rejects.jsonl")) as f, open(os.path.join(vb, "rejects.jsonl")) as g:
        assert f.read() == g.read()
    for mode in modes:
        ra = _run_file(reindexed, str(tmp_path / f"re-{mode}.trec"), mode)
        rb = _run_file(full, str(tmp_path / f"full-{mode}.trec"), mode)
        assert ra == rb and ra.count(b"\n") > 2 * len(QUERIES), mode


@pytest.fixture(scope="module")
def corpora(demo_corpus, tmp_path_factory):
    return _corpora(_docs(demo_corpus), tmp_path_factory.mktemp("corpora"), uuid.uuid4().hex[:8])


@pytest.fixture(scope="module")
def built_a(ray_session, corpora, tmp_path_factory) -> str:
    """A's index, built once; tests reindex copies of it."""
    root = str(tmp_path_factory.mktemp("a") / "ix")
    build(corpora[0], root, shards=4)
    return root


@pytest.fixture(scope="module")
def built_b(ray_session, corpora, tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("b") / "ix")
    build(corpora[1], root, shards=4)
    return root


@pytest.fixture
def index_a(built_a, tmp_path) -> str:
    root = str(tmp_path / "ix")
    shutil.copytree(built_a, root)
    return root


def _debris(root: str) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith((".staging-", ".work-", ".new-", ".trash-")))


# -- tier 2: reindex == full build -------------------------------------------------------------


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_reindex_equals_a_full_build(executor, index_a, built_b, corpora, tmp_path):
    _, corpus_b, truth = corpora
    serving = open_index(index_a)  # a searcher opened before: it switches without a restart
    rep = reindex(index_a, corpus_b, executor=executor)
    assert rep.executor == executor and rep.version == "v000002" and rep.base_version == "v000001"
    assert (rep.changed, rep.added, rep.deleted) == (N_EACH, N_EACH, N_EACH)
    assert rep.unchanged == N_A - 2 * N_EACH and rep.n_docs == N_A
    assert rep.n_rejects == 2  # B's own bad rows, not A's
    m = load_manifest(_version(index_a))
    assert m["parent"] == "v000001" and m["reindex"]["base"] == "v000001"
    assert m["corpus"]["source"] == corpus_b
    assert_same_index(index_a, built_b, tmp_path)
    ix = open_index(index_a)
    for d in truth["deleted"]:
        assert ix.index.docs.docno_of(d) is None
    assert "Revised edition" in ix.get_document(sorted(truth["changed"])[0])["text"]
    assert _debris(index_a) == []
    assert serving.refresh() and os.path.basename(serving.index.dir) == "v000002"
    assert all(serving.index.docs.docno_of(d) is not None for d in truth["added"])


def test_shards_that_empty_and_fill(ray_session, tmp_path):
    """A shard with no documents gets some, another loses all of its own: still the full build."""
    from funnel.pipelines.sources.corpus import shard_of
    ids = {s: [f"doc{i}" for i in range(200) if shard_of(f"doc{i}", 4) == s][:2] for s in range(4)}
    text = lambda i: {"title": f"T {i}", "text": f"words about topic {i} and gzip json"}  # noqa: E731
    a = write_jsonl(tmp_path / "a.jsonl", [{"_id": d, **text(d)} for s in (0, 1) for d in ids[s]])
    b = write_jsonl(tmp_path / "b.jsonl", [{"_id": d, **text(d)} for d in ids[0] + ids[2] + ids[3][:1]])
    re_root, full_root = str(tmp_path / "re"), str(tmp_path / "full")
    build(a, re_root, shards=4)
    rep = reindex(re_root, b, executor="local")
    assert (rep.unchanged, rep.added, rep.deleted, rep.shards_rebuilt) == (2, 3, 2, 3)  # shard 0 copied
    build(b, full_root, shards=4)
    assert [s["n_docs"] for s in load_manifest(_version(re_root))["shards"]] == [2, 0, 2, 1]
    assert_same_index(re_root, full_root, tmp_path, modes=())


def test_no_changes_publishes_nothing_unless_forced(index_a, corpora, tmp_path):
    corpus_a = corpora[0]
    rep = reindex(index_a, corpus_a, executor="local")
    assert not rep.published and rep.version is None
    assert (rep.changed, rep.added, rep.deleted, rep.unchanged) == (0, 0, 0, N_A)
    assert list_versions(index_a) == ["v000001"] and read_current(index_a) == "v000001"
    assert _debris(index_a) == []
    before = _run_file(index_a, str(tmp_path / "before.trec"))
    rep = reindex(index_a, corpus_a, executor="local", force=True)
    assert rep.version == "v000002" and rep.shards_rebuilt == 0  # every shard copied as it was
    v1, v2 = (load_manifest(os.path.join(index_a, v)) for v in ("v000001", "v000002"))
    f1, f2 = dict(v1["files"]), dict(v2["files"])
    f1.pop("stats.duckdb"), f2.pop("stats.duckdb")
    assert f1 == f2 and v1["collection"] == v2["collection"]
    assert _run_file(index_a, str(tmp_path / "after.trec")) == before


def test_keep_retires_old_versions(index_a, corpora):
    reindex(index_a, corpora[1], executor="local", force=True)
    rep = reindex(index_a, corpora[0], executor="local", keep_versions=1)
    assert rep.version == "v000003" and list_versions(index_a) == ["v000003"]
    assert read_current(index_a) == "v000003" and open_index(index_a).index.n_docs == N_A


# -- bad input and failures publish nothing ------------------------------------------------------


def test_bad_input_is_a_clear_error(index_a, corpora, tmp_path, capsys):
    missing = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="index root .* does not exist.*funnel build"):
        reindex(missing, corpora[1])
    assert not os.path.exists(missing)
    os.makedirs(tmp_path / "bare")
    with pytest.raises(IndexFormatError, match="no live version"):
        reindex(str(tmp_path / "bare"), corpora[1])
    with pytest.raises(FileNotFoundError, match="corpus path .* does not exist"):
        reindex(index_a, str(tmp_path / "missing.jsonl"))
    allbad = write_jsonl(tmp_path / "allbad.jsonl", ["[1, 2]", '{"_id": "x"}'])
    with pytest.raises(BuildError, match="no valid documents.*2 rows were rejected.*rejects-"):
        reindex(index_a, allbad, executor="local")
    with pytest.raises(BuildError, match="--strict: 2 rows rejected"):
        reindex(index_a, corpora[1], executor="local", strict=True)
    with pytest.raises(ValueError, match="--keep must be at least 1"):
        reindex(index_a, corpora[1], keep_versions=0)
    assert list_versions(index_a) == ["v000001"] and read_current(index_a) == "v000001"
    assert _debris(index_a) == []

    from funnel.serving.frontends.cli import main
    assert main(["reindex", "--index", missing, "--corpus", corpora[1]]) == 2
    assert "error: index root" in capsys.readouterr().err


def test_a_damaged_live_version_is_not_reused(index_a, corpora):
    p = os.path.join(_version(index_a), "lexical", "shard-0000", "tfs.npy")
    with open(p, "r+b") as f:
        f.seek(-1, 2)
        b = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(IndexFormatError, match="tfs.npy does not match its sha256"):
        reindex(index_a, corpora[1], executor="local")
    assert list_versions(index_a) == ["v000001"] and _debris(index_a) == []


@pytest.mark.parametrize("where", ["funnel.pipelines.store.reindex.merge_postings",
                                   "funnel.pipelines.lexical.stats.reduce_term_stats",
                                   "funnel.pipelines.store.artifacts.write_manifest"])
def test_a_failure_mid_reindex_publishes_nothing(where, index_a, corpora, monkeypatch):
    import importlib
    module, name = where.rsplit(".", 1)

    def boom(*args, **kwargs):
        raise RuntimeError(f"injected failure in {name}")

    monkeypatch.setattr(importlib.import_module(module), name, boom)
    before = sorted(os.listdir(index_a))
    with pytest.raises(RuntimeError, match="injected failure"):
        reindex(index_a, corpora[1], executor="local")
    assert read_current(index_a) == "v000001" and list_versions(index_a) == ["v000001"]
    # Nothing published or left behind; the live version's verification record (reindex hashed
    # every file of it, VERIFIED) may appear: it is not debris, and gc drops it with the version.
    assert sorted(n for n in os.listdir(index_a) if n not in (LOCK, VERIFIED)) == [
        n for n in before if n not in (LOCK, VERIFIED)]
    assert open_index(index_a).index.n_docs == N_A + 0  # the live version still opens and verifies


def test_cli_reindex(index_a, corpora, capsys):
    from funnel.serving.frontends.cli import main
    assert main(["reindex", "--index", index_a, "--corpus", corpora[1], "--executor", "local", "--keep", "1"]) == 0
    out = capsys.readouterr().out
    assert f"published {index_a}/v000002 (parent v000001)" in out
    assert f"{N_EACH} changed, {N_EACH} added, {N_EACH} deleted" in out
    assert main(["reindex", "--index", index_a, "--corpus", corpora[1], "--executor", "local"]) == 0
    assert "no changes" in capsys.readouterr().out and list_versions(index_a) == ["v000002"]


# -- dense: only changed and new documents are embedded ------------------------------------------


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_dense_reindex_embeds_only_what_changed(executor, ray_session, demo_corpus, tmp_path):
    docs = _docs(demo_corpus)[:48]  # a tiny corpus: MiniLM on CPU
    folder = tmp_path / "c"
    folder.mkdir()
    tag = uuid.uuid4().hex[:8]
    a_docs, extra = docs[:40], docs[40:42]
    a = write_jsonl(folder / "a.jsonl", a_docs)
    changed, deleted = {a_docs[3]["_id"], a_docs[11]["_id"]}, {a_docs[5]["_id"], a_docs[20]["_id"]}
    rows_b = [{**d, "text": d["text"] + f" Revised edition {tag}."} if d["_id"] in changed else d
              for d in a_docs if d["_id"] not in deleted]
    rows_b += [{**d, "text": d["text"] + f" New {tag}."} for d in extra]
    b = write_jsonl(folder / "b.jsonl", rows_b)
    re_root, full_root = str(tmp_path / "re"), str(tmp_path / "full")
    build(a, re_root, shards=2, dense=True)
    rep = reindex(re_root, b, executor=executor)  # dense follows the live version
    m = load_manifest(_version(re_root))
    # Counts are of vectors, one per passage: the 36 unchanged documents' passages are reused,
    # the 2 changed and 2 added documents' passages embedded (none of them was seen before).
    ix = open_index(re_root)
    fresh = sum(len(ix.passage_spans(ix.index.docs.docno_of(d), "")) for d in changed | {d["_id"] for d in extra})
    assert rep.dense == {"reused": m["dense"]["ntotal"] - fresh, "from_cache": 0, "embedded": fresh}
    assert fresh >= 4 and m["reindex"]["vectors"] == rep.dense and m["dense"]["passages"]["n_docs"] == 40
    # A full build of B finds every vector in the embedding cache (the reindex put the new ones
    # there), so both sides hold the same vectors and must rank identically.
    build(b, full_root, shards=2, dense=True)
    assert_same_index(re_root, full_root, tmp_path, modes=("bm25", "dense"))
    again = reindex(re_root, b, executor="local", force=True)
    assert again.dense == {"reused": m["dense"]["ntotal"], "from_cache": 0, "embedded": 0}


def test_cli_help_states_every_default(capsys):
    from test_cli_help import option_entries

    from funnel.serving.frontends.cli import main
    assert main(["reindex", "--help"]) == 0
    entries = option_entries(capsys.readouterr().out)
    assert {"--index", "--corpus", "--dense", "--keep", "--force", "--executor"} <= set(entries)
    missing = [o for o, text in entries.items() if o != "-h" and not o.startswith("--no-")
               and "(default: " not in text and "(required" not in text]
    assert not missing


def test_auto_executor_stays_in_the_driver_on_a_cluster(monkeypatch):
    """Under ray job submit (RAY_ADDRESS) workers may sit on machines that do not see the
    driver's folders, which reindex's Ray tasks read and write: auto runs locally there."""
    from funnel.jobs.reindex import _pick_executor
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert _pick_executor("auto") == "local" and _pick_executor("ray") == "ray"
