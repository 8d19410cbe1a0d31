"""`funnel search` flags against the real 400-document demo index (BM25, no vectors): the
per-query options reach the scorer or fail the API's own validation with exit 2, and batch
runs create their folder, say which queries were skipped and can drop self-hits."""

from __future__ import annotations

import json
import os

import pytest

from funnel.serving.frontends.cli import main

from conftest import write_jsonl

QUERY = "parse command line arguments"


def search_json(capsys, index, *flags) -> dict:
    assert main(["search", index, QUERY, "--json", *flags]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_the_query_may_follow_the_options(demo_index_1, capsys):
    res = search_json(capsys, demo_index_1, "--k", "2")
    assert main(["search", demo_index_1, "--k", "2", "--json", QUERY]) == 0
    assert json.loads(capsys.readouterr().out)["hits"] == res["hits"]
    assert main(["search", demo_index_1, "--k", "2", QUERY, "extra words"]) == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_bm25_options_reach_the_scorer(demo_index_1, capsys):
    base = search_json(capsys, demo_index_1)
    res = search_json(capsys, demo_index_1, "--k1", "1.2", "--b", "0.75", "--length-norm", "exact")
    assert res["trace"]["bm25"] == {**base["trace"]["bm25"], "k1": 1.2, "b": 0.75, "length_norm": "exact"}
    assert [h["score"] for h in res["hits"]] != [h["score"] for h in base["hits"]]
    res = search_json(capsys, demo_index_1, "--context-tokens", "120", "--k", "3")
    assert res["trace"]["context"] and sum(len(c["text"].split()) for c in res["trace"]["context"]) <= 120


@pytest.mark.parametrize("flags, says", [
    (["--b", "2"], "b must be in [0, 1], got 2.0"),
    (["--k1", "-1"], "k1 must be >= 0"),
    (["--alpha", "0.3"], "unknown option(s) alpha for mode 'bm25'; valid: b, context_tokens, k1, length_norm"),
    (["--nprobe", "4"], "unknown option(s) nprobe for mode 'bm25'"),
    (["--rerank", "biencoder"], "--rerank biencoder reranks with the index's embedder"),
    (["--mode", "hybrid", "--fusion", "rrf"], "mode 'hybrid' needs dense vectors"),
    (["--k", "0"], "k must be an integer between 1 and"),
    (["--chat", "localhost:8080"], "--chat wants BASE_URL#MODEL"),
])
def test_option_errors_come_from_the_api_as_exit_2(demo_index_1, capsys, flags, says):
    assert main(["search", demo_index_1, QUERY, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and "Traceback" not in err


def test_batch_run_creates_its_folder_and_lists_skipped_queries(demo_index_1, tmp_path, capsys):
    queries = write_jsonl(tmp_path / "q.jsonl", [
        {"_id": "q1", "text": QUERY}, {"_id": "q2", "text": "   "},
        {"_id": "q3", "text": "x" * 200_000}, {"_id": "q4", "text": "gzip compress a file"}])
    run = tmp_path / "new" / "deeper" / "bm25.trec"
    assert main(["search", demo_index_1, "--queries", queries, "--run", str(run), "--k", "5"]) == 0
    out, err = capsys.readouterr()
    assert f"wrote {run}: 2 queries" in out
    assert "skipped 2 of 4 queries:" in err
    assert "  q2: empty query" in err and "  q3: query has 200000 characters" in err
    lines = [line.split() for line in run.read_text().splitlines()]
    assert {l[0] for l in lines} == {"q1", "q4"} and len(lines) == 10


def test_remove_query_drops_self_hits(demo_index_1, tmp_path, capsys):
    # A query whose id is a document id, as in ArguAna or Quora: its own document ranks first.
    queries = write_jsonl(tmp_path / "q.jsonl", [{"_id": "argparse", "text": QUERY}])
    keep, drop = tmp_path / "keep.trec", tmp_path / "drop.trec"
    assert main(["search", demo_index_1, "--queries", queries, "--run", str(keep), "--k", "5"]) == 0
    assert main(["search", demo_index_1, "--queries", queries, "--run", str(drop), "--k", "5",
                 "--remove-query"]) == 0
    capsys.readouterr()
    kept = [l.split()[2] for l in keep.read_text().splitlines()]
    dropped = [l.split()[2] for l in drop.read_text().splitlines()]
    assert kept[0] == "argparse" and "argparse" not in dropped
    assert dropped[:4] == kept[1:] and len(dropped) == 5  # still k documents


def test_unwritable_run_is_refused_before_any_work(demo_index_1, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    missing_queries = str(tmp_path / "no-such-queries.jsonl")  # would fail later, were the run not checked first
    assert main(["search", demo_index_1, "--queries", missing_queries, "--run", str(blocker / "run.trec")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write --run {blocker / 'run.trec'}: {blocker} is a file, not a folder")
    os.makedirs(tmp_path / "adir")
    assert main(["search", demo_index_1, "--queries", missing_queries, "--run", str(tmp_path / "adir")]) == 2
    assert "is a folder: give a file name" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--queries", "q.jsonl"], "--queries needs --run"),
    (["--run", "r.trec", QUERY], "--run writes a batch run: give --queries FILE"),
    ([QUERY, "--remove-query"], "--remove-query applies to a batch run"),
    (["--queries", "q.jsonl", "--run", "r.trec", "--context-tokens", "100"], "--context-tokens packs the context"),
    ([QUERY, "--queries", "q.jsonl", "--run", "r.trec"], "either a query or --queries"),
    ([], "give a query"),
])
def test_flag_combinations_that_make_no_sense(demo_index_1, capsys, argv, says):
    assert main(["search", demo_index_1, *argv]) == 2
    assert says in capsys.readouterr().err


def test_output_into_a_closed_pipe_ends_quietly(demo_index_1):
    """`funnel search ... | head -1`: the reader closes the pipe early; no traceback."""
    import subprocess
    import sys as _sys
    cmd = (f"{_sys.executable} -m funnel.serving.frontends.cli search {demo_index_1} 'parse command line arguments' "
           "--k 50 | head -1")
    p = subprocess.run(["bash", "-c", cmd + "; echo \"rc=${PIPESTATUS[0]}\" >&2"], capture_output=True,
                       text=True, timeout=120)
    assert p.stdout.strip()  # head got its line
    assert "Traceback" not in p.stderr and "BrokenPipeError" not in p.stderr, p.stderr


def test_a_search_process_does_not_import_pandas(demo_index_1):
    """Importing pandas costs a `funnel search` process ~0.3 s before the query; serving
    never needs it (pyarrow's ``to_numpy`` and ``pq.read_table`` pulled it in)."""
    import subprocess
    import sys as _sys
    code = ("import sys; from funnel.serving.frontends.cli import main; "
            f"rc = main(['search', {demo_index_1!r}, {QUERY!r}, '--k', '3']); "
            "print('PANDAS', 'pandas' in sys.modules, rc)")
    p = subprocess.run([_sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "PANDAS False 0" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]


@pytest.mark.parametrize("flags", [[], ["--mode", "bm25", "--k1", "1.2"], ["--mode", "sira", "--proposer", "prf"]],
                         ids=["default", "bm25-k1", "sira-prf"])
def test_one_query_takes_the_numpy_path_and_answers_as_the_kernels_do(demo_index_1, flags):
    """`funnel search INDEX "text"` answers one query, so it does not load numba's compiled
    kernels (~0.45 s a process; importing numba alone ~0.15 s) but scores on the NumPy
    reference path: numba is not imported in that process, and the hits and scores are the ones a searcher
    with the kernels returns (the batch path, which keeps them, is checked too)."""
    import subprocess
    import sys as _sys
    from funnel.serving import kernels
    from funnel.serving.search import open_index
    code = ("import json, sys; from funnel.serving.frontends.cli import main; "
            f"rc = main(['search', {demo_index_1!r}, {QUERY!r}, '--k', '5', '--json', *{flags!r}]); "
            "k = sys.modules.get('funnel.serving.kernels'); "
            "used = sorted(n for n in dir(k) if getattr(getattr(k, n), 'signatures', None)) if k and k.HAVE_NUMBA else []; "
            "print('KERNELS', json.dumps(used), rc, 'numba' in sys.modules, file=sys.stderr)")
    p = subprocess.run([_sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "KERNELS [] 0 False" in p.stderr, p.stdout[-2000:] + p.stderr[-2000:]  # numba not even imported
    got = json.loads(p.stdout)["hits"]
    opts = {"k1": 1.2} if "--k1" in flags else {"proposer": "prf"} if "sira" in flags else {}
    mode = flags[1] if flags else "bm25"
    with open_index(demo_index_1) as ix:
        assert ix.bm25._use_kernel() == kernels.HAVE_NUMBA
        want = ix.search(QUERY, mode=mode, k=5, **opts).to_dict()["hits"]
    assert got and [(h["doc_id"], h["score"]) for h in got] == [(h["doc_id"], h["score"]) for h in want]
    assert got == want
