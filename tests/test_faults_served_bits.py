"""Bytes that change under a running server (issue 46, item 2): a flipped bit in a served
postings file never crashes the process.

A version is memory-mapped once it is opened, so damage that leaves a file's size and mtime
as they were (a failing disk, a bad copy over it) reaches the next query's reads; the
structure checks of the open cannot see it. Before this, one huge document id in
``docs.npy`` made the next query on that term segfault the server. Now the kernels check
every value they index with, the query fails with a 503 naming the file, the version is
marked damaged as the background scrub marks it, and later queries get a clear error.

Real indexes (built with the local engine), real files changed in place, a real
``funnel serve`` process on 127.0.0.1. The random-corruption loop runs in a subprocess of
its own: a crash there must fail the test, not kill pytest.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from fields_corpus import write_corpus
from funnel.pipelines.store.artifacts import IndexFormatError, load_manifest, new_staging_dir, publish, read_current, \
    read_stamps
from funnel.serving.errors import IndexDamaged
from funnel.serving.index import IndexVersion
from funnel.serving.search import Searcher
from servers import free_port

TERM = "river"  # a word of most documents of fields_corpus: postings in every block shape
SHARD = "lexical/shard-0000"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> str:
    """A 1,200-document index with fields (2 shards, local engine), built once here."""
    from funnel.jobs.build_index import build
    d = tmp_path_factory.mktemp("served-bits")
    corpus = str(d / "corpus.jsonl")
    write_corpus(corpus, n_docs=1200, seed=5)
    build(corpus, str(d / "ix"), shards=2, engine="local")
    return str(d / "ix")


@pytest.fixture
def root(built, tmp_path) -> str:
    r = str(tmp_path / "ix")
    shutil.copytree(built, r)
    return r


def _vdir(root: str) -> str:
    return os.path.join(root, read_current(root))


def _term_place(vdir: str, word: str = TERM, shard: str = SHARD) -> tuple[int, int, int]:
    """(local term id, first posting, end) of ``word``'s postings in ``shard``."""
    ix = IndexVersion(vdir, verify="none")
    try:
        g = ix.vocab[ix.analyzer.analyze(word)[0]]
        gid = np.load(os.path.join(vdir, shard, "term_gid.npy"))
        li = int(np.searchsorted(gid, g))
        assert gid[li] == g
        ptr = np.load(os.path.join(vdir, shard, "indptr.npy"))
        return li, int(ptr[li]), int(ptr[li + 1])
    finally:
        ix.close()


def overwrite(path: str, index: int, value) -> None:
    """Put ``value`` at element ``index`` of the .npy file at ``path`` in place (same inode,
    size and mtime): what decay below the file system does to a served file."""
    st = os.stat(path)
    arr = np.load(path, mmap_mode="r")
    raw = np.asarray([value], dtype=arr.dtype).tobytes()
    with open(path, "r+b") as f:
        f.seek(arr.offset + index * arr.dtype.itemsize)
        f.write(raw)
    del arr
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


def _damage(vdir: str, name: str) -> tuple[str, dict]:
    """Damage ``name`` of shard 0 where a query on TERM reads it; (file, the request that
    reads it: the search body's extra keys)."""
    li, a, e = _term_place(vdir)
    path = os.path.join(vdir, SHARD, name)
    if name == "docs.npy":
        overwrite(path, a + 1, 0x7FFF0000)  # a document id two billion past the shard
        return f"{SHARD}/docs.npy", {}
    if name == "indptr.npy":
        overwrite(path, li + 1, 1 << 40)  # the term's postings run far past docs.npy
        return f"{SHARD}/indptr.npy", {}
    if name == "tfs.npy":
        # tf 0: an impact of 0 (a document listed twice in a touched list). Read where the
        # impacts of other parameters are computed from the tfs.
        overwrite(path, a + 2, 0)
        return f"{SHARD}/tfs.npy", {"options": {"k1": 1.3}}
    if name == "block_start.npy":
        overwrite(path, li, int(np.load(path)[li]) + 1)  # the term's blocks shifted by one
        return f"{SHARD}/block_start.npy", {"filter": {"cat": "memo"}}  # filtered BM25 prunes by blocks
    raise AssertionError(name)


# -- a real `funnel serve` process ------------------------------------------------------------

class Served:
    """``funnel serve ROOT`` in a process of its own on 127.0.0.1, until closed."""

    def __init__(self, root: str, log_path: str):
        self.port = free_port()
        self.log = open(log_path, "w")
        env = dict(os.environ, RAY_AUTH_MODE="disabled")
        self.proc = subprocess.Popen([sys.executable, "-m", "funnel.serving.frontends.cli", "serve", root, "--port",
                                      str(self.port), "--scrub-interval", "0"], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)
        deadline = time.monotonic() + 300  # a fresh install compiles the kernels at the warm-up
        while True:
            assert self.proc.poll() is None, open(log_path).read()
            try:
                if self.http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "funnel serve did not come up"
            time.sleep(0.2)

    def close(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


@pytest.mark.parametrize("name", ["docs.npy", "indptr.npy", "tfs.npy", "block_start.npy"])
def test_a_damaged_served_file_is_a_503_naming_it_and_the_server_lives(root, tmp_path, name):
    vdir = _vdir(root)
    log_path = str(tmp_path / "serve.log")
    srv = Served(root, log_path)
    try:
        body = {"query": TERM, "k": 5}
        r = srv.http.post("/search", json=body)
        assert r.status_code == 200 and r.json()["hits"], r.text
        rel, extra = _damage(vdir, name)
        r = srv.http.post("/search", json={**body, **extra})
        assert srv.proc.poll() is None, "the server died"
        assert r.status_code == 503, r.text
        msg = r.json()["error"]
        assert rel in msg and "damaged" in msg and "funnel verify" in msg, msg
        # Marked damaged as the scrub marks it: nothing left to serve (one version), /health
        # names the file, and this host's verification record of it is gone.
        h = srv.http.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "unavailable", h.text
        assert [d["file"] for d in h.json()["damaged"]] == [rel]
        assert rel not in read_stamps(vdir)
        # Later queries, on any term: a clear error naming the file, never a crash.
        for q in (TERM, "apple", "lantern meadow"):
            r = srv.http.post("/search", json={"query": q, "k": 3})
            assert r.status_code == 503 and rel in r.json()["error"], r.text
        assert srv.proc.poll() is None
    finally:
        srv.close()
    logged = open(log_path).read()
    assert rel in logged and "found while answering a query" in logged, logged
    with pytest.raises(IndexFormatError, match=rel.replace(".", r"\.")):  # a restart refuses the version
        IndexVersion(root)


def test_a_query_finding_damage_falls_back_to_the_last_good_version(root):
    staging = new_staging_dir(root)  # v2: a copy of v1, as a rebuild publishes
    shutil.copytree(_vdir(root), staging, dirs_exist_ok=True)
    v2 = publish(root, staging, load_manifest(staging))
    with Searcher(root) as s:
        assert s.version == v2
        want = [h.doc_id for h in s.search(TERM, k=5).hits]
        rel, _ = _damage(os.path.join(root, v2), "docs.npy")
        with pytest.raises(IndexDamaged, match=rel) as e:
            s.search(TERM, k=5)
        assert e.value.file == os.path.join(root, v2, rel)
        st = s.status()
        assert st["state"] == "degraded" and st["serving_version"] == "v000001" and rel in st["reason"]
        assert [h.doc_id for h in s.search(TERM, k=5).hits] == want  # the last good version answers
        assert [d["file"] for d in s.follower.damaged()] == [rel]


def test_an_in_process_version_refuses_every_later_query(root):
    """Without a follower (a retriever over one opened version): the first query that meets
    the damage and every later one raise IndexDamaged naming the file."""
    vdir = _vdir(root)
    with Searcher(root) as s:
        bm = s.bm25
        s.search(TERM)
        rel, _ = _damage(vdir, "indptr.npy")
        ix = s.index
        ix.on_damage = None  # this version only: no quarantine
        for terms in ({TERM: 1.0}, {"appl": 1.0}, {TERM: 1.0}):  # the first meets it; later ones, any term
            with pytest.raises(IndexDamaged, match=rel):
                bm.search_arrays(terms, 5)
        assert ix.damage is not None and ix.damage[0] == rel


def test_damage_in_the_passage_index_marks_the_version(tmp_path, monkeypatch):
    """Passage BM25 (``--bm25-passages``) searches a second index inside the version: damage
    found there is the version's, named by its path under the version folder."""
    from funnel.jobs.build_index import build
    monkeypatch.setenv("FUNNEL_CACHE", str(tmp_path / "cache"))
    corpus = str(tmp_path / "corpus.jsonl")
    write_corpus(corpus, n_docs=120, seed=3)
    rep = build(corpus, str(tmp_path / "ix"), shards=1, engine="local", dense=True, bm25_passages=True)
    vdir = os.path.join(str(tmp_path / "ix"), rep.version)
    sub = rep.bm25_passages["dir"]  # the passage index's folder in the version
    with Searcher(str(tmp_path / "ix")) as s:
        assert s.search(TERM, k=3).hits
        li, a, _ = _term_place(os.path.join(vdir, sub))
        overwrite(os.path.join(vdir, sub, SHARD, "docs.npy"), a, -7)
        rel = f"{sub}/{SHARD}/docs.npy"
        with pytest.raises(IndexDamaged, match=rel):
            s.search(TERM, k=3)
        assert s.status()["state"] == "unavailable" and [d["file"] for d in s.follower.damaged()] == [rel]
        with pytest.raises(IndexFormatError, match=rel):
            s.search("apple", k=3)


# -- random corruption, every BM25 path, in a process of its own -------------------------------

def test_random_corruption_never_crashes_any_bm25_path(root, tmp_path):
    """Bits and bytes flipped and extreme values written at random places of every lexical
    array (a fixed seed), each after a version is opened, then queries on every BM25 path:
    each answers with well-formed results or raises IndexDamaged; nothing else, no crash."""
    out = str(tmp_path / "summary.json")
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    r = subprocess.run([sys.executable, __file__, root, out, "7", "160"], capture_output=True, text=True,
                       timeout=1500, env=env, cwd=os.path.dirname(__file__))
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    summary = json.load(open(out))
    assert summary["unexpected"] == [], summary["unexpected"][:5]
    per = summary["files"]
    assert all(per[name]["trials"] > 0 for name in FILES), per  # every array was damaged
    assert sum(x["damaged"] for x in per.values()) > 0 and sum(x["answered"] for x in per.values()) > 0, per
    # An impossible value in each array a kernel indexes by, where a query reads it: caught,
    # naming that file.
    assert summary["targeted"] == [[name, True] for name, _, _ in TARGETED], summary["targeted"]


FILES = ("docs.npy", "indptr.npy", "tfs.npy", "impacts.npy", "block_start.npy", "doclen.npy", "block_max.npy",
         "block_last.npy", "term_gid.npy", "term_kth.npy", "term_max.npy", "term_max_tf.npy", "term_min_dl.npy")
QUERIES = ["river", "river stone market", "apple bridge castle dolphin", "lantern meadow thunder canyon pepper",
           "signal garden engine harbor ledger window orbit copper valley", "violet anchor pilot river stone"]


def _well_formed(dn, sc, k: int, sizes: list[int]) -> bool:
    dn = np.asarray(dn)
    if len(dn) > k or len(dn) != len(sc):
        return False
    s, local = dn >> 32, dn & 0xFFFFFFFF
    return bool(((s >= 0) & (s < len(sizes))).all() and (local < np.asarray(sizes)[s]).all())


def _paths(ix, k: int):
    """(name, run) of every BM25 path over ``ix``: each run answers QUERIES one way and
    returns (docnos, scores) per query."""
    from funnel.serving import filters
    from funnel.serving.lexical import retriever as lexical, masked
    from funnel.serving.lexical.bm25 import BM25Params
    from funnel.serving.lexical.retriever import BM25Retriever
    from funnel.serving.search import VersionSearcher

    vs = VersionSearcher(ix)

    def one(bm, params=None, weights=None):
        return [bm.search_arrays(weights or dict(bm.query_terms(q)), k, params) for q in QUERIES]

    def retriever(**kw):
        bm = BM25Retriever(ix)
        for a, v in kw.items():
            setattr(bm, a, v)
        return bm

    def batch(bm):
        pos, sc, cnt = bm.search_texts(QUERIES, k)
        off = np.cumsum([0] + [s.n_docs for s in ix.shards])
        out = []
        for i in range(len(QUERIES)):
            p = pos[i, :cnt[i]]
            shard = np.searchsorted(off, p, side="right") - 1
            out.append(((shard.astype(np.int64) << 32) | (p - off[shard]), sc[i, :cnt[i]]))
        return out

    def stored32():  # the build's 16-bit impact levels, rescored exactly (an index past IMPACT_POSTINGS)
        old = lexical.IMPACT_POSTINGS
        lexical.IMPACT_POSTINGS = 0
        try:
            return one(retriever(rescore_min_postings=0, dense_min_docs=-1)) + \
                one(retriever(rescore_min_postings=0, dense_min_docs=0))
        finally:
            lexical.IMPACT_POSTINGS = old

    def masked_runs(strategy):
        old = masked.STRATEGY
        masked.STRATEGY = strategy
        try:
            bm = retriever()
            with filters.scope(vs.mask({"cat": "memo"}, None)):
                return one(bm) + one(retriever(prune_min_postings=0)) + one(bm, BM25Params(k1=1.1))
        finally:
            masked.STRATEGY = old

    def numpy_masked():
        with filters.scope(vs.mask({"cat": "memo"}, None)):
            return one(retriever(kernels=False))

    return [
        ("exhaustive", lambda: one(retriever())),
        ("exhaustive-dense", lambda: one(retriever(dense_min_docs=0))),
        ("batch", lambda: batch(retriever())),
        ("batch-pruned", lambda: batch(retriever(prune_min_postings=0))),
        ("pruned-blocks", lambda: one(retriever(prune_min_postings=0))),
        ("pruned-term-bounds", lambda: one(retriever(prune_min_postings=0), BM25Params(k1=1.2, b=0.5))),
        ("exact-lengths", lambda: one(retriever(prune_min_postings=0), BM25Params(length_norm="exact"))),
        ("negative-weight", lambda: [retriever().search_arrays({"river": 1.0, "stone": -0.5}, k)]),
        ("stored-levels", stored32),
        ("masked-auto", lambda: masked_runs("auto")),
        ("masked-candidates", lambda: masked_runs("candidates")),
        ("masked-blocks", lambda: masked_runs("blocks")),
        ("numpy-reference", lambda: one(retriever(kernels=False))),
        ("numpy-masked", lambda: numpy_masked()),
        ("explain", lambda: [(np.zeros(0, np.int64), np.zeros(0)) for _ in
                             [retriever().explain({"river": 1.0, "stone": 1.0}, 0)]]),
    ]


def _corrupt(rng: random.Random, vdir: str, name: str, targets: dict) -> list[tuple[str, int, bytes]]:
    """Damage ``name`` of one shard at a random place (a bit, a byte, an extreme value of the
    element's type, or a run of up to 4 KiB of zeros or random bytes: a bad sector), half the
    time inside what a query reads; the (path, offset, old bytes) to put back."""
    shard = rng.choice(sorted(targets))
    path = os.path.join(vdir, shard, name)
    arr = np.load(path, mmap_mode="r")
    n, size = len(arr), arr.dtype.itemsize
    lo, hi = targets[shard].get(name, (0, n))
    i = rng.randrange(lo, max(lo + 1, min(hi, n))) if rng.random() < 0.5 else rng.randrange(n)
    kind = rng.randrange(4)
    if kind == 3:  # a run of bytes
        at = arr.offset + i * size
        run = min(rng.randrange(1, 4097), arr.offset + n * size - at)
        new = bytes(run) if rng.random() < 0.5 else bytes(rng.randrange(256) for _ in range(run))
        bit = 0
    elif kind == 0:  # one bit
        at = arr.offset + i * size + rng.randrange(size)
        new = None
        bit = 1 << rng.randrange(8)
    elif kind == 1:  # one byte
        at = arr.offset + i * size + rng.randrange(size)
        new = bytes([rng.randrange(256)])
    elif kind == 2:  # an extreme value of the element's type
        at = arr.offset + i * size
        if arr.dtype.kind == "f":
            v = rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e30, -0.0])
        else:
            info = np.iinfo(arr.dtype)
            v = rng.choice([-1, 0, info.max, info.min, 1 << 20, int(arr[i]) + 1, int(arr[i]) - 1])
            v = max(info.min, min(info.max, v))
        new = np.asarray([v], dtype=arr.dtype).tobytes()
    del arr
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(len(new) if new is not None else 1)
        f.seek(at)
        f.write(new if new is not None else bytes([old[0] ^ bit]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return [(path, at, old)]


def _restore(undo) -> None:
    for path, at, old in undo:
        st = os.stat(path)
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(old)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _trials(root: str, out: str, seed: int, n: int) -> None:
    """The subprocess of ``test_random_corruption_never_crashes_any_bm25_path``."""
    import logging
    logging.disable(logging.ERROR)  # each damage found logs an error: expected here
    rng = random.Random(seed)
    vdir = _vdir(root)
    ix0 = IndexVersion(vdir, verify="none")
    targets = {}  # per shard: per file, the element range a query on TERM reads
    for s, sh in enumerate(ix0.shards):
        g = ix0.vocab[ix0.analyzer.analyze(TERM)[0]]
        li = int(np.searchsorted(sh.term_gid, g))
        if li < len(sh.term_gid) and sh.term_gid[li] == g:
            a, e = int(sh.indptr[li]), int(sh.indptr[li + 1])
            b0, b1 = (int(x) for x in sh.stored_blocks[1][0][li:li + 2])
            targets[sh.rel] = {"docs.npy": (a, e), "tfs.npy": (a, e), "impacts.npy": (a, e),
                               "indptr.npy": (li, li + 2), "block_start.npy": (li, li + 2),
                               "block_max.npy": (b0, b1), "block_last.npy": (b0, b1),
                               "term_gid.npy": (li, li + 1), "term_max.npy": (li, li + 1),
                               "term_max_tf.npy": (li, li + 1), "term_min_dl.npy": (li, li + 1)}
    sizes = [sh.n_docs for sh in ix0.shards]
    ix0.close()
    files = {f: {"trials": 0, "damaged": 0, "answered": 0} for f in FILES}
    unexpected = []
    k = 10

    def run_all(ix, tag):
        damaged = answered = 0
        for pname, run in _paths(ix, k):
            ix.damage = None  # every path meets the damage afresh (the version refuses queries once marked)
            try:
                for dn, sc in run():
                    if not _well_formed(dn, sc, k, sizes):
                        unexpected.append(f"{tag} {pname}: malformed result {dn!r}")
                answered += 1
            except IndexDamaged:
                damaged += 1
            except Exception as e:  # noqa: BLE001 - anything else is what this test looks for
                unexpected.append(f"{tag} {pname}: {type(e).__name__}: {e}")
        return damaged, answered

    for t in range(n):
        name = FILES[t % len(FILES)]
        ix = IndexVersion(vdir, verify="none")  # opened (and checked) before the damage, as a server's
        if t % 2:  # half: the caches (tables, impacts) made before the damage, as after a warm-up
            run_all(ix, f"warm {t}")
            ix.damage = None
        undo = _corrupt(rng, vdir, name, targets)
        try:
            d, a = run_all(ix, f"trial {t} {name}")
        finally:
            _restore(undo)
            ix.close()
        files[name]["trials"] += 1
        files[name]["damaged"] += d
        files[name]["answered"] += a
    targeted = []
    for name, value, how in TARGETED:
        ix = IndexVersion(vdir, verify="none")
        lo, _ = targets[SHARD][name]
        path = os.path.join(vdir, SHARD, name)
        at = lo + 1 if name in ("docs.npy", "tfs.npy", "impacts.npy", "indptr.npy") else lo
        arr = np.load(path, mmap_mode="r")
        undo = [(path, arr.offset + at * arr.dtype.itemsize, arr[at:at + 1].tobytes())]
        del arr
        overwrite(path, at, value)
        try:
            found = None
            try:
                _targeted_query(ix, how, k)
            except IndexDamaged as e:
                found = e.file
            targeted.append([name, found is not None and found.endswith(f"{SHARD}/{name}")])
        finally:
            _restore(undo)
            ix.close()
    json.dump({"files": files, "unexpected": unexpected, "targeted": targeted}, open(out, "w"))


#: (file, value, how the query reads it) of the targeted cases: the value is written at the
#: second posting of TERM in shard 0 (its first index entry for indptr / block_start).
TARGETED = [("docs.npy", -5, "pruned"), ("docs.npy", 2**31 - 1, "exhaustive"), ("indptr.npy", -1, "exhaustive"),
            ("tfs.npy", 0, "pruned"), ("tfs.npy", 0, "other-k1"), ("impacts.npy", 0, "stored-levels"),
            ("block_start.npy", 1 << 40, "pruned"),
            ("block_start.npy", 1 << 40, "masked")]


def _targeted_query(ix, how: str, k: int) -> None:
    from funnel.serving import filters
    from funnel.serving.lexical import retriever as lexical
    from funnel.serving.lexical.bm25 import BM25Params
    from funnel.serving.lexical.retriever import BM25Retriever
    from funnel.serving.search import VersionSearcher
    bm = BM25Retriever(ix)
    if how == "pruned":
        bm.prune_min_postings = 0
        bm.search_arrays({TERM: 1.0, "stone": 1.0}, k)
    elif how == "exhaustive":
        bm.search_arrays({TERM: 1.0}, k)
    elif how == "other-k1":  # impacts computed from the tfs
        bm.search_arrays({TERM: 1.0}, k, BM25Params(k1=1.4))
    elif how == "stored-levels":
        old = lexical.IMPACT_POSTINGS
        lexical.IMPACT_POSTINGS = 0
        try:
            bm.rescore_min_postings, bm.dense_min_docs = 0, -1
            bm.search_arrays({TERM: 1.0}, k)
        finally:
            lexical.IMPACT_POSTINGS = old
    else:
        with filters.scope(VersionSearcher(ix).mask({"cat": "memo"}, None)):
            bm.search_arrays({TERM: 1.0}, k)


if __name__ == "__main__":
    _trials(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
