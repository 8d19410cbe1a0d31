"""BM25 per workload: natural-language and generated queries over Zipf and topical corpora, funnel vs bm25s vs PISA.

    .venv/bin/python bench/bench_workloads.py --size 1m [--corpora zipf,topical] [--queries 300] [--rounds 5] [--write]
    .venv/bin/python bench/bench_workloads.py --from-results RUN_A.json,RUN_B.json --write   # one run per corpus

``bench/bench_scale.py`` times one workload (``bench/synth.py``'s own short queries, which
lean to rare terms); this script times several, each reported on its own row, because a
speed figure holds only for the queries it was measured on. Per corpus:

- ``zipf``: ``bench/synth.py``'s corpus (Zipf-Mandelbrot pseudo-words, every word spread
  evenly: the worst case for pruning). Real queries are mapped onto it by frequency rank:
  a real term of document-frequency rank r in SciFact + NFCorpus becomes the pseudo-word of
  rank r, so a question's common words stay common.
- ``topical``: ``bench/synth_topical.py``'s corpus (documents drawn from topic mixtures
  fitted to SciFact + NFCorpus, in their real terms): real queries are used as they are,
  reduced to the corpus vocabulary's form (``synth_topical.analyze_query``) so that every
  system sees the same terms.

Workloads: ``scifact`` (SciFact's claims) and ``nfcorpus`` (NFCorpus's queries), read from
the BEIR folder at run time; ``long`` (12-24 distinct terms) and ``short`` (2-4) questions
generated from random documents of the corpus, their terms drawn as the document's tokens
fall (common words come in as often as they do in text, as in a question); on ``zipf``
also ``synth-short``, synth.py's own queries. The first ``--queries`` of each set.

Indexes are built once per corpus and size under ``.funnel/workloads/CORPUS-SIZE/`` (funnel
with its CLI, default engine and shard choice; bm25s numba and PISA as in
``bench/bench_scale.py``) and reused while the corpus's meta.json is unchanged. Timing: one
child process holds all three systems, warm; ``--rounds`` rounds, each running every
workload at k=10 and k=100 on every system in a shuffled order (one thread each: funnel
``Searcher.search_batch``; bm25s ``retrieve(n_threads=0, backend numba)`` on pre-tokenized
queries; PISA's compiled block-max WAND retrieval, ``threads=1``); q/s from the best round
and the median, by wall and by process CPU time. Then one query per call (funnel
``search_batch`` of one query, bm25s tokenize + retrieve, PISA one string) for p50/p99.
Serving RSS: each system alone in a fresh process after answering every workload.
Index bytes per posting (``index_bytes``): each system's lexical files on disk over its number
of postings, by group: the postings themselves, with the block maxima / skip data, and every
file a query process reads (PISA: its compressed index, block-max data and lexicons, not the
uncompressed collection its build leaves beside them); and the serving RSS over the postings.

``--bounds-check-cost`` times funnel alone, twice: its kernels as served, which check every
value they index with against the arrays it indexes (``serving/kernels/checks.py``, "Damaged
files"), and the same kernels compiled without those checks (a second copy of the package,
loaded with ``BOUNDS_CHECK`` off, not cached on disk), interleaved in one process: per round
and workload and k, both in a shuffled order, each a ``search_batch`` of the workload (one
thread, end to end), then both again as the compiled batch alone (``BM25Retriever.search_texts``
on the workload's texts, whose analysis is cached by then). It prints checked ÷ unchecked
process CPU time per workload (the median of the rounds' paired ratios, and the ratio of the
best rounds) and writes its own section (``bounds-check-SIZE``); bm25s and PISA are not built.

    .venv/bin/python bench/bench_workloads.py --bounds-check-cost --size 100k [--rounds 7] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_scale  # noqa: E402
import synth  # noqa: E402
import synth_topical  # noqa: E402
from results import DEFAULT_DATA, report  # noqa: E402

KS = (10, 100)
SYSTEMS = ("funnel", "funnel-packed", "bm25s", "pisa")
# funnel's two postings formats (``funnel build --postings``): plain, the default, and packed
# (bit-packed blocks decoded into a bounded cache, ``serving/lexical/packed.py``), each its own index
# and system in the same run. The ratios are plain funnel's; packed's own are a column beside.
FUNNELS = ("funnel", "funnel-packed")
CORPORA = ("zipf", "topical")
REAL = ("scifact", "nfcorpus")


# -- corpora, indexes, query sets ---------------------------------------------------------------

def corpus_dir(corpus: str, n: int, a) -> str:
    lab = bench_scale.label(n)
    if corpus == "zipf":
        out = os.path.join(a.synth, lab)
        synth.ensure(n, out, a.seed)
    else:
        out = os.path.join(a.synth + "-topical", lab)
        synth_topical.ensure(n, out, a.seed, a.data)
    return out


def _stamp(corpus: str) -> dict:
    with open(os.path.join(corpus, "meta.json")) as f:
        m = json.load(f)
    return {k: m.get(k) for k in ("generator", "version", "n_docs", "seed", "params")}


def ensure_index(system: str, corpus: str, work: str, a) -> dict:
    """Build ``system``'s index of ``corpus`` under ``work/system`` unless a build of this
    corpus is recorded there (``work/system.build.json``); returns that record."""
    record = os.path.join(work, f"{system}.build.json")
    out = os.path.join(work, system)
    try:
        with open(record) as f:
            got = json.load(f)
        if got.get("corpus") == _stamp(corpus) and os.path.exists(out):
            return got
    except (OSError, ValueError):
        pass
    print(f"  building {system} index of {corpus} ...", file=sys.stderr)
    min_avail = int(a.min_avail_gib * bench_scale.GIB)
    if system in FUNNELS:
        m = bench_scale.funnel_build(corpus, out, a.engine, a.shards, work, min_avail,
                                     postings="packed" if system == "funnel-packed" else "plain")
    else:
        m = bench_scale.run_child(f"{system}-build", {"corpus": corpus, "out": out, "threads": os.cpu_count()},
                                  work, min_avail)
    if "failed" in m:
        raise SystemExit(f"{system} build of {corpus} failed: {m['failed']}")
    got = {"corpus": _stamp(corpus), "path": out,
           **{k: m.get(k) for k in ("wall_s", "cpu_s", "load_avg", "peak_tree_rss", "index_bytes", "stages")}}
    with open(record, "w") as f:
        json.dump(got, f, indent=1)
    return got


def _real_queries(name: str, data: str) -> list[tuple[str, str]]:
    with open(os.path.join(data, name, "queries.jsonl")) as f:
        return [(q["_id"], q["text"]) for q in map(json.loads, f)]


def _sample_docs(corpus: str, n: int, seed: int) -> list[list[str]]:
    """Word lists of ``n`` documents at random byte offsets of corpus.jsonl (the line after each)."""
    path = os.path.join(corpus, "corpus.jsonl")
    size = os.path.getsize(path)
    rng = random.Random(seed)
    out = []
    with open(path, "rb") as f:
        while len(out) < n:
            f.seek(rng.randrange(size))
            f.readline()
            line = f.readline()
            if line:
                d = json.loads(line)
                out.append((d["title"] + " " + d["text"]).split())
    return out


def _generated(corpus: str, n: int, lo: int, hi: int, seed: int) -> list[str]:
    """``n`` questions of lo..hi distinct words, each drawn from one random document as its tokens fall."""
    rng = random.Random(seed)
    qs = []
    for words in _sample_docs(corpus, n, seed):
        want = rng.randint(lo, hi)
        order = rng.sample(range(len(words)), len(words))
        qs.append(" ".join(list(dict.fromkeys(words[i] for i in order))[:want]))
    return qs


def query_sets(corpus_kind: str, corpus: str, n: int, a) -> dict[str, dict[str, str]]:
    """{workload: {qid: text}} for one corpus (see the module docstring)."""
    from funnel.pipelines.lexical.analysis import Analyzer
    an, keep = Analyzer(), synth_topical._vocab_filter()
    sets: dict[str, dict[str, str]] = {}
    if corpus_kind == "zipf":
        docs, _ = synth_topical.read_sources(a.data)
        df: dict[str, int] = {}
        for d in docs:
            for t in set(d):
                df[t] = df.get(t, 0) + 1
        rank = {t: r for r, t in enumerate(sorted(df, key=lambda t: (-df[t], t)))}
        with open(os.path.join(corpus, "meta.json")) as f:
            meta = json.load(f)
        words = synth.Model(meta["seed"], meta["params"]).words  # rank order
        to_zipf = {t: words[r] for t, r in rank.items() if r < len(words)}
        for name in REAL:
            qs = {}
            for qid, text in _real_queries(name, a.data):
                terms = [to_zipf[t] for t in synth_topical.analyze_query(text, an, keep) if t in to_zipf]
                if terms:
                    qs[qid] = " ".join(terms)
                if len(qs) == n:
                    break
            sets[name] = qs
        sets["synth-short"] = bench_scale._queries(corpus, n)
    else:
        for name in REAL:
            qs = {}
            for qid, text in _real_queries(name, a.data):
                terms = synth_topical.analyze_query(text, an, keep)
                if terms:
                    qs[qid] = " ".join(terms)
                if len(qs) == n:
                    break
            sets[name] = qs
    sets["long"] = {f"L{i}": q for i, q in enumerate(_generated(corpus, n, 12, 24, a.seed + 1))}
    sets["short"] = {f"S{i}": q for i, q in enumerate(_generated(corpus, n, 2, 4, a.seed + 2))}
    return sets


# -- the children ------------------------------------------------------------------------------

class Funnel:
    def __init__(self, path: str):
        from funnel.serving.search import open_index
        self.ix = open_index(path)

    def prepare(self, qs: dict):
        return qs

    def batch(self, prepared, k: int):
        return self.ix.search_batch(prepared, k=k)

    def one(self, qid: str, q: str, k: int):
        return self.ix.search_batch({qid: q}, k=k)

    def top_ids(self, qs: dict, k: int) -> list[list[str]]:
        got = self.ix.search_batch(qs, k=k)
        return [[d for d, _ in got.get(qid, [])] for qid in qs]

    def shape(self, qs: dict) -> tuple[float, float]:
        """(mean distinct known terms, mean postings) per query."""
        import numpy as np
        b = self.ix.bm25
        qptr, gids = b.query_gids(list(qs.values()))
        terms = post = 0
        for i in range(len(qptr) - 1):
            g = np.unique(gids[qptr[i]:qptr[i + 1]])
            terms += len(g)
            post += int(np.asarray(b.index.df)[g].sum())
        return terms / max(1, len(qs)), post / max(1, len(qs))


class BM25S:
    def __init__(self, path: str):
        import bm25s
        import Stemmer
        self.bm25s = bm25s
        self.stem = Stemmer.Stemmer("porter")
        self.model = bm25s.BM25.load(path, show_progress=False)

    def _tok(self, texts):
        return self.bm25s.tokenize(texts, stopwords="en", stemmer=self.stem, show_progress=False)

    def prepare(self, qs: dict):
        return self._tok(list(qs.values()))

    def batch(self, prepared, k: int):
        return self.model.retrieve(prepared, k=k, n_threads=0, backend_selection="numba", show_progress=False)

    def one(self, qid: str, q: str, k: int):
        return self.model.retrieve(self._tok([q]), k=k, n_threads=0, backend_selection="numba", show_progress=False)

    def top_ids(self, qs: dict, k: int) -> list[list[str]]:
        docs, _ = self.batch(self.prepare(qs), k)
        return [[f"doc{int(d)}" for d in row] for row in docs]


class Pisa:
    def __init__(self, path: str):
        import pyterrier_pisa as pp
        ix = pp.PisaIndex(path, stemmer="none", stops="none", threads=1)
        self.retr = {k: ix.bm25(k1=0.9, b=0.4, num_results=k, threads=1) for k in KS}

    def prepare(self, qs: dict):
        return list(enumerate(qs.values()))

    def batch(self, items, k: int):
        import numpy as np
        from pyterrier_pisa import _pisathon
        r = self.retr[k]
        n = len(items) * k
        qidx, ranks = np.empty(n, np.int32), np.empty(n, np.int32)
        docnos, scores = np.empty(n, dtype=object), np.empty(n, np.float32)
        size = _pisathon.retrieve(r._ctxt, r.query_algorithm.value, items, k=k, threads=1,
                                  query_weighted=1 if r.query_weighted else 0, pretokenised=False,
                                  result_qidxs=qidx, result_docnos=docnos, result_ranks=ranks, result_scores=scores)
        return qidx[:size], docnos[:size], scores[:size]

    def one(self, qid: str, q: str, k: int):
        return self.batch([(0, q)], k)

    def top_ids(self, qs: dict, k: int) -> list[list[str]]:
        qidx, docnos, scores = self.batch(self.prepare(qs), k)
        out: list[list[tuple[float, str]]] = [[] for _ in qs]
        for q, d, s in zip(qidx, docnos, scores):
            out[int(q)].append((-float(s), str(d)))
        return [[d for _, d in sorted(row)] for row in out]


OPENERS = {"funnel": Funnel, "funnel-packed": Funnel, "bm25s": BM25S, "pisa": Pisa}


def _pct(xs: list[float]) -> dict:
    import numpy as np
    a = np.asarray(xs) * 1000
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99))}


def child_throughput(args: dict) -> None:
    """Every workload on every system: ``rounds`` shuffled rounds of batch passes, then one query per call."""
    import numpy as np
    sets = args["sets"]
    systems = {name: OPENERS[name](path) for name, path in args["indexes"].items()}
    prepared = {(s, w): systems[s].prepare(qs) for s in systems for w, qs in sets.items()}
    out: dict = {"load_start": os.getloadavg()[0], "shape": {}, "overlap": {}}
    if "funnel" in systems:
        out["shape"] = {w: systems["funnel"].shape(qs) for w, qs in sets.items()}
        ref = {w: systems["funnel"].top_ids(qs, 10) for w, qs in sets.items()}
        for s in systems:
            if s != "funnel":
                out["overlap"][s] = {w: float(np.mean([len(set(a) & set(b)) / max(1, len(a))
                                                       for a, b in zip(ref[w], systems[s].top_ids(qs, 10))]))
                                     for w, qs in sets.items()}
    for (s, w), p in prepared.items():  # warm: compilation, caches, page cache
        for k in KS:
            systems[s].batch(p, k)
    rng = random.Random(args["seed"])
    wall: dict = {}
    cpu: dict = {}
    for _ in range(args["rounds"]):
        for w in sets:
            order = list(systems)
            rng.shuffle(order)
            for s in order:
                # One untimed batch first: a system's first queries after another system's run
                # slower (in one process, right after bm25s's batch, funnel's next 30 queries
                # took 3-5x their thread CPU, with or without a pause between: CPU caches and
                # allocator state, not spinning threads), which charged each row's k=10 for
                # whichever system ran before it in the shuffled order.
                systems[s].batch(prepared[(s, w)], KS[0])
                for k in KS:
                    t, c = time.perf_counter(), time.process_time()
                    systems[s].batch(prepared[(s, w)], k)
                    cpu.setdefault(f"{s}|{w}|{k}", []).append(time.process_time() - c)
                    wall.setdefault(f"{s}|{w}|{k}", []).append(time.perf_counter() - t)
    out["wall"], out["cpu"] = wall, cpu
    lat: dict = {}
    for w, qs in sets.items():
        items = list(qs.items())[:args["latency_queries"]]
        for s, sysobj in systems.items():
            sysobj.batch(prepared[(s, w)], KS[0])  # untimed, as in the rounds
            for k in KS:
                # And one untimed query per k: a single query runs kernels a batch does not
                # (numba compiles them at first use where its disk cache is cold: a 24 s "p99").
                sysobj.one(*items[0], k)
                times, cpus = [], []
                for qid, q in items:
                    t, c = time.perf_counter(), time.thread_time()
                    sysobj.one(qid, q, k)
                    cpus.append(time.thread_time() - c)
                    times.append(time.perf_counter() - t)
                lat[f"{s}|{w}|{k}"] = {**_pct(times), **{"cpu_" + x: v for x, v in _pct(cpus).items()}}
    out["latency"] = lat
    out["load_end"] = os.getloadavg()[0]
    if "funnel" in systems:
        out["funnel_prune_stats"] = [int(x) for x in systems["funnel"].ix.bm25.prune_stats]
        out["funnel_shards"] = systems["funnel"].ix.index.n_shards
    bench_scale._done(args, out)


def unchecked_kernels():
    """The ``funnel.serving.kernels`` package compiled again with ``BOUNDS_CHECK`` off
    (``serving/kernels/_jit.py``, ``load_copy``): the same sources, every check compiled
    out, nothing cached on disk."""
    import funnel.serving.kernels as checked
    mod = checked.load_copy("funnel.serving._kernels_unchecked", unchecked=True)
    assert mod.BOUNDS_CHECK is False and checked.BOUNDS_CHECK is True
    return mod


def child_boundscheck(args: dict) -> None:
    """funnel's batch search with the checked and the unchecked kernels, interleaved
    (module docstring, ``--bounds-check-cost``)."""
    import funnel.serving.kernels as checked
    from funnel.serving.lexical import retriever as lexical
    from funnel.serving.search import open_index
    variants = {"checked": checked, "unchecked": unchecked_kernels()}
    ix = open_index(args["indexes"]["funnel"])
    sets = args["sets"]
    out: dict = {"load_start": os.getloadavg()[0], "cpu": {}, "wall": {}, "same": {}}

    texts = {w: list(qs.values()) for w, qs in sets.items()}

    def run(v: str, level: str, w: str, k: int):
        lexical.kernels = variants[v]
        try:
            if level == "kernel":  # the compiled batch over the workload's (cached) term ids
                return ix.bm25.search_texts(texts[w], k)
            return ix.search_batch(sets[w], k=k)
        finally:
            lexical.kernels = checked
    for w in sets:  # warm (compiles the unchecked copy) and compare the answers
        for k in KS:
            got = {v: run(v, "search", w, k) for v in variants}
            out["same"][f"{w}|{k}"] = got["checked"] == got["unchecked"]
    rng = random.Random(args["seed"])
    for _ in range(args["rounds"]):
        for w in sets:
            for k in KS:
                for level in ("search", "kernel"):
                    order = list(variants)
                    rng.shuffle(order)
                    for v in order:
                        t, c = time.perf_counter(), time.process_time()
                        run(v, level, w, k)
                        out["cpu"].setdefault(f"{v}|{level}|{w}|{k}", []).append(time.process_time() - c)
                        out["wall"].setdefault(f"{v}|{level}|{w}|{k}", []).append(time.perf_counter() - t)
    out["load_end"] = os.getloadavg()[0]
    out["shards"] = ix.index.n_shards
    bench_scale._done(args, out)


def render_boundscheck(res: dict, command: str) -> str:
    """The ``bounds-check-SIZE`` section: checked ÷ unchecked per corpus, workload and k."""
    import numpy as np
    loads = ", ".join(f"{c}: {r['tp'].get('load_start', 0):.1f} → {r['tp'].get('load_end', 0):.1f}"
                      for c, r in res["corpora"].items())
    L = [f"Machine: {os.uname().machine}, {os.cpu_count()} cores, shared with other jobs (1-minute load average "
         f"over the timing children: {loads}). Command: `{command}`.", "",
         "funnel's BM25 batch search (one thread) with the kernels as served, which compare every value read "
         "from the index files before indexing memory with it, against the same kernels compiled with "
         "`BOUNDS_CHECK` off, interleaved in one process in a shuffled order per round: each workload's "
         "`search_batch` end to end, and the compiled batch alone (`BM25Retriever.search_texts`, analysis "
         "cached). Ratio = checked ÷ unchecked process CPU time of the same round's two runs, the median over "
         "the rounds (the ratio of the two best rounds in brackets; on a shared machine a single round is "
         "off by several percent either way): above 1.00 the checks cost that much. CPU ms of the best "
         "unchecked round for scale.", "",
         "| corpus | workload | queries | k | search CPU ms | search: checked ÷ unchecked | kernel CPU ms "
         "| kernel: checked ÷ unchecked | same results |",
         "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    meds, bests, kmeds = [], [], []
    for c, r in res["corpora"].items():
        tp = r["tp"]
        for w, n in r["n_queries"].items():
            for k in KS:
                cells = []
                for level in ("search", "kernel"):
                    ck, un = tp["cpu"][f"checked|{level}|{w}|{k}"], tp["cpu"][f"unchecked|{level}|{w}|{k}"]
                    best = min(ck) / min(un)
                    med = float(np.median(np.asarray(ck) / np.asarray(un)))
                    (meds if level == "search" else kmeds).append(med)
                    bests.append(best)
                    cells.append(f"{min(un) * 1000:,.1f} | **{med:.3f}** ({best:.3f})")
                L.append(f"| {c} | {w} | {n:,} | {k} | " + " | ".join(cells)
                         + f" | {'yes' if tp['same'][f'{w}|{k}'] else 'NO'} |")

    def gm(xs):
        return float(np.exp(np.mean(np.log(xs))))
    L += ["", f"Over the {len(meds)} rows, median ratios: search {gm(meds):.3f} geometric mean ({min(meds):.3f} to "
          f"{max(meds):.3f}), kernel {gm(kmeds):.3f} ({min(kmeds):.3f} to {max(kmeds):.3f}); best-round ratios "
          f"{min(bests):.3f} to {max(bests):.3f}. "
          f"{res['rounds']} rounds. Indexes: " + "; ".join(
              f"{c} {r['n_docs']:,} docs, {r['tp'].get('shards')} shard(s)" for c, r in res["corpora"].items())
          + "; numba " + bench_scale._pkg_version("numba") + "."]
    return "\n".join(L)


def _size(*paths: str) -> int:
    return sum(os.path.getsize(x) for x in paths if os.path.isfile(x))


def index_bytes(system: str, path: str) -> dict:
    """What each system's lexical index holds on disk, per group of files: ``postings``
    (document ids, frequencies, and funnel's impact levels / bm25s's scores), ``skip``
    (block maxima and other per-term bounds pruning reads), ``all`` (every file a query
    process reads: also the dictionaries and lengths), and the number of postings. PISA's
    are the compressed index (``*.block_simdbp``), its block-max data (``*.bmw.*``) and the
    lexicons, not the uncompressed collection its build leaves beside them."""
    import glob

    import numpy as np
    if system in FUNNELS:
        with open(os.path.join(path, "CURRENT")) as f:
            lex = os.path.join(path, f.read().strip(), "lexical")
        shards = sorted(glob.glob(os.path.join(lex, "shard-*")))
        n = sum(int(np.load(os.path.join(d, "indptr.npy"), mmap_mode="r")[-1]) for d in shards)
        files = {d: os.listdir(d) for d in shards}
        postings = sum(_size(*(os.path.join(d, x) for x in fs if x in ("docs.npy", "tfs.npy", "impacts.npy")
                               or x.startswith("packed"))) for d, fs in files.items())
        bounds = ("block_", "term_max", "term_kth", "term_min")
        skip = sum(_size(*(os.path.join(d, x) for x in fs if x.startswith(bounds))) for d, fs in files.items())
        every = sum(_size(*(os.path.join(d, x) for x in fs)) for d, fs in files.items()) + _size(
            os.path.join(lex, "vocab.arrow"))
    elif system == "pisa":
        n_terms = sum(1 for _ in open(os.path.join(path, "fwd.terms"), "rb"))
        n = os.path.getsize(os.path.join(path, "inv.freqs")) // 4 - n_terms  # [len, freqs...] per term
        postings = _size(*glob.glob(os.path.join(path, "*.block_simdbp")))
        skip = _size(*[x for x in glob.glob(os.path.join(path, "*.bmw.*")) if not x.endswith(".block_simdbp")])
        lexicons = ("fwd.termlex", "fwd.doclex", "fwd.documents")
        every = postings + skip + _size(*(os.path.join(path, x) for x in lexicons))
    elif system == "bm25s":
        n = len(np.load(os.path.join(path, "indices.csc.index.npy"), mmap_mode="r"))
        postings = _size(os.path.join(path, "data.csc.index.npy"), os.path.join(path, "indices.csc.index.npy"))
        skip = 0
        every = _size(*glob.glob(os.path.join(path, "*")))
    else:
        raise ValueError(f"unknown system {system!r}: choose from {', '.join(SYSTEMS)}")
    return {"n_postings": int(n), "postings": int(postings), "skip": int(skip), "all": int(every)}


def child_rss(args: dict) -> None:
    """One system alone: open, answer every workload at k=10 and k=100, then its RSS."""
    s = OPENERS[args["system"]](args["index"])
    for qs in args["sets"].values():
        p = s.prepare(qs)
        for k in KS:
            s.batch(p, k)
    bench_scale._done(args, {"status": bench_scale._proc_status()})


CHILDREN = {"throughput": child_throughput, "rss": child_rss, "boundscheck": child_boundscheck}


def run_child(kind: str, args: dict, work: str, min_avail: int) -> dict:
    result = os.path.join(work, f"{kind}.result.json")
    if os.path.exists(result):
        os.remove(result)
    path = os.path.join(work, f"{kind}.args.json")  # the query sets are too large for argv
    with open(path, "w") as f:
        json.dump({**args, "result": result}, f)
    m = bench_scale.measure([sys.executable, os.path.abspath(__file__), "--child", kind, path],
                            os.path.join(work, f"{kind}.log"), min_avail)
    if m["returncode"] != 0 or not os.path.exists(result):
        why = bench_scale._failure(m)
        print(f"  {kind} failed ({why}); log {m['log']}:\n{bench_scale._tail(m['log'], 2000)}", file=sys.stderr)
        return {**m, "failed": why}
    with open(result) as f:
        return {**m, **json.load(f)}


# -- rendering ---------------------------------------------------------------------------------

def _qps(xs: list[float], n: int, how: str) -> float:
    import numpy as np
    return n / (min(xs) if how == "best" else float(np.median(xs)))


def render(res: dict, command: str) -> str:
    L = [f"Machine: {os.uname().machine}, {os.cpu_count()} cores, shared with other jobs (1-minute load average "
         "over the timing children: " + ", ".join(f"{c}: {r['tp'].get('load_start', 0):.1f} → "
                                                  f"{r['tp'].get('load_end', 0):.1f}" for c, r in res["corpora"].items())
         + "). Command: `" + command + "`. " + res.get("how", "All figures below come from this one run.")
         + (" funnel read its postings (plain arrays, packed blocks) into memory at open "
            "(`FUNNEL_LOAD_POSTINGS=1`, as bm25s loads its arrays) instead of mapping them."
            if res.get("load_postings") else ""), ""]
    rows = []
    for c, r in res["corpora"].items():
        tp = r["tp"]
        for w, qs_n in r["n_queries"].items():
            def q(s, k, how="best", key="wall", tp=tp, w=w, qs_n=qs_n):  # bound now: rows outlive the loop
                xs = tp[key].get(f"{s}|{w}|{k}")
                return _qps(xs, qs_n, how) if xs else float("nan")
            ratios = [q("funnel", k) / q(o, k) for o in ("bm25s", "pisa") for k in KS if f"{o}|{w}|{k}" in tp["wall"]]
            rows.append((min(ratios) if ratios else float("nan"), c, w, qs_n, q))
    rows.sort(key=lambda x: x[0])
    L += ["Throughput, one thread, batch, warm: q/s of the best of the rounds (median of the rounds in "
          "brackets). Ratios are funnel ÷ baseline of the best rounds; CPU ratio = the same from each "
          "round's process CPU time, which waiting for a core on the shared machine does not inflate. Rows "
          "from the weakest workload for funnel (its smallest ratio) to the strongest.", "",
          "| corpus | workload | queries | terms / query | postings / query | k | funnel q/s | funnel packed q/s "
          "| bm25s-numba q/s | PISA q/s | funnel ÷ bm25s | funnel ÷ PISA | CPU ratio ÷ bm25s / ÷ PISA "
          "| packed ÷ bm25s / ÷ PISA |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for _, c, w, n, q in rows:
        shape = res["corpora"][c]["tp"]["shape"].get(w, (float("nan"), float("nan")))
        for k in KS:
            cells = []
            for s in SYSTEMS:
                cells.append(f"{q(s, k):,.0f} ({q(s, k, 'median'):,.0f})")
            cr = " / ".join(f"{q('funnel', k, key='cpu') / q(o, k, key='cpu'):.2f}" for o in ("bm25s", "pisa"))
            pr = " / ".join(f"{q('funnel-packed', k) / q(o, k):.2f}" for o in ("bm25s", "pisa"))
            L.append(f"| {c} | {w} | {n:,} | {shape[0]:.1f} | {shape[1]:,.0f} | {k} | " + " | ".join(cells)
                     + f" | **{q('funnel', k) / q('bm25s', k):.2f}** | **{q('funnel', k) / q('pisa', k):.2f}** | {cr} "
                     f"| {pr} |")
    L += ["", "Latency, one query per call after the rounds (first "
          f"{res['latency_queries']} queries of each workload): p50 / p99 ms, wall (thread CPU).", "",
          "| corpus | workload | k | funnel | funnel packed | bm25s-numba (+tokenize) | PISA |",
          "|---|---|---:|---|---|---|---|"]
    for _, c, w, n, q in rows:
        lat = res["corpora"][c]["tp"]["latency"]
        for k in KS:
            cells = []
            for s in SYSTEMS:
                v = lat.get(f"{s}|{w}|{k}")
                cells.append(f"{v['p50_ms']:.2f} / {v['p99_ms']:.2f} ({v['cpu_p50_ms']:.2f} / {v['cpu_p99_ms']:.2f})"
                             if v else "–")
            L.append(f"| {c} | {w} | {k} | " + " | ".join(cells) + " |")
    L += ["", "Serving RSS: each system alone in a fresh process after answering every workload at k=10 and "
          "k=100 (anon = private memory, file = mapped index pages, + shmem where there is any: shared "
          "anonymous memory, funnel packed's decoded postings in runs before they were made private).", "",
          "| corpus | system | RSS MiB (anon + file) | peak RSS MiB |", "|---|---|---|---:|"]
    for c, r in res["corpora"].items():
        for s, v in r["rss"].items():
            st = v.get("status")
            if not st:
                L.append(f"| {c} | {s} | failed: {v.get('failed')} | |")
                continue
            mib = lambda x: f"{(x or 0) / bench_scale.MIB:,.0f}"  # noqa: E731
            shm = f" + {mib(st['RssShmem'])}" if st.get("RssShmem", 0) >= bench_scale.MIB else ""
            L.append(f"| {c} | {s} | {mib(st['VmRSS'])} ({mib(st.get('RssAnon'))} + {mib(st.get('RssFile'))}{shm}) "
                     f"| {mib(st['VmHWM'])} |")
    if any("bytes" in r for r in res["corpora"].values()):
        L += ["", "Index bytes per posting on disk (`index_bytes`): postings = document ids and frequencies (funnel "
              "also its 16-bit impact levels, bm25s its float32 scores instead of frequencies; PISA's "
              "block_simdbp compressed index); + skip = with the block maxima and per-term bounds pruning reads "
              "(PISA's block-max data); all = every file a query process reads. RSS per posting: the serving "
              "RSS above over the postings.", "",
              "| corpus | system | postings | B / posting: postings | + skip | all | all MiB | RSS B / posting | "
              "÷ PISA (all) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for c, r in res["corpora"].items():
            by = r.get("bytes", {})
            pisa = by.get("pisa")
            for s, b in by.items():
                n = max(b["n_postings"], 1)
                st = r.get("rss", {}).get(s, {}).get("status") or {}
                rss = f"{st['VmRSS'] / n:.2f}" if st.get("VmRSS") else "–"
                vs = f"{(b['all'] / n) / (pisa['all'] / max(pisa['n_postings'], 1)):.2f}" if pisa else "–"
                L.append(f"| {c} | {s} | {b['n_postings']:,} | {b['postings'] / n:.2f} | "
                         f"{(b['postings'] + b['skip']) / n:.2f} | {b['all'] / n:.2f} | "
                         f"{b['all'] / bench_scale.MIB:,.0f} | {rss} | {vs} |")
    L += ["", "Agreement: mean share of funnel's top 10 that each baseline also returns (the same BM25 on the "
          "same terms; bm25s scores in float32, PISA with its own length quantisation, so ties and near-ties "
          "can differ; funnel packed is the same index packed: 1.000 where it answers as the plain one).", "",
          "| corpus | workload | funnel packed | bm25s | PISA |", "|---|---|---:|---:|---:|"]
    for _, c, w, n, q in rows:
        ov = res["corpora"][c]["tp"]["overlap"]
        L.append(f"| {c} | {w} | " + " | ".join(f"{ov[s][w]:.3f}" if s in ov else "–"
                                               for s in ("funnel-packed", "bm25s", "pisa")) + " |")
    L += ["", "Builds (reused while the corpus is unchanged; wall / CPU s, load average, index MiB):", ""]
    for c, r in res["corpora"].items():
        L.append(f"- {c} {r['n_docs']:,} docs: " + "; ".join(
            f"{s} {b['wall_s']:.0f} / {b['cpu_s']:.0f} s, load {b['load_avg']:.1f}, {b['index_bytes'] / bench_scale.MIB:,.0f} MiB"
            for s, b in r["builds"].items()) + f"; funnel shards {r['tp'].get('funnel_shards')}.")
    L += ["", "bm25s " + bench_scale._pkg_version("bm25s") + ", numba " + bench_scale._pkg_version("numba")
          + ", pyterrier-pisa " + bench_scale._pkg_version("pyterrier-pisa") + "."]
    return "\n".join(L)


TITLE = "BM25 per workload: natural-language and generated queries, Zipf and topical corpora (bench/bench_workloads.py)"


def section(res: dict) -> tuple[str, str]:
    """(name, title) of the RESULTS.md section for a run: ``workloads`` at 1M (the size the
    README's rows cite), ``workloads-3m`` etc. for other sizes."""
    sizes = sorted({r["n_docs"] for r in res["corpora"].values()})
    label = "+".join(bench_scale.label(n) for n in sizes)
    some = sorted(res["corpora"]) != sorted(CORPORA)  # a run of some corpora: its own section
    if label == "1m" and not some:
        return "workloads", TITLE
    if some:
        names = "+".join(res["corpora"])
        return (f"workloads-{label}-{names}", f"BM25 per workload at {label.upper()} documents, {names} corpus only "
                "(bench/bench_workloads.py)")
    return f"workloads-{label}", f"BM25 per workload at {label.upper()} documents (bench/bench_workloads.py)"


def main(argv=None):
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "--child":
        with open(sys.argv[3]) as f:
            CHILDREN[sys.argv[2]](json.load(f))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--size", type=synth.parse_count, default=synth.parse_count("100k"),
                   help="documents per corpus (default 100k)")
    p.add_argument("--corpora", default=",".join(CORPORA), help="comma-separated (default %(default)s)")
    p.add_argument("--queries", type=int, default=300, help="queries per workload (default %(default)s)")
    p.add_argument("--latency-queries", type=int, default=200,
                   help="queries per workload timed one per call (default %(default)s)")
    p.add_argument("--rounds", type=int, default=5, help="timing rounds (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=DEFAULT_DATA, help="BEIR folder with scifact/ and nfcorpus/ (default %(default)s)")
    p.add_argument("--engine", default="auto", choices=["auto", "local", "ray"], help="funnel build --engine")
    p.add_argument("--shards", type=int, default=None, help="funnel build --shards (default: its auto choice)")
    p.add_argument("--min-avail-gib", type=float, default=3.0)
    p.add_argument("--synth", default=os.path.join(".funnel", "synth"), help="corpus cache (default %(default)s; "
                   "the topical corpora go under %(default)s-topical)")
    p.add_argument("--work", default=os.path.join(".funnel", "workloads"), help="indexes and results "
                   "(default %(default)s)")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="comma-separated systems to build and time (default %(default)s)")
    p.add_argument("--build-only", action="store_true", help="make the corpora and indexes, time nothing")
    p.add_argument("--from-results", metavar="JSON[,JSON]", help="run nothing: render a saved results.json, or "
                   "several (one per corpus, e.g. runs of --corpora zipf and --corpora topical) together")
    p.add_argument("--bounds-check-cost", action="store_true",
                   help="time funnel's kernels with and without their bounds checks, interleaved (module "
                        "docstring); builds and times funnel only, writes the 'bounds-check-SIZE' section")
    p.add_argument("--load-postings", action="store_true",
                   help="funnel reads its postings (plain arrays, packed blocks) into memory at open "
                        "(FUNNEL_LOAD_POSTINGS=1, for every funnel child), as bm25s loads its arrays, instead of "
                        "mapping them")
    p.add_argument("--write", action="store_true", help="record the 'workloads' section of bench/RESULTS.md")
    a = p.parse_args(argv)
    if a.load_postings:
        os.environ["FUNNEL_LOAD_POSTINGS"] = "1"
    if a.from_results:
        runs = []
        for path in a.from_results.split(","):
            with open(path) as f:
                runs.append(json.load(f))
        saved = {**runs[0], "corpora": {c: r for run in runs for c, r in run["corpora"].items()}}
        if len(runs) > 1:
            saved["command"] = "` then `".join(run["command"] for run in runs)
            saved["how"] = (f"{len(runs)} runs back to back on the same code, rendered together with `--from-results`: "
                            "compare figures within a corpus (each corpus's three systems were timed in the same "
                            "process, interleaved).")
        report(*section(saved), render(saved, saved["command"]), a.write)
        return
    command = ".venv/bin/python bench/bench_workloads.py " + " ".join(sys.argv[1:] if argv is None else argv)
    min_avail = int(a.min_avail_gib * bench_scale.GIB)
    systems = [x for x in a.systems.split(",") if x]
    if "funnel" not in systems or any(x not in SYSTEMS for x in systems):
        p.error(f"--systems {a.systems}: funnel and any of {', '.join(SYSTEMS[1:])}")
    res = {"command": command, "latency_queries": a.latency_queries, "rounds": a.rounds, "corpora": {},
           "load_postings": bool(a.load_postings)}
    for c in [x for x in a.corpora.split(",") if x]:
        if c not in CORPORA:
            p.error(f"--corpora {c}: choose from {', '.join(CORPORA)}")
        corpus = corpus_dir(c, a.size, a)
        work = os.path.join(a.work, f"{c}-{bench_scale.label(a.size)}")
        os.makedirs(work, exist_ok=True)
        builds = {s: ensure_index(s, corpus, work, a) for s in (("funnel",) if a.bounds_check_cost else systems)}
        if a.build_only:
            continue
        qpath = os.path.join(work, f"queries-{a.queries}.json")
        if os.path.exists(qpath):
            with open(qpath) as f:
                sets = json.load(f)
        else:
            sets = query_sets(c, corpus, a.queries, a)
            with open(qpath, "w") as f:
                json.dump(sets, f)
        indexes = {s: b["path"] for s, b in builds.items()}
        print(f"  timing {c} ({', '.join(f'{w}: {len(q)}' for w, q in sets.items())}) ...", file=sys.stderr)
        if a.bounds_check_cost:
            tp = run_child("boundscheck", {"sets": sets, "indexes": indexes, "rounds": a.rounds, "seed": a.seed},
                           work, min_avail)
            if "failed" in tp:
                raise SystemExit(f"timing failed on {c}: {tp['failed']}")
            res["corpora"][c] = {"n_docs": a.size, "tp": tp, "n_queries": {w: len(q) for w, q in sets.items()}}
            continue
        tp = run_child("throughput", {"sets": sets, "indexes": indexes, "rounds": a.rounds, "seed": a.seed,
                                      "latency_queries": a.latency_queries}, work, min_avail)
        if "failed" in tp:
            raise SystemExit(f"timing failed on {c}: {tp['failed']}")
        rss = {s: run_child("rss", {"sets": sets, "system": s, "index": indexes[s]}, work, min_avail)
               for s in systems}
        res["corpora"][c] = {"n_docs": a.size, "builds": builds, "tp": tp, "rss": rss,
                             "bytes": {s: index_bytes(s, indexes[s]) for s in systems},
                             "n_queries": {w: len(q) for w, q in sets.items()}}
        name = f"results-{bench_scale.label(a.size)}-{'+'.join(res['corpora'])}.json"
        with open(os.path.join(a.work, name), "w") as f:  # one per size and corpora: --from-results
            json.dump(res, f, indent=1)
    if a.bounds_check_cost and not a.build_only:
        report(f"bounds-check-{bench_scale.label(a.size)}", f"Cost of the kernels' bounds checks at "
               f"{bench_scale.label(a.size).upper()} documents (bench/bench_workloads.py --bounds-check-cost)",
               render_boundscheck(res, command), a.write)
    elif not a.build_only:
        report(*section(res), render(res, command), a.write)


if __name__ == "__main__":
    main()
