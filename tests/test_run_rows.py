"""The array run writer (``write_run_rows``, what ``funnel search --queries --run`` writes
through) against the dict path it replaces (``write_run(run_as_written(...))``): the same
bytes, ties, rounding edge cases and self-hit removal included."""

from __future__ import annotations

import numpy as np
import pytest

from funnel.evaluation.trec import (ANSERINI_MODES, RunRows, _round_like_python, run_as_written, write_run,
                                    write_run_rows)
from funnel.serving.search import open_index


def _dict_bytes(tmp_path, run, mode):
    p = tmp_path / "dict.trec"
    write_run(p, run_as_written(run, mode), tag="t")
    return p.read_bytes()


def _rows_bytes(tmp_path, parts, mode):
    p = tmp_path / "rows.trec"
    write_run_rows(p, parts, tag="t", tiebreak=mode in ANSERINI_MODES)
    return p.read_bytes()


def _random_rows(seed, n=40, width=150):
    """Rows with every kind of tie: exact ties, scores equal after rounding to 4 decimals
    (runs of more than 100, where the 1e-6 steps reach the next group), values on a
    rounding half, and rows not in run order."""
    rng = np.random.default_rng(seed)
    ids = np.full((n, width), None, dtype=object)
    scores = np.zeros((n, width))
    counts = rng.integers(0, width + 1, size=n)
    counts[0] = width
    pool = [f"d{i}" for i in range(400)] + ["D7", "a", "z-9", "d1_"]
    for i in range(n):
        c = int(counts[i])
        ids[i, :c] = list(rng.choice(pool, size=c, replace=False))
        kind = i % 4
        if kind == 0:
            v = np.round(rng.uniform(0, 30, c), 2)          # many exact ties
        elif kind == 1:
            v = 5.0 + rng.integers(0, 3, c) * 1e-4 + rng.uniform(0, 4e-5, c)  # long rounded ties
        elif kind == 2:
            v = rng.integers(0, 2000, c) / 1e4 + 0.00005       # halves at the 4th decimal
        else:
            v = rng.uniform(-3, 3, c)
        scores[i, :c] = v if i % 3 else np.sort(v)[::-1]
    qids = [f"q{i}" for i in range(n)]
    run = {q: {ids[i, j]: float(scores[i, j]) for j in range(int(counts[i]))} for i, q in enumerate(qids)}
    return run, RunRows(qids, ids, scores, counts)


@pytest.mark.parametrize("mode", ["bm25", "dense"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rows_write_the_bytes_the_dict_path_writes(tmp_path, mode, seed):
    run, rows = _random_rows(seed)
    half = len(rows.qids) // 2
    parts = [RunRows(rows.qids[:half], rows.doc_ids[:half], rows.scores[:half], rows.counts[:half]),
             RunRows(rows.qids[half:], rows.doc_ids[half:], rows.scores[half:], rows.counts[half:])]
    assert _rows_bytes(tmp_path, parts, mode) == _dict_bytes(tmp_path, run, mode)


def test_rounding_is_pythons_round_bit_for_bit():
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(-50, 50, 20000), rng.integers(-10**6, 10**6, 5000) / 1e4 + 0.00005,
                        [2.675, 0.125, 1e15 + 0.5, -0.00005, 0.0, 123.45675, 1e-9]])
    for d in (4, 6):
        got = _round_like_python(x, d)
        assert [float(v) for v in got] == [round(v, d) for v in x.tolist()]


def test_bad_rows_are_refused(tmp_path):
    ids = np.array([["a", "b c"]], dtype=object)
    with pytest.raises(ValueError, match="whitespace"):
        write_run_rows(tmp_path / "r", [RunRows(["q"], ids, np.ones((1, 2)), np.array([2]))], "t", tiebreak=True)
    ids = np.array([["a", "b"]], dtype=object)
    with pytest.raises(ValueError, match="NaN"):
        write_run_rows(tmp_path / "r", [RunRows(["q"], ids, np.array([[1.0, np.nan]]), np.array([2]))], "t",
                       tiebreak=False)
    with pytest.raises(ValueError, match="do not match"):
        write_run_rows(tmp_path / "r", [RunRows(["q", "r"], ids, np.ones((1, 2)), np.array([2]))], "t",
                       tiebreak=False)


@pytest.mark.parametrize("mode", ["bm25", "sira"])
@pytest.mark.parametrize("remove_query", [False, True])
def test_searcher_rows_equal_search_batch(demo_index_1, tmp_path, mode, remove_query):
    ix = open_index(demo_index_1)
    docs = [ix.index.docs.doc_id((0 << 32) | i) for i in range(3)]
    # Queries named after documents, so that removing self-hits removes something.
    queries = {docs[0]: "what causes anemia", docs[1]: "vitamin deficiency and fatigue",
               docs[2]: "iron", "q-none": "zzzz qqqq", "q4": "blood cells"}
    for k in (1, 3, 10):
        run = ix.search_batch(queries, mode=mode, k=k, remove_query=remove_query)
        rows = ix.search_batch_rows(queries, mode=mode, k=k, remove_query=remove_query)
        assert sum(len(p.qids) for p in rows) == len(run)
        got = {q: list(zip(p.doc_ids[i, :c].tolist(), p.scores[i, :c].tolist()))
               for p in rows for i, (q, c) in enumerate(zip(p.qids, p.counts.tolist()))}
        assert got == run
        assert _rows_bytes(tmp_path, rows, mode) == _dict_bytes(tmp_path, {q: dict(h) for q, h in run.items()},
                                                                mode)
