"""Dense-stage scale benchmark: peak memory of ``funnel build --dense`` (Ray engine) on the
synthetic corpora, against the same corpus built without ``--dense`` in the same run.

    .venv/bin/python bench/bench_dense_scale.py [--sizes 100k,1m] [--baseline-rev REV] [--write [--supplement]]

Per size, each build a fresh child process measured from outside with ``bench_scale.measure``
(wall and CPU seconds, peak RSS and PSS summed over the whole process tree: driver, raylet,
GCS, Ray workers and actors, every 0.2 s):

1. ``funnel build --engine ray`` without ``--dense``: the baseline the ratios are taken against;
2. ``funnel build --engine ray --dense --embed-model openai:hash-384@URL``: the same corpus,
   embedded through a real OpenAI-compatible ``/v1/embeddings`` server on 127.0.0.1
   (``tests/embed_server.py``, started by this script in its own process, so its memory is
   not counted) whose model is a hash: each text's vector is a unit Gaussian draw seeded by
   the text's BLAKE2 digest, dimension 384 like MiniLM-L6;
3. with ``--baseline-rev REV``: build 2 with funnel as of git revision ``REV`` (checked out
   with ``git worktree`` under the work folder and imported through a ``PYTHONPATH`` package
   shim, which Python searches before the editable install). ``3278292~1`` is the last
   revision whose dense stage shuffled the vectors with Ray Data's ``groupby("shard")``.

Why a hash embedder: MiniLM on this machine's two cores embeds a few hundred documents a
second, so a million would take hours, and what is measured here (how the vectors travel
from the actors to the FAISS shards, and how much of them is held where) does not depend on
what the vectors say. The FAISS stage is funnel's default (IVF, nlist from the corpus size).
Every build gets a fresh, empty ``FUNNEL_CACHE`` (no embedding cache hits).

Reports per size and build: wall, CPU, peak tree RSS / PSS, the dense build's peak PSS minus
the lexical build's, and the corpus's raw vector bytes (n · 384 · 4) to compare it with.
``--write`` records the "dense-scale" section of bench/RESULTS.md. Logs, memory timelines
(``.mem.tsv``) and per-process peaks (``.procs.tsv``) go under ``.funnel/dense-scale/``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_scale import GIB, MIB, label, measure_build  # noqa: E402
from results import now_stamp, recorded_section, report, write_section  # noqa: E402
from synth import ensure, parse_count  # noqa: E402

DIM = 384
MODEL = "hash-384"


class HashModel:
    """``encode`` as sentence-transformers spells it; a text's vector depends on the text only."""

    def encode(self, texts, normalize_embeddings=True, convert_to_numpy=True):
        import numpy as np
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for i, t in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little")
            v = np.random.default_rng(seed).standard_normal(DIM)
            out[i] = v / np.linalg.norm(v)
        return out


def _serve(port_out) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from embed_server import ServerThread, create_app
    server = ServerThread(create_app(HashModel(), MODEL)).start()
    port_out.put(server.base_url)
    while True:
        time.sleep(3600)


def _shim(rev: str, work: str) -> str:
    """A folder whose ``funnel`` package maps to a worktree of ``rev``; returns it."""
    tree = os.path.join(work, f"tree-{rev.replace('~', '_').replace('/', '_')}")
    if not os.path.isdir(tree):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", tree, rev], check=True,
                       stdout=subprocess.DEVNULL)
    shim = tree + "-shim"
    pkg = os.path.join(shim, "funnel")
    os.makedirs(pkg, exist_ok=True)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    for sub in ("pipelines", "jobs", "serving", "evaluation"):
        link = os.path.join(pkg, sub)
        if not os.path.lexists(link) and os.path.isdir(os.path.join(tree, sub)):
            os.symlink(os.path.join(tree, sub), link)
    return shim


def build(corpus: str, out: str, work: str, name: str, min_avail: int, dense_url: str | None,
          pythonpath: str | None = None) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cache = tempfile.mkdtemp(prefix="funnel-cache-", dir=work)
    cmd = [sys.executable, "-m", "funnel.serving.frontends.cli", "build", "--corpus", corpus, "--out", out,
           "--engine", "ray", "--progress-seconds", "30"]
    if dense_url:
        cmd += ["--dense", "--embed-model", f"openai:{MODEL}@{dense_url}"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["FUNNEL_CACHE"] = cache
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    try:
        m, vdir, man = measure_build(cmd, os.path.join(work, f"{name}.log"), min_avail, env, out, what=name)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if vdir is None:
        return m
    shutil.rmtree(out, ignore_errors=True)
    if dense_url:
        m["stage_pss"] = stage_peaks(m)
    return {**m, "n_docs": man["corpus"]["n_docs"], "n_shards": len(man.get("shards", [])) or man.get("n_shards"),
            "dense": {k: man["dense"].get(k) for k in ("ntotal", "nlist", "factory")} if man.get("dense") else None}


SUPPLEMENT = "### Supplementary run, separate from the table above"


def stage_peaks(m: dict) -> dict[str, int]:
    """Peak tree PSS (bytes) of a dense build's two last stages, placed on the memory timeline by
    its log's timestamps: ``embed`` from "embed: N documents with" (the actors at work, Ray up)
    to the end of embedding ("ray: stopped ..." or "embed: N vectors"), ``after`` from there to
    the end (writing the vector shards, FAISS training and adds, publishing)."""
    marks = {}
    with open(m["log"]) as f:
        for line in f:
            if " funnel.build INFO " not in line:
                continue
            t = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() - m["started_at"]
            if " embed: " in line and " documents with " in line:
                marks.setdefault("embed", t)
            elif "ray: stopped the local Ray" in line or ("INFO embed: " in line and " vectors; writing " in line):
                marks.setdefault("after", t)
    if "embed" not in marks or "after" not in marks:
        return {}
    with open(m["log"] + ".mem.tsv") as f:
        next(f)
        samples = [(float(t), float(pss)) for t, _, pss, *_ in (line.split("\t") for line in f)]
    out = {}
    for name, lo, hi in (("embed", marks["embed"], marks["after"]), ("after", marks["after"], float("inf"))):
        inside = [pss for t, pss in samples if lo <= t < hi]
        if inside:
            out[name] = int(max(inside) * MIB)
    return out


def render(results: dict, a, command: str) -> str:
    lines = ["Command: `" + command + "`. Builds with `--engine ray` (local Ray, 2 CPUs); memory is the peak "
             "over the whole process tree, sampled every 0.2 s (PSS divides shared pages, e.g. the object "
             "store, among the processes mapping them); load: the 1-minute load average during the build. Embeddings: a hash model (unit Gaussian vectors seeded "
             "by each text's digest, dim 384) behind a real OpenAI-compatible HTTP server on 127.0.0.1 in "
             "another process; see the script's docstring for why. Ratio baseline: the same corpus built "
             "without `--dense` in the same run. Stage peaks (tree PSS, placed on the memory timeline by "
             "the build log's timestamps): 'embedding' while the actors embed, 'shards + FAISS' from the last "
             "vector to the end (writing the vector shards, FAISS training and adds, publishing).", "",
             "| size | build | wall s | CPU s | load | peak RSS | peak PSS | PSS − lexical | embedding PSS | "
             "shards + FAISS PSS | vectors n·384·4 |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for size, r in results.items():
        lex = r.get("lexical", {})
        for key, title in (("lexical", "lexical only (baseline)"), ("dense", "--dense (this revision)"),
                           ("dense_baseline", f"--dense at {a.baseline_rev}")):
            m = r.get(key)
            if not m:
                continue
            if m.get("failed"):
                lines.append(f"| {size} | {title} | | | | | | failed: {m['failed']} | | | |")
                continue
            sp = m.get("stage_pss") or {}
            stages = " | ".join(f"{sp[k] / GIB:.2f} GiB" if k in sp else "" for k in ("embed", "after"))
            extra = (f"{(m['peak_tree_pss'] - lex['peak_tree_pss']) / MIB:,.0f} MiB"
                     if key != "lexical" and lex and not lex.get("failed") else "")
            vec = f"{m['n_docs'] * DIM * 4 / MIB:,.0f} MiB" if key != "lexical" else ""
            lines.append(f"| {size} | {title} | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | {m['load_avg']:.1f} | "
                         f"{m['peak_tree_rss'] / GIB:.2f} GiB | {m['peak_tree_pss'] / GIB:.2f} GiB | {extra} | "
                         f"{stages} | {vec} |")
        d, b = r.get("dense"), r.get("dense_baseline")
        if d and b and not d.get("failed") and not b.get("failed"):
            lines.append(f"| {size} | ratio this / {a.baseline_rev} | {d['wall_s'] / b['wall_s']:.2f}× | "
                         f"{d['cpu_s'] / b['cpu_s']:.2f}× | | {d['peak_tree_rss'] / b['peak_tree_rss']:.2f}× | "
                         f"{d['peak_tree_pss'] / b['peak_tree_pss']:.2f}× | | | | |")
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sizes", default="100k,1m", help="corpus sizes, comma-separated")
    p.add_argument("--baseline-rev", default=None,
                   help="also build --dense with funnel at this git revision (e.g. 3278292~1, the group-by stage)")
    p.add_argument("--min-avail-gib", type=float, default=3.0, help="kill a build when MemAvailable falls below this")
    p.add_argument("--synth", default=os.path.join(".funnel", "synth"), help="synthetic corpus cache")
    p.add_argument("--work", default=os.path.join(".funnel", "dense-scale"), help="logs and temporary indexes")
    p.add_argument("--write", action="store_true", help="record the 'dense-scale' section of bench/RESULTS.md")
    p.add_argument("--supplement", action="store_true",
                   help="with --write: keep the recorded run's table and add this run below it, as a "
                        "supplementary run (replacing an earlier supplement)")
    a = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    min_avail = int(a.min_avail_gib * GIB)
    shim = _shim(a.baseline_rev, work) if a.baseline_rev else None
    q = mp.get_context("spawn").Queue()
    server = mp.get_context("spawn").Process(target=_serve, args=(q,), daemon=True)
    server.start()
    url = q.get(timeout=60)
    results: dict[str, dict] = {}
    try:
        for n in [parse_count(s) for s in a.sizes.split(",")]:
            size = label(n)
            corpus = os.path.join(a.synth, size)
            ensure(n, corpus)
            r = results.setdefault(size, {})
            out = os.path.join(work, f"index-{size}")
            runs = [("lexical", None, None), ("dense", url, None)]
            if shim:
                runs.append(("dense_baseline", url, shim))
            for key, u, pp in runs:
                print(f"{size}: {key} ...", flush=True)
                r[key] = build(corpus, out, work, f"{size}-{key}", min_avail, u, pp)
                m = r[key]
                if not m.get("failed"):
                    print(f"  {m['wall_s']:.1f} s wall, {m['cpu_s']:.1f} s CPU, peak RSS {m['peak_tree_rss'] / GIB:.2f} "
                          f"GiB, PSS {m['peak_tree_pss'] / GIB:.2f} GiB", flush=True)
                with open(os.path.join(work, "results.json"), "w") as f:
                    json.dump(results, f, indent=1, default=str)
    finally:
        server.terminate()
        if shim:  # the worktree is registered in this repository's .git: remove it, not just its files
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", shim[:-len("-shim")]],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            shutil.rmtree(shim, ignore_errors=True)
    command = ".venv/bin/python bench/bench_dense_scale.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(results, a, command.strip())
    title = "Dense stage at scale: build memory with and without --dense (bench/bench_dense_scale.py)"
    recorded = recorded_section("dense-scale") if a.supplement else None
    if recorded is None:
        report("dense-scale", title, text, a.write)
        return 0
    stamp, body = recorded
    body = body.split(SUPPLEMENT, 1)[0].rstrip("\n")
    print("\n" + text)
    if a.write:
        write_section("dense-scale", title, f"{body}\n\n{SUPPLEMENT}\n\n_measured {now_stamp()}_\n\n{text}", stamp)
        print("\nadded this run to the 'dense-scale' section of bench/RESULTS.md as its supplementary run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
