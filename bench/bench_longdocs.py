"""Long documents: every mode before and after passages, on SciFact abstracts packed into containers.

    .venv/bin/python bench/bench_longdocs.py [--data DIR] [--per-doc 20,40] [--seed 0] [--write]

The check the issue asks for, built from data at hand: SciFact's 5,183 abstracts are
shuffled (seeded) and packed, 20 to 40 at a time, into long documents of a few thousand
words (each abstract a paragraph: its title, a line break, its text). A query's relevant
containers are those holding a relevant abstract (its highest grade); SciFact's test queries
are asked of them. The corpus is written under ``--out`` at run time, never committed.

Three builds of the same corpus, in subprocesses (each one's peak memory is its own):
``--passages off`` (one vector per document: the embedder reads its first window, what
funnel did before passages), ``--passages on`` (the default) and ``--passages on
--bm25-passages`` (BM25 too scores a document by its best passage; hybrid and sira fuse and
expand that list). All are evaluated with ``funnel eval``'s code on bm25, dense, hybrid and
sira (each mode's defaults). Whole-document BM25 does not depend on passages, so its row is
the same in the first two. Then SciFact itself (abstracts: 11 of 5,183 are long enough to
split) is built with and without ``--bm25-passages`` and evaluated the same way
(``--no-scifact`` skips it). Prints its section of bench/RESULTS.md; --write records it there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))
from results import add_common_arguments, dataset_dir, report  # noqa: E402

MODES = ("bm25", "dense", "hybrid", "sira")
#: (name, --passages, --bm25-passages) of each build of the long-document corpus.
SETTINGS = (("off", "off", False), ("on", "on", False), ("bm25p", "on", True))


def pack(corpus: list[dict], per_doc: tuple[int, int], seed: int) -> tuple[list[dict], dict[str, str]]:
    """(containers, abstract id -> container id): abstracts shuffled, then packed in runs of
    ``per_doc[0]..per_doc[1]`` (seeded), each a paragraph ``title\\ntext``; no titles."""
    rng = random.Random(seed)
    docs = list(corpus)
    rng.shuffle(docs)
    out, where, i = [], {}, 0
    while i < len(docs):
        n = rng.randint(*per_doc)
        part = docs[i:i + n]
        cid = f"L{len(out):04d}"
        out.append({"_id": cid, "title": "",
                    "text": "\n\n".join(f"{d.get('title', '')}\n{d['text']}".strip() for d in part)})
        for d in part:
            where[d["_id"]] = cid
        i += n
    return out, where


def write_dataset(src: str, out: str, per_doc: tuple[int, int], seed: int) -> dict:
    """The packed corpus as a BEIR folder (test queries and container qrels); its stats."""
    corpus = [json.loads(line) for line in open(os.path.join(src, "corpus.jsonl"))]
    containers, where = pack(corpus, per_doc, seed)
    os.makedirs(os.path.join(out, "qrels"), exist_ok=True)
    with open(os.path.join(out, "corpus.jsonl"), "w") as f:
        for c in containers:
            f.write(json.dumps(c) + "\n")
    qrels: dict[str, dict[str, int]] = {}
    with open(os.path.join(src, "qrels", "test.tsv")) as f:
        next(f)
        for line in f:
            qid, did, rel = line.rstrip("\n").split("\t")[:3]
            if did in where and int(rel) > 0:
                c = qrels.setdefault(qid, {})
                c[where[did]] = max(c.get(where[did], 0), int(rel))
    with open(os.path.join(out, "qrels", "test.tsv"), "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for qid, rels in qrels.items():
            for cid, rel in sorted(rels.items()):
                f.write(f"{qid}\t{cid}\t{rel}\n")
    with open(os.path.join(src, "queries.jsonl")) as f, open(os.path.join(out, "queries.jsonl"), "w") as g:
        g.writelines(line for line in f if json.loads(line)["_id"] in qrels)
    words = sorted(len(c["text"].split()) for c in containers)
    return {"abstracts": len(corpus), "documents": len(containers), "queries": len(qrels),
            "median_words": words[len(words) // 2], "max_words": words[-1]}


def build(corpus: str, root: str, passages: str, bm25_passages: bool = False, cache: str | None = None) -> dict:
    """``funnel build --dense --passages P [--bm25-passages]`` in a subprocess: its seconds,
    peak RSS, manifest. ``cache``: an embedding cache folder of its own (``FUNNEL_CACHE``),
    emptied first, so the build embeds every vector."""
    env = None
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
        env = dict(os.environ, FUNNEL_CACHE=cache)
    cmd = [sys.executable, "-m", "funnel.serving.frontends.cli", "build", "--corpus", corpus, "--out", root, "--dense",
           "--passages", passages] + (["--bm25-passages"] if bm25_passages else [])
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    secs = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: {' '.join(cmd)} failed")
    from funnel.pipelines.store.artifacts import load_manifest, read_current
    m = load_manifest(os.path.join(root, read_current(root)))
    return {"seconds": secs, "peak_mib": usage.ru_maxrss / 1024, "manifest": m}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common_arguments(p)
    p.add_argument("--out", default=os.path.join(".funnel", "longdocs"),
                   help="where the packed corpus and the indexes are written")
    p.add_argument("--per-doc", default="20,40", help="abstracts per long document: MIN,MAX")
    p.add_argument("--seed", type=int, default=0, help="shuffle and packing seed")
    p.add_argument("--scifact", action=argparse.BooleanOptionalAction, default=True,
                   help="also build SciFact itself with and without --bm25-passages and evaluate both")
    p.add_argument("--cold", action="store_true",
                   help="each long-document build with an empty embedding cache of its own, so build times "
                        "include embedding every vector (default: the shared cache, which a rerun hits)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    a = parse_args(argv)
    lo, hi = (int(x) for x in a.per_doc.split(","))
    src = dataset_dir(a.data, "scifact")
    data = os.path.join(a.out, "scifact-long")
    stats = write_dataset(src, data, (lo, hi), a.seed)
    print(f"{stats['documents']} documents (median {stats['median_words']:,} words) from {stats['abstracts']:,} "
          f"abstracts; {stats['queries']} test queries", file=sys.stderr)
    from funnel.evaluation.evaluate import eval_dataset
    from funnel.serving.search import open_index
    rows, builds = {}, {}
    for setting, passages, bm25p in SETTINGS:
        root = os.path.join(a.out, f"index-passages-{setting}")
        shutil.rmtree(root, ignore_errors=True)
        builds[setting] = build(os.path.join(data, "corpus.jsonl"), root, passages, bm25p,
                                cache=os.path.join(a.out, "cold-cache") if a.cold else None)
        res = eval_dataset(open_index(root), data, list(MODES))
        rows[setting] = {m: res["metrics"][m]["ndcg@10"] for m in MODES}
        print(setting, rows[setting], file=sys.stderr)
    off, on, bp = rows["off"], rows["on"], rows["bm25p"]
    sci = {}
    if a.scifact:
        for setting, bm25p in (("default", False), ("bm25p", True)):
            root = os.path.join(a.out, f"scifact-{setting}")
            shutil.rmtree(root, ignore_errors=True)
            builds[f"scifact-{setting}"] = build(os.path.join(src, "corpus.jsonl"), root, "on", bm25p)
            res = eval_dataset(open_index(root), src, list(MODES))
            sci[setting] = {m: res["metrics"][m]["ndcg@10"] for m in MODES}
            print("scifact", setting, sci[setting], file=sys.stderr)
    lines = [f"SciFact's {stats['abstracts']:,} abstracts packed {lo}-{hi} to a document (seed {a.seed}): "
             f"{stats['documents']} documents, median {stats['median_words']:,} words (max "
             f"{stats['max_words']:,}); {stats['queries']} SciFact test queries, a container relevant when "
             f"it holds a relevant abstract. Embedder all-MiniLM-L6-v2 (256 word pieces); every mode at "
             f"its defaults; NDCG@10.", "",
             "| passages | bm25 | dense | hybrid (default) | sira (default) |", "|---|---:|---:|---:|---:|"]
    for setting, label in (("off", "off (one vector per document, its first window)"),
                           ("on", "on (MaxP over passages)"),
                           ("bm25p", "on, and --bm25-passages (BM25 too: MaxP over passages)")):
        r = rows[setting]
        lines.append(f"| {label} | {r['bm25']:.4f} | {r['dense']:.4f} | {r['hybrid']:.4f} | {r['sira']:.4f} |")
    lines += ["", f"Dense with passages / without: {on['dense'] / max(off['dense'], 1e-9):.2f}x (target >= 2x). "
              f"Default hybrid {'>=' if on['hybrid'] >= on['bm25'] else '<'} BM25 alone "
              f"({on['hybrid']:.4f} vs {on['bm25']:.4f}); default sira "
              f"{'>=' if on['sira'] >= on['bm25'] else '<'} BM25 alone ({on['sira']:.4f} vs {on['bm25']:.4f}).",
              f"Passage BM25 / whole-document BM25: {bp['bm25'] / max(on['bm25'], 1e-9):.2f}x "
              f"({bp['bm25']:.4f} vs {on['bm25']:.4f}); with it, hybrid {bp['hybrid']:.4f} (was {on['hybrid']:.4f}) "
              f"and sira {bp['sira']:.4f} (was {on['sira']:.4f}).", ""]
    if sci:
        d, p = sci["default"], sci["bm25p"]
        same = "equals" if f"{d['bm25']:.4f}" == "0.6789" else "differs from"
        lines += [f"SciFact itself (its test queries, {builds['scifact-bm25p']['manifest']['bm25_passages']['n_passages']:,} "
                  f"passages for {builds['scifact-bm25p']['manifest']['corpus']['n_docs']:,} abstracts): the default "
                  f"build and one with --bm25-passages; no tuning. The default build's BM25 {same} Lucene's "
                  "published 0.6789.", "",
                  "| SciFact build | bm25 | dense | hybrid (default) | sira (default) |", "|---|---:|---:|---:|---:|"]
        for label, r in (("default (whole-document BM25)", d), ("--bm25-passages", p)):
            lines.append(f"| {label} | {r['bm25']:.4f} | {r['dense']:.4f} | {r['hybrid']:.4f} | {r['sira']:.4f} |")
        lines.append("")
    lines += ["| build | vectors | BM25 documents | dense stage s | passage BM25 stage s | whole build s "
              "| peak RSS of the build process |", "|---|---:|---:|---:|---:|---:|---:|"]
    for setting, label in (("off", "--passages off"), ("on", "--passages on"),
                           ("bm25p", "--passages on --bm25-passages")):
        b = builds[setting]
        m = b["manifest"]
        stages = m["build"]["stages"]
        bm25_docs = (f"{m['corpus']['n_docs']:,} + {m['bm25_passages']['n_passages']:,} passages"
                     if m.get("bm25_passages") else f"{m['corpus']['n_docs']:,}")
        lines.append(f"| {label} | {m['dense']['ntotal']:,} | {bm25_docs} | {stages.get('dense', 0):.0f} "
                     f"| {stages.get('bm25_passages', 0):.1f} | {b['seconds']:.0f} | {b['peak_mib']:,.0f} MiB |")
    lines += ["", ("Build times include embedding every vector on this machine's CPU (--cold: each build "
                   "with an empty embedding cache)" if a.cold else "Build times include embedding on this "
                   "machine's CPU, through the embedding cache (a rerun embeds nothing)")
              + "; peak RSS is the build process's own (its engine: "
              f"{builds['on']['manifest']['build'].get('engine', {}).get('name', '?')}).", "",
              f"Load average at the end of the run: {' / '.join(f'{x:.1f}' for x in os.getloadavg())} "
              f"({os.cpu_count()} CPUs).", "",
              f"`.venv/bin/python bench/bench_longdocs.py --per-doc {lo},{hi} --seed {a.seed}"
              f"{'' if a.scifact else ' --no-scifact'}{' --cold' if a.cold else ''} --write`"]
    report("longdocs", "Long documents: passages (SciFact abstracts packed into long documents)",
           "\n".join(lines), a.write)


if __name__ == "__main__":
    main()
