"""The ``funnel compare`` subcommand: a paired test of two TREC runs on the same qrels.

Why separate from ``cli.py``: the evaluation layer needs no index, so the main CLI only
registers this parser (``add_compare_parser(subparsers)``) and stays a thin dispatcher.
The statistics are those of `funnel.evaluation.compare` (McNemar on success@k, a
sign-flip randomization test and bootstrap CI on NDCG@10).

    funnel compare RUN_A RUN_B --qrels QRELS [--queries QUERIES] [--k 10]
                   [--success hit|recall] [--permutations N] [--seed S] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .compare import SUCCESS_MODES, compare_runs
from .trec import read_qrels, read_queries, read_run


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def add_compare_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``compare`` on ``subparsers``.

    The handler `run_compare` is set as both ``args.func`` and ``args.fn``; it
    returns the exit code 0.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        From ``parser.add_subparsers()``.

    Returns
    -------
    argparse.ArgumentParser
        The ``compare`` parser.
    """
    p = subparsers.add_parser(
        "compare",
        help="paired significance test of two TREC runs (McNemar on success@k, randomization on NDCG@10)",
        description="Compare run B against run A on the same qrels: success@k 2x2 table and McNemar test, "
                    "sign-flip randomization test and bootstrap CI on per-query NDCG@10, flipped queries.",
    )
    p.add_argument("run_a", metavar="RUN_A", help="baseline TREC run (qid Q0 docid rank score tag; .gz ok)")
    p.add_argument("run_b", metavar="RUN_B", help="candidate TREC run")
    p.add_argument("--qrels", required=True, help="BEIR qrels .tsv or TREC qrels (required)")
    p.add_argument("--queries", help="BEIR queries.jsonl, to show the text of flipped queries (default: ids only)")
    p.add_argument("--k", type=_positive_int, default=10, help="cutoff for success@k (default: %(default)s)")
    p.add_argument("--success", choices=SUCCESS_MODES, default="hit",
                   help="hit: any relevant doc in top k; recall: all relevant docs in top k (default: %(default)s)")
    p.add_argument("--permutations", type=_positive_int, default=10000,
                   help="sign flips for the randomization test (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed for randomization and bootstrap (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level for the verdict (default: %(default)s)")
    p.add_argument("--name-a", default="A", help="label of RUN_A in the output (default: %(default)s)")
    p.add_argument("--name-b", default="B", help="label of RUN_B in the output (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the full result as JSON (default: off)")
    # cli.py dispatches on `fn`; `func` is the argparse idiom other front ends expect.
    p.set_defaults(func=run_compare, fn=run_compare)
    return p


def run_compare(args: argparse.Namespace) -> int:
    """Handle ``funnel compare``: read the files, compare, print; returns exit code 0."""
    qrels = read_qrels(args.qrels)
    result = compare_runs(
        read_run(args.run_a), read_run(args.run_b), qrels,
        queries=read_queries(args.queries) if args.queries else None,
        k=args.k, success=args.success, permutations=args.permutations, seed=args.seed,
        alpha=args.alpha, name_a=args.name_a, name_b=args.name_b,
    )
    if args.json:
        out = result.to_dict()
        out["files"] = {"run_a": args.run_a, "run_b": args.run_b, "qrels": args.qrels, "queries": args.queries}
        print(json.dumps(out, indent=2))
    else:
        print(f"{args.name_a} = {args.run_a}\n{args.name_b} = {args.run_b}\n")
        print(result.to_text(), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the evaluation subcommands standalone: ``python -m funnel.evaluation.evalcli compare ...``."""
    parser = argparse.ArgumentParser(prog="funnel-eval")
    sub = parser.add_subparsers(dest="command", required=True)
    add_compare_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
