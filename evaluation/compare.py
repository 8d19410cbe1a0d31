"""Paired comparison of two runs on the same queries: did B really beat A?

Why: a mean NDCG difference of 0.01 on 300 queries may be noise. Both runs answer the
same queries, so paired tests are the right tools (Smucker, Allan & Carterette 2007,
"A comparison of statistical significance tests for IR evaluation").

**Success@k and McNemar.** A query is a *success* for a run when

* ``hit``: at least one relevant document (grade >= 1) is in its top k, or
* ``recall``: every relevant document is in its top k (recall@k == 1.0).

Queries without relevant documents, or missing from a run, are failures. The top k, like
every figure here, follows trec_eval's order (score desc, ties by docid desc) unless
``ties="rank"`` asks for the run's own order (ties by docid asc). Over all qrels
queries the 2x2 table counts a = both succeed, b = only A, c = only B, d = neither.
McNemar's test uses only the discordant pairs b and c; under H0 each is B(b+c, 1/2):

* exact: p = min(1, 2 * BinomCDF(min(b, c); b + c, 1/2)), used when b + c < threshold;
* chi-square: X2 = (b - c)^2 / (b + c), and with continuity correction
  X2cc = max(0, |b - c| - 1)^2 / (b + c); p = P(chi2_1 >= X2). Used when b + c >= threshold.

All three are always reported; b + c = 0 gives every p = 1.0.

**Randomization test.** With per-query differences d_i = m_B(q_i) - m_A(q_i) (m is
NDCG@10 by default), the sign-flip test draws R random sign vectors s and counts
p = (1 + #{|mean(s * d)| >= |mean(d)|}) / (R + 1) (two-sided, with the +1 correction of
Phipson & Smyth 2010). The 95% CI of mean(d) is the percentile bootstrap over queries.
Both use a fixed seed, so a report is reproducible.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from .metrics import evaluate, format_table
from .trec import check_ties, ranked_docids

logger = logging.getLogger(__name__)

SUCCESS_MODES = ("hit", "recall")


@dataclass(frozen=True)
class McNemarResult:
    """McNemar test on the discordant counts b (only A right) and c (only B right)."""

    b: int
    c: int
    exact_p: float
    chi2: float
    chi2_p: float
    chi2_cc: float
    chi2_cc_p: float
    exact_threshold: int
    method: str  # "exact" or "chi2": the one ``p_value`` comes from
    p_value: float


@dataclass(frozen=True)
class RandomizationResult:
    """Paired sign-flip randomization test and bootstrap CI on per-query differences."""

    metric: str
    mean_a: float
    mean_b: float
    mean_diff: float
    ci_low: float
    ci_high: float
    ci_level: float
    p_value: float
    permutations: int
    bootstrap: int
    seed: int


@dataclass(frozen=True)
class FlippedQuery:
    """A query that succeeded for one run and failed for the other."""

    qid: str
    text: str
    metric_a: float
    metric_b: float


@dataclass(frozen=True)
class Comparison:
    """Everything `compare_runs` found; ``to_dict`` for JSON, ``to_text`` for people."""

    name_a: str
    name_b: str
    k: int
    success: str
    n_queries: int
    a: int
    b: int
    c: int
    d: int
    alpha: float
    mcnemar: McNemarResult
    randomization: RandomizationResult
    improved: tuple[FlippedQuery, ...]  # only B succeeds (the c cell)
    worsened: tuple[FlippedQuery, ...]  # only A succeeds (the b cell)
    per_query: tuple[tuple[str, float, float], ...]  # (qid, metric A, metric B)
    verdict: str
    ties: str = "trec_eval"  # tie order of every top k and metric (see funnel.evaluation.trec)

    def to_dict(self) -> dict:
        """A JSON-serializable dict of every field."""
        d = asdict(self)
        d["per_query"] = [{"qid": q, "a": a, "b": b} for q, a, b in self.per_query]
        return d

    def to_text(self, max_flipped: int = 20) -> str:
        """A readable report: 2x2 table, p-values, flipped queries, verdict."""
        A, B, m, r = self.name_a, self.name_b, self.mcnemar, self.randomization
        label = f"success@{self.k} ({self.success})"
        lines = [f"{A} vs {B}: {label}, {self.n_queries} queries, tie order {self.ties}", ""]
        lines.append(format_table(
            [{label: f"{A} right", f"{B} right": self.a, f"{B} wrong": self.b},
             {label: f"{A} wrong", f"{B} right": self.c, f"{B} wrong": self.d}]))
        lines.append(f"McNemar (b={m.b}, c={m.c}): exact p = {m.exact_p:.4g}; "
                     f"chi2 = {m.chi2:.3f}, p = {m.chi2_p:.4g}; "
                     f"chi2 corrected = {m.chi2_cc:.3f}, p = {m.chi2_cc_p:.4g}; "
                     f"using {m.method} (exact when b+c < {m.exact_threshold})")
        lines.append(f"{r.metric}: {A} {r.mean_a:.4f}, {B} {r.mean_b:.4f}, difference {r.mean_diff:+.4f} "
                     f"({r.ci_level:.0%} CI [{r.ci_low:+.4f}, {r.ci_high:+.4f}]), randomization p = "
                     f"{r.p_value:.4g} ({r.permutations} sign flips, seed {r.seed})")
        for title, flipped in ((f"Improved (only {B} succeeds)", self.improved),
                               (f"Got worse (only {A} succeeds)", self.worsened)):
            lines.append("")
            lines.append(f"{title}: {len(flipped)}")
            for f in flipped[:max_flipped]:
                text = f"  {f.text}" if f.text else ""
                lines.append(f"  {f.qid}  {r.metric} {f.metric_a:.3f} -> {f.metric_b:.3f}{text}")
            if len(flipped) > max_flipped:
                lines.append(f"  ... and {len(flipped) - max_flipped} more")
        lines += ["", self.verdict]
        return "\n".join(lines) + "\n"


def success_at_k(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    k: int = 10,
    success: str = "hit",
    ties: str = "trec_eval",
) -> dict[str, bool]:
    """Per-query success@k for every qrels query (see the module docstring).

    Parameters
    ----------
    run, qrels : Mapping
        ``{qid: {docid: score}}`` and ``{qid: {docid: grade}}``.
    k : int
        Rank cutoff.
    success : {"hit", "recall"}
        ``hit``: any relevant document in the top k; ``recall``: all of them.
    ties : {"trec_eval", "rank"}
        Order of the top k: trec_eval's (score desc, docid desc; default) or the run's
        own (docid asc); see `funnel.evaluation.trec.ranked_docids`.
    """
    if success not in SUCCESS_MODES:
        raise ValueError(f"unknown success mode {success!r}; choose one of {', '.join(SUCCESS_MODES)}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    check_ties(ties)
    out: dict[str, bool] = {}
    for qid, judged in qrels.items():
        relevant = {d for d, g in judged.items() if g >= 1}
        top = set(ranked_docids(run.get(qid, {}), k, ties))
        found = len(relevant & top)
        out[qid] = bool(relevant) and (found > 0 if success == "hit" else found == len(relevant))
    return out


def contingency(success_a: Mapping[str, bool], success_b: Mapping[str, bool]) -> tuple[int, int, int, int]:
    """The paired 2x2 counts ``(a, b, c, d)``: both, only A, only B, neither."""
    if set(success_a) != set(success_b):
        raise ValueError("success_a and success_b must cover the same queries")
    pairs = [(success_a[q], success_b[q]) for q in success_a]
    return (sum(x and y for x, y in pairs), sum(x and not y for x, y in pairs),
            sum(y and not x for x, y in pairs), sum(not x and not y for x, y in pairs))


def mcnemar(b: int, c: int, exact_threshold: int = 25) -> McNemarResult:
    """McNemar's test from the discordant counts.

    Parameters
    ----------
    b, c : int
        Queries where only A, resp. only B, succeeds.
    exact_threshold : int
        Report the exact binomial p as ``p_value`` when ``b + c < exact_threshold``,
        else the uncorrected chi-square p.
    """
    from scipy import stats  # imported here: scipy costs ~0.5 s at CLI start-up
    if b < 0 or c < 0:
        raise ValueError(f"b and c are counts and must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        chi2 = chi2_cc = 0.0
        exact_p = chi2_p = chi2_cc_p = 1.0
    else:
        exact_p = float(min(1.0, 2.0 * stats.binom.cdf(min(b, c), n, 0.5)))
        chi2 = (b - c) ** 2 / n
        chi2_cc = max(0, abs(b - c) - 1) ** 2 / n
        chi2_p, chi2_cc_p = float(stats.chi2.sf(chi2, 1)), float(stats.chi2.sf(chi2_cc, 1))
    method = "exact" if n < exact_threshold else "chi2"
    return McNemarResult(b=b, c=c, exact_p=exact_p, chi2=float(chi2), chi2_p=chi2_p, chi2_cc=float(chi2_cc),
                         chi2_cc_p=chi2_cc_p, exact_threshold=exact_threshold, method=method,
                         p_value=exact_p if method == "exact" else chi2_p)


def randomization_test(diffs: np.ndarray, permutations: int = 10000, seed: int = 0) -> float:
    """Two-sided paired sign-flip randomization p-value for ``mean(diffs) != 0``.

    ``p = (1 + #{|mean(s * d)| >= |mean(d)|}) / (permutations + 1)`` over random sign
    vectors ``s``; identical runs (all ``d = 0``) give ``p = 1``.
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError("diffs must be a non-empty 1-D array of per-query differences")
    if permutations < 1:
        raise ValueError(f"permutations must be >= 1, got {permutations}")
    rng = np.random.default_rng(seed)
    observed = abs(d.mean())
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))  # float noise must not break ties
    hits = 0
    chunk = max(1, 4_000_000 // d.size)  # bound memory to ~32 MB per chunk
    for start in range(0, permutations, chunk):
        m = min(chunk, permutations - start)
        signs = rng.integers(0, 2, size=(m, d.size), dtype=np.int8) * 2 - 1
        hits += int(np.count_nonzero(np.abs(signs @ d) / d.size >= observed - tol))
    return (hits + 1) / (permutations + 1)


def bootstrap_ci(diffs: np.ndarray, n: int = 10000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of ``mean(diffs)``, resampling queries with replacement."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError("diffs must be a non-empty 1-D array of per-query differences")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    means = np.empty(n)
    chunk = max(1, 4_000_000 // d.size)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        means[start:start + m] = d[rng.integers(0, d.size, size=(m, d.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _verdict(cmp_k: int, success: str, a: str, b: str, mc: McNemarResult, rnd: RandomizationResult,
             alpha: float) -> str:
    label = f"success@{cmp_k}" + (" (all relevant found)" if success == "recall" else "")
    if mc.p_value < alpha:
        head = f"{b} is {'better' if mc.c > mc.b else 'worse'} than {a} on {label}"
    else:
        head = f"no significant difference between {a} and {b} on {label}"
    head += (f": {mc.c} quer{'y' if mc.c == 1 else 'ies'} improved, {mc.b} got worse, "
             f"McNemar {mc.method} p = {mc.p_value:.3g}")
    if rnd.p_value < alpha:
        tail = f"{b} is {'better' if rnd.mean_diff > 0 else 'worse'} on {rnd.metric}"
    else:
        tail = f"no significant difference on {rnd.metric}"
    tail += (f": {rnd.mean_diff:+.3f} ({rnd.ci_level:.0%} CI [{rnd.ci_low:+.3f}, {rnd.ci_high:+.3f}]), "
             f"randomization p = {rnd.p_value:.3g}")
    return f"{head[0].upper()}{head[1:]}; {tail} (alpha = {alpha:g})."


def compare_runs(
    run_a: Mapping[str, Mapping[str, float]],
    run_b: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    queries: Mapping[str, str] | None = None,
    k: int = 10,
    success: str = "hit",
    metric: str = "ndcg@10",
    permutations: int = 10000,
    bootstrap: int = 10000,
    seed: int = 0,
    alpha: float = 0.05,
    exact_threshold: int = 25,
    name_a: str = "A",
    name_b: str = "B",
    ties: str = "trec_eval",
) -> Comparison:
    """Compare run B against run A on every qrels query.

    Parameters
    ----------
    run_a, run_b : Mapping
        ``{qid: {docid: score}}``; queries missing from a run count as failures / 0.
    qrels : Mapping
        ``{qid: {docid: grade}}``; defines the query set.
    queries : Mapping[str, str], optional
        Query text, shown next to flipped queries.
    k, success : int, {"hit", "recall"}
        The success@k definition for McNemar.
    metric : str
        Per-query metric for the randomization test and bootstrap CI.
    permutations, bootstrap, seed : int
        Sign flips, bootstrap resamples, and the seed both use.
    alpha : float
        Significance level for the verdict.
    exact_threshold : int
        McNemar uses the exact binomial p when b + c is below this.
    name_a, name_b : str
        Labels used in the verdict and text.
    ties : {"trec_eval", "rank"}
        Tie order for success@k and the per-query metric (default trec_eval's).

    Returns
    -------
    Comparison
    """
    if not qrels:
        raise ValueError("qrels are empty; pass the judgements for the queries both runs answered")
    sa, sb = success_at_k(run_a, qrels, k, success, ties), success_at_k(run_b, qrels, k, success, ties)
    a, b, c, d = contingency(sa, sb)
    mc = mcnemar(b, c, exact_threshold)

    _, pq_a = evaluate(run_a, qrels, (metric,), ties)
    _, pq_b = evaluate(run_b, qrels, (metric,), ties)
    qids = list(qrels)
    va = np.array([pq_a[q][metric] for q in qids])
    vb = np.array([pq_b[q][metric] for q in qids])
    diffs = vb - va
    lo, hi = bootstrap_ci(diffs, bootstrap, seed)
    rnd = RandomizationResult(metric=metric, mean_a=float(va.mean()), mean_b=float(vb.mean()),
                              mean_diff=float(diffs.mean()), ci_low=lo, ci_high=hi, ci_level=0.95,
                              p_value=randomization_test(diffs, permutations, seed),
                              permutations=permutations, bootstrap=bootstrap, seed=seed)
    queries = queries or {}

    def flipped(want_a: bool) -> tuple[FlippedQuery, ...]:
        return tuple(FlippedQuery(q, queries.get(q, ""), pq_a[q][metric], pq_b[q][metric])
                     for q in qids if sa[q] == want_a and sb[q] != want_a)

    return Comparison(
        name_a=name_a, name_b=name_b, k=k, success=success, n_queries=len(qids), a=a, b=b, c=c, d=d,
        alpha=alpha, mcnemar=mc, randomization=rnd, improved=flipped(False), worsened=flipped(True),
        per_query=tuple((q, float(x), float(y)) for q, x, y in zip(qids, va, vb)),
        verdict=_verdict(k, success, name_a, name_b, mc, rnd, alpha), ties=ties,
    )
