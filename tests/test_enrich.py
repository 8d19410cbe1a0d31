"""SIRA corpus enrichment: the pure pieces (parsing, DF filter, injection, cache) on hand-made
fixtures, and the whole build against a real OpenAI-compatible server on 127.0.0.1 that
answers good JSON, chatty text, bullet lines, malformed JSON, empty replies, HTTP 500 and
slow replies. The build finishes, failures are counted, and a rebuild asks only about the
documents that failed."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading

import duckdb
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from funnel.jobs.build_index import BuildError
from funnel.pipelines.lexical.analysis import Analyzer
from funnel.pipelines.enrich import (EnrichmentCache, EnrichSettings, filter_phrase, injection_terms,
                                     ngram_doc_freq, parse_keywords, propose_documents)

sys.path.insert(0, os.path.dirname(__file__))
from conftest import write_jsonl  # noqa: E402
from embed_server import ServerThread  # noqa: E402

# --- pure pieces ----------------------------------------------------------------------------


@pytest.mark.parametrize("reply, expected", [
    ('{"keywords": ["heart attack", "MI"]}', ["heart attack", "MI"]),
    ('Reasoning: it is about {cardiac} things.\n```json\n{"keywords": ["MI", "mi", " heart  attack "]}\n```',
     ["MI", "heart attack"]),
    ("Here are phrases:\n1. sleep apnea\n2) snoring\n- \"OSA\"", ["sleep apnea", "snoring", "OSA"]),
    ("Keywords: renal failure, kidney", ["renal failure", "kidney"]),
    ('["a", "b"]', ["a", "b"]),
    ('{"keywords": []}', []),
    # cut off by max_tokens: the complete strings count, the torn one does not
    ('{"keywords": ["abc",', ["abc"]),
    ('{\n  "keywords": ["sleep apnea", "OSA", "snor', ["sleep apnea", "OSA"]),
])
def test_parse_keywords_reads_json_chatty_and_line_replies(reply, expected):
    assert parse_keywords(reply) == expected


@pytest.mark.parametrize("reply", ["", "   ", '{"keywords": ["ab', '{"keywords": [', "I cannot help with that."])
def test_parse_keywords_refuses_what_it_cannot_read(reply):
    with pytest.raises(ValueError):
        parse_keywords(reply)


def test_parse_keywords_keeps_at_most_ten_distinct_phrases():
    got = parse_keywords(json.dumps({"keywords": [f"p{i}" for i in range(15)] + ["P0", 3, "x" * 200]}))
    assert got == [f"p{i}" for i in range(10)]


def test_filter_phrase_keeps_a_phrase_with_one_rare_window():
    df = {"a": 5, "b": 2, "a b": 0, "c": 9}
    n, tau = 10, 0.3                                   # ceiling tau*N = 3
    v = filter_phrase(["a", "b"], df.get, n, tau, 1)
    assert v.kept and v.df == 2                        # b: 2 <= 3
    v = filter_phrase(["a", "c"], lambda k: df.get(k, 0), n, tau, 1)
    assert not v.kept and v.df == 5 and "too common" in v.reason
    v = filter_phrase(["a", "c"], lambda k: df.get(k, 0), n, tau, 2)
    assert v.kept and v.df == 0                        # the n-gram "a c" is new: no lower bound
    v = filter_phrase(["b"], df.get, n, 0.2, 1)       # boundary: 2 <= 0.2*10
    assert v.kept
    assert not filter_phrase([], df.get, n, tau, 2).kept


def test_injection_terms_are_unigrams_then_atomic_ngrams():
    assert injection_terms(["myocardi", "infarct", "acut"], 1) == ["myocardi", "infarct", "acut"]
    assert injection_terms(["myocardi", "infarct", "acut"], 2) == [
        "myocardi", "infarct", "acut", "myocardi infarct", "infarct acut"]
    assert len(injection_terms(["a", "b", "c"], 3)) == 3 + 2 + 1


def test_ngram_doc_freq_counts_documents_not_occurrences():
    docs = [["blood", "pressur", "blood", "pressur"], ["blood", "x", "pressur"], ["high", "blood", "pressur"]]
    got = ngram_doc_freq(docs, {"blood pressur", "high blood", "x y"}, 2)
    assert got == {"blood pressur": 2, "high blood": 1}


def test_cache_round_trip_and_propose_documents(tmp_path):
    cache = EnrichmentCache(str(tmp_path), "m", "v1")
    calls = []

    def propose(title, text):
        calls.append(title)
        if title == "bad":
            raise RuntimeError("boom")
        return [title.upper()]

    docs = [("h1", "a", ""), ("h2", "bad", ""), ("h1", "a", ""), ("h3", "c", "")]
    out = propose_documents(docs, propose, cache, concurrency=2)
    assert [o.status for o in out] == ["enriched", "failed", "enriched", "enriched"]
    assert out[2].phrases == ("A",) and "boom" in out[1].error
    assert sorted(calls) == ["a", "bad", "c"]          # the same content is asked once
    again = EnrichmentCache(str(tmp_path), "m", "v1")  # a new process sees the segments
    calls.clear()
    ticks = []
    out = propose_documents(docs, propose, again, concurrency=2, progress=lambda n, cached: ticks.append((n, cached)))
    assert calls == ["bad"] and [o.status for o in out] == ["cached", "failed", "cached", "cached"]
    assert ticks == [(3, True), (1, False)]           # cache hits first, at once; then each call
    assert len(EnrichmentCache(str(tmp_path), "m", "v2")) == 0       # another prompt: another key
    assert again.compact() == 0                        # one segment: nothing to merge
    assert again.put_many({"h9": ["z"], "h1": ["changed?"]}) == 1   # the first answer stays
    assert again.compact() == 2
    fresh = EnrichmentCache(str(tmp_path), "m", "v1")
    assert len(fresh) == 3 and fresh.get_many(["h1", "h9"]) == {"h1": ["A"], "h9": ["z"]}


def test_settings_are_validated():
    with pytest.raises(ValueError, match="choose one of general, qa"):
        EnrichSettings("http://x/v1", "m", task="poetry")
    with pytest.raises(ValueError, match="max-n"):
        EnrichSettings("http://x/v1", "m", max_n=5)
    assert EnrichSettings("http://x/v1", "m", task="qa", max_n=1).prompt_id.endswith("/qa/max_n=1")


# --- the build against a scripted OpenAI-compatible server ------------------------------------

GOOD = {"keywords": ["myocardial infarction", "patients", "the of", "cardiology"]}
#: title -> how the server answers: ("ok", content) | ("status", code) | ("slow", seconds)
PLAN = {
    "Cardiac arrest outcomes": ("ok", json.dumps(GOOD)),
    "Kidney disease progression": ("ok", 'Let me think about it. The text covers {x}.\n```json\n'
                                         '{"keywords": ["renal failure", "nephrology"]}\n```'),
    "Sleep disorders in adults": ("ok", "Here are some phrases:\n- sleep apnea\n- snoring"),
    "Glucose control trial": ("ok", json.dumps({"keywords": ["diabetes mellitus", "blood pressure"]})),
    "Bone density screening": ("ok", '{"keywords": ["osteopor'),        # malformed
    "Vitamin intake survey": ("ok", ""),                                       # empty
    "Liver enzyme study": ("status", 500),
    "Asthma inhaler adherence": ("slow", 3.0),
    "Migraine prevention": ("ok", json.dumps({"keywords": ["headache", "triptan"]})),
    "Skin cancer screening": ("ok", json.dumps({"keywords": ["melanoma"]})),
}
FAILING = {"Bone density screening", "Vitamin intake survey", "Liver enzyme study", "Asthma inhaler adherence"}


def corpus_rows():
    rows = []
    for i, title in enumerate(PLAN):
        text = f"Patients in study {i} were followed for a year."
        if i < 4:
            text += " Blood pressure was recorded."
        rows.append({"_id": f"d{i:02d}", "title": title, "text": text})
    return rows


def chat_app() -> FastAPI:
    app = FastAPI()
    app.state.plan, app.state.requests = dict(PLAN), []
    lock = threading.Lock()

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        title = body["messages"][-1]["content"].split("Document:\n", 1)[1].split("\n", 1)[0]
        with lock:
            app.state.requests.append(title)
            kind, arg = app.state.plan[title]
        if kind == "status":
            return JSONResponse({"error": {"message": "scripted failure", "type": "server_error"}},
                                status_code=arg)
        if kind == "slow":
            await asyncio.sleep(arg)
            arg = json.dumps({"keywords": ["too late"]})
        return {"id": "t", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": arg}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    return app


@pytest.fixture(scope="module")
def server():
    app = chat_app()
    srv = ServerThread(app).start()
    srv.app = app
    yield srv
    srv.stop()


def settings(server, **kw) -> EnrichSettings:
    return EnrichSettings(server.base_url, "scripted", tau=0.3, max_n=2, concurrency=3, timeout=1.0,
                          retries=1, backoff=0.05, **kw)


@pytest.fixture(scope="module")
def built(server, tmp_path_factory):
    """A plain index and an enriched one of the same corpus; the enrichment cache; the first
    build's requests."""
    from funnel.jobs.build_index import build
    d = tmp_path_factory.mktemp("enrich")
    corpus = write_jsonl(d / "corpus.jsonl", corpus_rows())
    plain, enriched, cache = str(d / "plain"), str(d / "enriched"), str(d / "cache")
    build(corpus, plain, shards=1, engine="local")
    server.app.state.requests.clear()
    rep = build(corpus, enriched, shards=2, engine="local", enrich=settings(server), enrich_cache=cache)
    return {"corpus": corpus, "plain": plain, "enriched": enriched, "cache": cache, "report": rep,
            "requests": list(server.app.state.requests)}


def _version(root):
    with open(os.path.join(root, "CURRENT")) as f:
        return os.path.join(root, f.read().strip())


def test_failures_are_counted_and_the_build_finishes(built):
    rep = built["report"]
    c = rep.enrichment["counts"]
    assert rep.n_docs == 10
    assert c["documents"] == 10 and c["enriched"] == 6 and c["failed"] == 4 and c["cached"] == 0
    with open(os.path.join(_version(built["enriched"]), "manifest.json")) as f:
        m = json.load(f)["enrichment"]
    assert m["counts"] == c and m["model"] == "scripted" and m["tau"] == 0.3 and m["max_n"] == 2
    assert m["prompt_version"] and m["prompt_id"].startswith(m["prompt_version"]) and m["fields"] == ["lexical"]
    assert c["phrases_proposed"] == c["phrases_kept"] + c["phrases_rejected"] == 4 + 2 + 2 + 2 + 2 + 1
    # retries: the 500 and the slow document were asked retries + 1 = 2 times, the others once
    reqs = built["requests"]
    assert reqs.count("Liver enzyme study") == 2 and reqs.count("Asthma inhaler adherence") == 2
    assert reqs.count("Bone density screening") == 1 and reqs.count("Cardiac arrest outcomes") == 1
    con = duckdb.connect(os.path.join(_version(built["enriched"]), "stats.duckdb"), read_only=True)
    status = dict(con.execute("SELECT d.status, COUNT(*) FROM enrichment_docs d GROUP BY 1").fetchall())
    errors = dict(con.execute("SELECT doc_id, error FROM enrichment_docs WHERE status = 'failed'").fetchall())
    con.close()
    assert status == {"enriched": 6, "failed": 4}
    assert "empty reply" in errors["d05"] and "no keywords" in errors["d04"]
    assert "InternalServerError" in errors["d06"] and "timed out" in errors["d07"]


def test_the_df_filter_uses_the_unenriched_corpus(built):
    con = duckdb.connect(os.path.join(_version(built["enriched"]), "stats.duckdb"), read_only=True)
    audit = {(d, p): (k, r, df) for d, p, k, r, df in con.execute("SELECT * FROM enrichment").fetchall()}
    con.close()
    # tau*N = 0.3*10 = 3: "patients" is in all 10 documents; "the of" has no searchable word
    assert audit[("d00", "patients")][:1] == (False,) and audit[("d00", "patients")][2] == 10
    assert audit[("d00", "the of")][0] is False and audit[("d00", "the of")][2] is None
    assert audit[("d00", "myocardial infarction")] [0] is True and audit[("d00", "myocardial infarction")][2] == 0
    # "blood pressure": blood, pressur and the bigram "blood pressur" are each in 4 documents
    # of the plain corpus (4 > 3): too common, though enrichment itself never added it
    assert audit[("d03", "blood pressure")][0] is False and audit[("d03", "blood pressure")][2] == 4
    assert audit[("d02", "sleep apnea")][0] is True and audit[("d01", "renal failure")][0] is True


def test_injected_terms_are_in_postings_and_lengths(built):
    from funnel.serving.search import open_index
    ix = open_index(built["enriched"])
    hits = ix.search("myocardial infarction", mode="bm25", k=3).hits
    assert [h.doc_id for h in hits] == ["d00"]
    assert ix.search("nephrology", k=3).hits[0].doc_id == "d01"
    assert open_index(built["plain"]).search("myocardial infarction", k=3).hits == ()
    # plain BM25 still answers from the original text, for every document
    got = {h.doc_id for h in ix.search("patients followed year", k=10).hits}
    assert got == {f"d{i:02d}" for i in range(10)}
    con = duckdb.connect(os.path.join(_version(built["enriched"]), "stats.duckdb"), read_only=True)
    df = dict(con.execute("SELECT term, df FROM terms WHERE term IN ('myocardi infarct', 'myocardi', "
                          "'patient', 'sleep apnea', 'blood pressur')").fetchall())
    n_enr = con.execute("SELECT total_terms FROM collection").fetchone()[0]
    con.close()
    assert df == {"myocardi infarct": 1, "myocardi": 1, "patient": 10, "sleep apnea": 1}
    con = duckdb.connect(os.path.join(_version(built["plain"]), "stats.duckdb"), read_only=True)
    n_plain = con.execute("SELECT total_terms FROM collection").fetchone()[0]
    con.close()
    a = Analyzer()
    kept_terms = sum(len(injection_terms(a.analyze(p), 2)) for p in
                     ["myocardial infarction", "cardiology", "renal failure", "nephrology", "sleep apnea",
                      "snoring", "diabetes mellitus", "headache", "triptan", "melanoma"])
    assert n_enr - n_plain == kept_terms == built["report"].enrichment["counts"]["terms_injected"]


def test_a_rebuild_asks_only_about_the_failed_documents(built, server):
    from funnel.jobs.build_index import build
    server.app.state.requests.clear()
    for title in FAILING:  # the endpoint recovers
        server.app.state.plan[title] = ("ok", json.dumps({"keywords": ["recovered term"]}))
    try:
        rep = build(built["corpus"], built["enriched"], shards=2, engine="local", enrich=settings(server),
                    enrich_cache=built["cache"])
    finally:
        server.app.state.plan.update({t: PLAN[t] for t in FAILING})
    assert sorted(server.app.state.requests) == sorted(FAILING)
    c = rep.enrichment["counts"]
    assert c["cached"] == 6 and c["enriched"] == 4 and c["failed"] == 0
    from funnel.serving.search import open_index
    hits = open_index(built["enriched"]).search("recovered term", k=10).hits
    assert {h.doc_id for h in hits} == {"d04", "d05", "d06", "d07"}
    # and a third build sends nothing at all
    server.app.state.requests.clear()
    for title in FAILING:
        server.app.state.plan[title] = ("ok", json.dumps({"keywords": ["recovered term"]}))
    try:
        rep = build(built["corpus"], built["enriched"], shards=2, engine="local", enrich=settings(server),
                    enrich_cache=built["cache"])
    finally:
        server.app.state.plan.update({t: PLAN[t] for t in FAILING})
    assert server.app.state.requests == [] and rep.enrichment["counts"]["cached"] == 10


def test_enrich_report_cli(built, capsys):
    from funnel.serving.frontends.cli import main
    assert main(["enrich-report", built["enriched"], "--examples", "2"]) == 0
    out = capsys.readouterr().out
    assert "failed (left unenriched)" in out and "most frequent injected phrases" in out
    assert "example d00" in out and "myocardial infarction" in out
    assert main(["enrich-report", built["enriched"], "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["settings"]["counts"]["documents"] == 10 and rep["top_kept"] and rep["examples"]
    assert main(["enrich-report", built["plain"]]) == 2
    assert "without --enrich" in capsys.readouterr().err


def test_build_cli_flags(server, tmp_path, capsys):
    from funnel.serving.frontends.cli import main
    corpus = write_jsonl(tmp_path / "c.jsonl", corpus_rows()[:3])
    assert main(["build", "--corpus", corpus, "--out", str(tmp_path / "ix"), "--engine", "local", "--enrich",
                 "--llm-base-url", server.base_url, "--llm-model", "scripted", "--enrich-tau", "0.5",
                 "--enrich-max-n", "1", "--enrich-task", "qa", "--enrich-cache", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "enrichment: scripted (sira-enrich-3/qa/max_n=1): 3 docs" in out
    with open(os.path.join(_version(str(tmp_path / "ix")), "manifest.json")) as f:
        m = json.load(f)["enrichment"]
    assert m["task"] == "qa" and m["max_n"] == 1 and m["tau"] == 0.5
    assert main(["build", "--corpus", corpus, "--out", str(tmp_path / "ix2"), "--enrich"]) == 2
    assert "--enrich needs an LLM" in capsys.readouterr().err


def test_reindex_of_an_enriched_index_is_a_full_enriched_build_asking_only_about_new_text(built, server,
                                                                                         tmp_path):
    """Reindex carries enrichment over (issue 16): the result equals a full enriched build of
    the changed corpus, and the LLM is asked only about changed and new documents (plus, if
    not cached yet, the ones that failed before)."""
    import shutil

    import numpy as np
    import pyarrow.parquet as pq

    from funnel.jobs.build_index import build
    from funnel.jobs.reindex import reindex
    from funnel.serving.search import open_index
    rows = corpus_rows()
    rows[0]["text"] += " The outcome was recorded again."        # changed: Cardiac arrest outcomes
    deleted = rows.pop()                                           # deleted: Skin cancer screening
    rows.append({"_id": "d42", "title": "Migraine prevention", "text": "A new trial of headache drugs."})
    corpus = write_jsonl(tmp_path / "corpus2.jsonl", rows)
    root = str(tmp_path / "ix")
    shutil.copytree(built["enriched"], root)
    server.app.state.requests.clear()
    rep = reindex(root, corpus, llm=(server.base_url, "scripted"), enrich_cache=built["cache"])
    asked = set(server.app.state.requests)
    assert {"Cardiac arrest outcomes", "Migraine prevention"} <= asked <= \
        {"Cardiac arrest outcomes", "Migraine prevention"} | FAILING
    assert (rep.changed, rep.added, rep.deleted, rep.unchanged) == (1, 1, 1, 8) and rep.enrichment
    full = str(tmp_path / "full")
    build(corpus, full, shards=2, engine="local", enrich=settings(server), enrich_cache=built["cache"])
    a, b = _version(root), _version(full)
    for s in range(2):
        for name in ("indptr", "docs", "tfs", "doclen", "term_gid"):
            fa, fb = (os.path.join(v, "lexical", f"shard-{s:04d}", f"{name}.npy") for v in (a, b))
            assert np.array_equal(np.load(fa), np.load(fb)), (s, name)
        fa, fb = (os.path.join(v, "docs", f"shard-{s:04d}.parquet") for v in (a, b))
        assert pq.read_table(fa).equals(pq.read_table(fb))
    q = "SELECT term, df, cf FROM terms ORDER BY term"
    ta, tb = (duckdb.connect(os.path.join(v, "stats.duckdb"), read_only=True) for v in (a, b))
    assert ta.execute(q).fetchall() == tb.execute(q).fetchall()
    ta.close()
    tb.close()
    hits = open_index(root).search("myocardial infarction headache", k=10).hits
    assert deleted["_id"] not in {h.doc_id for h in hits}
    with pytest.raises(BuildError, match="loopback endpoint that is gone"):  # the port is not recorded
        reindex(root, corpus, enrich_cache=built["cache"])
