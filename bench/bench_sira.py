"""SIRA (query side, no corpus enrichment): speed against plain BM25, the train/dev grid
that chose the defaults, and the test table with a paired comparison per row.

    .venv/bin/python bench/bench_sira.py [--llm-queries 200]     # speed (default)
    .venv/bin/python bench/bench_sira.py --select                # train/dev grid
    .venv/bin/python bench/bench_sira.py --test --runs runs/sira # test table + funnel compare
    .venv/bin/python bench/bench_sira.py --test --llm-queries 50 # + llm rows on the first 50 queries
    .venv/bin/python bench/bench_sira.py --test --enriched scifact=IDX  # + rows on an enriched index

Speed: SIRA's query time excluding LLM time vs plain BM25 on the same queries in the same
process (every query of queries.jsonl, k=100, batch API, best of --repeats passes each). The
baseline is funnel's own BM25 batch path (search_batch mode="bm25"). The dense proposer needs
a query vector; its embedding is computed once before timing and reported as its own column.
Selection: SciFact train qrels and NFCorpus dev qrels only (never test). Test: the chosen
defaults, each SIRA row against BM25 with `funnel compare` (McNemar on success@10 and the
sign-flip randomization test on NDCG@10); ``--enriched NAME=INDEX_ROOT`` adds the same rows
(BM25 too) on a corpus-enriched index of that set, each against the un-enriched BM25. Indexes come from .funnel/indexes/NAME (built
with vectors if missing, as `funnel eval` does). Nothing is written to bench/RESULTS.md
unless --write is given.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(REPO, "..", "shared", "data", "beir")
SPLITS = {"scifact": "train", "nfcorpus": "dev"}   # selection splits, never test
METRICS = ["ndcg@10", "recall@10", "recall@100"]
GRID = {"lambda": [0.1, 0.2, 0.3, 0.5], "tau": [0.05, 0.1], "fb_docs": [5, 10], "fb_terms": [10, 20]}
OFFLINE = ("prf", "dense", "union")


def _env() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _index(ds: str, shards: int | None = 4):
    """The index of set ``ds`` with vectors: 4 shards at .funnel/indexes/NAME (as `funnel eval`
    builds it), another count at .funnel/indexes/NAME-N, or with ``shards=None`` the count the
    build chooses (.funnel/indexes/NAME-auto)."""
    from funnel.serving.frontends.cli import ensure_index
    from funnel.serving.search import open_index
    root = None if shards == 4 else os.path.join(".funnel", "indexes", f"{ds}-{shards or 'auto'}")
    return open_index(ensure_index(os.path.join(DATA, ds), root, True, shards))


def _evaluate(ix, queries, qrels, mode, **opts):
    from funnel.evaluation.metrics import evaluate
    from funnel.evaluation.trec import tiebreak_run
    run = tiebreak_run({q: dict(h) for q, h in ix.search_batch(queries, mode=mode, k=100, **opts).items()})
    return evaluate(run, qrels, METRICS)[0], run


# -- speed ---------------------------------------------------------------------------------

def speed(datasets, repeats: int, llm_queries: int = 0, shard_counts=(None, 4)) -> str:
    from funnel.evaluation.trec import read_queries
    from funnel.serving.hybrid import prefill_query_vectors
    from funnel.serving.sira import batch as sira_batch
    lines = ["Command: `.venv/bin/python bench/bench_sira.py"
             + (f" --llm-queries {llm_queries}" if llm_queries else "") + " --write`. Every query of queries.jsonl, "
             "k=100, batch API (`search_batch`: for prf, dense and union one compiled call per chunk, "
             "`serving/sira/batch.py`), one process, best of "
             f"{repeats} interleaved passes each; SIRA with its chosen defaults and no LLM. Baseline: funnel's BM25 "
             "batch path on the same queries and index. The dense proposer's query embedding (MiniLM-L6, CPU) "
             "is computed once before timing; its cost per query is the last column. Each set on two indexes: "
             "the shard count `funnel build` chooses (auto: 1 for these sizes) and 4 shards (what `funnel eval` "
             "builds); each extra shard adds a fixed cost per pass over the shards, and SIRA makes four "
             "(feedback scoring, feedback top, expansion scoring, top k) where BM25 makes two. The dense and "
             "union rows' vector search (their feedback documents: an exact search over every vector on "
             "FAISS's per-query path, with the cached query vectors' lookups) is timed inside the same passes "
             "and shown on its own; the last ratio leaves it out, as the llm rows leave out the LLM's time."
             + (f" The llm rows: the first {llm_queries} queries through `search_batch` (each query's sketch "
                "and DF filter in Python, then the chunk's weighted queries in one compiled call), the "
                "sketches cached by a first pass so no LLM time is timed, "
                "against BM25's batch path on the same queries." if llm_queries else ""), "",
             "| dataset | shards | queries | BM25 ms/q | SIRA proposer | SIRA ms/q | ratio SIRA/BM25 | "
             "query embedding ms/q | vector search ms/q | ratio without the vector search |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for ds, shards in itertools.product(datasets, shard_counts):
        ix = _index(ds, shards)
        label = f"{len(ix.index.shards)}" + (" (auto)" if shards is None else "")
        qs = read_queries(os.path.join(DATA, ds, "queries.jsonl"))
        ix.dense_mode.dense().cache_size = len(qs) + 16  # every query vector stays cached: none is timed
        t = time.perf_counter()
        prefill_query_vectors(ix, list(qs.values()))
        embed_ms = (time.perf_counter() - t) * 1000 / len(qs)
        for mode, opts in [("bm25", {})] + [("sira", {"proposer": p}) for p in OFFLINE]:
            ix.search_batch(dict(list(qs.items())[:50]), mode=mode, k=100, **opts)  # warm: JIT, caches, forward index

        configs = [("bm25", {})] + [("sira", {"proposer": p}) for p in OFFLINE]
        secs = {i: float("inf") for i in range(len(configs))}
        vsecs = dict(secs)  # the vector search inside the best pass
        for _ in range(repeats):  # interleaved: every configuration sees the same machine load
            for i, (mode, opts) in enumerate(configs):
                with _timed(sira_batch, "_dense_feedback") as spent:
                    t = time.perf_counter()
                    ix.search_batch(qs, mode=mode, k=100, **opts)
                    took = time.perf_counter() - t
                if took < secs[i]:
                    secs[i], vsecs[i] = took, spent[0]
        per_q = {i: v * 1000 / len(qs) for i, v in secs.items()}
        bm = per_q[0]
        for i, p in enumerate(OFFLINE, start=1):
            ms, vms = per_q[i], vsecs[i] * 1000 / len(qs)
            emb = f"{embed_ms:.2f}" if p != "prf" else "—"
            vec = f"{vms:.3f} | {(ms - vms) / bm:.2f}×" if p != "prf" else "— | —"
            lines.append(f"| {ds} | {label} | {len(qs)} | {bm:.3f} | {p} | {ms:.3f} | {ms / bm:.2f}× | {emb} | {vec} |")
            print(f"{ds}, {label} shards: bm25 {bm:.3f} ms/q, sira-{p} {ms:.3f} ms/q, ratio {ms / bm:.2f}x",
                  flush=True)
        if shards != shard_counts[-1]:  # the llm row and the per-stage medians once per set
            continue
        if llm_queries:
            lines.append(_speed_llm(ds, ix.root, qs, llm_queries, repeats))
        stages: dict[str, list[float]] = {}
        for q in list(qs.values())[:300]:
            for st, v in ix.search(q, mode="sira", k=100, proposer="prf", explain=False).trace["timings_ms"].items():
                stages.setdefault(st, []).append(v)
        med = {st: sorted(v)[len(v) // 2] for st, v in stages.items()}
        lines.append(f"| {ds} | {label} | 300 | | prf, median per stage of one `search()` (ms) | "
                     + ", ".join(f"{st} {v:.3f}" for st, v in med.items()) + " | | | | |")
    return "\n".join(lines + [""])


@contextlib.contextmanager
def _timed(module, name: str):
    """Accumulate the seconds spent in ``module.name`` while the block runs (a one-element list)."""
    spent, inner = [0.0], getattr(module, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t

    setattr(module, name, wrapper)
    try:
        yield spent
    finally:
        setattr(module, name, inner)


def _speed_llm(ds: str, root: str, qs: dict, n: int, repeats: int) -> str:
    """The llm proposer with its sketches already cached (LLM time excluded) vs BM25."""
    from funnel.serving.chat import LocalLlamaServer
    from funnel.serving.search import open_index
    sub = dict(list(qs.items())[:n])
    with LocalLlamaServer(n_ctx=1024) as llm:
        ix = open_index(root, chat=llm.chat(timeout=120))
        t = time.perf_counter()
        ix.search_batch(sub, mode="sira", k=100, proposer="llm")   # fills the sketch cache
        llm_ms = (time.perf_counter() - t) * 1000 / len(sub)
        configs = (("bm25", {}), ("sira", {"proposer": "llm"}))
        best = {mode: float("inf") for mode, _ in configs}
        ix.search_batch(sub, mode="bm25", k=100)
        for _ in range(repeats):  # interleaved, as the offline rows: both see the same machine load
            for mode, opts in configs:
                t = time.perf_counter()
                ix.search_batch(sub, mode=mode, k=100, **opts)
                best[mode] = min(best[mode], time.perf_counter() - t)
        times = {mode: v * 1000 / len(sub) for mode, v in best.items()}
        shards = len(ix.index.shards)
        del ix
    print(f"{ds}: bm25 {times['bm25']:.3f} ms/q, sira-llm (sketch cached) {times['sira']:.3f} ms/q, "
          f"ratio {times['sira'] / times['bm25']:.2f}x; LLM {llm_ms:.0f} ms/q", flush=True)
    return (f"| {ds} | {shards} | {len(sub)} | {times['bm25']:.3f} | llm, sketch cached (LLM time excluded; "
            f"SmolLM2-135M took {llm_ms:.0f} ms/q) | {times['sira']:.3f} | "
            f"{times['sira'] / times['bm25']:.2f}× | — | — | — |")


# -- selection on train/dev ----------------------------------------------------------------

def _shared_choice(results, base, datasets):
    """The (τ, fb_docs, fb_terms) shared by the proposers and each one's λ: largest summed
    best-λ mean gain over BM25, counting only λ where no dataset loses."""
    best = None
    for shared in itertools.product(GRID["tau"], GRID["fb_docs"], GRID["fb_terms"]):
        lams, total = {}, 0.0
        for p in OFFLINE:
            cands = []
            for lam in GRID["lambda"]:
                gains = [results[(p, lam, *shared)][ds]["ndcg@10"] - base[ds]["ndcg@10"] for ds in datasets]
                if min(gains) >= 0:
                    cands.append((sum(gains) / len(gains), lam))
            if not cands:
                total = float("-inf")
                break
            g, lam = max(cands)
            lams[p] = (lam, g)
            total += g
        if best is None or total > best[0]:
            best = (total, shared, lams)
    return best


def select(datasets, llm_queries: int = 0) -> str:
    from funnel.evaluation.evaluate import load_beir
    from funnel.serving.hybrid import prefill_query_vectors
    results: dict[tuple, dict[str, dict]] = {}
    base, selection = {}, {}
    for ds in datasets:
        ix = _index(ds)
        qs, qrels = load_beir(os.path.join(DATA, ds), SPLITS[ds])
        selection[ds] = (ix, qs, qrels)
        prefill_query_vectors(ix, list(qs.values()))
        base[ds] = _evaluate(ix, qs, qrels, "bm25")[0]
        print(ds, SPLITS[ds], len(qs), "bm25", base[ds], flush=True)
        for p in OFFLINE:
            for values in itertools.product(*GRID.values()):
                opts = dict(zip(GRID, values))
                m = _evaluate(ix, qs, qrels, "sira", proposer=p, **opts)[0]
                results.setdefault((p, *values), {})[ds] = m
                print(ds, p, opts, {k: round(v, 4) for k, v in m.items()}, flush=True)
    rows = []
    for key, per in results.items():
        gains = [per[ds]["ndcg@10"] - base[ds]["ndcg@10"] for ds in datasets]
        rows.append((sum(gains) / len(gains), key, per))
    rows.sort(key=lambda r: -r[0])
    head = " | ".join(f"{ds} {SPLITS[ds]} NDCG@10 | R@10" for ds in datasets)
    lines = ["Command: `.venv/bin/python bench/bench_sira.py --select"
             + (f" --llm-queries {llm_queries}" if llm_queries else "") + " --write`. Selection data only: "
             + ", ".join(f"{ds} {SPLITS[ds]} qrels ({len(selection[ds][1])} queries)" for ds in datasets)
             + "; k=100; grid " + ", ".join(f"{k} ∈ {{{', '.join(map(str, v))}}}" for k, v in GRID.items())
             + f", proposer ∈ {{{', '.join(OFFLINE)}}}; max_n 1 (no n-gram terms without enrichment). "
             "BM25: " + ", ".join(f"{ds} {base[ds]['ndcg@10']:.4f} / R@10 {base[ds]['recall@10']:.4f}"
                                  for ds in datasets) + ". The ten best settings by mean NDCG@10 gain over "
             "BM25, then the best of each proposer:",
             "", f"| proposer | λ | τ | fb_docs | fb_terms | {head} | mean Δ NDCG@10 |",
             "|---|---:|---:|---:|---:|" + "---:|---:|" * len(datasets) + "---:|"]
    best_per = {}
    for mean, key, per in rows:
        best_per.setdefault(key[0], (mean, key, per))
    shown = rows[:10] + [r for r in best_per.values() if r not in rows[:10]]
    for mean, key, per in shown:
        cells = " | ".join(f"{per[ds]['ndcg@10']:.4f} | {per[ds]['recall@10']:.4f}" for ds in datasets)
        lines.append(f"| {' | '.join(map(str, key))} | {cells} | {mean:+.4f} |")
    total, shared, lams = _shared_choice(results, base, datasets)
    lines += ["", "Chosen (shared τ, fb_docs, fb_terms with the largest summed gain where no proposer loses on "
              f"any set, then λ per proposer): τ {shared[0]}, fb_docs {shared[1]}, fb_terms {shared[2]}; "
              + "; ".join(f"{p} λ {lam} (mean Δ {g:+.4f})" for p, (lam, g) in lams.items())
              + f"; offline proposer: {max(lams, key=lambda p: lams[p][1])}.", ""]
    if llm_queries:
        from funnel.serving.chat import LocalLlamaServer
        lines += [f"llm proposer (local SmolLM2-135M, first {llm_queries} selection queries of each set, "
                  f"τ {shared[0]}; LLM answers cached across λ):", "",
                  "| dataset | queries | BM25 NDCG@10 | " + " | ".join(f"λ {x}" for x in GRID["lambda"]) + " | s/query (LLM) |",
                  "|---|---:|---:|" + "---:|" * len(GRID["lambda"]) + "---:|"]
        from funnel.serving.search import open_index
        llm_gain: dict[float, float] = {}
        with LocalLlamaServer(n_ctx=1024) as llm:
            for ds in datasets:
                _, qs, qrels = selection[ds]
                ix = open_index(os.path.join(".funnel", "indexes", ds), chat=llm.chat(timeout=120))
                sub = dict(list(qs.items())[:llm_queries])
                subq = {q: qrels[q] for q in sub}
                b = _evaluate(ix, sub, subq, "bm25")[0]
                t = time.perf_counter()
                ms = [_evaluate(ix, sub, subq, "sira", proposer="llm", tau=shared[0], **{"lambda": lam})[0]
                      for lam in GRID["lambda"]]
                per_q = (time.perf_counter() - t) / len(sub)
                lines.append(f"| {ds} | {len(sub)} | {b['ndcg@10']:.4f} | "
                             + " | ".join(f"{m['ndcg@10']:.4f}" for m in ms) + f" | {per_q:.2f} |")
                print(ds, "llm", [round(m["ndcg@10"], 4) for m in ms], flush=True)
                for lam, m in zip(GRID["lambda"], ms):
                    llm_gain[lam] = llm_gain.get(lam, 0.0) + (m["ndcg@10"] - b["ndcg@10"]) / len(datasets)
        best = max(llm_gain, key=llm_gain.get)
        lines += ["", f"llm λ chosen: {best} (mean Δ NDCG@10 {llm_gain[best]:+.4f} on these queries).", ""]
    return "\n".join(lines)


# -- test ----------------------------------------------------------------------------------

def _compare(run_a: str, run_b: str, qrels: str, name_b: str) -> dict:
    out = subprocess.run([os.path.join(REPO, ".venv", "bin", "funnel"), "compare", run_a, run_b, "--qrels", qrels,
                          "--json", "--name-a", "bm25", "--name-b", name_b],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _enrichment_line(ds: str, root: str) -> str:
    """What the enriched index of ``ds`` holds: its manifest's enrichment counts."""
    from funnel.serving.search import open_index
    man = open_index(root).index.manifest
    e = man.get("enrichment") or {}
    c = e.get("counts") or {}
    return (f"Enriched {ds} index `{root}`: {e.get('model', '?')}, prompt `{e.get('prompt_id', '?')}`, τ "
            f"{e.get('tau', '?')}; of {c.get('documents', 0):,} documents {c.get('cached', 0) + c.get('enriched', 0):,} "
            f"have an answer ({c.get('failed', 0):,} without one stay unenriched), {c.get('with_kept', 0):,} got "
            f"at least one phrase; {c.get('phrases_kept', 0):,} of {c.get('phrases_proposed', 0):,} proposed "
            f"phrases kept, {c.get('terms_injected', 0):,} terms injected.")


def test_table(datasets, runs_dir: str, llm_queries: int, enriched: dict[str, str] | None = None) -> str:
    from funnel.evaluation.evaluate import load_beir
    from funnel.evaluation.trec import write_run
    from funnel.serving.sira import SiraConfig as SiraDefaults
    os.makedirs(runs_dir, exist_ok=True)
    lines = ["Command: `.venv/bin/python bench/bench_sira.py --test --runs RUNS"
             + (f" --llm-queries {llm_queries}" if llm_queries else "")
             + "".join(f" --enriched {k}={v}" for k, v in (enriched or {}).items()) + " --write`. Test qrels, k=100, "
             "SIRA with the defaults chosen on train/dev; rows marked +enriched search the corpus-enriched index "
             "(BM25 there too), every row against the un-enriched BM25. p-values from `funnel compare "
             "BM25_RUN SIRA_RUN --qrels test.tsv`: McNemar on success@10 (hit) and the sign-flip randomization "
             "test on NDCG@10 (10,000 flips, seed 0).", "",
             "| dataset | run | queries | NDCG@10 | R@10 | Δ NDCG@10 | b / c (only BM25 / only SIRA succeed) "
             "| McNemar p | randomization p |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for ds in datasets:
        ix = _index(ds)
        qs, qrels = load_beir(os.path.join(DATA, ds), "test")
        qrels_path = os.path.join(DATA, ds, "qrels", "test.tsv")
        default = SiraDefaults().offline_proposer
        rows = [("bm25", ix, "bm25", {}, qs)] + [
            (f"sira-{p}" + (" (default)" if p == default else ""), ix, "sira", {"proposer": p}, qs) for p in OFFLINE]
        eroot = (enriched or {}).get(ds)
        if eroot:
            from funnel.serving.search import open_index
            ix_e = open_index(eroot)
            lines.insert(1, "\n" + _enrichment_line(ds, eroot))
            rows += [("bm25+enriched", ix_e, "sira-bm25", {}, qs)] + [
                (f"sira-{p}+enriched", ix_e, "sira", {"proposer": p}, qs) for p in OFFLINE]
        llm = None
        if llm_queries:
            from funnel.serving.chat import LocalLlamaServer
            from funnel.serving.search import open_index
            llm = LocalLlamaServer(n_ctx=1024).__enter__()
            ix_llm = open_index(os.path.join(".funnel", "indexes", ds), chat=llm.chat(timeout=120))
            sub = dict(list(qs.items())[:llm_queries])
            rows += [(f"bm25 (first {llm_queries})", ix, "bm25", {}, sub),
                     (f"sira-llm (first {llm_queries})", ix_llm, "sira", {"proposer": "llm"}, sub),
                     (f"sira-union+llm (first {llm_queries})", ix_llm, "sira", {"proposer": "union"}, sub)]
            if eroot:
                ix_llm_e = open_index(eroot, chat=llm.chat(timeout=120))
                rows += [(f"sira-llm+enriched (first {llm_queries})", ix_llm_e, "sira", {"proposer": "llm"}, sub)]
        base_path = {}
        for label, searcher, mode, opts, qset in rows:
            t = time.perf_counter()
            # "sira-bm25": plain BM25 on another index, compared against the un-enriched BM25
            m, run = _evaluate(searcher, qset, {q: qrels[q] for q in qset}, mode.removeprefix("sira-"), **opts)
            secs = time.perf_counter() - t
            path = os.path.join(runs_dir, f"{ds}-{label.split(' ')[0]}{'-sub' if len(qset) < len(qs) else ''}.trec")
            write_run(path, run, tag=label.split(" ")[0])
            sub_qrels = qrels_path
            if len(qset) < len(qs):
                sub_qrels = os.path.join(runs_dir, f"{ds}-qrels-first{len(qset)}.tsv")
                with open(sub_qrels, "w") as f:
                    f.write("query-id\tcorpus-id\tscore\n")
                    for q in qset:
                        for d, g in qrels[q].items():
                            f.write(f"{q}\t{d}\t{g}\n")
            print(ds, label, {k: round(v, 4) for k, v in m.items()}, f"{secs:.1f}s", flush=True)
            if mode == "bm25":
                base_path[len(qset)] = (path, m)
                lines.append(f"| {ds} | {label} | {len(qset)} | {m['ndcg@10']:.4f} | {m['recall@10']:.4f} | | | | |")
                continue
            bpath, bm = base_path[len(qset)]
            c = _compare(bpath, path, sub_qrels, label.split(" ")[0])
            lines.append(f"| {ds} | {label} | {len(qset)} | {m['ndcg@10']:.4f} | {m['recall@10']:.4f} | "
                         f"{m['ndcg@10'] - bm['ndcg@10']:+.4f} | {c['b']} / {c['c']} | "
                         f"{c['mcnemar']['p_value']:.4f} | {c['randomization']['p_value']:.4f} |")
        if llm is not None:
            ix_llm = ix_llm_e = None  # noqa: F841 (closed before the server stops)
            del rows
            llm.__exit__(None, None, None)
    return "\n".join(lines + [""])


def _shard_counts(text: str) -> tuple[int | None, ...]:
    """--shards: 'auto' or a positive integer, comma-separated (None stands for auto)."""
    out = []
    for x in (x.strip() for x in text.split(",")):
        if x == "auto" or (x.isdigit() and int(x) > 0):
            out.append(None if x == "auto" else int(x))
        else:
            raise argparse.ArgumentTypeError(f"{x!r} is not a shard count: give 'auto' or a positive integer, "
                                             "comma-separated, e.g. auto,4")
    return tuple(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Nothing is written to bench/RESULTS.md unless --write is given.")
    p.add_argument("--datasets", default="scifact,nfcorpus", help="comma-separated BEIR names (default: %(default)s)")
    p.add_argument("--select", action="store_true", help="run the train/dev selection grid instead of the speed test")
    p.add_argument("--test", action="store_true", help="run the test table with funnel compare per row")
    p.add_argument("--runs", default=os.path.join(".funnel", "runs", "sira"),
                   help="where --test writes its TREC runs (default: %(default)s)")
    p.add_argument("--llm-queries", type=int, default=0,
                   help="also run the llm proposer (local SmolLM2) on the first N queries of each set: "
                        "--select and --test score it, the speed test times it with its sketches cached "
                        "(default: 0, none; ~1-3 s per query on a 2-core CPU)")
    p.add_argument("--enriched", action="append", default=[], metavar="NAME=INDEX_ROOT",
                   help="--test: also the rows on this corpus-enriched index of set NAME (repeatable)")
    p.add_argument("--shards", default="auto,4", type=_shard_counts,
                   help="speed: shard counts of the indexes timed, comma-separated, 'auto' for the build's "
                        "choice (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="speed: passes per configuration, best kept (default: 3)")
    p.add_argument("--write", action="store_true", help="rewrite this benchmark's section(s) of bench/RESULTS.md")
    a = p.parse_args(argv)
    _env()
    sys.path.insert(0, HERE)
    datasets = [d for d in a.datasets.split(",") if d]
    if a.select:
        name, title, body = "sira-select", "SIRA: choosing the defaults on train/dev", select(datasets, a.llm_queries)
    elif a.test:
        enriched = dict(e.split("=", 1) for e in a.enriched)
        name, title, body = ("sira-test", "SIRA: test quality vs BM25",
                             test_table(datasets, a.runs, a.llm_queries, enriched))
    else:
        name, title, body = ("sira-speed", "SIRA: query time vs plain BM25",
                             speed(datasets, a.repeats, a.llm_queries, a.shards))
    print(body)
    if a.write:
        from results import write_section
        write_section(name, title, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
