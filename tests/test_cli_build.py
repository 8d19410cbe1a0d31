"""`funnel build` as a user runs it: a fresh process, no RAY_ADDRESS, a dense build.

It must say which Ray it used (and record it in the manifest), log progress lines, keep
stderr free of Ray's error-looking notices, and end by saying what it built. The index it
builds then serves the hybrid flags of `funnel search`. The progress line itself is a pure
function, tested here first.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from funnel.pipelines.progress import ProgressLog, Status, format_duration, status_line
from funnel.serving.frontends.cli import main
from funnel.serving.search import open_index

N_DOCS = 60
QUERY = "split a string into shell-like tokens"


# -- the progress line (pure) --------------------------------------------------------------


def test_status_line_rate_and_eta():
    assert status_line(Status("embed", 50, total=200), elapsed=10.0) == \
        "embed: 50 of 200 documents (25%), 5.0 documents/s, ETA 30s, elapsed 10s"
    # Without a total, the ETA comes from the fraction of the work done: elapsed·(1 − f)/f.
    assert status_line(Status("read", 1200, fraction=0.25, detail="chunk 1 of 4"), elapsed=20.0) == \
        "read: 1,200 documents (25%), 60.0 documents/s, ETA 1m00s, elapsed 20s; chunk 1 of 4"
    assert status_line(Status("embed", 0, total=10), elapsed=3.0) == "embed: 0 of 10 documents (0%), elapsed 3s"
    assert [format_duration(s) for s in (0, 59.6, 185, 7620)] == ["0s", "1m00s", "3m05s", "2h07m"]


def test_progress_log_measures_each_stage_from_its_start():
    now = [0.0]
    seen = iter([Status("read", 100, total=400), Status("read", 400, total=400), Status("index", 50, total=400)])
    plog = ProgressLog(lambda: next(seen), interval=0, clock=lambda: now[0])
    with plog:
        now[0] = 10.0
        plog.tick()
        now[0] = 40.0
        plog.tick()
        now[0] = 50.0
        plog.tick()  # index began after the last read line: its rate counts from 40 s, not 0
    assert plog.lines == ["read: 100 of 400 documents (25%), 10.0 documents/s, ETA 30s, elapsed 10s",
                          "read: 400 of 400 documents (100%), 10.0 documents/s, ETA 0s, elapsed 40s",
                          "index: 50 of 400 documents (12%), 5.0 documents/s, ETA 1m10s, elapsed 10s"]


def test_a_failing_poll_never_breaks_the_build():
    def broken():
        raise TimeoutError("counter actor gone")
    assert ProgressLog(broken, interval=0).tick() is None


# -- a real build in a fresh process ---------------------------------------------------------


@pytest.fixture(scope="module")
def built(demo_corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("clibuild")
    corpus = d / "corpus.jsonl"
    with open(demo_corpus) as f, open(corpus, "w") as g:
        for _, line in zip(range(N_DOCS), f):
            g.write(line)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["FUNNEL_CACHE"] = str(d / "cache")  # embed for real, not from a warm cache
    p = subprocess.run([sys.executable, "-m", "funnel.serving.frontends.cli", "build", "--corpus", str(corpus),
                        "--out", str(d / "ix"), "--shards", "2", "--engine", "ray", "--dense",
                        "--progress-seconds", "1"],
                       env=env, capture_output=True, text=True, timeout=900)
    return p, str(d / "ix")


def test_build_says_which_ray_and_records_it(built):
    p, root = built
    assert p.returncode == 0, p.stderr[-3000:]
    assert re.search(r"ray: a new local Ray started by funnel \(RAY_ADDRESS is unset\), address \S+: "
                     r"1 node\(s\)", p.stderr)
    # Ray is stopped once the vectors are on the driver's disk, before the FAISS stage, and the
    # build still publishes a working dense index (test_build_logs_progress_and_says_what_it_built).
    assert "ray: stopped the local Ray this build started" in p.stderr
    assert p.stderr.index("ray: stopped the local Ray") < p.stderr.index("faiss: building the vector index")
    current = open(os.path.join(root, "CURRENT")).read().strip()
    manifest = json.load(open(os.path.join(root, current, "manifest.json")))
    ray_info = manifest["build"]["ray"]
    assert ray_info["cluster"] == "local" and ray_info["started_by"] == "funnel" and ray_info["cpus"] > 0


def test_build_logs_progress_and_says_what_it_built(built):
    p, root = built
    assert re.search(rf"funnel\.build INFO embed: \d+ of {N_DOCS} documents \(\d+%\)", p.stderr), p.stderr[-3000:]
    # The lexical stage of 60 documents ends within the first 1 s tick (Ray tasks, no shuffle),
    # so it may log no periodic line; it always logs its summary.
    assert re.search(rf"funnel\.build INFO lexical: {N_DOCS} documents in 2 shards, 0 rejected", p.stderr), \
        p.stderr[-3000:]
    out = p.stdout.splitlines()
    assert out[0].startswith(f"published {root}/v000001: {N_DOCS} documents in 2 shards, 0 rejected")
    assert out[0].endswith("on a local Ray started by funnel")
    assert "  modes: bm25, dense, hybrid" in out and any(l.startswith("  dense: ") for l in out)


def test_build_stderr_has_no_error_looking_notices(built):
    p, _ = built
    for noise in ("core_worker", "max_restarts", "Token authentication", "DeprecationWarning",
                  "Progress bars disabled", "Traceback", " ERROR "):
        assert noise not in p.stderr, f"{noise!r} in stderr:\n{p.stderr[-3000:]}"


# -- the hybrid flags of `funnel search`, on that index -----------------------------------------


def hybrid_json(capsys, root, *flags) -> dict:
    assert main(["search", root, QUERY, "--mode", "hybrid", "--json", *flags]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_hybrid_flags_reach_the_fusion(built, capsys):
    _, root = built
    res = hybrid_json(capsys, root, "--fusion", "rrf", "--rrf-k", "30", "--no-top-rank-bonus", "--candidates", "20")
    cfg = res["trace"]["hybrid"]
    assert cfg["fusion"] == "rrf" and cfg["rrf_k"] == 30 and cfg["top_rank_bonus"] is None and cfg["candidates"] == 20
    top = res["hits"][0]["explain"]["fusion"]
    assert top["contributions"] == pytest.approx({n: 1 / (30 + r) for n, r in top["ranks"].items()})
    assert top["bonus"] == 0
    res = hybrid_json(capsys, root, "--fusion", "convex", "--alpha", "0.3")
    assert res["trace"]["hybrid"]["fusion"] == "convex" and res["trace"]["hybrid"]["alpha"] == 0.3
    res = hybrid_json(capsys, root, "--rerank", "biencoder", "--rerank-depth", "5", "--k", "5")
    assert res["trace"]["hybrid"]["reranker"] and res["trace"]["hybrid"]["rerank_depth"] == 5
    assert "rerank_score" in res["hits"][0]["explain"]["fusion"]
    assert main(["search", root, QUERY, "--mode", "dense", "--nprobe", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trace"]["dense"]["nprobe"] == 3


@pytest.mark.parametrize("flags, says", [
    (["--mode", "hybrid", "--candidates", "5000"], "candidates must be in 1..1000, got 5000"),
    (["--mode", "dense", "--fusion", "rrf"], "unknown option(s) fusion for mode 'dense'; valid: context_tokens, nprobe"),
    (["--mode", "dense", "--rerank", "biencoder"], "unknown option(s) rerank for mode 'dense'"),
    (["--mode", "hybrid", "--expand", "2"], "--expand asks an LLM for query expansions: give its endpoint with --chat"),
])
def test_hybrid_flag_errors_are_exit_2(built, capsys, flags, says):
    _, root = built
    assert main(["search", root, QUERY, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err


def test_ray_reindex_stops_its_local_ray_before_the_faiss_stage(built, demo_corpus, tmp_path):
    """A reindex on a local Ray it started stops that Ray once the changed documents' vectors
    are on its disk (as the build does), and still publishes the right dense index. Runs last
    in this module: it publishes a second version of the shared index."""
    p, root = built
    assert p.returncode == 0, p.stderr[-3000:]
    with open(demo_corpus) as f:
        rows = [json.loads(line) for _, line in zip(range(N_DOCS), f)]
    for i in (3, 17):
        rows[i]["text"] += " A revised paragraph about enzymes."
    b = tmp_path / "b.jsonl"
    b.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["FUNNEL_CACHE"] = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, "-m", "funnel.serving.frontends.cli", "reindex", "--index", root, "--corpus", str(b),
                        "--executor", "ray"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ray: stopped the local Ray this reindex started" in r.stderr
    current = open(os.path.join(root, "CURRENT")).read().strip()
    manifest = json.load(open(os.path.join(root, current, "manifest.json")))
    # One vector per passage: the two changed documents' passages are embedded (a new cache).
    ix = open_index(root)
    changed = sum(len(ix.passage_spans(ix.index.docs.docno_of(rows[i]["_id"]), "")) for i in (3, 17))
    assert manifest["reindex"]["vectors"]["embedded"] == changed and manifest["dense"]["passages"]["n_docs"] == N_DOCS
    assert main(["search", root, "revised paragraph about enzymes", "--mode", "dense", "--k", "3"]) == 0
