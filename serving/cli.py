"""The ``funnel`` command: a thin dispatcher that imports each side lazily.

    funnel build --corpus PATH --out INDEX_ROOT [--shards N] [--dense]   (the Ray job)
    funnel search INDEX_ROOT "query" [--mode bm25] [--k 10] [--json]
    funnel search INDEX_ROOT --queries queries.jsonl --mode bm25 --k 100 --run out.trec
    funnel eval --dataset BEIR_DIR [--index INDEX_ROOT] [--modes bm25,dense] [--check MATRIX]
    funnel compare RUN_A RUN_B --qrels QRELS
    funnel serve INDEX_ROOT | funnel mcp INDEX_ROOT | funnel demo | funnel verify INDEX_ROOT
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

EXIT_USAGE = 2


def _err(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _searcher(root: str, args=None):
    from .search import open_index
    kw = {}
    if args is not None and getattr(args, "verify", None):
        kw["verify"] = args.verify
    return open_index(root, **kw)


def _search_options(a) -> dict:
    opts = {}
    for name in ("k1", "b", "length_norm", "nprobe"):
        v = getattr(a, name, None)
        if v is not None:
            opts[name] = v
    return opts


def cmd_build(a) -> int:
    from funnel.jobs.build_index import run_from_args
    run_from_args(a)
    return 0


def cmd_search(a) -> int:
    ix = _searcher(a.index, a)
    opts = _search_options(a)
    if a.queries:
        from funnel.evaluation.trec import read_queries, write_run
        if not a.run:
            return _err("--queries needs --run OUT.trec (where to write the TREC run)")
        queries = read_queries(a.queries)
        run = ix.search_batch(queries, mode=a.mode, k=a.k, **opts)
        write_run(a.run, {q: dict(hits) for q, hits in run.items()}, tag=f"funnel-{a.mode}")
        print(f"wrote {a.run}: {len(run)} queries, mode {a.mode}, k {a.k}")
        return 0
    if not a.query:
        return _err('give a query ("funnel search INDEX \\"text\\"") or --queries FILE --run OUT')
    res = ix.search(a.query, mode=a.mode, k=a.k, **opts)
    if a.json:
        print(json.dumps(res.to_dict(), ensure_ascii=False, indent=2))
    else:
        print(res.summary)
        for h in res.hits:
            if h.snippet:
                print(f"   {h.rank}. {h.snippet}")
    return 0


def ensure_index(dataset_dir: str, root: str | None, need_dense: bool, shards: int) -> str:
    """Reuse the index at ``root`` (default ``.funnel/indexes/NAME``) or build it from the dataset."""
    from funnel.pipelines.artifacts import load_manifest, read_current
    name = os.path.basename(os.path.normpath(dataset_dir))
    root = root or os.path.join(".funnel", "indexes", name)
    cur = read_current(root)
    if cur is not None:
        m = load_manifest(os.path.join(root, cur))
        if not need_dense or m.get("dense"):
            return root
    from funnel.jobs.build_index import build
    print(f"building {root} from {dataset_dir} ({shards} shards{', dense' if need_dense else ''})", file=sys.stderr)
    build(dataset_dir, root, shards=shards, dense=need_dense)
    return root


def cmd_eval(a) -> int:
    from funnel.evaluation.evaluate import run_eval
    return run_eval(a, ensure_index)


def cmd_demo(a) -> int:
    from funnel.pipelines.demo import write_demo_corpus
    from funnel.jobs.build_index import build
    os.makedirs(a.out, exist_ok=True)
    corpus = os.path.join(a.out, "..", "demo-corpus.jsonl")
    n = write_demo_corpus(corpus)
    print(f"demo corpus: {n} Python standard-library docstrings -> {os.path.normpath(corpus)}")
    rep = build(corpus, a.out, shards=2, dense=a.dense)
    print(f"published {a.out}/{rep.version}: {rep.n_docs} documents, {rep.n_rejects} rejected, {rep.seconds:.1f}s")
    ix = _searcher(a.out)
    modes = ["bm25"] + (["dense", "hybrid"] if a.dense else [])
    for mode in modes:
        res = ix.search(a.query, mode=mode, k=5)
        print(f"\n$ funnel search {a.out} {a.query!r} --mode {mode}")
        print(res.summary)
    return 0


def cmd_verify(a) -> int:
    from .index import IndexVersion
    ix = IndexVersion(a.index, verify="full")
    print(f"{ix.dir}: OK ({len(ix.manifest['files'])} files checked, {ix.n_docs} documents)")
    return 0


def cmd_serve(a) -> int:
    from .http import serve
    return serve(a.index, host=a.host, port=a.port, token=a.token or os.environ.get("FUNNEL_TOKEN"))


def cmd_mcp(a) -> int:
    from .mcp import run_mcp
    return run_mcp(a.index, transport=a.transport, host=a.host, port=a.port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="funnel", description="Retrieval for agents: build, search, evaluate.")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    from funnel.jobs.build_index import add_arguments
    b = sub.add_parser("build", help="build and publish an index version (Ray Data)")
    add_arguments(b)
    b.set_defaults(fn=cmd_build)

    s = sub.add_parser("search", help="query an index (one query, or a batch into a TREC run)")
    s.add_argument("index")
    s.add_argument("query", nargs="?")
    s.add_argument("--mode", default="bm25")
    s.add_argument("--k", type=int, default=10)
    s.add_argument("--json", action="store_true")
    s.add_argument("--queries", help="BEIR queries.jsonl for batch mode")
    s.add_argument("--run", help="TREC run to write in batch mode")
    s.add_argument("--k1", type=float)
    s.add_argument("--b", type=float)
    s.add_argument("--length-norm", dest="length_norm", choices=["lucene-byte4", "exact"])
    s.add_argument("--nprobe", type=int)
    s.add_argument("--verify", choices=["none", "sizes", "full"])
    s.set_defaults(fn=cmd_search)

    e = sub.add_parser("eval", help="evaluate modes on a BEIR dataset (builds the index if needed)")
    e.add_argument("--dataset", required=False, help="BEIR directory (corpus.jsonl, queries.jsonl, qrels/)")
    e.add_argument("--index", help="INDEX_ROOT (default: .funnel/indexes/<dataset name>)")
    e.add_argument("--mode", dest="modes", help="one mode (same as --modes)")
    e.add_argument("--modes", dest="modes", default="bm25")
    e.add_argument("--split", default="test")
    e.add_argument("--k", type=int, default=100)
    e.add_argument("--shards", type=int, default=4)
    e.add_argument("--out", help="folder for runs, report and plot (default: next to the index)")
    e.add_argument("--check", help="regression matrix YAML: print OK/FAIL per row, exit 1 on FAIL")
    e.add_argument("--json", action="store_true")
    e.set_defaults(fn=cmd_eval)

    try:
        from funnel.evaluation.evalcli import add_compare_parser
        add_compare_parser(sub)
    except ImportError:  # pragma: no cover - evalcli ships with funnel
        pass

    d = sub.add_parser("demo", help="build the embedded demo index and answer a query")
    d.add_argument("--out", default=".funnel/demo-index")
    d.add_argument("--query", default="parse command line arguments")
    d.add_argument("--dense", dest="dense", action="store_true")
    d.add_argument("--no-dense", dest="dense", action="store_false")
    d.set_defaults(fn=cmd_demo, dense=True)

    v = sub.add_parser("verify", help="check every file of the CURRENT version against its sha256")
    v.add_argument("index")
    v.set_defaults(fn=cmd_verify)

    sv = sub.add_parser("serve", help="HTTP API (FastAPI) on 127.0.0.1")
    sv.add_argument("index")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8765)
    sv.add_argument("--token", help="require 'Authorization: Bearer TOKEN' (or set FUNNEL_TOKEN)")
    sv.set_defaults(fn=cmd_serve)

    m = sub.add_parser("mcp", help="MCP server (stdio or streamable HTTP)")
    m.add_argument("index")
    m.add_argument("--transport", default="stdio", choices=["stdio", "streamable-http"])
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=8766)
    m.set_defaults(fn=cmd_mcp)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if a.command != "build":
        logging.getLogger("funnel.build").setLevel(logging.INFO)
    from funnel.jobs.build_index import BuildError
    from funnel.pipelines.artifacts import IndexFormatError
    from .search import SearchError
    try:
        return a.fn(a) or 0
    except (SearchError, IndexFormatError, BuildError, FileNotFoundError, ValueError) as e:
        return _err(str(e))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
