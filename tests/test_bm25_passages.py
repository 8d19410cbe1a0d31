"""Passage BM25 (``funnel build --dense --bm25-passages``): a document scored by its best passage.

Tier 2: every BM25 answer equals exhaustive MaxP computed here in plain Python (the same
analyzer; N, df and avgdl over the passages, as the index keeps them; Lucene's one-byte
lengths), also where the passage search has to go deeper; under an ACL or a filter it equals
MaxP over the allowed documents. Default builds are unchanged; a reindex rebuilds the passage
index; bad option combinations are refused with the fix. Real components: MiniLM for the
passages' split (through the embedding cache), Parquet, DuckDB, local Ray for one engine.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest

from funnel.jobs.build_index import BuildError, build
from funnel.jobs.build_index import main as build_main
from funnel.jobs.reindex import reindex
from funnel.pipelines.lexical.analysis import Analyzer
from funnel.pipelines.store.artifacts import IndexFormatError, read_current, verify_version
from funnel.pipelines.dense.passages import PassageSettings, read_passages
from funnel.serving.lexical.bm25 import byte4_to_int, int_to_byte4
from funnel.serving.lexical.retriever import BM25Retriever
from funnel.serving.lexical.passage_bm25 import PassageBM25
from funnel.serving.principals import principal
from funnel.serving.search import open_index

from conftest import write_jsonl

ALICE, BOB = principal("alice"), principal("bob")
K1, B = 0.9, 0.4


def _corpus(demo_corpus: str, path) -> list[dict]:
    """Three long documents (30 demo docstrings each, in paragraphs) and 30 short ones; long1
    and one short document readable by alice only; a ``kind`` field to filter on."""
    docs = [json.loads(line) for line in open(demo_corpus)]
    rows = [{"_id": f"long{i}", "title": f"Notes {i}", "kind": "long",
             "text": "\n\n".join(f"{d['title']}\n{d['text']}" for d in docs[30 * i:30 * (i + 1)])}
            for i in range(3)]
    rows += [{"_id": d["_id"], "title": d["title"], "text": d["text"], "kind": "short"} for d in docs[200:230]]
    rows[1]["acl"] = ["alice"]
    rows[5]["acl"] = ["alice"]
    write_jsonl(path, rows)
    return rows


def _deep(rows: list[dict], doc: int, para: int) -> str:
    """The first line (a docstring's title) of paragraph ``para`` of a long document."""
    return rows[doc]["text"].split("\n\n")[para].split("\n")[0]


def _queries(rows: list[dict]) -> list[str]:
    return [_deep(rows, 1, 20), _deep(rows, 0, 25), "compress data with zlib", "parse command line arguments",
            "socket connection timeout error", "file file path", "return the value", rows[10]["title"]]


# -- the reference: exhaustive MaxP in plain Python ----------------------------------------


class Reference:
    """Every passage of a version (its ``docs/`` and ``passages/``), analyzed and scored here."""

    def __init__(self, vdir: str, length_norm: str = "lucene-byte4"):
        an = Analyzer()
        self.passages = []  # (doc_id, ordinal, Counter of terms, length)
        m = json.load(open(os.path.join(vdir, "manifest.json")))
        for s in range(len(m["shards"])):
            docs = pq.read_table(os.path.join(vdir, "docs", f"shard-{s:04d}.parquet")).to_pydict()
            spans = read_passages(os.path.join(vdir, "passages", f"shard-{s:04d}.parquet"))
            for local, o, a, b in zip(*(spans[c].tolist() for c in ("local_id", "ordinal", "char_start",
                                                                      "char_end"))):
                title, text = docs["title"][local], docs["text"][local]
                body = text[a:b]
                terms = an.analyze(f"{title}\n{body}" if title else body)
                self.passages.append((docs["doc_id"][local], o, Counter(terms), len(terms)))
        nonempty = [p for p in self.passages if p[3] > 0]
        self.n = len(nonempty)
        self.avgdl = sum(p[3] for p in nonempty) / self.n
        self.df = Counter(t for p in self.passages for t in p[2])
        self.length_norm = length_norm
        self.analyze = an.analyze

    def passage_score(self, q: Counter, tf: Counter, dl: int) -> float:
        if self.length_norm == "lucene-byte4":
            dl = byte4_to_int(int_to_byte4(dl))
        s = 0.0
        for t, w in q.items():
            if tf.get(t):
                idf = math.log(1 + (self.n - self.df[t] + 0.5) / (self.df[t] + 0.5))
                s += w * idf * tf[t] / (tf[t] + K1 * (1 - B + B * dl / self.avgdl))
        return s

    def maxp(self, query: str, k: int, allowed=None) -> list[tuple[str, float, int]]:
        """[(doc_id, best passage score, its ordinal)] of the top k, ties by doc_id."""
        q = Counter(self.analyze(query))
        best: dict[str, tuple[float, int]] = {}
        for doc, o, tf, dl in self.passages:
            if allowed is not None and doc not in allowed:
                continue
            s = self.passage_score(q, tf, dl)
            if s > 0 and (doc not in best or s > best[doc][0]):
                best[doc] = (s, o)
        ranked = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))[:k]
        return [(d, s, o) for d, (s, o) in ranked]

    def df_among(self, term: str, allowed: set[str]) -> int:
        return sum(1 for doc, _, tf, _ in self.passages if doc in allowed and tf.get(term))


def assert_same_ranking(got: list[tuple[str, float]], want: list[tuple[str, float, int]], atol: float) -> None:
    """Same documents in the same order and the same scores (within ``atol``); documents
    whose scores tie within ``atol`` may come in either order."""
    assert len(got) == len(want), (got, want)
    np.testing.assert_allclose([s for _, s in got], [s for _, s, _ in want], rtol=0, atol=atol)
    for i, ((d, s), (w, ws, _)) in enumerate(zip(got, want)):
        if d != w:
            tied = {x for x, y, _ in want if abs(y - ws) <= atol}
            assert d in tied and w in {x for x, y in got if abs(y - s) <= atol}, (i, got, want)


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One embedding cache for the module: each passage is embedded once."""
    old = os.environ.get("FUNNEL_CACHE")
    os.environ["FUNNEL_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    os.environ.pop("FUNNEL_CACHE") if old is None else os.environ.__setitem__("FUNNEL_CACHE", old)


@pytest.fixture(scope="module")
def built(cache, demo_corpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bm25p")
    rows = _corpus(demo_corpus, tmp / "c.jsonl")
    rep = build(str(tmp / "c.jsonl"), str(tmp / "ix"), shards=2, engine="local", dense=True, bm25_passages=True)
    vdir = os.path.join(tmp / "ix", rep.version)
    return tmp, rows, rep, vdir, Reference(vdir)


# -- tier 2: exactly MaxP ------------------------------------------------------------------


@pytest.mark.parametrize("shallow", [False, True], ids=["default-depth", "one-k-deep-then-deeper"])
def test_bm25_is_exact_maxp_over_the_passages(built, monkeypatch, shallow):
    tmp, rows, rep, vdir, ref = built
    ix = open_index(str(tmp / "ix"))
    assert isinstance(ix.bm25, PassageBM25)
    if shallow:  # the first passage search only k deep: most answers need the deeper searches
        monkeypatch.setattr(PassageBM25, "_first_depth", lambda self, k: k)
    coll = rep.bm25_passages["collection"]
    assert (coll["n_docs_nonempty"], coll["avgdl"]) == (ref.n, pytest.approx(ref.avgdl, rel=1e-12))
    assert rep.bm25_passages["n_passages"] == len(ref.passages) > len(rows) + 40  # long documents split
    for q in _queries(rows):
        for k in (1, 3, 5, 8, 50):
            want = ref.maxp(q, k)
            dn, sc = ix.bm25.search_arrays(dict(ix.bm25.query_terms(q)), k)
            assert_same_ranking(list(zip(ix.index.docs.doc_ids_of(dn), sc.tolist())), want, 1e-9)
            hits = ix.search(q, mode="bm25", k=k).hits
            assert_same_ranking([(h.doc_id, h.score) for h in hits], want, 2e-6)
        batch = ix.search_batch({"q": q, "again": q}, mode="bm25", k=8)
        assert_same_ranking(batch["q"], ref.maxp(q, 8), 1e-9)
        assert batch["again"] == batch["q"]
    exact = Reference(vdir, "exact")
    q = _queries(rows)[0]
    assert_same_ranking([(h.doc_id, h.score) for h in ix.search(q, mode="bm25", k=5, length_norm="exact").hits],
                        exact.maxp(q, 5), 2e-6)
    assert ix.search("the of and", mode="bm25", k=5).hits == ()  # stopwords only: nothing, as before


def test_a_hit_cites_the_passage_its_score_came_from(built):
    tmp, rows, rep, vdir, ref = built
    ix = open_index(str(tmp / "ix"))
    q = _deep(rows, 0, 25)
    res = ix.search(q, mode="bm25", k=5)
    assert res.trace["bm25"]["scoring"] == "best passage (MaxP)"
    want = {d: o for d, _, o in ref.maxp(q, 5)}
    top = res.hits[0]
    assert top.doc_id == "long0" and want["long0"] > 0 and q in top.passage.text
    for h in res.hits:
        c = h.passage
        text = ix.get_document(h.doc_id)["text"]
        assert c.via == "bm25" and c.ordinal == want[h.doc_id] and c.text == text[c.start:c.end]
        assert c.score == pytest.approx(h.score, abs=2e-6)
        assert c.line_start == text.count("\n", 0, c.start) + 1
    for mode in ("hybrid", "sira"):  # the other modes read the passage BM25 list, and cite from it too
        top = ix.search(q, mode=mode, k=3).hits[0]
        assert top.doc_id == "long0" and top.passage.via == "dense+bm25" and q in top.passage.text, mode


def test_sira_and_hybrid_use_the_passage_list(built):
    tmp, rows, rep, vdir, ref = built
    ix = open_index(str(tmp / "ix"))
    qs = {f"q{i}": q for i, q in enumerate(_queries(rows)[:5])}
    batch = ix.search_batch(qs, mode="sira", k=5)
    for qid, q in qs.items():
        single = ix.search(q, mode="sira", k=5).hits
        assert [d for d, _ in batch[qid]] == [h.doc_id for h in single], qid
        # hybrid fuses the passage list: each hit's bm25 rank is its rank by best passage
        ranks = {h.doc_id: r for r, h in enumerate(
            ix.search(q, mode="bm25", k=ix.hybrid_config.candidates).hits, start=1)}
        hy = ix.search(q, mode="hybrid", k=10).hits
        lexical = [h for h in hy if "bm25" in h.explain["fusion"]["ranks"]]
        assert lexical and all(h.explain["fusion"]["ranks"]["bm25"] == ranks[h.doc_id] for h in lexical), qid


def test_sira_judges_and_feeds_back_in_passages(built):
    """Where BM25 scores passages, SIRA's DF filter counts passages (N and df over the passage
    index) and its feedback reads each feedback document's best passage, not all of it."""
    tmp, rows, rep, vdir, ref = built
    ix = open_index(str(tmp / "ix"))
    pix = ix.bm25.passages
    for q in _queries(rows)[:3]:
        tr = ix.search(q, mode="sira", k=5, proposer="prf").trace["sira"]
        assert tr["df_over"] == "passages" and tr["tau_n"] == pytest.approx(tr["tau"] * pix.n_docs)
        kept = [p for p in tr["proposals"] if p["kept"]]
        for p in tr["proposals"]:  # every verdict's df is a passage df
            for key, df in p["df"].items():
                g = pix.vocab.get(key)
                assert df == (0 if g is None else int(pix.df[g])), (p, key)
        # the feedback units are the best passages of the top documents: every kept term occurs
        # in one of those passages
        from funnel.serving.sira.space import best_passages
        docnos, _ = ix.bm25.search_arrays(dict(ix.bm25.query_terms(q)), ix.sira_config.fb_docs)
        units = best_passages(ix, docnos, dict(ix.bm25.query_terms(q)), ix._bm25_params({}))
        words = set()
        for u in units[units >= 0].tolist():
            words |= set(pix.analyzer.analyze(pix.docs.get(u)["text"] or ""))
        assert all(p["phrase"] in words for p in kept), q


# -- filters and ACLs ------------------------------------------------------------------------


def test_a_forbidden_document_never_shows_through_a_passage(built):
    tmp, rows, rep, vdir, ref = built
    ix = open_index(str(tmp / "ix"))
    hidden = {r["_id"] for r in rows if r.get("acl")}
    public = {r["_id"] for r in rows} - hidden
    q = _deep(rows, 1, 20)  # a passage deep in long1, which bob may not read
    assert ix.search(q, mode="bm25", k=1, principal=ALICE).hits[0].doc_id == "long1"
    for query in _queries(rows):
        for k in (1, 5, 50):
            got = ix.search(query, mode="bm25", k=k, principal=BOB).hits
            assert not hidden & {h.doc_id for h in got}
            assert_same_ranking([(h.doc_id, h.score) for h in got], ref.maxp(query, k, public), 2e-6)
            for h in got:  # dfs shown to bob count the passages he may read
                for t, v in h.explain["terms"].items():
                    assert v["df"] == ref.df_among(t, public), (t, h.doc_id)
        for mode in ("hybrid", "sira", "dense"):
            assert not hidden & {h.doc_id for h in ix.search(query, mode=mode, k=20, principal=BOB).hits}, mode
        assert not hidden & {d for d, _ in ix.search_batch({"q": query}, mode="bm25", k=20, principal=BOB)["q"]}
    short = {r["_id"] for r in rows if r["kind"] == "short"}
    got = ix.search("data", mode="bm25", k=50, filter={"kind": "short"}).hits
    assert {h.doc_id for h in got} <= short
    assert_same_ranking([(h.doc_id, h.score) for h in got], ref.maxp("data", 50, short), 2e-6)


# -- defaults unchanged, options checked -----------------------------------------------------


def test_default_build_is_unchanged(built):
    tmp, rows, rep, vdir, ref = built
    plain = build(str(tmp / "c.jsonl"), str(tmp / "plain"), shards=2, engine="local", dense=False)
    pdir = os.path.join(tmp / "plain", plain.version)
    m = json.load(open(os.path.join(pdir, "manifest.json")))
    assert "bm25_passages" not in m and plain.bm25_passages is None
    assert not os.path.exists(os.path.join(pdir, "bm25-passages"))
    assert not any(f.startswith("bm25-passages/") for f in m["files"])
    with_opt = json.load(open(os.path.join(vdir, "manifest.json")))
    for rel, meta in m["files"].items():  # the whole-document index is the same, file for file
        if rel.startswith(("lexical/", "docs/")):
            assert with_opt["files"][rel]["sha256"] == meta["sha256"], rel
    a, b = open_index(str(tmp / "plain")), open_index(str(tmp / "ix"))
    assert type(a.bm25) is BM25Retriever
    whole = BM25Retriever(b.index)
    for q in _queries(rows):
        x, y = a.bm25.search(q, 10), whole.search(q, 10)
        assert [(s.docno, s.score) for s in x] == [(s.docno, s.score) for s in y]
    assert "scoring" not in a.search(rows[0]["title"], mode="bm25").trace["bm25"]
    assert a.search(_deep(rows, 0, 25), mode="bm25", k=1).hits[0].passage.via == "terms"


def test_passage_index_is_checksummed_with_its_version(built):
    tmp, rows, rep, vdir, ref = built
    m = json.load(open(os.path.join(vdir, "manifest.json")))
    assert "bm25-passages/manifest.json" in m["files"] and "bm25-passages/lexical/shard-0000/tfs.npy" in m["files"]
    verify_version(vdir, "full")


def test_bad_option_combinations_are_refused(tmp_path, demo_corpus, capsys):
    with pytest.raises(ValueError, match="add --dense"):
        build(demo_corpus, str(tmp_path / "a"), dense=False, bm25_passages=True)
    with pytest.raises(ValueError, match="drop --passages off"):
        build(demo_corpus, str(tmp_path / "b"), dense=True, bm25_passages=True, passages=PassageSettings(enabled=False))
    from funnel.pipelines.enrich import EnrichSettings
    with pytest.raises(ValueError, match="does not take --enrich"):
        build(demo_corpus, str(tmp_path / "d"), dense=True, bm25_passages=True,
              enrich=EnrichSettings(base_url="http://127.0.0.1:9/v1", model="m"))
    assert build_main(["--corpus", demo_corpus, "--out", str(tmp_path / "c"), "--bm25-passages"]) == 2
    assert "--bm25-passages indexes the passages the dense stage splits: add --dense" in capsys.readouterr().err
    assert not any(os.path.exists(tmp_path / x) for x in "abcd")  # refused before any work


def test_ray_engine_builds_the_same_passage_index(built, ray_session):
    tmp, rows, rep, vdir, ref = built
    build(str(tmp / "c.jsonl"), str(tmp / "ray"), shards=2, engine="ray", dense=True, bm25_passages=True)
    a, b = open_index(str(tmp / "ray")), open_index(str(tmp / "ix"))
    assert a.index.manifest["bm25_passages"]["collection"] == b.index.manifest["bm25_passages"]["collection"]
    for q in _queries(rows):
        x, y = a.search(q, mode="bm25", k=10).hits, b.search(q, mode="bm25", k=10).hits
        assert [(h.doc_id, h.score, h.passage.start) for h in x] == [(h.doc_id, h.score, h.passage.start) for h in y]


# -- reindex ---------------------------------------------------------------------------------


def test_reindex_updates_the_passages_of_an_edited_document(built, tmp_path):
    tmp, rows, rep, vdir, ref = built
    root = str(tmp_path / "ix")
    build(str(tmp / "c.jsonl"), root, shards=2, engine="local", dense=True, bm25_passages=True)
    word = f"zq{uuid.uuid4().hex[:10]}"
    edited = [dict(r) for r in rows]
    paras = edited[2]["text"].split("\n\n")
    paras[-1] = paras[-1].replace(" ", f" {word} ", 1)  # long2's last passage changes
    edited[2]["text"] = "\n\n".join(paras)
    write_jsonl(tmp_path / "c2.jsonl", edited)
    assert open_index(root).search(word, mode="bm25").hits == ()
    out = reindex(root, str(tmp_path / "c2.jsonl"), executor="local")
    assert out.changed == 1 and "bm25_passages" in out.stage_seconds
    ix = open_index(root)
    [hit] = ix.search(word, mode="bm25", k=5).hits
    assert hit.doc_id == "long2" and word in hit.passage.text and hit.passage.via == "bm25"
    new = Reference(ix.index.dir)
    assert ix.index.manifest["bm25_passages"]["n_passages"] == len(new.passages)
    full = build(str(tmp_path / "c2.jsonl"), str(tmp_path / "full"), shards=2, engine="local", dense=True,
                 bm25_passages=True)
    assert ix.index.manifest["bm25_passages"]["collection"] == full.bm25_passages["collection"]
    f = open_index(str(tmp_path / "full"))
    for q in _queries(edited) + [word]:
        x, y = ix.search(q, mode="bm25", k=10).hits, f.search(q, mode="bm25", k=10).hits
        assert [(h.doc_id, h.score) for h in x] == [(h.doc_id, h.score) for h in y], q
        assert_same_ranking([(h.doc_id, h.score) for h in x], new.maxp(q, 10), 2e-6)
    # an ACL change alone: the passage index is the live one's, copied, and still masks
    acl = [dict(r) for r in edited]
    acl[2]["acl"] = ["alice"]
    write_jsonl(tmp_path / "c3.jsonl", acl)
    out = reindex(root, str(tmp_path / "c3.jsonl"), executor="local")
    assert out.fields_changed == 1 and "bm25_passages" not in out.stage_seconds
    ix = open_index(root)
    verify_version(ix.index.dir, "full")
    assert ix.search(word, mode="bm25", principal=BOB).hits == ()
    assert ix.search(word, mode="bm25", principal=ALICE).hits[0].doc_id == "long2"
    with pytest.raises(BuildError, match="--bm25-passages"):
        reindex(root, str(tmp_path / "c2.jsonl"), executor="local", dense=False)
    assert read_current(root) == ix.version


def test_a_damaged_passage_index_is_refused(built, tmp_path):
    import shutil
    tmp, rows, rep, vdir, ref = built
    root = tmp_path / "copy"
    shutil.copytree(tmp / "ix", root)
    target = os.path.join(root, rep.version, "bm25-passages", "lexical", "shard-0000", "tfs.npy")
    with open(target, "r+b") as fh:  # a term frequency's last byte: the file still loads
        fh.seek(-1, os.SEEK_END)
        b0 = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([b0[0] ^ 0x01]))
    with pytest.raises(IndexFormatError):
        open_index(str(root), verify="full")
