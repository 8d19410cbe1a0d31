"""The array run writer (``write_run_rows``, what ``funnel search --queries --run`` writes
through) against the dict path it replaces (``write_run(run_as_written(...))``): the same
bytes, ties, rounding edge cases and self-hit removal included."""

from __future__ import annotations

import numpy as np
import pytest

from funnel.evaluation import runbytes
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
        if mode == "bm25":  # ids come with their positions: the compiled lines are written from them
            assert all((p.names is not None) == runbytes.HAVE_NUMBA for p in rows)
        assert _rows_bytes(tmp_path, rows, mode) == _dict_bytes(tmp_path, {q: dict(h) for q, h in run.items()},
                                                                mode)


def _python_lines(qids, ids, scores, valid, counts, tag):
    """write_run_rows's Python formatting of the same cells (the reference for the compiled pass)."""
    cols = np.broadcast_to(np.arange(1, ids.shape[1] + 1), ids.shape)[valid].tolist()
    cells = zip(np.repeat(np.asarray(qids, dtype=object), counts).tolist(), ids[valid].tolist(), cols,
                scores[valid].tolist())
    return "".join("%s Q0 %s %d %r %s\n" % (q, d, r, s, tag) for q, d, r, s in cells).encode("ascii")


def test_compiled_lines_are_the_python_lines():
    """The compiled formatter (what bm25/sira runs go through) against Python's ``%r`` on
    scores where the shortest repr has 1 to 6 decimals, integers (``12.0``), the range
    limits, and qids/ids/ranks of every length; and it declines what it cannot write."""
    rng = np.random.default_rng(11)
    n, width = 60, 120
    counts = rng.integers(0, width + 1, size=n)
    counts[0] = width
    ids = np.full((n, width), None, dtype=object)
    scores = np.zeros((n, width))
    edge = [runbytes.LOW, 12.0, 0.5, 0.000123, 9999999.999999, 1.1, 100.000001, 3.14159, 7.0, 2.5e-4]
    for i in range(n):
        c = int(counts[i])
        ids[i, :c] = [f"doc-{rng.integers(0, 10 ** rng.integers(1, 12))}" for _ in range(c)]
        v = _round_like_python(rng.uniform(1e-4, 40, c) * 10.0 ** rng.integers(-3, 5), int(rng.integers(0, 7)))
        v[:min(c, len(edge))] = edge[:min(c, len(edge))]
        scores[i, :c] = np.clip(v, runbytes.LOW, 9999999.999999)
    qids = [f"q{'x' * int(rng.integers(0, 9))}{i}" for i in range(n)]
    valid = np.arange(width)[None, :] < counts[:, None]
    got = runbytes.part_bytes(qids, ids, scores, valid, counts, "tag-1")
    if runbytes.HAVE_NUMBA:
        assert got == _python_lines(qids, ids, scores, valid, counts, "tag-1")
    else:  # FUNNEL_NUMBA=0: never the compiled pass
        assert got is None

    one = np.array([[2.5]])
    ok = np.array([[True]])
    assert runbytes.part_bytes(["q"], np.array([["é"]], dtype=object), one, ok, np.array([1]), "t") is None
    assert runbytes.part_bytes(["q"], np.array([["a b"]], dtype=object), one, ok, np.array([1]), "t") is None
    assert runbytes.part_bytes(["q"], np.array([[""]], dtype=object), one, ok, np.array([1]), "t") is None
    assert runbytes.part_bytes(["q\tx"], np.array([["a"]], dtype=object), one, ok, np.array([1]), "t") is None
    assert runbytes.part_bytes(["q"], np.array([[7]], dtype=object), one, ok, np.array([1]), "t") is None
    for bad in (5e-5, -1.0, 1e7, 2.1234567, np.nan):  # out of range, or not a 6-decimal value
        assert runbytes.part_bytes(["q"], np.array([["a"]], dtype=object), np.array([[bad]]), ok,
                                   np.array([1]), "t") is None


def test_tie_broken_rows_take_the_compiled_pass_and_write_the_dict_paths_bytes(tmp_path, monkeypatch):
    """Positive scores with ties and rows out of order (the rounding to 4 decimals makes new
    ties): the bytes equal the dict path's, with the compiled pass used for every part (where
    numba is present), and with it switched off."""
    run, rows = _random_rows(7)
    scores = np.where(np.arange(rows.scores.shape[1])[None, :] < rows.counts[:, None],
                      np.abs(rows.scores) + 0.5, 0.0)
    rows = RunRows(rows.qids, rows.doc_ids, scores, rows.counts)
    run = {q: {d: float(s) for d, s in zip(rows.doc_ids[i, :c], scores[i, :c])}
           for i, (q, c) in enumerate(zip(rows.qids, rows.counts.tolist()))}
    expected = _dict_bytes(tmp_path, run, "bm25")
    used = []
    real = runbytes.part_bytes
    monkeypatch.setattr(runbytes, "part_bytes", lambda *a: used.append(real(*a)) or used[-1])
    assert _rows_bytes(tmp_path, [rows], "bm25") == expected
    assert used and all(b is not None for b in used) == runbytes.HAVE_NUMBA
    monkeypatch.setattr(runbytes, "part_bytes", lambda *a: None)
    assert _rows_bytes(tmp_path, [rows], "bm25") == expected


def test_compressed_runs_get_the_same_lines(tmp_path):
    """A ``.gz`` run path: the compiled pass writes through the gzip layer, the same lines."""
    import gzip
    run, rows = _random_rows(9)
    scores = np.where(np.arange(rows.scores.shape[1])[None, :] < rows.counts[:, None], np.abs(rows.scores) + 1.0, 0.0)
    rows = RunRows(rows.qids, rows.doc_ids, scores, rows.counts)
    run = {q: {d: float(s) for d, s in zip(rows.doc_ids[i, :c], scores[i, :c])}
           for i, (q, c) in enumerate(zip(rows.qids, rows.counts.tolist()))}
    p = tmp_path / "rows.trec.gz"
    write_run_rows(p, [rows], tag="t", tiebreak=True)
    assert gzip.decompress(p.read_bytes()) == _dict_bytes(tmp_path, run, "bm25")


def _table_rows(seed, n=50, width=120, n_docs=700):
    """An id table (ids sharing prefixes, so str order is not position order) and rows of
    positions with descending scores full of ties, as the kernel hands them over."""
    rng = np.random.default_rng(seed)
    names = [f"d{rng.integers(0, 10 ** rng.integers(1, 6))}-{i}" if i % 3 else f"D{i % 7}x{i}" for i in range(n_docs)]
    order = sorted(range(n_docs), key=names.__getitem__)
    rank = np.empty(n_docs, dtype=np.int64)
    rank[order] = np.arange(n_docs)
    data = "".join(names).encode("ascii")
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in names])])
    table = runbytes.id_table(np.frombuffer(data, dtype=np.uint8), offsets, rank)
    pos = np.zeros((n, width), dtype=np.int64)
    scores = np.zeros((n, width))
    counts = rng.integers(0, width + 1, size=n)
    counts[0] = width
    for i in range(n):
        c = int(counts[i])
        pos[i, :c] = rng.choice(n_docs, size=c, replace=False)
        v = np.round(rng.uniform(0.5, 30, c), int(rng.integers(1, 8))) if i % 2 else \
            7.0 + rng.integers(0, 3, c) * 1e-4 + rng.uniform(0, 4e-5, c)  # long runs of rounded ties
        scores[i, :c] = np.sort(v)[::-1]  # kernel order: score descending (ties in any order here)
    ids = np.full((n, width), None, dtype=object)
    all_ids = np.asarray(names, dtype=object)
    for i in range(n):
        ids[i, :counts[i]] = all_ids[pos[i, :counts[i]]]
    qids = [f"q{i}" for i in range(n)]
    run = {q: {ids[i, j]: float(scores[i, j]) for j in range(int(counts[i]))} for i, q in enumerate(qids)}
    return run, RunRows(qids, ids, scores, counts, pos, table)


@pytest.mark.parametrize("chunk", [64, 1 << 18])
def test_rows_with_positions_write_the_dict_paths_bytes(tmp_path, monkeypatch, chunk):
    """Rows that carry positions into an id table (what ``search_batch_rows`` hands over):
    the compiled tie-break and lines give the dict path's bytes, formatted in chunks of any
    size (a row larger than the chunk grows it). Rows it cannot prove (out of order, a
    score outside [LOW, HIGH)) and every row after them go the general way, same bytes."""
    monkeypatch.setattr(runbytes, "CHUNK", chunk)
    run, rows = _table_rows(3)
    assert (rows.names is not None) == runbytes.HAVE_NUMBA
    calls = []
    real = runbytes.write_rows
    monkeypatch.setattr(runbytes, "write_rows", lambda *a: calls.append(real(*a)) or calls[-1])
    assert _rows_bytes(tmp_path, [rows], "bm25") == _dict_bytes(tmp_path, run, "bm25")
    assert calls == ([len(rows.qids)] if runbytes.HAVE_NUMBA else [])

    scores = rows.scores.copy()
    scores[20, :2] = [1.0, 2.0]  # out of order
    scores[31, 0] = 2e7  # above HIGH
    bad = rows._replace(scores=scores)
    run = {q: {d: float(s) for d, s in zip(bad.doc_ids[i, :c], scores[i, :c])}
           for i, (q, c) in enumerate(zip(bad.qids, bad.counts.tolist()))}
    calls.clear()
    assert _rows_bytes(tmp_path, [bad], "bm25") == _dict_bytes(tmp_path, run, "bm25")
    assert calls == ([20] if runbytes.HAVE_NUMBA else [])


def test_id_tables_refuse_ids_a_run_cannot_hold():
    ok = runbytes.id_table(np.frombuffer(b"ab", np.uint8), np.array([0, 1, 2]), np.array([0, 1]))
    assert (ok is not None) == runbytes.HAVE_NUMBA
    for data, offsets in ((b"a b", [0, 1, 3]), (b"a\xc3\xa9", [0, 1, 3]), (b"ab", [0, 0, 2]), (b"a\tb", [0, 1, 3])):
        assert runbytes.id_table(np.frombuffer(data, np.uint8), np.array(offsets), np.array([0, 1])) is None


def test_a_run_cut_short_leaves_the_earlier_file_whole(tmp_path):
    """The run appears whole or not at all: a write that fails part-way (here a NaN score in
    the second part, after the first was written) leaves the earlier file as it was and no
    temporary file beside it; a write that succeeds replaces it. A symlink is written
    through, in place."""
    run, rows = _random_rows(4)
    good = tmp_path / "run.trec"
    write_run_rows(good, [rows], tag="t", tiebreak=True)
    before = good.read_bytes()
    scores = rows.scores.copy()
    scores[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        write_run_rows(good, [rows, rows._replace(scores=scores)], tag="t", tiebreak=True)
    with pytest.raises(ValueError, match="NaN"):
        write_run(good, {"q": {"d": float("nan")}}, tag="t")
    assert good.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["run.trec"]
    half = len(rows.qids) // 2
    write_run_rows(good, [RunRows(rows.qids[:half], rows.doc_ids[:half], rows.scores[:half], rows.counts[:half])],
                   tag="t", tiebreak=True)
    assert good.read_bytes() != before and before.startswith(good.read_bytes())
    link = tmp_path / "link.trec"
    link.symlink_to(good)
    write_run_rows(link, [rows], tag="t", tiebreak=True)
    assert link.is_symlink() and good.read_bytes() == before


def test_compiled_round4_is_pythons_round_bit_for_bit():
    """``runbytes._round4`` (the compiled tie-break's rounding) against ``round(x, 4)``: random
    scores, values a few ulps around every kind of half at the 4th decimal, exact binary
    halves (odd multiples of 1/32, where half-to-even decides), tiny values and the range
    ends; NaN outside (0, 1e11). Without numba there is no compiled pass to check."""
    if not runbytes.HAVE_NUMBA:
        assert runbytes._round4 is None and runbytes.write_rows(print, ["q"], None, None, None, None, "t") == 0
        return
    rng = np.random.default_rng(8)
    halves = (rng.integers(0, 10**7, 4000) + 0.5) / 1e4
    near = np.concatenate([np.nextafter(halves, np.inf), halves, np.nextafter(halves, -np.inf),
                           np.nextafter(np.nextafter(halves, np.inf), np.inf)])
    exact = (2 * rng.integers(0, 10**6, 2000) + 1) / 32.0
    x = np.concatenate([rng.uniform(0, 40, 20000), rng.uniform(0, 1e10, 2000), near, exact,
                        [1e-300, 5e-5, 4.9999e-5, 5.00001e-5, 1e-4, 0.00015, 2.675, 0.125, 99999999999.99]])
    x = x[(x > 0) & (x < 1e11)]
    got = [runbytes._round4(v) for v in x.tolist()]
    assert got == [round(v, 4) for v in x.tolist()]
    for bad in (0.0, -1.0, 1e11, np.inf, np.nan):
        assert np.isnan(runbytes._round4(bad))
