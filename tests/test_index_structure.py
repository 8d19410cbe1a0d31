"""Damaged postings never reach the compiled kernels (issue 37, item 2).

The kernels read the memory-mapped arrays through raw pointers: a document id past the
shard made the process die with SIGSEGV. Each open now checks the invariants they rely on
(``serving.structure``) and refuses the version with an IndexFormatError naming the file.
Opens that could crash run in a child process, so a segfault is a failed test, not a dead
pytest. Every test damages a copy of the session's demo index (``demo_index_1``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from funnel.pipelines.store import artifacts
from funnel.pipelines.store.artifacts import VERIFIED, IndexFormatError, load_manifest, read_current
from funnel.serving.structure import check_shard

SHARD = "lexical/shard-0000"


@pytest.fixture
def root(demo_index_1, tmp_path) -> str:
    r = str(tmp_path / "ix")
    shutil.copytree(demo_index_1, r, ignore=shutil.ignore_patterns(".readers", VERIFIED))
    return r


def _vdir(root: str) -> str:
    return os.path.join(root, read_current(root))


def trust_as_hashed(vdir: str) -> None:
    """Record every file of ``vdir`` as hashed on this host with its manifest sha256 and its
    stat now: what an earlier ``cached`` open leaves, so the next one hashes nothing."""
    stamps = {}
    for rel, meta in load_manifest(vdir)["files"].items():
        st = os.stat(os.path.join(vdir, rel))
        stamps[rel] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, meta["sha256"]]
    artifacts.write_stamps(vdir, stamps)


def rot(vdir: str, rel: str, edit) -> None:
    """Damage ``rel`` in place as a failing disk does: ``edit(bytearray)`` changes bytes, the
    size and mtime stay, and the file's record is brought to its new stat (ctime cannot be
    set back from user space; decay below the file system would not have moved it)."""
    path = os.path.join(vdir, rel)
    st = os.stat(path)
    raw = bytearray(open(path, "rb").read())
    edit(raw)
    assert len(raw) == st.st_size
    with open(path, "r+b") as f:
        f.write(raw)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    trust_as_hashed(vdir)


def set_npy(vdir: str, rel: str, index: int, value: int) -> None:
    """``rot`` one element of a ``.npy`` array to ``value``."""
    arr = np.load(os.path.join(vdir, rel), mmap_mode="r")
    at = arr.offset + (index % len(arr)) * arr.dtype.itemsize

    def edit(raw: bytearray) -> None:
        raw[at:at + arr.dtype.itemsize] = np.asarray([value], dtype=arr.dtype).tobytes()
    rot(vdir, rel, edit)


# A child process: open each root given (verify="cached", the default) and search it every
# way the kernels can (exhaustive, exact lengths, block-max pruning, batch); one line each.
OPEN_AND_SEARCH = r"""
import sys
from funnel.pipelines.store.artifacts import IndexFormatError
from funnel.serving.search import Searcher

for root in sys.argv[1:]:
    print("CASE", root, end=": ", flush=True)
    try:
        s = Searcher(root)
    except IndexFormatError as e:
        print("REFUSED", " ".join(str(e).split()), flush=True)
        continue
    s.warm()
    for q in ("parse command line arguments", "json encode decode", "thread lock queue"):
        s.search(q, k=10)
        s.search(q, k=10, length_norm="exact")
    s.bm25.prune_min_postings = 0  # the block-max pruning kernel too
    s.search("parse command line arguments", k=10)
    s.search_batch({"a": "json encode", "b": "thread lock"}, k=10)
    s.close()
    print("ANSWERED", flush=True)
"""


def _child(*roots: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", OPEN_AND_SEARCH, *roots], capture_output=True, text=True,
                          timeout=600)


def _answers(p: subprocess.CompletedProcess) -> dict[str, str]:
    """{root: what its open did}; fails naming the case where the child crashed."""
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("CASE ")]
    if p.returncode != 0:
        last = lines[-1] if lines else "before the first case"
        pytest.fail(f"the child crashed (exit {p.returncode}) at {last}: {p.stderr[-2000:]}")
    return {ln[5:].split(": ", 1)[0]: ln.split(": ", 1)[1] for ln in lines}


def test_rotted_docs_npy_is_refused_under_cached_verify(root):
    """The probe's case: docs.npy damaged with size and mtime unchanged, so the cached open
    hashes nothing; the default open refuses it naming the file (it used to segfault)."""
    vdir = _vdir(root)
    trust_as_hashed(vdir)
    n = len(np.load(os.path.join(vdir, SHARD, "docs.npy"), mmap_mode="r"))
    for i in range(n // 2, n // 2 + 40):
        set_npy(vdir, f"{SHARD}/docs.npy", i, 1 << 30)
    got = _answers(_child(root))[root]
    assert got.startswith("REFUSED"), got
    assert f"{SHARD}/docs.npy" in got and "document id 1073741824" in got


def _offsets_at(raw: bytearray, first: list[int]) -> int:
    at = raw.find(np.asarray(first, dtype=np.int32).tobytes())
    assert at >= 0
    return at


def _string_offset(column: int):
    """An edit of an Arrow file: the third offset of its ``column``-th string column's
    offsets (found by their bytes) pointed far past the data."""
    def edit(raw: bytearray, path: str) -> None:
        import pyarrow as pa
        table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        arr = table.column(column).chunk(0)
        off = np.frombuffer(arr.buffers()[1], dtype=np.int32)[:4].tolist()
        at = _offsets_at(raw, off) + 8
        raw[at:at + 4] = np.asarray([1 << 30], dtype=np.int32).tobytes()
    return edit


def _rank_out_of_range(raw: bytearray, path: str) -> None:
    import pyarrow as pa
    rank = pa.ipc.open_file(pa.memory_map(path)).read_all().column("rank").to_numpy()
    at = raw.find(rank.astype(np.int64).tobytes())
    assert at >= 0
    raw[at:at + 8] = np.asarray([len(rank) + 5], dtype=np.int64).tobytes()


# (file, element index (negative: from the end), value) or (file, edit(raw, path)): each
# breaks one invariant the kernels or the readers rely on.
DAMAGE = {
    "doc id past the shard": (f"{SHARD}/docs.npy", 7, 1 << 30),
    "negative doc id": (f"{SHARD}/docs.npy", 11, -1),
    "doc ids out of order": (f"{SHARD}/docs.npy", 1, 0),
    "zero tf (uint16: none is negative)": (f"{SHARD}/tfs.npy", 5, 0),
    "zero tf": (f"{SHARD}/tfs.npy", 3, 0),
    "indptr past the postings": (f"{SHARD}/indptr.npy", 9, 1 << 40),
    "indptr end": (f"{SHARD}/indptr.npy", -1, 3),
    "negative length": (f"{SHARD}/doclen.npy", 2, -3),
    "term id past the vocabulary": (f"{SHARD}/term_gid.npy", -1, 1 << 30),
    "term ids out of order": (f"{SHARD}/term_gid.npy", 4, 0),
    "min length past the longest": (f"{SHARD}/term_min_dl.npy", 6, 1 << 30),
    "negative max tf": (f"{SHARD}/term_max_tf.npy", 6, -1),
    "block starts": (f"{SHARD}/block_start.npy", 8, 1 << 20),
    "rank past the documents": ("docs/ids.arrow", _rank_out_of_range),
    "doc_id offsets": ("docs/ids.arrow", _string_offset(0)),
    "vocabulary offsets": ("lexical/vocab.arrow", _string_offset(0)),
}


def test_every_kind_of_damage_is_refused_naming_the_file(root, tmp_path):
    """Each damage in DAMAGE, applied to its own copy, is refused at the default open
    naming the file; none crashes the process that opens it."""
    roots = {}
    for i, (name, (rel, *how)) in enumerate(DAMAGE.items()):
        r = str(tmp_path / f"case{i}")
        shutil.copytree(root, r)
        vdir = _vdir(r)
        trust_as_hashed(vdir)
        if len(how) == 2:
            set_npy(vdir, rel, *how)
        else:
            rot(vdir, rel, lambda raw, p=os.path.join(vdir, rel), f=how[0]: f(raw, p))
        roots[name] = (r, rel)
    got = _answers(_child(*(r for r, _ in roots.values())))
    for name, (r, rel) in roots.items():
        assert got[r].startswith("REFUSED"), f"{name}: {got[r]}"
        assert rel in got[r], f"{name}: the error does not name {rel}: {got[r]}"


def _shard(**override) -> dict[str, np.ndarray]:
    """Two terms over three documents: term 0 in docs 0 and 2, term 1 in doc 1."""
    a = {"indptr": np.array([0, 2, 3], np.int64), "docs": np.array([0, 2, 1], np.int32),
         "tfs": np.array([1, 3, 2], np.int32), "doclen": np.array([4, 2, 5], np.int32),
         "term_gid": np.array([3, 7], np.int32), "term_max_tf": np.array([3, 2], np.int32),
         "term_min_dl": np.array([4, 2], np.int32)}
    a.update({k: np.asarray(v, dtype=a[k].dtype) for k, v in override.items()})
    return a


def test_a_sound_shard_passes():
    check_shard("/v", SHARD, _shard(), n_docs=3, n_terms=10)


@pytest.mark.parametrize("override, n_docs, file, words", [
    ({"docs": [0, 3, 1]}, 3, "docs.npy", "document id 3"),
    ({"docs": [2, 0, 1]}, 3, "docs.npy", "ascend"),
    ({"tfs": [1, -1, 2]}, 3, "tfs.npy", "term frequency -1"),
    ({"tfs": [1, 3]}, 3, "tfs.npy", "one tf per posting"),
    ({"indptr": [0, 4, 3]}, 3, "indptr.npy", "decreases"),
    ({"indptr": [0, 2, 2]}, 3, "indptr.npy", "expected 0 to 3"),
    ({"indptr": [0, 3]}, 3, "indptr.npy", "expected 3"),
    ({"doclen": [4, -2, 5]}, 3, "doclen.npy", "document length -2"),
    ({}, 4, "doclen.npy", "holds 4 documents"),
    ({"term_gid": [7, 3]}, 3, "term_gid.npy", "does not increase"),
    ({"term_gid": [3, 10]}, 3, "term_gid.npy", "global term id 10"),
    ({"term_min_dl": [4, 6]}, 3, "term_min_dl.npy", "bound 6"),
    ({"term_max_tf": [3]}, 3, "term_max_tf.npy", "one per term"),
])
def test_each_broken_invariant_names_its_file(override, n_docs, file, words):
    with pytest.raises(IndexFormatError) as e:
        check_shard("/v", SHARD, _shard(**override), n_docs=n_docs, n_terms=10)
    assert f"/v/{SHARD}/{file}" in str(e.value) and words in str(e.value)


@pytest.mark.parametrize("chunk", [1, 2, 3, 1 << 20])
def test_the_order_check_holds_across_its_steps(monkeypatch, chunk):
    """Terms of 3, 0, 2 and 1 postings; every drop in order inside a term is found, in any
    step size, and the drops between terms are not."""
    from funnel.serving import structure
    monkeypatch.setattr(structure, "_CHUNK", chunk)
    a = _shard(indptr=[0, 3, 3, 5, 6], docs=[0, 1, 2, 0, 2, 1], tfs=[1] * 6, term_gid=[1, 2, 3, 4],
               term_max_tf=[1] * 4, term_min_dl=[2] * 4)
    check_shard("/v", SHARD, a, n_docs=3, n_terms=10)
    for at, value in ((1, 0), (2, 1), (4, 0)):
        docs = a["docs"].copy()
        docs[at] = value
        with pytest.raises(IndexFormatError, match=f"position {at}"):
            check_shard("/v", SHARD, dict(a, docs=docs), n_docs=3, n_terms=10)


def test_block_maxima_must_match_the_postings():
    a = _shard()
    blocks = ({"block": 64, "kth": [10, 100, 1000]},
              (np.array([0, 1, 2]), np.zeros(2), np.zeros(2), np.zeros(6), np.zeros(2, np.int32)))
    check_shard("/v", SHARD, a, 3, 10, blocks)
    bad = (blocks[0], (np.array([0, 2, 3]),) + blocks[1][1:])
    with pytest.raises(IndexFormatError, match="block_start.npy"):
        check_shard("/v", SHARD, a, 3, 10, bad)
    short = (blocks[0], blocks[1][:3] + (np.zeros(5),) + blocks[1][4:])
    with pytest.raises(IndexFormatError, match="term_kth.npy"):
        check_shard("/v", SHARD, a, 3, 10, short)


def test_structure_checks_leave_a_sound_index_open(root):
    """The demo index itself passes every check and answers (no false alarm)."""
    assert _answers(_child(root)) == {root: "ANSWERED"}
