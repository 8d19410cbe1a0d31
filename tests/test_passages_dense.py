"""Passages in the dense index: MaxP search (tier 2, against exhaustive scoring), the build's
passage artifacts on both engines, citations, ranges of a document, and a reindex that embeds
only the passages whose text changed. Real components: MiniLM, FAISS, local Ray, Parquet."""

import json
import os
import types
import uuid

import numpy as np
import pyarrow.parquet as pq
import pytest

from funnel.jobs.build_index import build
from funnel.jobs.reindex import reindex
from funnel.pipelines.store.artifacts import read_current
from funnel.pipelines.dense.passages import PassageSettings, passage_input, read_passages
from funnel.pipelines.dense.vectors import build_dense_index, write_passage_shard
from funnel.serving.dense import DenseIndex
from funnel.serving.search import SearchError, open_index

from conftest import write_jsonl
from test_build_engines import assert_same_index


# -- tier 2: MaxP search against exhaustive scoring ---------------------------------------


def _maxp_oracle(q: np.ndarray, vecs: np.ndarray, docnos: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Every passage scored with NumPy; a document's score is its best passage's."""
    scores = vecs @ q
    best: dict[int, float] = {}
    for d, s in zip(docnos.tolist(), scores.tolist()):
        best[d] = max(best.get(d, -np.inf), s)
    return sorted(best.items(), key=lambda kv: -kv[1])[:k]


@pytest.fixture(scope="module")
def passage_index(tmp_path_factory):
    """40 documents of 1 to 12 passages in 3 shards, clustered random unit vectors."""
    rng = np.random.default_rng(7)
    dim, root = 16, tmp_path_factory.mktemp("maxp")
    dense_dir, pdir = str(root / "dense"), str(root / "passages")
    centers = rng.normal(size=(5, dim))
    all_vecs, all_docnos = [], []
    for s in range(3):
        counts = rng.integers(1, 13, size=14 if s < 2 else 12)
        local = np.repeat(np.arange(len(counts)), counts)
        ordinal = np.concatenate([np.arange(c) for c in counts])
        vecs = centers[rng.integers(0, 5, size=len(local))] + 0.6 * rng.normal(size=(len(local), dim))
        vecs = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)
        perm = rng.permutation(len(local))  # arrive in any order, as batches do
        write_passage_shard(dense_dir, pdir, s, vecs[perm], local[perm], ordinal[perm], ordinal[perm] * 10,
                            ordinal[perm] * 10 + 12)
        all_vecs.append(vecs)
        all_docnos.append((s << 32) | local)
    info = build_dense_index(dense_dir, 3)
    info["passages"] = {"window": 256, "overlap": 0.15}
    # The query embedder is never called: these tests hand FAISS query vectors directly.
    provider = types.SimpleNamespace(dim=dim, name="vectors-given", fingerprint=lambda: {})
    index = DenseIndex.open(dense_dir, info, provider)
    return index, np.vstack(all_vecs), np.concatenate(all_docnos), rng


@pytest.mark.parametrize("k", [1, 5, 10, 39, 40, 55])
def test_passage_search_is_exactly_maxp(passage_index, k):
    index, vecs, docnos, rng = passage_index
    assert index.passages.max_per_doc > 1 and index.depth_factor > 1
    queries = rng.normal(size=(12, vecs.shape[1])).astype(np.float32)
    queries[:4] = vecs[rng.integers(0, len(vecs), size=4)]  # some sit on a passage: deep clusters
    scores, ids = index.search_vectors(queries, k)
    for q, srow, irow in zip(queries, scores, ids):
        want = _maxp_oracle(q, vecs, docnos, k)
        got = [(int(i), float(s)) for i, s in zip(irow, srow) if i >= 0]
        assert len(got) == len(want) == min(k, 40)  # k distinct documents, or every document
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=0, atol=1e-5)
        assert [d for d, _ in got] == [d for d, _ in want]
        assert (irow[len(got):] == -1).all()


def test_best_passage_is_the_one_the_score_came_from(passage_index):
    index, vecs, docnos, rng = passage_index
    q = vecs[17]
    (score,), (doc,) = (x[0] for x in index.search_vectors(q[None, :], 1))
    best = index.best_passage(q, int(doc))
    rows = np.flatnonzero(docnos == doc)
    assert best["score"] == pytest.approx(float(score), abs=1e-5)
    assert best["score"] == pytest.approx(float((vecs[rows] @ q).max()), abs=1e-5)
    assert (best["start"], best["end"]) == (best["ordinal"] * 10, best["ordinal"] * 10 + 12)


# -- the build: passages on both engines, MaxP with the real model, citations -------------


def _long_corpus(demo_corpus: str, path) -> tuple[str, list[dict]]:
    """Three long documents (30 demo docstrings each, paragraphs) and five short ones."""
    docs = [json.loads(line) for line in open(demo_corpus)]
    rows = [{"_id": f"long{i}", "title": f"Notes {i}",
             "text": "\n\n".join(f"{d['title']}\n{d['text']}" for d in docs[30 * i:30 * (i + 1)])}
            for i in range(3)]
    rows += [{"_id": d["_id"], "title": d["title"], "text": d["text"]} for d in docs[200:205]]
    return write_jsonl(path, rows), rows


@pytest.fixture(scope="module")
def long_build(ray_session, demo_corpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("longdocs")
    corpus, rows = _long_corpus(demo_corpus, tmp / "c.jsonl")
    old = os.environ.get("FUNNEL_CACHE")
    os.environ["FUNNEL_CACHE"] = str(tmp / "cache")  # embeds for real, once; the second engine reads it
    try:
        for engine in ("local", "ray"):
            build(corpus, str(tmp / engine), shards=2, engine=engine, dense=True)
    finally:
        os.environ.pop("FUNNEL_CACHE") if old is None else os.environ.__setitem__("FUNNEL_CACHE", old)
    return tmp, rows


def test_engines_publish_the_same_passages(long_build):
    tmp, rows = long_build
    assert_same_index(str(tmp / "ray"), str(tmp / "local"), vector_atol=1e-6)
    vdir = os.path.join(tmp / "local", read_current(str(tmp / "local")))
    m = json.load(open(os.path.join(vdir, "manifest.json")))
    assert m["dense"]["passages"]["window"] == 256 and m["dense"]["passages"]["n_docs"] == len(rows)
    assert {"passages/shard-0000.parquet", "passages/shard-0001.parquet"} <= set(m["files"])  # checksummed
    texts = {r["_id"]: r["text"] for r in rows}
    ids = [pq.read_table(os.path.join(vdir, "docs", f"shard-{s:04d}.parquet"), columns=["doc_id"])
           .column(0).to_pylist() for s in range(2)]
    n_passages = 0
    for s in range(2):
        p = read_passages(os.path.join(vdir, "passages", f"shard-{s:04d}.parquet"))
        assert len(p["local_id"]) == m["dense"]["counts"][s] == len(np.load(os.path.join(vdir, "dense",
                                                                                      f"ids-{s:04d}.npy")))
        for local in np.unique(p["local_id"]):
            sel = p["local_id"] == local
            text = texts[ids[s][local]]
            st, en = p["char_start"][sel], p["char_end"][sel]
            assert st[0] == 0 and en[-1] == len(text) and (st[1:] <= en[:-1]).all()  # the text, covered
            assert sel.sum() > 5 if ids[s][local].startswith("long") else sel.sum() == 1
        n_passages += len(p["local_id"])
    assert m["dense"]["ntotal"] == n_passages


def test_dense_search_is_maxp_over_the_stored_passages(long_build):
    tmp, rows = long_build
    ix = open_index(str(tmp / "local"))
    d = ix.dense_mode.dense()
    vdir = ix.index.dir
    vecs = np.vstack([np.load(os.path.join(vdir, "dense", f"emb-{s:04d}.npy")) for s in range(2)])
    docnos = np.concatenate([np.load(os.path.join(vdir, "dense", f"ids-{s:04d}.npy")) for s in range(2)])
    deep = rows[1]["text"].split("\n\n")[20].split("\n")[0]  # a docstring's title, deep in long1
    for q in (deep, "parse command line arguments", "compress data with zlib"):
        want = _maxp_oracle(d.embed_query(q), vecs, docnos, 5)
        got = ix.search(q, mode="dense", k=5).hits
        assert [h.docno for h in got] == [n for n, _ in want]
        np.testing.assert_allclose([h.score for h in got], [s for _, s in want], atol=1e-5)
    top = ix.search(deep, mode="dense", k=1).hits[0]
    # passages ranked by both signals: the dense one and the query terms over each passage's text
    assert top.doc_id == "long1" and top.passage.via == "dense+terms" and top.passage.ordinal > 0
    assert deep in top.passage.text


def test_every_hit_cites_its_best_passage_with_lines(long_build):
    tmp, rows = long_build
    ix = open_index(str(tmp / "local"))
    texts = {r["_id"]: r["text"] for r in rows}
    part = rows[2]["text"].split("\n\n")[25]
    q = part.split("\n")[0]
    for mode in ("bm25", "dense", "hybrid", "sira"):
        res = ix.search(q, mode=mode, k=3)
        for h in res.hits:
            c = h.passage
            text = texts[h.doc_id]
            assert c.text == text[c.start:c.end] and c.text
            assert c.line_start == text.count("\n", 0, c.start) + 1 and c.line_end >= c.line_start
            assert h.to_dict()["passage"]["start"] == c.start  # in the JSON every front end returns
        top = res.hits[0]
        assert top.doc_id == "long2" and q in top.passage.text, mode
        # bm25 does not embed the query; the others (sira: its dense proposer) did, so both signals rank
        assert top.passage.via == ("terms" if mode == "bm25" else "dense+terms"), mode
    ctx = ix.search(q, mode="hybrid", k=3, context_tokens=400).trace["context"]
    assert any(q in c["text"] for c in ctx)  # the packer reads the cited passage, not the opening


def test_sira_feeds_back_the_best_passage_and_batches_agree(long_build):
    """The dense proposer reads a long document's best passage, not all its vocabulary; a
    batch (compiled path, queries with such feedback expanded one by one) equals single
    searches."""
    from funnel.serving.sira.proposers import passage_rows
    tmp, rows = long_build
    ix = open_index(str(tmp / "local"))
    q = rows[0]["text"].split("\n\n")[12].split("\n")[0]
    docnos = [h.docno for h in ix.search(q, mode="dense", k=4).hits]
    g, tf, owner, dl = passage_rows(ix, q, docnos)
    for i, n in enumerate(docnos):
        doc = ix.index.docs.get(n)
        best = ix.dense_mode.dense().best_passage(q, n)
        text = doc["text"][best["start"]:best["end"]]
        terms = ix.index.analyzer.analyze(f"{doc['title']}\n{text}" if doc["title"] else text)
        ids = [x for t in terms if (x := ix.index.vocab.get(t)) is not None]
        assert sorted(g[owner == i].tolist()) == sorted(set(ids)) and dl[i] == len(ids)
        if ix.dense_mode.passages().count(n) > 1:
            assert len(set(ids)) < len(ix.forward.row(n)[0])  # a passage, not the whole document
    qs = {f"q{i}": r["text"].split("\n\n")[3 + i].split("\n")[0] for i, r in enumerate(rows[:3])}
    qs["short"] = rows[4]["title"]
    batch = ix.search_batch(qs, mode="sira", k=5)
    for qid, text in qs.items():
        single = ix.search(text, mode="sira", k=5).hits
        assert [d for d, _ in batch[qid]] == [h.doc_id for h in single], qid
        np.testing.assert_allclose([s for _, s in batch[qid]], [h.score for h in single], atol=1e-5)


def test_get_document_fetches_a_bounded_range(long_build):
    tmp, rows = long_build
    ix = open_index(str(tmp / "local"))
    text = rows[0]["text"]
    d = ix.get_document("long0", 100, 250)
    assert d["text"] == text[100:250] and (d["start"], d["end"], d["length"]) == (100, 250, len(text))
    assert d["line_start"] == text.count("\n", 0, 100) + 1 and d["next_start"] == 250 and not d["truncated"]
    whole = ix.get_document("long0")
    assert whole["text"] == text and whole["next_start"] is None
    cut = ix.get_document("long0", 10, None, max_chars=50)  # the title counts toward the 50
    n = 50 - len(rows[0]["title"])
    assert cut["text"] == text[10:10 + n] and cut["truncated"] and cut["next_start"] == 10 + n
    assert ix.get_document("long0", 0, 10 ** 9)["end"] == len(text)  # an end past the text: to its end
    assert ix.get_document("no-such-doc") is None
    with pytest.raises(SearchError, match=f"past the end of document 'long0', which has {len(text)} characters"):
        ix.get_document("long0", len(text) + 1)
    with pytest.raises(SearchError, match="end 5 is before start 10"):
        ix.get_document("long0", 10, 5)
    with pytest.raises(SearchError, match="count characters from 0"):
        ix.get_document("long0", -3)
    with pytest.raises(SearchError, match="whole number"):
        ix.get_document("long0", "7")


def test_passages_off_embeds_each_document_whole(ray_session, demo_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("FUNNEL_CACHE", str(tmp_path / "cache"))
    corpus, rows = _long_corpus(demo_corpus, tmp_path / "c.jsonl")
    rep = build(corpus, str(tmp_path / "off"), shards=2, engine="local", dense=True,
                passages=PassageSettings(enabled=False))
    assert rep.dense["ntotal"] == len(rows) and "passages" not in rep.dense
    ix = open_index(str(tmp_path / "off"))
    assert ix.dense_mode.passages() is None and ix.dense_mode.dense().depth_factor == 1
    h = ix.search("zlib compression", mode="hybrid", k=2).hits[0]
    assert h.passage.via == "terms" and h.passage.text  # cited from the query-time split


# -- reindex: only changed passages are embedded ------------------------------------------


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_reindex_embeds_only_the_passages_whose_text_changed(ray_session, demo_corpus, tmp_path, monkeypatch,
                                                            executor):
    monkeypatch.setenv("FUNNEL_CACHE", str(tmp_path / "cache"))
    corpus, rows = _long_corpus(demo_corpus, tmp_path / "c.jsonl")
    root = str(tmp_path / "ix")
    build(corpus, root, shards=2, engine=executor, dense=True)
    before = open_index(root).dense_mode.passages()
    n_long1 = len(before.spans_of(open_index(root).index.docs.docno_of("long1")))
    # Add one word to the last paragraph of long1: its last passages change, nothing else. The
    # word is new to every cache (Ray's workers may read the machine's default one).
    paras = rows[1]["text"].split("\n\n")
    paras[-1] = paras[-1].replace(" ", f" edit{uuid.uuid4().hex[:8]} ", 1)
    rows[1]["text"] = "\n\n".join(paras)
    write_jsonl(tmp_path / "c2.jsonl", rows)
    rep = reindex(root, str(tmp_path / "c2.jsonl"), executor=executor)
    assert rep.changed == 1
    assert 1 <= rep.dense["embedded"] <= 2  # the passage(s) holding the edit
    assert rep.dense["embedded"] + rep.dense["from_cache"] == n_long1
    assert rep.dense["reused"] == open_index(root).index.manifest["dense"]["ntotal"] - n_long1
    again = reindex(root, str(tmp_path / "c2.jsonl"), executor=executor, force=True)
    assert again.dense == {"reused": open_index(root).index.manifest["dense"]["ntotal"], "from_cache": 0,
                           "embedded": 0}  # an unchanged document embeds nothing
    # The result equals a full build of the new corpus.
    build(str(tmp_path / "c2.jsonl"), str(tmp_path / "full"), shards=2, engine=executor, dense=True)
    a, b = open_index(root), open_index(str(tmp_path / "full"))
    q = paras[-1].split("\n")[0]
    assert [(h.doc_id, h.passage.start) for h in a.search(q, mode="dense", k=3).hits] == \
        [(h.doc_id, h.passage.start) for h in b.search(q, mode="dense", k=3).hits]


def test_split_batch_keeps_a_long_document_in_windows():
    """A 25,000-word document becomes ~150 passages, each within the window (the embedder
    then sees them ``batch_size`` at a time: ``embed_passages``)."""
    from funnel.pipelines.dense.embed import SentenceTransformerProvider
    from funnel.pipelines.dense.passages import split_batch, splitter_spec
    provider = SentenceTransformerProvider(device="cpu")
    spec = splitter_spec(provider, PassageSettings())
    words = [f"w{i % 997}" for i in range(25_000)]
    text = "\n\n".join(" ".join(words[i:i + 120]) + "." for i in range(0, len(words), 120))
    out = split_batch({"title": np.array(["Big"], dtype=object), "text": np.array([text], dtype=object),
                       "content_hash": np.array(["h" * 32], dtype=object), "local_id": np.array([0])}, spec)
    n = len(out["text"])
    assert 100 < n < 400 and out["ordinal"].tolist() == list(range(n))
    tok = provider.model.tokenizer
    assert max(len(tok(passage_input("Big", t))["input_ids"]) for t in out["text"]) <= 256
    # A key per distinct passage text (repeated text shares its vector)
    assert len(set(out["content_hash"])) == len(set(out["text"].tolist())) > 100
