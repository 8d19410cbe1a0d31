"""Evidence for agents: is the answer inside the text an agent reads? (DESIGN.md "The result an agent gets")

    .venv/bin/python bench/bench_evidence.py [--sets longdocs,scifact,nfcorpus,packages] [--queries 100]
        [--budgets 500,1000,2000] [--modes bm25,dense,hybrid,sira] [--before 75f23af] [--out DIR] [--write]

For every query of each set, in every mode, ``evidence@B``: whether the evidence is inside

* **text**: the search's ``summary`` (what MCP returns as text content, HTTP as ``summary``,
  the CLI prints) at a budget of B tokens (``budget=B``), and
* **context**: the packed context at ``context_tokens=B`` (``trace["context"]``, joined),

with NDCG@10 of the same hits beside it, **after** (this checkout) and **before** (the code
at ``--before``, checked out into a git worktree and run in a subprocess on the same indexes
and queries; before, the summary had no budget, so its text is the same at every B).

Evidence, per set (text and evidence compared with whitespace collapsed, and the summary's
quote markers, a line's leading ``   > ``, removed: formatting, not text):

* ``longdocs``: SciFact's abstracts packed 20-40 into long documents (``bench_longdocs.pack``,
  seed 0) and SciFact's test queries; the evidence is a relevant abstract's span inside its
  long document: a hit when the text holds one full sentence of it (a sentence: split after
  ``.``, ``!`` or ``?`` and whitespace, of at least :data:`MIN_SENTENCE_WORDS` words).
* ``scifact``, ``nfcorpus``: the BEIR test queries; a hit when the text holds a full sentence
  (as above) of a relevant document (grade > 0).
* ``packages``: ``bench/evidence_packages.json``: questions whose answers are exact strings in
  the README (METADATA long description) of installed packages; the corpus is those packages'
  READMEs, read from the installed distributions at run time; a hit when the text holds an
  answer string. Its qrels for NDCG are the documents that hold an answer.

Latency, in the same process and interleaved query by query: the default search (budgeted
text, passages ranked) against the same search with ``explain=False`` (the ranking alone);
the before code's default search (explanations, its one-line-per-hit summary) in its own
subprocess over the same queries. p50 of wall and CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import add_common_arguments, dataset_dir, report  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SETS = ("longdocs", "scifact", "nfcorpus", "packages")
MODES = ("bm25", "dense", "hybrid", "sira")
#: A "sentence" of evidence has at least this many words (shorter ones, e.g. "Results.", match anywhere).
MIN_SENTENCE_WORDS = 6
#: The commit before the evidence-bearing summary (issue 47).
BEFORE = "75f23af"
_SENT = re.compile(r"(?<=[.!?])\s+")
_QUOTE = re.compile(r"^ {3}> ", re.M)


def norm(text: str) -> str:
    return " ".join(text.split())


def sentences(text: str) -> list[str]:
    """The evidence units of a relevant text: its sentences of at least MIN_SENTENCE_WORDS words."""
    return [s for s in (norm(x) for x in _SENT.split(text)) if len(s.split()) >= MIN_SENTENCE_WORDS]


def readable(summary: str) -> str:
    """The summary as evidence is looked for in it: quote markers removed, whitespace collapsed."""
    return norm(_QUOTE.sub("", summary))


# -- the sets -------------------------------------------------------------------------------


def _beir(path: str, split: str = "test"):
    from funnel.evaluation.trec import read_qrels, read_queries
    qrels = {q: {d: g for d, g in r.items() if g > 0} for q, r in read_qrels(os.path.join(path, "qrels",
                                                                                           f"{split}.tsv")).items()}
    queries = read_queries(os.path.join(path, "queries.jsonl"))
    return queries, {q: r for q, r in qrels.items() if r}


def _corpus(path: str) -> dict[str, dict]:
    with open(os.path.join(path, "corpus.jsonl")) as f:
        return {(r := json.loads(line))["_id"]: r for line in f}


def build(corpus: str, root: str, dense: bool = True, extra: tuple = ()) -> None:
    """``funnel build`` in a subprocess (reused when ``root`` already has a version)."""
    if os.path.exists(os.path.join(root, "CURRENT")):
        return
    cmd = [sys.executable, "-m", "funnel.serving.frontends.cli", "build", "--corpus", corpus, "--out", root,
           "--engine", "local", *(["--dense"] if dense else []), *extra]
    print("building:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def make_set(name: str, a) -> dict:
    """``{"root", "queries", "qrels", "evidence": {qid: [strings]}, "size"}`` of one set."""
    out = os.path.join(a.out, name)
    os.makedirs(out, exist_ok=True)
    if name in ("scifact", "nfcorpus"):
        src = dataset_dir(a.data, name)
        queries, qrels = _beir(src)
        docs = _corpus(src)
        root = os.path.join(out, "index")
        build(src, root)
        evidence = {q: [s for d in r for s in sentences(docs[d].get("text", ""))] for q, r in qrels.items()}
        size = f"{len(docs):,} documents"
    elif name == "longdocs":
        from bench_longdocs import write_dataset
        src = dataset_dir(a.data, "scifact")
        data = os.path.join(out, "data")
        stats = write_dataset(src, data, (20, 40), 0)
        queries, qrels = _beir(data)
        _, orig = _beir(src)
        abstracts = _corpus(src)
        root = os.path.join(out, "index" + ("-bm25p" if a.bm25_passages else ""))
        build(os.path.join(data, "corpus.jsonl"), root, extra=("--bm25-passages",) if a.bm25_passages else ())
        evidence = {q: [s for d in orig.get(q, {}) for s in sentences(abstracts[d].get("text", ""))] for q in qrels}
        size = (f"{stats['documents']} long documents (median {stats['median_words']:,} words) packed from "
                f"{stats['abstracts']:,} abstracts{', built with --bm25-passages' if a.bm25_passages else ''}")
    else:
        import importlib.metadata as md
        cfg = json.load(open(os.path.join(HERE, "evidence_packages.json")))
        corpus = os.path.join(out, "corpus.jsonl")
        words = []
        with open(corpus, "w") as f:
            for pkg in cfg["packages"]:
                text = md.distribution(pkg).read_text("METADATA") or ""
                body = text.split("\n\n", 1)[1] if "\n\n" in text else ""
                words.append(len(body.split()))
                f.write(json.dumps({"_id": pkg, "title": pkg, "text": body}) + "\n")
        root = os.path.join(out, "index")
        build(corpus, root)
        queries = {q["id"]: q["question"] for q in cfg["questions"]}
        bodies = {json.loads(line)["_id"]: norm(json.loads(line)["text"]) for line in open(corpus)}
        evidence = {q["id"]: [norm(x) for x in q["answers"]] for q in cfg["questions"]}
        qrels = {q: {d: 1 for d, b in bodies.items() if any(x in b for x in ev)} for q, ev in evidence.items()}
        words.sort()
        size = (f"{len(cfg['packages'])} package READMEs (median {words[len(words) // 2]:,} words), "
                f"{len(queries)} questions")
    qids = [q for q in queries if q in qrels and evidence.get(q)][:a.queries]
    return {"root": root, "queries": {q: queries[q] for q in qids}, "qrels": {q: qrels[q] for q in qids},
            "evidence": {q: evidence[q] for q in qids}, "size": size}


# -- answering (this checkout, or the before code in a subprocess) ----------------------------


def answer(root: str, queries: dict[str, str], modes: list[str], budgets: list[int], k: int = 10) -> dict:
    """``{mode: {qid: {"hits", "text": {B: str}, "context": {B: str}, "ms": [plain, default], "cpu": [...]}}}``
    with whatever ``funnel`` this process imports (the before code has no ``budget``)."""
    import inspect

    from funnel.serving.search import VersionSearcher, open_index
    budgeted = "budget" in inspect.signature(VersionSearcher.search).parameters
    ix = open_index(root)
    out: dict = {}
    for mode in modes:
        if mode in ("dense", "hybrid") and not ix.dense_mode.available:
            continue
        rows = out[mode] = {}
        for qid, q in queries.items():
            ix.search(q, mode=mode, k=k, explain=False)  # warm: the query vector, first-use tables
            times, cpus = [], []
            for explain in (False, True):  # interleaved: the ranking alone, then the default answer
                t, c = time.perf_counter(), time.process_time()
                res = ix.search(q, mode=mode, k=k, explain=explain)
                times.append((time.perf_counter() - t) * 1000)
                cpus.append((time.process_time() - c) * 1000)
            rec = rows[qid] = {"hits": [h.doc_id for h in res.hits], "text": {}, "context": {}, "ms": times,
                               "cpu": cpus, "summary_default": res.summary}
            for b in budgets:
                kw = {"budget": max(100, b)} if budgeted else {}
                r = ix.search(q, mode=mode, k=k, context_tokens=b, **kw)
                rec["text"][str(b)] = r.summary
                rec["context"][str(b)] = "\n".join(c["text"] for c in r.trace.get("context", []))
    return out


def worker_main(argv: list[str]) -> None:
    """``--worker JOB.json OUT.json``: :func:`answer` for the job, in whatever code is on sys.path."""
    job = json.load(open(argv[0]))
    json.dump(answer(job["root"], job["queries"], job["modes"], job["budgets"]), open(argv[1], "w"))


def before_tree(rev: str, where: str) -> str:
    """A path whose ``funnel`` package is the code at ``rev`` (a git worktree plus a shim)."""
    wt = os.path.join(where, "worktree")
    if not os.path.exists(wt):
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", wt, rev], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shim = os.path.join(where, "shim", "funnel")
    os.makedirs(shim, exist_ok=True)
    open(os.path.join(shim, "__init__.py"), "w").close()
    for d in ("serving", "pipelines", "jobs", "evaluation"):
        link = os.path.join(shim, d)
        if not os.path.exists(link):
            os.symlink(os.path.join(wt, d), link)
    return os.path.dirname(shim)


def answer_before(rev: str, where: str, root: str, queries, modes, budgets) -> dict:
    path = before_tree(rev, where)
    job, out = os.path.join(where, "job.json"), os.path.join(where, "out.json")
    json.dump({"root": root, "queries": queries, "modes": modes, "budgets": budgets}, open(job, "w"))
    env = dict(os.environ, PYTHONPATH=path)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", job, out], check=True, env=env)
    return json.load(open(out))


# -- scoring --------------------------------------------------------------------------------


def score(ans: dict, s: dict, budgets: list[int], exact: bool) -> dict:
    """Per mode: NDCG@10, evidence@B of text and context, p50 ms and CPU ms."""
    from funnel.evaluation.metrics import evaluate
    out = {}
    for mode, rows in ans.items():
        run = {q: {d: float(100 - i) for i, d in enumerate(r["hits"])} for q, r in rows.items()}
        mean, _ = evaluate(run, {q: s["qrels"][q] for q in rows}, ["ndcg@10"], ties="rank")

        def hit(text: str, q: str) -> bool:
            body = readable(text)
            return any(e in body for e in s["evidence"][q])

        row = {"ndcg": mean["ndcg@10"], "n": len(rows)}
        for b in budgets:
            row[f"text@{b}"] = sum(hit(r["text"][str(b)], q) for q, r in rows.items()) / len(rows)
            row[f"context@{b}"] = sum(hit(r["context"][str(b)], q) for q, r in rows.items()) / len(rows)
        for i, name in enumerate(("plain", "default")):
            ms = sorted(r["ms"][i] for r in rows.values())
            cpu = sorted(r["cpu"][i] for r in rows.values())
            row[f"{name}_ms"], row[f"{name}_cpu"] = ms[len(ms) // 2], cpu[len(cpu) // 2]
        out[mode] = row
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common_arguments(p)
    p.add_argument("--out", default=os.path.join(".funnel", "evidence"), help="indexes and scratch files")
    p.add_argument("--sets", default=",".join(SETS), help="comma-separated, from: " + ", ".join(SETS))
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    p.add_argument("--budgets", default="500,1000,2000", help="token budgets B of evidence@B")
    p.add_argument("--queries", type=int, default=100, help="queries per set (the first N with qrels)")
    p.add_argument("--before", default=BEFORE, help="git revision of the code before (run from a worktree)")
    p.add_argument("--no-before", dest="run_before", action="store_false", help="skip the before code")
    p.add_argument("--bm25-passages", action="store_true", help="longdocs: build with --bm25-passages")
    return p.parse_args(argv)


def main(argv=None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker_main(sys.argv[2:])
    a = parse_args(argv)
    budgets = [int(x) for x in a.budgets.split(",")]
    modes = a.modes.split(",")
    results, sizes = {}, {}
    scratch = tempfile.mkdtemp(prefix="before-", dir=os.path.abspath(a.out) if os.path.isdir(a.out) else None)
    try:
        for name in a.sets.split(","):
            s = make_set(name, a)
            sizes[name] = f"{s['size']}; {len(s['queries'])} queries"
            print(name, sizes[name], file=sys.stderr)
            t = time.perf_counter()
            after = answer(s["root"], s["queries"], modes, budgets)
            results[(name, "after")] = score(after, s, budgets, name == "packages")
            print(name, "after", f"{time.perf_counter() - t:.0f}s", results[(name, "after")], file=sys.stderr)
            if a.run_before:
                before = answer_before(a.before, scratch, s["root"], s["queries"], modes, budgets)
                results[(name, "before")] = score(before, s, budgets, name == "packages")
                print(name, "before", results[(name, "before")], file=sys.stderr)
            if name == "packages":  # one example text for the docs
                mode = "hybrid" if "hybrid" in after else modes[0]
                q = next(iter(after[mode]))
                print(f"\nexample ({name}, {mode}, {s['queries'][q]!r}):\n{after[mode][q]['summary_default']}",
                      file=sys.stderr)
    finally:
        if os.path.exists(os.path.join(scratch, "worktree")):
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", os.path.join(scratch, "worktree")],
                           check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    lines = [f"Evidence: the fraction of queries whose evidence is inside the text an agent reads (the search's "
             f"summary at `budget=B`) and inside the packed context (`context_tokens=B`), k=10, every mode at its "
             f"defaults; before = the code at {a.before} (its summary lists ids and why, so its text is the same at "
             f"every B). Evidence: a full sentence (>= {MIN_SENTENCE_WORDS} words) of a relevant document, or of the "
             "relevant abstract inside its long document; for the package READMEs an exact answer string. "
             "Whitespace collapsed, quote markers removed.", ""]
    for name in a.sets.split(","):
        lines += [f"**{name}** ({sizes[name]})", "",
                  "| mode | code | NDCG@10 | " + " | ".join(f"text@{b}" for b in budgets) + " | "
                  + " | ".join(f"context@{b}" for b in budgets) + " |",
                  "|---|---|---:|" + "---:|" * (2 * len(budgets))]
        for mode in modes:
            for code in ("before", "after"):
                r = results.get((name, code), {}).get(mode)
                if r is None:
                    continue
                lines.append(f"| {mode} | {code} | {r['ndcg']:.4f} | "
                             + " | ".join(f"{r[f'text@{b}']:.2f}" for b in budgets) + " | "
                             + " | ".join(f"{r[f'context@{b}']:.2f}" for b in budgets) + " |")
        lines.append("")
    lines += ["Latency per query, p50 over the same queries (k=10; wall ms / CPU ms): the ranking alone "
              "(`explain=False`) and the default answer (explanations, passages ranked, the budgeted text), "
              "interleaved in one process; the before code's default answer in its own process.", "",
              "| set | mode | ranking alone | default answer | default / ranking alone | before: default answer "
              "| default / before default |", "|---|---|---:|---:|---:|---:|---:|"]
    for name in a.sets.split(","):
        for mode in modes:
            r, o = results.get((name, "after"), {}).get(mode), results.get((name, "before"), {}).get(mode)
            if r is None:
                continue
            old = f"{o['default_ms']:.1f} / {o['default_cpu']:.1f}" if o else "-"
            ratio = f"{r['default_ms'] / o['default_ms']:.2f}x" if o else "-"
            lines.append(f"| {name} | {mode} | {r['plain_ms']:.1f} / {r['plain_cpu']:.1f} | {r['default_ms']:.1f} / "
                         f"{r['default_cpu']:.1f} | {r['default_ms'] / r['plain_ms']:.2f}x | {old} | {ratio} |")
    lines += ["", f"Load average at the end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())} "
              f"({os.cpu_count()} CPUs).", "",
              f"`.venv/bin/python bench/bench_evidence.py --sets {a.sets} --queries {a.queries} --budgets {a.budgets}"
              f"{' --bm25-passages' if a.bm25_passages else ''} --write`"]
    if a.bm25_passages:
        report("evidence-bm25p", "Evidence for agents on a --bm25-passages build (bench/bench_evidence.py)",
               "\n".join(lines), a.write)
    else:
        report("evidence", "Evidence for agents: is the answer in the text? (bench/bench_evidence.py)",
               "\n".join(lines), a.write)


if __name__ == "__main__":
    main()
