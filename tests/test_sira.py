"""SIRA's query side (mode="sira"): the formula on a real built index, the DF filter's
reasons, option validation, and running with no chat model configured.

The index is tests/data/tiny-beir (40 medical abstracts) built by the real Ray job. Scores
are checked against two separate BM25 calls and against the BM25 formula written out over
the analyzed documents.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter

import numpy as np
import pytest

from funnel.serving.lexical.bm25 import BM25Params
from funnel.serving.search import ModeUnavailable, SearchError, open_index
from funnel.serving.sira import (SiraConfig, df_filter, expansion_terms, ngram_key, rm3_weights, select_terms,
                                 sub_ngrams, weighted_query)
from funnel.serving.sira.proposers import Proposal

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "tiny-beir")
Q_FRACTURE = "Vitamin D deficiency increases the risk of bone fractures."


# -- pure parts: the DF filter, RM3, the weighted query -------------------------------------

DF = {"vitamin": 9, "d": 9, "bone": 3, "fractur": 5, "osteoporosi": 2, "calcium": 30, "xyzzi": 0,
      "bone densiti": 2}


def df_of(key):
    return DF.get(key, 0)


def test_sub_ngrams_are_every_window_shortest_first():
    assert sub_ngrams(["a", "b", "c"], 1) == [("a",), ("b",), ("c",)]
    assert sub_ngrams(["a", "b", "c"], 2) == [("a",), ("b",), ("c",), ("a", "b"), ("b", "c")]
    assert ngram_key(("bone", "densiti")) == "bone densiti"


def test_df_filter_keeps_and_rejects_with_reasons():
    q = {"vitamin", "d", "fractur"}
    n, tau = 100, 0.1   # ceiling tau*N = 10
    keep = df_filter(["osteoporosi"], q, df_of, n, tau, 1)
    assert keep.kept and keep.reason == "kept: df 2 <= tau*N = 10" and keep.terms == ("osteoporosi",)
    assert df_filter([], q, df_of, n, tau, 1).reason.startswith("no searchable words")
    assert df_filter(["vitamin", "d"], q, df_of, n, tau, 1).reason.startswith("adds nothing")
    absent = df_filter(["xyzzi"], q, df_of, n, tau, 1)
    assert not absent.kept and absent.reason == "not in the index (df 0)" and absent.df == {"xyzzi": 0}
    common = df_filter(["calcium"], q, df_of, n, tau, 1)
    assert not common.kept and common.reason == "too common: df 30 > tau*N = 10"
    # A query word cannot carry a phrase: "vitamin xyzzy" has only the unknown new word.
    assert df_filter(["vitamin", "xyzzi"], q, df_of, n, tau, 1).reason == "not in the index (df 0)"
    # One rare window is enough, and a kept phrase brings every known new token, common ones too.
    mixed = df_filter(["calcium", "osteoporosi", "xyzzi"], q, df_of, n, tau, 1)
    assert mixed.kept and mixed.terms == ("calcium", "osteoporosi")
    assert mixed.df == {"calcium": 30, "osteoporosi": 2, "xyzzi": 0}
    # The boundary: df == tau*N is kept, df == tau*N + 1 is not.
    assert df_filter(["calcium"], q, df_of, 300, 0.1, 1).kept
    assert not df_filter(["calcium"], q, df_of, 290, 0.1, 1).kept


def test_df_filter_ngrams_count_only_with_max_n_above_one():
    q = {"vitamin"}
    one = df_filter(["bone", "densiti"], q, df_of, 20, 0.1, 1)   # ceiling 2: bone (3) too common
    assert not one.kept and one.reason == "too common: df 3 > tau*N = 2"
    two = df_filter(["bone", "densiti"], q, df_of, 20, 0.1, 2)   # the atomic bigram has df 2
    assert two.kept and two.terms == ("bone", "bone densiti") and two.df["bone densiti"] == 2


def test_rm3_weights_formula():
    g = [np.array([1, 2, 5]), np.array([2, 3])]
    tf = [np.array([2.0, 1.0, 1.0]), np.array([3.0, 1.0])]
    uniq, w, ndocs = rm3_weights(g, tf, np.array([2.0, 1.0]))
    assert uniq.tolist() == [1, 2, 3, 5] and ndocs.tolist() == [1, 2, 1, 1]
    # Σ_d w_d · tf/|d|: |d1| = 4, |d2| = 4
    assert w == pytest.approx([2 * 2 / 4, 2 * 1 / 4 + 1 * 3 / 4, 1 * 1 / 4, 2 * 1 / 4])
    assert rm3_weights([], [], np.zeros(0))[0].size == 0


def test_select_terms_keeps_best_eligible_and_scales_to_one():
    uniq = np.array([10, 11, 12, 13])
    w = np.array([0.5, 2.0, 1.0, 1.0])
    pos, sc = select_terms(uniq, w, np.array([True, False, True, True]), 2)
    assert pos.tolist() == [2, 3] and sc.tolist() == [1.0, 1.0]       # tie: lower term id first
    pos, sc = select_terms(uniq, w, np.ones(4, bool), 3, idf=np.array([4.0, 1.0, 1.0, 1.0]))
    assert pos.tolist() == [0, 1, 2] and sc == pytest.approx([1.0, 1.0, 0.5])
    assert select_terms(uniq, w, np.zeros(4, bool), 3)[0].size == 0


def test_weighted_query_and_expansion_terms():
    assert weighted_query({"a": 2, "b": 1}, {"c": 1.0, "a": 0.5}, 0.3) == {"a": 2.15, "b": 1, "c": 0.3}
    props = [Proposal("x", "prf", 0.4), Proposal("y", "dense", 0.9), Proposal("z", "llm", 1.0)]
    verdicts = [df_filter(["t1", "t2"], set(), lambda _: 1, 10, 1.0, 1),
                df_filter(["t1"], set(), lambda _: 1, 10, 1.0, 1),
                df_filter(["t3"], set(), lambda _: 0, 10, 1.0, 1)]
    # Agreeing sources do not add up: the term keeps its largest weight and both sources.
    assert expansion_terms(props, verdicts) == {"t1": (0.9, ("prf", "dense")), "t2": (0.4, ("prf",))}


# -- on a built index ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_index(ray_session, tmp_path_factory):
    from funnel.jobs.build_index import build
    root = str(tmp_path_factory.mktemp("sira-ix"))
    build(FIXTURE, root, shards=2)
    return root


@pytest.fixture(scope="module")
def ix(tiny_index):
    return open_index(tiny_index)


def _full_scores(ix, terms, params):
    """{doc_id: score} of every matching document, from one plain BM25 call."""
    dn, sc = ix.bm25.search_arrays(terms, ix.index.n_docs, params)
    return dict(zip(ix.index.docs.doc_ids_of(dn), sc.tolist()))


def _formula_scores(ix, terms, k1, b):
    """BM25 written out over the analyzed corpus (exact lengths): Σ w·idf·tf/(tf + k1(1-b+b·dl/avgdl))."""
    docs = {}
    with open(os.path.join(FIXTURE, "corpus.jsonl")) as f:
        for line in f:
            o = json.loads(line)
            docs[o["_id"]] = Counter(ix.index.analyzer.analyze(o["title"] + "\n" + o["text"]))
    n = len(docs)
    avgdl = sum(sum(c.values()) for c in docs.values()) / n
    out = {}
    for d, c in docs.items():
        dl = sum(c.values())
        s = 0.0
        for t, w in terms.items():
            df = sum(1 for c2 in docs.values() if t in c2)
            if c[t]:
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                s += w * idf * c[t] / (c[t] + k1 * (1 - b + b * dl / avgdl))
        if s > 0:
            out[d] = s
    return out


@pytest.mark.parametrize("lam", [0.3, 1.0])
def test_one_weighted_call_equals_bm25_q_plus_lambda_bm25_e(ix, lam):
    res = ix.search(Q_FRACTURE, mode="sira", k=40, proposer="prf", fb_docs=3, fb_terms=8, tau=0.25,
                    length_norm="exact", **{"lambda": lam})
    tr = res.trace["sira"]
    q = tr["query_terms"]
    e = {t: v["weight"] for t, v in tr["expansion_terms"].items()}
    assert e and not set(e) & set(q) and tr["lambda"] == lam
    params = BM25Params(length_norm="exact")
    s_q, s_e = _full_scores(ix, q, params), _full_scores(ix, e, params)
    expected = {d: s_q.get(d, 0.0) + lam * s_e.get(d, 0.0) for d in set(s_q) | set(s_e)}
    got = {h.doc_id: h.score for h in res.hits}
    assert set(got) == set(expected)
    for d, s in got.items():
        assert s == pytest.approx(expected[d], abs=2e-6)          # hit scores are rounded to 1e-6
    formula = _formula_scores(ix, {**q, **{t: lam * w for t, w in e.items()}}, 0.9, 0.4)
    assert got == pytest.approx(formula, abs=2e-6)
    scores = [h.score for h in res.hits]
    assert scores == sorted(scores, reverse=True)


def test_lambda_zero_is_plain_bm25(ix):
    sira = ix.search(Q_FRACTURE, mode="sira", k=10, proposer="prf", **{"lambda": 0})
    bm25 = ix.search(Q_FRACTURE, mode="bm25", k=10)
    assert [(h.doc_id, h.score) for h in sira.hits] == [(h.doc_id, h.score) for h in bm25.hits]


def test_prf_proposals_are_rm3_terms_of_the_top_bm25_docs(ix):
    cfg = dict(fb_docs=2, fb_terms=100, tau=1.0)
    res = ix.search(Q_FRACTURE, mode="sira", k=5, proposer="prf", **cfg)
    params = BM25Params()
    terms = dict(ix.bm25.query_terms(Q_FRACTURE))
    dn, sc = ix.bm25.search_arrays(terms, 2, params)
    want = Counter()
    for n, s in zip(dn.tolist(), sc.tolist()):
        d = ix.index.docs.get(n)
        toks = Counter(ix.index.analyzer.analyze(d["title"] + "\n" + d["text"]))
        for t, tf in toks.items():
            if t not in terms and len(t) >= 2:
                want[t] += s * tf / sum(toks.values())
    top = max(want.values())
    got = {p["phrase"]: p["weight"] for p in res.trace["sira"]["proposals"]}
    assert got == pytest.approx({t: w / top for t, w in want.items()}, abs=1e-6)
    assert all(p["source"] == "prf" and p["kept"] for p in res.trace["sira"]["proposals"])


def test_trace_lists_every_proposal_and_hits_split_their_terms(ix):
    res = ix.search(Q_FRACTURE, mode="sira", k=5, proposer="prf", tau=0.1, fb_terms=10)
    tr = res.trace["sira"]
    assert tr["proposer"] == "prf" and tr["tau_n"] == pytest.approx(4.0)
    for p in tr["proposals"]:
        assert set(p) >= {"phrase", "source", "weight", "kept", "reason", "df", "terms", "evidence"}
        assert p["kept"] == p["reason"].startswith("kept")
        assert all(1 <= d <= 4 for d in p["df"].values())            # prf only proposes eligible terms
    assert {"propose", "filter", "bm25", "total"} <= set(res.trace["timings_ms"])
    seen_expansion = False
    for h in res.hits:
        ex = h.explain
        assert set(ex["query_terms"]) <= set(tr["query_terms"])
        assert set(ex["expansion_terms"]) <= set(tr["expansion_terms"])
        # The explanation is the score's own terms: contributions add up to the hit's score.
        assert sum(v["contribution"] for v in ex["terms"].values()) == pytest.approx(h.score, abs=1e-5)
        assert set(h.matched_terms) == set(ex["query_terms"]) | set(ex["expansion_terms"])
        if ex["expansion_terms"]:
            seen_expansion = True
            assert "expansion terms" in h.why and "prf" in h.why
            assert all(ex["terms"][t]["sources"] == ["prf"] for t in ex["expansion_terms"])
    assert seen_expansion


def test_options_are_validated_with_the_valid_choices(ix):
    def bad(match, **opts):
        with pytest.raises(SearchError, match=match):
            ix.search("vitamin d", mode="sira", **opts)

    bad("unknown option\\(s\\) alpha for mode 'sira'; valid: b, context_tokens, fb_docs, fb_terms, k1, lambda, "
        "length_norm, max_n, nprobe, proposer, tau", alpha=0.5)
    bad("unknown proposer 'magic'; choose one of auto, prf, dense, llm, union", proposer="magic")
    bad(r"lambda must be a number in \[0, 100\], got -1", **{"lambda": -1})
    bad(r"lambda must be a number in \[0, 100\], got True", **{"lambda": True})
    bad(r"tau must be a number in \(0, 1\], got 0", tau=0)
    bad(r"tau must be a number in \(0, 1\], got 1.5", tau=1.5)
    bad(r"max_n must be an integer in \[1, 3\], got 4", max_n=4)
    bad(r"fb_docs must be an integer in \[1, 100\], got 0", fb_docs=0)
    bad(r"fb_terms must be an integer in \[1, 100\], got 'many'", fb_terms="many")
    bad(r"fb_terms must be an integer in \[1, 100\], got 2.5", fb_terms=2.5)
    # A batch refuses a bad value before any query runs.
    with pytest.raises(SearchError, match="tau must be"):
        ix.search_batch({"1": "vitamin d"}, mode="sira", tau=2)
    ok = ix.search("vitamin d", mode="sira", fb_docs="3", max_n=2.0)     # numbers as text are fine
    assert ok.trace["sira"]["fb_docs"] == 3 and ok.trace["sira"]["max_n"] == 2


def test_works_with_no_chat_model_and_no_vectors(ix):
    assert ix.chat is None and not ix.dense_mode.available
    res = ix.search(Q_FRACTURE, mode="sira", k=5)
    tr = res.trace["sira"]
    offline = SiraConfig().offline_proposer
    assert tr["requested"] == "auto" and tr["proposer"] == ("prf" if offline == "dense" else offline)
    assert tr["sources"] == ["prf"]
    assert "no chat model configured" in tr["note"] and "No chat model configured" in res.summary
    assert res.hits and res.hits[0].doc_id in {"d01", "d02", "d36"}
    union = ix.search(Q_FRACTURE, mode="sira", k=5, proposer="union")
    assert union.trace["sira"]["sources"] == ["prf"]
    with pytest.raises(ModeUnavailable, match="needs a chat model"):
        ix.search(Q_FRACTURE, mode="sira", proposer="llm")
    with pytest.raises(ModeUnavailable, match="--dense"):
        ix.search(Q_FRACTURE, mode="sira", proposer="dense")
    with pytest.raises(ModeUnavailable, match="--dense"):
        ix.search_batch({"1": Q_FRACTURE}, mode="sira", proposer="dense")


def test_stopword_query_and_unknown_words_say_so(ix):
    res = ix.search("the of is", mode="sira")
    assert not res.hits and "no searchable words" in res.summary
    res = ix.search("zzqx wwpt", mode="sira")
    assert not res.hits and "None of the query's terms occur" in res.summary


def test_batch_equals_single_queries(ix):
    qs = {"1": Q_FRACTURE, "3": "Statins reduce cardiovascular events by lowering LDL cholesterol.",
          "14": "Sunlight is the main source of vitamin D."}
    batch = ix.search_batch(qs, mode="sira", k=5, proposer="prf", **{"lambda": 0.5})
    for qid, q in qs.items():
        single = ix.search(q, mode="sira", k=5, proposer="prf", **{"lambda": 0.5})
        assert [d for d, _ in batch[qid]] == [h.doc_id for h in single.hits]


def test_manifest_section_overrides_defaults():
    cfg = SiraConfig.from_manifest({"tau": 0.2, "lambdas": {"prf": 0.7}, "offline_proposer": "dense"})
    assert cfg.tau == 0.2 and cfg.lambda_for("prf") == 0.7 and cfg.lambda_for("dense") == SiraConfig().lambda_for("dense")
    assert SiraConfig.from_options(cfg, {"lambda": 0.1}).lambda_for("prf") == 0.1
    with pytest.raises(ValueError, match="unknown key\\(s\\) alpha"):
        SiraConfig.from_manifest({"alpha": 1})
    with pytest.raises(ValueError, match="offline_proposer 'llm'; choose one of prf, dense, union"):
        SiraConfig.from_manifest({"offline_proposer": "llm"})


# -- the dense proposer, on the same corpus built with vectors ---------------------------------

@pytest.fixture(scope="module")
def dense_ix(ray_session, tmp_path_factory):
    from funnel.jobs.build_index import build
    root = str(tmp_path_factory.mktemp("sira-dense-ix"))
    build(FIXTURE, root, shards=2, dense=True)
    return open_index(root)


def test_dense_proposals_are_idf_weighted_rm3_terms_of_the_dense_top_docs(dense_ix):
    ix = dense_ix
    q = "Running works as well as pills for low mood."
    res = ix.search(q, mode="sira", k=5, proposer="dense", fb_docs=3, fb_terms=100, tau=1.0)
    tr = res.trace["sira"]
    assert tr["proposer"] == "dense" and tr["sources"] == ["dense"] and "dense" in res.trace["timings_ms"]
    terms = dict(ix.bm25.query_terms(q))
    want = Counter()
    for h in ix.dense_mode.search(q, 3):
        d = ix.index.docs.get(h.docno)
        toks = Counter(ix.index.analyzer.analyze(d["title"] + "\n" + d["text"]))
        for t, tf in toks.items():
            if t not in terms and len(t) >= 2:
                want[t] += max(h.score, 0.0) * tf / sum(toks.values()) * ix.index.idf[ix.index.vocab[t]]
    top = max(want.values())
    got = {p["phrase"]: p["weight"] for p in tr["proposals"]}
    assert got == pytest.approx({t: w / top for t, w in want.items()}, abs=1e-6)
    # The paraphrase shares no content word with d11 ("aerobic exercise ... depression"); the
    # dense neighbours' vocabulary brings it in.
    assert "d11" in [h.doc_id for h in res.hits]
    assert "d11" not in [h.doc_id for h in ix.search(q, mode="bm25", k=5).hits]


def test_with_vectors_auto_is_the_offline_proposer_and_union_adds_dense(dense_ix):
    tr = dense_ix.search(Q_FRACTURE, mode="sira", k=5).trace["sira"]
    assert tr["proposer"] == SiraConfig().offline_proposer and tr["lambda"] == SiraConfig().lambda_for(tr["proposer"])
    union = dense_ix.search(Q_FRACTURE, mode="sira", k=5, proposer="union").trace["sira"]
    assert union["sources"] == ["prf", "dense"] and {p["source"] for p in union["proposals"]} == {"prf", "dense"}
    both = [t for t, v in union["expansion_terms"].items() if len(v["sources"]) == 2]
    for t in both:   # a term both sources propose keeps the larger weight, not the sum
        ws = [p["weight"] for p in union["proposals"] if p["phrase"] == t]
        assert union["expansion_terms"][t]["weight"] == max(ws)


def test_dense_batch_equals_single_queries(dense_ix):
    qs = {"5": "Running works as well as pills for low mood.", "7": "Intestinal flora from heavy donors makes lean animals fat."}
    batch = dense_ix.search_batch(qs, mode="sira", k=5, proposer="dense")
    for qid, q in qs.items():
        assert [d for d, _ in batch[qid]] == [h.doc_id for h in dense_ix.search(q, mode="sira", k=5, proposer="dense").hits]
