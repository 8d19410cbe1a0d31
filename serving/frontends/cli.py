"""The ``funnel`` command: a thin dispatcher that imports each side lazily.

    funnel build --corpus PATH --out INDEX_ROOT [--shards N] [--dense]   (the Ray job)
    funnel reindex --index INDEX_ROOT --corpus PATH [--dense] [--keep N]  (only what changed)
    funnel search INDEX_ROOT "query" [--mode hybrid] [--k 10] [--budget 1000] [--json] [--fusion rrf ...]
    funnel search INDEX_ROOT --queries queries.jsonl --mode bm25 --k 100 --run out.trec
    funnel eval --dataset BEIR_DIR [--index INDEX_ROOT] [--modes bm25,dense] [--check MATRIX]
    funnel compare RUN_A RUN_B --qrels QRELS
    funnel get INDEX_ROOT DOC_ID [--start S --end E | --lines A:B] [--fields F] [--json]
    funnel list INDEX_ROOT [--prefix P | --glob G] [--offset N] [--limit M] [--json]
    funnel serve INDEX_ROOT | funnel mcp INDEX_ROOT | funnel demo | funnel verify INDEX_ROOT | funnel gc INDEX_ROOT [--keep N]

Start-up stays fast: building the parser imports nothing heavy. Choices that belong to
another module (the searcher's modes, the fusions) are read from it only when ``--help``
or the parse needs them (`_LazyChoices`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import textwrap

EXIT_USAGE = 2
#: How many skipped queries a batch search lists by id.
SHOW_SKIPPED = 10


def _err(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return EXIT_USAGE


# -- argparse helpers ----------------------------------------------------------------------


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option says its default; ``None`` defaults are described in the help text
    itself ("default: the index's setting"), and ``--no-X`` switches need none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_ = action.help or ""
        if "%(default)" in help_ or "default:" in help_ or not action.option_strings:
            return help_
        if action.default in (None, argparse.SUPPRESS) or (action.nargs == 0 and action.const is False):
            return help_
        if action.default is True or action.default is False:
            return f"{help_} (default: {'on' if action.default else 'off'})"
        return f"{help_} (default: %(default)s)"


class _LazyChoices:
    """``choices`` read from the module that owns them on first use (parse or ``--help``).

    argparse only iterates choices to validate a value or to print them, so with a
    ``metavar`` set, building the parser imports nothing. ``str()`` is the list, for
    ``%(choices)s`` in help strings.
    """

    def __init__(self, load):
        self._load = load
        self._values: tuple[str, ...] | None = None

    def _get(self) -> tuple[str, ...]:
        if self._values is None:
            self._values = tuple(self._load())
        return self._values

    def __iter__(self):
        return iter(self._get())

    def __contains__(self, value) -> bool:
        return value in self._get()

    def __str__(self) -> str:
        return ", ".join(self._get())


class _Unbound:
    """Stands in for a searcher so the class's mode registry can be read without an index."""

    def __getattr__(self, name):
        return None


def _search_modes() -> tuple[str, ...]:
    from ..search import VersionSearcher
    return tuple(VersionSearcher.modes(_Unbound()))


def _fusions() -> tuple[str, ...]:
    from ..hybrid import FUSIONS
    return FUSIONS


def _proposers() -> tuple[str, ...]:
    from ..sira import PROPOSER_CHOICES
    return PROPOSER_CHOICES


def _length_norms() -> tuple[str, ...]:
    from ..lexical.bm25 import LENGTH_NORMS
    return LENGTH_NORMS


def _remove_query_choices() -> tuple[str, ...]:
    from funnel.evaluation.evaluate import REMOVE_QUERY_CHOICES
    return REMOVE_QUERY_CHOICES


def _tie_orders() -> tuple[str, ...]:
    from funnel.evaluation.trec import TIE_ORDERS
    return TIE_ORDERS


MODES = _LazyChoices(_search_modes)


class _ApiDefault:
    """The search API's own default of an option, for ``%(api_default)s`` in help strings.

    Read from ``BM25Params`` / ``HybridConfig`` when ``--help`` is printed, so the text
    cannot drift from the code (and building the parser imports neither).
    """

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        from ..lexical.bm25 import BM25Params
        from ..hybrid import HybridConfig
        from ..sira import SiraConfig
        if self.name == "lambda":  # SIRA's λ depends on the proposer
            return ", ".join(f"{p} {w:g}" for p, w in SiraConfig.lambdas)
        for cls in (BM25Params, HybridConfig, SiraConfig):
            field = cls.__dataclass_fields__.get(self.name)
            if field is not None:
                return _format_default(self.name, field.default)
        return "none"


def _format_default(name: str, value) -> str:
    if value is None:
        return "none"
    if name == "blend_tiers":
        return ",".join(f"{'*' if r is None else r}:{w:g}" for r, w in value)
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


class _VersionAction(argparse.Action):
    """``--version``: the installed package's version, looked up only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("funnel")
        except PackageNotFoundError:
            v = "unknown (not installed: pip install -e .)"
        print(f"funnel {v}")
        parser.exit()


def _float_pair(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers like 0.05,0.02, got {text!r}") from None
    return a, b


def _blend_tiers(text: str) -> tuple[tuple[int | None, float], ...]:
    tiers = []
    try:
        for part in text.split(","):
            rank, w = part.split(":")
            tiers.append((None if rank.strip() in ("", "*") else int(rank), float(w)))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LAST_RANK:WEIGHT pairs like 3:0.75,10:0.6,*:0.4, got {text!r}") from None
    return tuple(tiers)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _finite_float(text: str) -> float:
    """A number flag: ``inf`` and ``nan`` read as floats, and are never a sensible setting."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _at_least(low: float, what: str, strict: bool = True):
    """A finite-float flag parser that refuses values below ``low`` (or equal to it when
    ``strict``), its error naming ``what`` the value must be."""
    def parse(text: str) -> float:
        value = _finite_float(text)
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    return parse


_positive_seconds = _at_least(0.0, "a number of seconds above 0")
_non_negative_seconds = _at_least(0.0, "a number of seconds, 0 or more", strict=False)
_positive_rate = _at_least(0.0, "a rate above 0 (MiB per second)")


# -- search --------------------------------------------------------------------------------

#: The per-query options of ``Searcher.search`` that have a flag here (dest == API name).
#: They default to "not given", so the index's own settings apply unless a flag is used.
QUERY_OPTIONS = ("k1", "b", "length_norm", "nprobe", "fusion", "alpha", "rrf_k", "candidates",
                 "bm25_weight", "dense_weight", "top_rank_bonus", "rerank_depth", "chunk_tokens",
                 "blend_tiers", "expand", "context_tokens",
                 "proposer", "lambda", "tau", "max_n", "fb_docs", "fb_terms")


def _search_options(a) -> dict:
    opts = {name: getattr(a, name) for name in QUERY_OPTIONS if hasattr(a, name)}
    if a.rerank:
        opts["rerank"] = True  # the API refuses it for modes without a second stage
    return opts


def _chat(args):
    """The ``ChatProvider`` that ``--chat BASE_URL#MODEL`` names, else None."""
    spec = getattr(args, "chat", None) if args is not None else None
    if not spec:
        return None
    from ..chat import ChatProvider
    base_url, _, model = spec.partition("#")
    if not base_url.startswith(("http://", "https://")) or not model:
        raise ValueError(f"--chat wants BASE_URL#MODEL (e.g. http://127.0.0.1:8080/v1#smollm2), got {spec!r}")
    return ChatProvider(base_url, model)


def _searcher(root: str, args=None, kernels: bool = True):
    from ..search import open_index
    kw = {} if kernels else {"kernels": False}
    if args is not None and getattr(args, "verify", None):
        kw["verify"] = args.verify
    chat = _chat(args)
    if chat is not None:
        kw["chat"] = chat
    ix = open_index(root, **kw)
    if args is not None and getattr(args, "rerank", None):
        from ..rerank import make_reranker
        embedder = None
        if args.rerank.strip().startswith("biencoder"):
            if not ix.dense_mode.available:
                raise ValueError(f"--rerank biencoder reranks with the index's embedder, and index {ix.version} "
                                 "has no vectors: rebuild with `funnel build ... --dense`")
            embedder = ix.dense_mode.dense().provider
        ix.reranker = make_reranker(args.rerank, embedder=embedder)
    return ix


def _writable_file(path: str, flag: str) -> None:
    """Create ``path``'s folder and prove a file can be written there, before any work."""
    import tempfile
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a folder: give a file name, e.g. {os.path.join(path, 'run.trec')}")
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"cannot write {flag} {path}: {existing} is a file, not a folder")
    try:
        os.makedirs(folder, exist_ok=True)
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is not writable")
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".funnel-write-test-"):
            pass
    except OSError as e:
        raise ValueError(f"cannot write {flag} {path}: {e.strerror or e}") from None


def print_hits(res, width: int = 100) -> None:
    """A result for a terminal: its summary (the ranked hits with their best passages quoted,
    within the search's token budget: ``serving.answers.summary``), then the packed context if asked."""
    print(res.summary)
    context = res.trace.get("context")
    if context:
        pad = " " * 6
        print(f"\ncontext ({len(context)} passages, U-shaped):")
        for c in context:
            print(textwrap.fill(" ".join(f"[{c['doc_id']}] {c['text']}".split()), width, initial_indent=pad,
                                subsequent_indent=pad))


def _read_filter(text: str) -> str:
    """``--filter``'s JSON: the text itself, or a file's with ``@PATH`` (read no further than
    one character past the bound ``filters.loads_filter`` then refuses, naming it)."""
    if text.startswith("@"):
        from ..filters import MAX_FILTER_CHARS
        try:
            with open(text[1:], encoding="utf-8") as f:
                return f.read(MAX_FILTER_CHARS + 1)
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) else f"not UTF-8 text: {e.reason} at byte {e.start}"
            raise ValueError(f"--filter {text}: cannot read the filter file ({why})") from None
    return text


def cmd_search(a) -> int:
    if a.queries and a.query:
        return _err("give either a query or --queries FILE, not both")
    if a.queries and not a.run:
        return _err("--queries needs --run OUT.trec (where to write the TREC run)")
    if a.run and not a.queries:
        return _err("--run writes a batch run: give --queries FILE as well")
    if not a.queries and not a.query:
        return _err('give a query ("funnel search INDEX \\"text\\"") or --queries FILE --run OUT')
    if a.queries and hasattr(a, "context_tokens"):
        return _err("--context-tokens packs the context of one query; a run file has none")
    if a.queries and (hasattr(a, "budget") or hasattr(a, "passages_per_hit")):
        return _err("--budget and --passages-per-hit shape the summary of one query; a run file has none")
    if hasattr(a, "expand") and not a.chat:
        return _err("--expand asks an LLM for query expansions: give its endpoint with --chat BASE_URL#MODEL")
    if a.remove_query and not a.queries:
        return _err("--remove-query applies to a batch run (--queries FILE --run OUT)")
    if a.queries and (hasattr(a, "offset") or a.fields is not None):
        return _err("--offset and --fields shape the hits of one query; a run file has neither")
    if a.run:
        _writable_file(a.run, "--run")
    # One query in this process: loading numba's compiled kernels (~0.45 s) costs more than
    # the NumPy reference path takes to answer it, even at 1M documents (~70 ms), with the
    # same rankings and scores (tests hold the two paths equal). A batch uses the kernels.
    ix = _searcher(a.index, a, kernels=bool(a.queries))
    opts = _search_options(a)
    if getattr(a, "filter", None) is not None:  # the same JSON as HTTP's and MCP's "filter" (serving/filters.py)
        opts["filter"] = _read_filter(a.filter)
    if a.queries:
        from funnel.evaluation.trec import ANSERINI_MODES, read_queries, write_run_rows
        queries = read_queries(a.queries)
        errors: dict[str, str] = {}
        a.mode = a.mode or ix.default_mode()
        rows = ix.search_batch_rows(queries, mode=a.mode, k=a.k, remove_query=a.remove_query, errors=errors,
                                    **opts)
        # BM25 runs are written the way Anserini writes them (scores to 4 decimals, ties apart
        # by docid ascending), so trec_eval on this file prints the published figures.
        n = write_run_rows(a.run, rows, tag=f"funnel-{a.mode}", tiebreak=a.mode in ANSERINI_MODES)
        print(f"wrote {a.run}: {n} queries, mode {a.mode}, k {a.k}"
              f"{', self-hits removed' if a.remove_query else ''}")
        if errors:
            print(f"skipped {len(errors)} of {len(queries)} queries:", file=sys.stderr)
            for qid, why in list(errors.items())[:SHOW_SKIPPED]:
                print(f"  {qid}: {why}", file=sys.stderr)
            if len(errors) > SHOW_SKIPPED:
                print(f"  ... and {len(errors) - SHOW_SKIPPED} more", file=sys.stderr)
        return 0
    if hasattr(a, "offset"):  # the next page: the hits ranked offset+1 .. offset+k
        opts["offset"] = a.offset
    if a.fields is not None:
        opts["fields"] = a.fields
    res = ix.search(a.query, mode=a.mode, k=a.k, budget=getattr(a, "budget", None),
                    passages_per_hit=getattr(a, "passages_per_hit", None), **opts)
    if a.json:
        print(json.dumps(res.to_dict(), ensure_ascii=False, indent=2))
    else:
        print_hits(res)
        print_page(res, a.k)
    return 0


def print_page(res, k: int) -> None:
    """Where this page of hits stands in the whole ranking, on stderr, as `funnel list`
    says it: ``(hits 4-6 of 16 documents; next page: --offset 6)``; ``at least`` where the
    total is a lower bound (``serving.answers.paging``)."""
    if not res.hits:
        return
    total = res.total or {}
    value, lower = total.get("value"), total.get("relation") == "gte"
    last = res.offset + len(res.hits)
    of = f" of {'at least ' if lower else ''}{value:,} documents" if isinstance(value, int) else ""
    more = len(res.hits) == k and (lower or (isinstance(value, int) and value > last))
    nxt = f"; next page: --offset {last}" if more else ""
    print(f"(hits {res.offset + 1}-{last}{of}{nxt})", file=sys.stderr)


# -- the other commands --------------------------------------------------------------------


def cmd_build(a) -> int:
    from funnel.jobs.build_index import run_from_args
    run_from_args(a)
    return 0


def cmd_reindex(a) -> int:
    from funnel.jobs.reindex import run_from_args
    run_from_args(a)
    return 0


def ensure_index(dataset_dir: str, root: str | None, need_dense: bool, shards: int | None) -> str:
    """Reuse the index at ``root`` (default ``.funnel/indexes/NAME``) or build it from the dataset."""
    from funnel.pipelines.store.artifacts import load_manifest, read_current
    name = os.path.basename(os.path.normpath(dataset_dir))
    root = root or os.path.join(".funnel", "indexes", name)
    cur = read_current(root)
    if cur is not None:
        m = load_manifest(os.path.join(root, cur))
        if not need_dense or m.get("dense"):
            return root
    from funnel.jobs.build_index import build
    print(f"building {root} from {dataset_dir} ({shards or 'auto'} shards{', dense' if need_dense else ''})", file=sys.stderr)
    build(dataset_dir, root, shards=shards, dense=need_dense)
    return root


def cmd_eval(a) -> int:
    from funnel.evaluation.evaluate import run_eval
    return run_eval(a, ensure_index)


def cmd_demo(a) -> int:
    from funnel.jobs.build_index import build
    from funnel.pipelines.sources.demo import write_demo_corpus
    os.makedirs(a.out, exist_ok=True)
    corpus = os.path.join(a.out, "..", "demo-corpus.jsonl")
    n = write_demo_corpus(corpus)
    print(f"demo corpus: {n} Python standard-library docstrings -> {os.path.normpath(corpus)}")
    # The demo runs the real job on a local Ray (engine "ray"), though a corpus this small
    # would build in-process under "auto": it is the pipeline a cluster would run.
    rep = build(corpus, a.out, dense=a.dense, engine=a.engine)
    print(f"published {a.out}/{rep.version}: {rep.n_docs} documents, {rep.n_rejects} rejected, "
          f"{rep.seconds:.1f}s, engine {rep.engine.get('name')}")
    ix = _searcher(a.out)
    modes = ["bm25"] + (["dense", "hybrid"] if a.dense else [])
    for mode in modes:
        res = ix.search(a.query, mode=mode, k=5)
        print(f"\n$ funnel search {a.out} {a.query!r} --mode {mode}")
        print_hits(res)
    return 0


def cmd_verify(a) -> int:
    from funnel.pipelines.store import remote
    if remote.is_remote(a.index):  # downloaded afresh, never the local cache's copy
        version, m = remote.verify_remote(a.index)
        print(f"{a.index.rstrip('/')}/{version}: OK ({len(m['files'])} files downloaded and checked, "
              f"{m['collection']['n_docs']} documents; manifest checksum verified)")
        return 0
    from ..index import IndexVersion
    ix = IndexVersion(a.index, verify="full")
    sealed = os.path.exists(os.path.join(ix.dir, "manifest.json.sha256"))
    print(f"{ix.dir}: OK ({len(ix.manifest['files'])} files checked, {ix.n_docs} documents; manifest "
          f"{'checksum verified' if sealed else 'has no checksum (built before funnel sealed manifests)'})")
    return 0


def cmd_enrich_report(a) -> int:
    from funnel.pipelines.store.artifacts import read_current
    from funnel.pipelines.enrich import enrichment_report, format_report
    vdir = a.index
    if not os.path.exists(os.path.join(vdir, "manifest.json")):
        cur = read_current(a.index)
        if cur is None:
            print(f"{a.index}: no published version (no CURRENT); build it first", file=sys.stderr)
            return 2
        vdir = os.path.join(a.index, cur)
    try:
        rep = enrichment_report(vdir, top=a.top, examples=a.examples)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rep, indent=1, ensure_ascii=False) if a.json else format_report(rep))
    return 0


def _line_range(text: str) -> tuple[int, int | None]:
    """``--lines A:B`` (or ``A-B``, as a citation prints it; ``A:`` to the end; ``A`` one line)
    as (from_line, max_lines)."""
    first, sep, last = text.replace("-", ":", 1).partition(":")
    try:
        a = int(first)
        b = None if sep and not last.strip() else int(last) if sep else a
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected lines like 12:40 (or 12-40, 12: to the end), got {text!r}") from None
    if a < 1 or (b is not None and b < a):
        raise argparse.ArgumentTypeError(f"lines count from 1 and end at or after they start, got {text!r}")
    return a, None if b is None else b - a + 1


def _print_document(doc: dict) -> None:
    """One fetched document for a terminal: id and title, which part of it, fields, the text."""
    print(f"[{doc['doc_id']}] {doc.get('title') or ''}".rstrip())
    lines = doc["line_start"] if doc["line_start"] == doc["line_end"] else f"{doc['line_start']}-{doc['line_end']}"
    part = f"characters {doc['start']}-{doc['end']} of {doc['length']}, line{'s' if '-' in str(lines) else ''} {lines}"
    if doc.get("truncated"):
        part += f"; cut, continue with --start {doc['next_start']}"
    print(f"({part})")
    for k, v in (doc.get("fields") or {}).items():
        print(f"{k}: {json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v}")
    print()
    print(doc.get("text") or "")


def cmd_get(a) -> int:
    if not a.ids and a.prefix is None and a.glob is None:
        return _err("give a doc_id (funnel get INDEX DOC_ID), several, or --prefix / --glob")
    if a.lines is not None and (a.start is not None or a.end is not None):
        return _err("give --lines or --start/--end, not both")
    from_line, max_lines = a.lines if a.lines is not None else (None, None)
    ix = _searcher(a.index, a, kernels=False)
    kw = dict(from_line=from_line, max_lines=max_lines, fields=a.fields)
    if len(a.ids) == 1 and a.prefix is None and a.glob is None:
        doc = ix.get_document(a.ids[0], a.start, a.end, **kw)
        if doc is None:
            return _err(f"no document with doc_id {a.ids[0]!r} in {a.index} (version {ix.version}); "
                        f"`funnel list {a.index} --prefix ...` lists the ids")
        if a.json:
            print(json.dumps(doc, ensure_ascii=False, indent=2))
        else:
            _print_document(doc)
        return 0
    got = ix.get_documents(a.ids or None, a.start, a.end, prefix=a.prefix, glob=a.glob, **kw)
    if a.json:
        print(json.dumps(got, ensure_ascii=False, indent=2))
    else:
        for i, doc in enumerate(got["documents"]):
            if i:
                print("\n---\n")
            _print_document(doc)
    if got["missing"]:
        print(f"missing: {', '.join(got['missing'])}", file=sys.stderr)
    if got["deferred"]:
        print(f"deferred (over {got['max_chars']:,} characters in all; ask for them again): "
              f"{', '.join(got['deferred'])}", file=sys.stderr)
    if got.get("matched", 0) > len(got["documents"]) + len(got["deferred"]):
        print(f"{got['matched']} ids match; these are the first {len(got['documents']) + len(got['deferred'])} "
              f"(funnel list {a.index} pages through them)", file=sys.stderr)
    return 1 if got["missing"] and not got["documents"] else 0


def cmd_list(a) -> int:
    if a.prefix is not None and a.glob is not None:
        return _err("give --prefix or --glob, not both")
    ix = _searcher(a.index, a, kernels=False)
    got = ix.list_documents(a.prefix, glob=a.glob, offset=a.offset, limit=a.limit, fields=a.fields)
    if a.json:
        print(json.dumps(got, ensure_ascii=False, indent=2))
        return 0
    for d in got["documents"]:
        extra = f"\t{json.dumps(d['fields'], ensure_ascii=False)}" if "fields" in d else ""
        print(f"{d['doc_id']}\t{d['title'] or ''}{extra}")
    shown = f"{a.offset + 1}-{a.offset + len(got['documents'])}" if got["documents"] else "none"
    nxt = f"; next page: --offset {got['next_offset']}" if got["next_offset"] is not None else ""
    print(f"({shown} of {got['total']:,} documents{nxt})", file=sys.stderr)
    return 0


def cmd_gc(a) -> int:
    from funnel.pipelines.store import remote
    from funnel.pipelines.store.artifacts import gc
    rep = (remote.gc if remote.is_remote(a.index) else gc)(a.index, keep=a.keep)
    if rep.busy:
        print(f"{a.index}: a build or publish holds the lock; nothing removed, try again later", file=sys.stderr)
        return 1
    for path, size in rep.removed:
        print(f"removed {path} ({size:,} bytes)")
    for path, why in rep.kept:
        print(f"kept    {path} ({why})")
    print(f"{len(rep.removed)} removed, {rep.bytes_freed:,} bytes freed")
    return 0


def _token(a) -> str | None:
    """--token, else $FUNNEL_TOKEN, else None; an empty one is refused, never taken as "no auth"."""
    if a.token is not None:
        if not a.token.strip():
            raise ValueError("--token is empty (was $FUNNEL_TOKEN unset when the shell expanded "
                             "--token \"$FUNNEL_TOKEN\"?): pass a non-empty token, or leave --token out "
                             "to serve without authentication")
        return a.token
    env = os.environ.get("FUNNEL_TOKEN")
    if env is not None and not env.strip():
        raise ValueError("FUNNEL_TOKEN is set but empty: set it to a non-empty token, or unset it "
                         "to serve without authentication")
    return env


def cmd_serve(a) -> int:
    token = _token(a)
    from .http import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, serve
    return serve(a.index, host=a.host, port=a.port, token=token, insecure=a.insecure,
                 max_body_bytes=a.max_body_bytes or DEFAULT_MAX_BODY_BYTES, chat=_chat(a), allow_hosts=a.allow_host,
                 body_timeout_s=a.body_timeout or DEFAULT_BODY_TIMEOUT_S, scrub=_scrub(a),
                 tokens=getattr(a, "tokens", None), limits=_limits(a))


def cmd_mcp(a) -> int:
    # Over stdio there is nothing to authenticate: $FUNNEL_TOKEN is for the HTTP transport,
    # and an explicit --token there is refused by run_mcp.
    token = _token(a) if a.transport != "stdio" else a.token
    from .http import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES
    from .mcp import run_mcp
    return run_mcp(a.index, transport=a.transport, host=a.host, port=a.port, token=token,
                   insecure=a.insecure, allow_hosts=a.allow_host,
                   max_body_bytes=a.max_body_bytes or DEFAULT_MAX_BODY_BYTES, chat=_chat(a),
                   body_timeout_s=a.body_timeout or DEFAULT_BODY_TIMEOUT_S, scrub=_scrub(a),
                   tokens=getattr(a, "tokens", None), limits=_limits(a))


def _limits(a):
    """The ``ConnectionLimits`` of ``serve`` / ``mcp``'s --header-timeout, --keep-alive-timeout
    and --max-connections (each left out: its default)."""
    from .connections import ConnectionLimits
    given = {"header_timeout_s": a.header_timeout, "keep_alive_s": a.keep_alive_timeout,
             "max_connections": a.max_connections}
    return ConnectionLimits(**{k: v for k, v in given.items() if v is not None})


# -- the parser ----------------------------------------------------------------------------


def _add_search_parser(sub, common) -> None:
    s = sub.add_parser("search", parents=[common], formatter_class=_HelpFormatter,
                       help="query an index (one query, or a batch into a TREC run)",
                       description="Query an index: one query printed for a terminal (or --json), or a "
                                   "batch of queries written as a TREC run.\n\nPer-query options default "
                                   "to the index's own settings (its manifest); a flag overrides it for "
                                   "this call. An option the mode does not take is refused.")
    s.add_argument("index", help="INDEX_ROOT (the folder holding CURRENT) or one version folder")
    s.add_argument("query", nargs="?", help="the text to search for (or use --queries)")
    s.add_argument("--mode", default=None, choices=MODES, metavar="MODE",
                   help="retrieval mode: %(choices)s (default: hybrid where the index has vectors, else bm25)")
    s.add_argument("--k", type=int, default=10, help="how many documents to return per query")
    s.add_argument("--json", action="store_true", help="print the full result (summary, hits, trace) as JSON")
    s.add_argument("--verify", choices=["none", "sizes", "cached", "full"], default="cached",
                   help="how the index files are checked on open: every file's sha256 (full); the same, "
                        "skipping files this host hashed before whose size, mtime, ctime and inode are "
                        "unchanged (cached, the default); sizes only; or none")

    b = s.add_argument_group("batch mode")
    b.add_argument("--queries", help="BEIR queries.jsonl (or TSV qid<TAB>text) to run as a batch "
                                     "(default: none, one query)")
    b.add_argument("--run", help="the TREC run file to write; its folder is created (required with --queries)")
    b.add_argument("--remove-query", action="store_true",
                   help="drop a hit whose doc id equals the query id (BEIR ignore_identical_ids; for "
                        "ArguAna, Quora, CQADupStack, where queries are corpus documents)")

    def option(group, *flags, **kw):
        """A per-query option: absent unless given; help names the API's default, read lazily."""
        act = group.add_argument(*flags, default=argparse.SUPPRESS, **kw)
        act.api_default = _ApiDefault(act.dest)
        return act

    lx = s.add_argument_group("BM25 (modes bm25, hybrid, sira)")
    option(lx, "--k1", type=_finite_float,
           help="term-frequency saturation (default: the index's, else %(api_default)s)")
    option(lx, "--b", type=_finite_float,
           help="length normalization, 0..1 (default: the index's, else %(api_default)s)")
    option(lx, "--length-norm", dest="length_norm", choices=_LazyChoices(_length_norms), metavar="NORM",
           help="document lengths: %(choices)s (default: the index's, else %(api_default)s)")

    dn = s.add_argument_group("dense (modes dense, hybrid; sira with proposer dense or union)")
    dn.add_argument("--nprobe", type=_positive_int, default=argparse.SUPPRESS,
                    help="IVF lists searched per query (default: the index's, chosen at build)")

    hy = s.add_argument_group("hybrid (mode hybrid)")
    option(hy, "--fusion", choices=_LazyChoices(_fusions), metavar="FUSION",
           help="how the BM25 and dense lists are fused: %(choices)s (default: the index's, else %(api_default)s)")
    option(hy, "--alpha", type=_finite_float,
           help="convex fusion: weight of BM25, 1 - alpha for dense (default: the index's, else %(api_default)s)")
    option(hy, "--rrf-k", dest="rrf_k", type=_finite_float,
           help="RRF smoothing constant k in 1/(k + rank) (default: the index's, else %(api_default)s)")
    option(hy, "--bm25-weight", dest="bm25_weight", type=_finite_float,
           help="RRF weight of the BM25 list (default: the index's, else %(api_default)s)")
    option(hy, "--dense-weight", dest="dense_weight", type=_finite_float,
           help="RRF weight of the dense list (default: the index's, else %(api_default)s)")
    option(hy, "--top-rank-bonus", dest="top_rank_bonus", type=_float_pair, metavar="R1,R23",
           help="RRF bonus for rank 1 and for a best rank 2-3 (default: the index's, else %(api_default)s)")
    hy.add_argument("--no-top-rank-bonus", dest="top_rank_bonus", action="store_const", const=None,
                    default=argparse.SUPPRESS, help="RRF without the top-rank bonus")
    option(hy, "--candidates", type=int,
           help="depth of each list before fusion, 1..1000 (default: the index's, else %(api_default)s)")
    hy.add_argument("--rerank", metavar="SPEC", default=None,
                    help="rerank the fused top with a second stage: cross-encoder:PATH, http:URL#MODEL "
                         "(Cohere shape), http+tei:URL#MODEL, biencoder (the index's embedder) "
                         "(default: no reranking)")
    option(hy, "--rerank-depth", dest="rerank_depth", type=int,
           help="fused candidates the reranker reads (default: the index's, else %(api_default)s)")
    option(hy, "--chunk-tokens", dest="chunk_tokens", type=int,
           help="tokens of a long document's best chunk that the reranker reads "
                "(default: the index's, else %(api_default)s)")
    option(hy, "--blend-tiers", dest="blend_tiers", type=_blend_tiers, metavar="TIERS",
           help="position-aware blend after reranking, LAST_RANK:RETRIEVAL_WEIGHT pairs "
                "(default: the index's, else %(api_default)s)")
    hy.add_argument("--expand", type=_positive_int, default=argparse.SUPPRESS,
                    help="LLM query expansions searched as extra lists; needs --chat (default: none)")
    hy.add_argument("--chat", metavar="BASE_URL#MODEL", default=None,
                    help="OpenAI-compatible chat endpoint for --expand and SIRA's llm proposer, "
                         "e.g. http://127.0.0.1:8080/v1#smollm2 "
                         "(default: none)")

    sr = s.add_argument_group("SIRA (mode sira): BM25(q) + lambda * BM25(proposed evidence terms), one call")
    option(sr, "--proposer", choices=_LazyChoices(_proposers), metavar="PROPOSER",
           help="where expansion terms come from: %(choices)s; auto = llm with --chat, else dense, "
                "else prf (default: the index's, else %(api_default)s)")
    option(sr, "--lambda", dest="lambda", type=_finite_float,
           help="weight of the expansion terms (default: the index's, else per proposer: %(api_default)s)")
    option(sr, "--tau", type=_finite_float,
           help="DF filter: keep a phrase only if 1 <= df <= tau * N (default: the index's, else %(api_default)s)")
    option(sr, "--max-n", dest="max_n", type=int,
           help="longest n-gram window the DF filter checks, 1..3 (default: the index's, else %(api_default)s)")
    option(sr, "--fb-docs", dest="fb_docs", type=int,
           help="feedback documents for prf/dense (default: the index's, else %(api_default)s)")
    option(sr, "--fb-terms", dest="fb_terms", type=int,
           help="feedback terms for prf/dense (default: the index's, else %(api_default)s)")

    s.add_argument("--filter", default=None, metavar="JSON",
                   help='only documents whose fields match, e.g. \'{"kind": "runbook", "year": {"gte": 2024}}\' '
                        '(or @FILE); the same JSON as the HTTP and MCP "filter"; one query or a --queries batch (default: none)')
    s.add_argument("--offset", type=int, default=argparse.SUPPRESS,
                   help="hits to skip: print the hits ranked offset+1 .. offset+k (offset + k at most 1000) "
                        "(default: 0)")
    s.add_argument("--fields", default=None, metavar="NAMES",
                   help="stored fields to add to each hit in --json: names separated by commas, or '*' for all "
                        "(default: none)")
    ctx = s.add_argument_group("summary and context (any mode, one query)")
    ctx.add_argument("--budget", type=_positive_int, default=argparse.SUPPRESS,
                     help="most tokens of the printed summary: the hits with their best passages quoted, "
                          "100..32000 (default: 1000)")
    ctx.add_argument("--passages-per-hit", dest="passages_per_hit", type=_positive_int, default=argparse.SUPPRESS,
                     help="ranked passages each hit carries in --json, 1..10 (default: 1)")
    ctx.add_argument("--context-tokens", dest="context_tokens", type=_positive_int, default=argparse.SUPPRESS,
                     help="pack the hits' best passages into this many tokens, U-shaped (default: off)")
    s.set_defaults(fn=cmd_search)


def _add_document_parsers(sub, common) -> None:
    g = sub.add_parser("get", parents=[common], formatter_class=_HelpFormatter,
                       help="print a document, or the lines or characters a citation names",
                       description="Print a stored document: all of it, the characters [--start, --end) or the "
                                   "lines --lines A:B that a search hit's citation gives, with its fields "
                                   "if asked. Several ids, --prefix or --glob fetch several at once (at most "
                                   "20, and 100,000 characters in all).")
    g.add_argument("index", help="INDEX_ROOT (the folder holding CURRENT) or one version folder")
    g.add_argument("ids", nargs="*", metavar="DOC_ID", help="the document id(s), as hits show them")
    g.add_argument("--start", type=int, default=None, help="first character (default: 0)")
    g.add_argument("--end", type=int, default=None, help="character after the last (default: the end)")
    g.add_argument("--lines", type=_line_range, default=None, metavar="A:B",
                   help="lines A to B, 1-based, as a citation prints them (A-B also; A: to the end) (default: all)")
    g.add_argument("--prefix", default=None, help="the documents whose id starts with it (default: none)")
    g.add_argument("--glob", default=None, help="the documents whose id matches it, e.g. 'runbooks/*.md' "
                                                "(default: none)")
    g.add_argument("--fields", default=None, metavar="NAMES",
                   help="fields to show: names separated by commas, or '*' for all (default: none)")
    g.add_argument("--json", action="store_true", help="print the answer as JSON")
    g.add_argument("--verify", choices=["none", "sizes", "cached", "full"], default="cached",
                   help="how the index files are checked on open (as for search)")
    g.set_defaults(fn=cmd_get)

    ls = sub.add_parser("list", parents=[common], formatter_class=_HelpFormatter,
                        help="list documents in id order, a page at a time",
                        description="List the index's documents in id order (id and title, tab-separated), "
                                    "optionally those whose id starts with --prefix or matches --glob; the "
                                    "count and the next page's --offset go to stderr.")
    ls.add_argument("index", help="INDEX_ROOT (the folder holding CURRENT) or one version folder")
    ls.add_argument("--prefix", default=None, help="only ids that start with it (default: every id)")
    ls.add_argument("--glob", default=None, help="only ids that match it, e.g. '*.pdf' (default: every id)")
    ls.add_argument("--offset", type=int, default=0, help="ids to skip")
    ls.add_argument("--limit", type=_positive_int, default=100, help="ids per page, at most 1000")
    ls.add_argument("--fields", default=None, metavar="NAMES",
                    help="fields to show: names separated by commas, or '*' for all (default: none)")
    ls.add_argument("--json", action="store_true", help="print the page as JSON")
    ls.add_argument("--verify", choices=["none", "sizes", "cached", "full"], default="cached",
                    help="how the index files are checked on open (as for search)")
    ls.set_defaults(fn=cmd_list)


def _add_eval_parser(sub, common) -> None:
    e = sub.add_parser("eval", parents=[common], formatter_class=_HelpFormatter,
                       help="evaluate modes on a BEIR dataset (builds the index if needed)")
    e.add_argument("--dataset", help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) "
                                     "(required unless --check)")
    e.add_argument("--index", help="INDEX_ROOT (default: .funnel/indexes/<dataset name>, built if missing)")
    modes = e.add_argument("--modes", dest="modes", default="bm25",
                           help="comma-separated modes to evaluate, from: %(all_modes)s")
    modes.all_modes = MODES  # read by the help formatter, lazily
    e.add_argument("--mode", dest="modes", default=argparse.SUPPRESS, help="one mode (same as --modes)")
    e.add_argument("--split", default="test", help="qrels split (qrels/SPLIT.tsv)")
    e.add_argument("--k", type=int, default=100, help="documents retrieved per query")
    e.add_argument("--shards", type=int, default=None,
                   help="shards when the index has to be built (default: auto, chosen from the corpus size)")
    e.add_argument("--remove-query", dest="remove_query", default="auto",
                   choices=_LazyChoices(_remove_query_choices), metavar="{auto,on,off}",
                   help="drop hits whose doc id is the query id (BEIR ignore_identical_ids); auto: on when "
                        "most query ids are corpus ids (ArguAna, Quora)")
    e.add_argument("--ties", default="trec_eval", choices=_LazyChoices(_tie_orders), metavar="ORDER",
                   help="tie order for metrics: %(choices)s")
    e.add_argument("--out", help="folder for runs, report and plot (default: eval/ next to the index)")
    e.add_argument("--check", help="regression matrix YAML: print OK/FAIL per row, exit 1 on a FAIL (default: none)")
    e.add_argument("--json", action="store_true", help="print the results as JSON")
    e.set_defaults(fn=cmd_eval)


class _LazyText:
    """Text computed when ``--help`` prints it, so building the parser imports nothing."""

    def __init__(self, load):
        self._load = load

    def __str__(self) -> str:
        return str(self._load())


def _max_body_default() -> str:
    from .http import DEFAULT_MAX_BODY_BYTES
    return f"{DEFAULT_MAX_BODY_BYTES}"


def _body_timeout_default() -> str:
    from .http import DEFAULT_BODY_TIMEOUT_S
    return f"{DEFAULT_BODY_TIMEOUT_S:g}"


def _add_exposure_arguments(p: argparse.ArgumentParser) -> None:
    """The options ``serve`` and ``mcp`` share about who may send what."""
    p.add_argument("--insecure", action="store_true",
                   help="listen beyond loopback (e.g. --host 0.0.0.0) without a token; without this "
                        "flag such a server refuses to start")
    act = p.add_argument("--max-body-bytes", dest="max_body_bytes", type=_positive_int, default=None,
                         metavar="N", help="largest request body accepted; a larger one is answered 413 "
                                           "before the token check (mcp over stdio: the longest request "
                                           "line) (default: %(server_default)s)")
    act.server_default = _LazyText(_max_body_default)
    act = p.add_argument("--body-timeout", dest="body_timeout", type=_positive_seconds, default=None,
                         metavar="SECONDS", help="seconds a request body may take to arrive in full; a slower "
                                                 "one is answered 408 (default: %(server_default)s)")
    act.server_default = _LazyText(_body_timeout_default)
    act = p.add_argument("--header-timeout", dest="header_timeout", type=_positive_seconds, default=None,
                         metavar="SECONDS", help="seconds a client has to send a request's line and headers, "
                                                 "from when it connects or its last response ended; then "
                                                 "the connection is closed (default: %(server_default)s)")
    act.server_default = _LazyText(lambda: f"{_limit_defaults().header_timeout_s:g}")
    act = p.add_argument("--keep-alive-timeout", dest="keep_alive_timeout", type=_positive_seconds, default=None,
                         metavar="SECONDS", help="seconds an idle connection stays open after a response "
                                                 "(default: %(server_default)s)")
    act.server_default = _LazyText(lambda: f"{_limit_defaults().keep_alive_s:g}")
    act = p.add_argument("--max-connections", dest="max_connections", type=_positive_int, default=None,
                         metavar="N", help="connections held at once; more are answered 503 and closed "
                                           "(default: %(server_default)s)")
    act.server_default = _LazyText(lambda: f"{_limit_defaults().max_connections}")
    act = p.add_argument("--scrub-interval", dest="scrub_interval", type=_non_negative_seconds, default=None,
                         metavar="SECONDS", help="seconds between background passes that re-hash the served "
                                                 "version's files and stop serving one that no longer matches "
                                                 "its checksums; 0 turns it off (default: %(server_default)s)")
    act.server_default = _LazyText(lambda: f"{_scrub_defaults().interval_s:g}")
    act = p.add_argument("--scrub-rate", dest="scrub_rate", type=_positive_rate, default=None, metavar="MB/s",
                         help="MiB per second the background scrub may read (default: %(server_default)s)")
    act.server_default = _LazyText(lambda: f"{_scrub_defaults().rate_mb_s:g}")


def _limit_defaults():
    from .connections import ConnectionLimits
    return ConnectionLimits()


def _scrub_defaults():
    from .scrub import ScrubConfig
    return ScrubConfig()


def _scrub(a):
    """The ``ScrubConfig`` of ``serve`` / ``mcp``'s --scrub-* flags."""
    from .scrub import ScrubConfig
    d = ScrubConfig()
    return ScrubConfig(interval_s=d.interval_s if a.scrub_interval is None else a.scrub_interval,
                       rate_mb_s=a.scrub_rate or d.rate_mb_s)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="funnel", formatter_class=_HelpFormatter,
                                description="Retrieval for agents: build, search, evaluate, serve.")
    p.add_argument("--version", action=_VersionAction, help="print the installed funnel version and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level from every part of funnel")
    # The same -v after the subcommand; SUPPRESS keeps a subcommand from resetting it to False.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log at INFO level from every part of funnel (default: off)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from funnel.jobs.build_index import add_arguments
    b = sub.add_parser("build", parents=[common], formatter_class=_HelpFormatter,
                       help="build and publish an index version (Ray Data)",
                       description="Build and publish a new index version with Ray Data: a fresh local "
                                   "Ray unless RAY_ADDRESS names a cluster. Progress is logged every "
                                   "--progress-seconds.")
    add_arguments(b)
    b.set_defaults(fn=cmd_build)

    from funnel.jobs.reindex import add_arguments as add_reindex_arguments
    r = sub.add_parser("reindex", parents=[common], formatter_class=_HelpFormatter,
                       help="publish the next version from a changed corpus, processing only what changed",
                       description="Diff the corpus's content hashes against the live version, analyze (and "
                                   "embed) only added and changed documents, drop deleted ones, and publish "
                                   "a new version that ranks exactly as a full build would. No changes: "
                                   "nothing is published (exit 0). Runs in this process unless RAY_ADDRESS "
                                   "is set or --executor ray.")
    add_reindex_arguments(r)
    r.set_defaults(fn=cmd_reindex)

    _add_search_parser(sub, common)
    _add_document_parsers(sub, common)
    _add_eval_parser(sub, common)

    from funnel.evaluation.evalcli import add_compare_parser
    c = add_compare_parser(sub)
    c.formatter_class = _HelpFormatter
    c.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="log at INFO level from every part of funnel (default: off)")

    d = sub.add_parser("demo", parents=[common], formatter_class=_HelpFormatter,
                       help="build the embedded demo index and answer a query")
    d.add_argument("--out", default=".funnel/demo-index", help="INDEX_ROOT of the demo index")
    d.add_argument("--query", default="parse command line arguments", help="the query to answer")
    d.add_argument("--dense", dest="dense", action="store_true", help="embed too, and show dense and hybrid")
    d.add_argument("--no-dense", dest="dense", action="store_false", help="BM25 only")
    d.add_argument("--engine", choices=["ray", "local", "auto"], default="ray",
                   help="ray: the Ray Data job on a local Ray; local: the same stages in this process")
    d.set_defaults(fn=cmd_demo, dense=True)

    v = sub.add_parser("verify", parents=[common], formatter_class=_HelpFormatter,
                       help="check every file of the CURRENT version against its sha256")
    v.add_argument("index", help="INDEX_ROOT or one version folder")
    v.set_defaults(fn=cmd_verify)

    g = sub.add_parser("gc", parents=[common], formatter_class=_HelpFormatter,
                       help="remove what killed builds left (.staging-*, .work-*) and versions beyond --keep")
    g.add_argument("index", help="INDEX_ROOT")
    g.add_argument("--keep", type=int, default=None,
                   help="keep this many newest versions, never removing the one CURRENT names (default: keep all)")
    g.set_defaults(fn=cmd_gc)

    er = sub.add_parser("enrich-report", parents=[common], formatter_class=_HelpFormatter,
                        help="what SIRA corpus enrichment did: counts, most frequent injected phrases, examples")
    er.add_argument("index", help="INDEX_ROOT or one version folder")
    er.add_argument("--top", type=int, default=20, help="injected phrases and failure reasons listed")
    er.add_argument("--examples", type=int, default=5, help="enriched documents shown with every proposal")
    er.add_argument("--json", action="store_true", help="the report as JSON")
    er.set_defaults(fn=cmd_enrich_report)

    sv = sub.add_parser("serve", parents=[common], formatter_class=_HelpFormatter,
                        help="HTTP API (FastAPI) on 127.0.0.1")
    sv.add_argument("index", help="INDEX_ROOT; a newly published version is picked up without a restart")
    sv.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    sv.add_argument("--port", type=int, default=8765, help="port to listen on (0: any free port)")
    sv.add_argument("--token", help="require 'Authorization: Bearer TOKEN' on every path but /health (/docs "
                                    "included); needed beyond loopback; an empty token is refused "
                                    "(default: $FUNNEL_TOKEN, else no token)")
    sv.add_argument("--tokens", default=None, metavar="FILE",
                   help="callers' tokens: a JSON file mapping sha256(token) hex to {\"principal\": NAME, \"groups\": "
                        "[...]}; each caller sees only the documents whose 'acl' names it or its groups (and public "
                        "ones); reloaded when it changes; --token stays the administrator's (default: none)")
    sv.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                    help="a Host header to accept besides loopback and this machine's names (DNS-rebinding "
                         "protection: any other gets 421), e.g. the name behind a proxy; repeatable (default: none)")
    _add_exposure_arguments(sv)
    sv.add_argument("--chat", metavar="BASE_URL#MODEL", default=None,
                    help="OpenAI-compatible chat endpoint for SIRA's llm proposer and hybrid expansions "
                         "(default: none; sira then uses its offline proposer)")
    sv.set_defaults(fn=cmd_serve)

    m = sub.add_parser("mcp", parents=[common], formatter_class=_HelpFormatter,
                       help="MCP server (stdio or streamable HTTP)")
    m.add_argument("index", help="INDEX_ROOT")
    m.add_argument("--transport", default="stdio", choices=["stdio", "streamable-http"],
                   help="stdio (the client starts this process) or streamable HTTP at /mcp")
    m.add_argument("--host", default="127.0.0.1", help="interface for streamable-http")
    m.add_argument("--port", type=int, default=8766, help="port for streamable-http")
    m.add_argument("--token", help="streamable-http: require 'Authorization: Bearer TOKEN' on every request; "
                                   "needed beyond loopback; an empty token is refused "
                                   "(default: $FUNNEL_TOKEN, else no token)")
    m.add_argument("--tokens", default=None, metavar="FILE",
                   help="streamable-http: callers' tokens: a JSON file mapping sha256(token) hex to {\"principal\": NAME, \"groups\": "
                        "[...]}; each caller sees only the documents whose 'acl' names it or its groups (and public "
                        "ones); reloaded when it changes; --token stays the administrator's (default: none)")
    m.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="streamable-http: a Host header to accept besides loopback and this machine's "
                        "names (DNS-rebinding protection), e.g. the name behind a proxy; repeatable "
                        "(default: none)")
    _add_exposure_arguments(m)
    m.add_argument("--chat", metavar="BASE_URL#MODEL", default=None,
                   help="OpenAI-compatible chat endpoint for SIRA's llm proposer and hybrid expansions "
                        "(default: none; sira then uses its offline proposer)")
    m.set_defaults(fn=cmd_mcp)
    return p


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record, not at set-up, so a
    ``main()`` called in-process (tests, notebooks) never logs into a stream since closed."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _setup_logging(a) -> None:
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, handlers=[_StderrHandler()],
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # What a command must say even without -v: a build's progress and which Ray it uses
    # (build, eval, demo build indexes), and where a server listens.
    if a.command in ("build", "reindex", "eval", "demo"):
        logging.getLogger("funnel.build").setLevel(logging.INFO)
    if a.command == "serve":
        logging.getLogger("funnel.serving.frontends.http").setLevel(logging.INFO)
    if a.command == "mcp" and a.transport != "stdio":
        logging.getLogger("funnel.serving.frontends.mcp").setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    try:
        a, extra = p.parse_known_args(argv)
        # argparse (before Python 3.13) gives an optional positional nothing once an option
        # came between the positionals: `funnel search IX --k 5 "text"`. Take the text back.
        if extra and a.command == "search" and a.query is None and len(extra) == 1 and not extra[0].startswith("-"):
            a.query, extra = extra[0], []
        if extra:
            p.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help, --version, or a usage error (already printed)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    _setup_logging(a)
    from funnel.jobs.build_index import BuildError
    try:
        return a.fn(a) or 0
    except (ValueError, FileNotFoundError, BuildError) as e:  # SearchError, IndexFormatError are ValueErrors
        return _err(str(e))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader closed the pipe (`funnel search ... | head`): stop quietly, as Unix tools
        # do, and keep Python from complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
