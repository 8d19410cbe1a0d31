"""Paired comparison: McNemar against statsmodels, the randomization test against scipy,
hand-built runs with known 2x2 tables, a swap-symmetry property, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar

from funnel.evaluation.compare import (
    bootstrap_ci,
    compare_runs,
    contingency,
    mcnemar,
    randomization_test,
    success_at_k,
)
from funnel.evaluation.evalcli import main as eval_main
from funnel.evaluation.trec import write_run


def make_run(rel_ranks: dict[str, int | None], n: int = 20) -> dict[str, dict[str, float]]:
    """A run where query q has its relevant doc 'rel' at rank rel_ranks[q] (None: absent)."""
    run = {}
    for q, rank in rel_ranks.items():
        docs = [f"f{i:02d}" for i in range(n)]
        if rank is not None:
            docs.insert(rank - 1, "rel")
        run[q] = {d: float(len(docs) - i) for i, d in enumerate(docs)}
    return run


# ---------------------------------------------------------------- McNemar

TABLES = [  # (a, b, c, d)
    (5, 0, 0, 7),  # b+c = 0
    (5, 1, 0, 7),  # b+c = 1
    (5, 0, 1, 7),
    (3, 2, 5, 4),  # tiny counts
    (1, 1, 4, 0),
    (20, 3, 20, 7),  # b+c = 23 < 25
    (150, 30, 12, 58),  # large
    (400, 160, 201, 300),
]


@pytest.mark.parametrize("table", TABLES)
def test_mcnemar_matches_statsmodels(table):
    a, b, c, d = table
    res = mcnemar(b, c)
    tab = [[a, b], [c, d]]
    assert res.exact_p == pytest.approx(sm_mcnemar(tab, exact=True).pvalue, rel=1e-9)
    if b + c == 0:  # statsmodels divides by zero here; no discordant pairs = no evidence
        assert (res.exact_p, res.chi2_p, res.chi2_cc_p, res.p_value) == (1.0, 1.0, 1.0, 1.0)
        return
    plain, corrected = sm_mcnemar(tab, exact=False, correction=False), sm_mcnemar(tab, exact=False, correction=True)
    assert res.chi2 == pytest.approx(plain.statistic) and res.chi2_p == pytest.approx(plain.pvalue)
    assert res.chi2_cc == pytest.approx(corrected.statistic) and res.chi2_cc_p == pytest.approx(corrected.pvalue)
    assert res.method == ("exact" if b + c < 25 else "chi2")
    assert res.p_value == (res.exact_p if b + c < 25 else res.chi2_p)


def test_mcnemar_by_formula_and_threshold():
    res = mcnemar(3, 20)
    assert res.exact_p == pytest.approx(2 * sum(stats.binom.pmf(i, 23, 0.5) for i in range(4)))
    assert res.chi2 == pytest.approx(17**2 / 23) and res.chi2_cc == pytest.approx(16**2 / 23)
    assert mcnemar(3, 20, exact_threshold=10).method == "chi2"
    # b == c: the corrected statistic is clipped at 0 (statsmodels would give 1/(b+c))
    tied = mcnemar(7, 7)
    assert tied.chi2_cc == 0.0 and tied.chi2_cc_p == 1.0 and tied.exact_p == 1.0
    with pytest.raises(ValueError, match="counts"):
        mcnemar(-1, 2)


# ---------------------------------------------------------------- randomization and bootstrap

def test_randomization_identical_runs():
    d = np.zeros(50)
    assert randomization_test(d, 1000, seed=3) == 1.0
    assert bootstrap_ci(d, 500) == (0.0, 0.0)


def test_randomization_clear_improvement():
    d = 0.1 + np.random.default_rng(0).uniform(0, 0.05, size=60)
    assert randomization_test(d, 2000, seed=1) == pytest.approx(1 / 2001)
    lo, hi = bootstrap_ci(d, 2000, seed=1)
    assert 0.1 < lo < d.mean() < hi < 0.15


def test_randomization_seed_is_fixed():
    d = np.random.default_rng(5).normal(0.01, 0.2, size=80)
    assert randomization_test(d, 3000, seed=7) == randomization_test(d, 3000, seed=7)


@pytest.mark.parametrize("n, shift, exact", [(12, 0.15, True), (150, 0.02, False)])
def test_randomization_matches_scipy(n, shift, exact):
    rng = np.random.default_rng(n)
    a = rng.uniform(0, 1, size=n)
    b = np.clip(a + shift + rng.normal(0, 0.3, size=n), 0, 1)
    d = b - a
    ref = stats.permutation_test(
        (b, a), lambda x, y, axis: np.mean(x - y, axis=axis), permutation_type="samples",
        vectorized=True, n_resamples=20000, alternative="two-sided", rng=np.random.default_rng(1),
    )
    ours = randomization_test(d, 20000, seed=2)
    assert 0.005 < ref.pvalue < 0.9  # a p where the comparison is informative
    # Monte Carlo standard error at 20000 draws is <= 0.0036; scipy is exact when n = 12
    assert ours == pytest.approx(ref.pvalue, abs=0.015 if exact else 0.02)


# ---------------------------------------------------------------- compare_runs on hand-built runs

def _built_case():
    # a=10 both at rank 1, b=3 only A, c=20 only B (B at rank 2), d=7 neither
    ra, rb = {}, {}
    for i in range(40):
        q = f"q{i:02d}"
        if i < 10:
            ra[q], rb[q] = 1, 1
        elif i < 13:
            ra[q], rb[q] = 1, None
        elif i < 33:
            ra[q], rb[q] = None, 2
        else:
            ra[q], rb[q] = 15, None  # A finds it, but outside the top 10
    qrels = {q: {"rel": 1} for q in ra}
    return make_run(ra), make_run(rb), qrels


def test_compare_runs_counts_and_verdict():
    run_a, run_b, qrels = _built_case()
    texts = {q: f"text of {q}" for q in qrels}
    res = compare_runs(run_a, run_b, qrels, queries=texts, permutations=2000, bootstrap=1000)
    assert (res.a, res.b, res.c, res.d) == (10, 3, 20, 7)
    assert res.mcnemar.method == "exact"
    assert res.mcnemar.p_value == pytest.approx(2 * stats.binom.cdf(3, 23, 0.5))
    assert [f.qid for f in res.worsened] == ["q10", "q11", "q12"]
    assert len(res.improved) == 20 and res.improved[0].text == "text of q13"
    assert res.improved[0].metric_a == 0.0 and res.improved[0].metric_b == pytest.approx(1 / np.log2(3))
    r = res.randomization
    expected_diff = (20 / np.log2(3) - 3) / 40  # the d cell's rank 15 is outside NDCG@10
    assert r.mean_diff == pytest.approx(expected_diff)
    assert r.ci_low < r.mean_diff < r.ci_high
    assert res.verdict.startswith("B is better than A on success@10: 20 queries improved, 3 got worse, "
                                  "McNemar exact p = ")
    assert "B is better on ndcg@10" in res.verdict
    payload = json.loads(json.dumps(res.to_dict()))
    assert payload["c"] == 20 and payload["mcnemar"]["method"] == "exact" and len(payload["per_query"]) == 40
    text = res.to_text()
    assert "Got worse (only A succeeds): 3" in text and "text of q10" in text


def test_compare_identical_runs_says_no_difference():
    run_a, _, qrels = _built_case()
    res = compare_runs(run_a, run_a, qrels, permutations=500, bootstrap=200)
    assert (res.b, res.c) == (0, 0) and res.mcnemar.p_value == 1.0
    assert res.randomization.p_value == 1.0 and res.randomization.mean_diff == 0.0
    assert res.verdict.startswith("No significant difference between A and B on success@10")
    assert "no significant difference on ndcg@10" in res.verdict


def test_success_modes():
    qrels = {"q": {"r1": 1, "r2": 2, "n": 0}, "empty": {"n": 0}, "absent": {"r1": 1}}
    run = {"q": {"r1": 3.0, "x": 2.0, "r2": 1.0}, "empty": {"n": 1.0}}
    assert success_at_k(run, qrels, 1, "hit") == {"q": True, "empty": False, "absent": False}
    assert success_at_k(run, qrels, 2, "recall") == {"q": False, "empty": False, "absent": False}
    assert success_at_k(run, qrels, 3, "recall")["q"] is True
    with pytest.raises(ValueError, match="hit, recall"):
        success_at_k(run, qrels, 3, "any")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, 1, 3, 8, 12]), st.sampled_from([None, 1, 2, 9, 15])),
                min_size=1, max_size=25))
def test_swapping_runs_swaps_b_and_c(pairs):
    ra = {f"q{i}": x for i, (x, _) in enumerate(pairs)}
    rb = {f"q{i}": y for i, (_, y) in enumerate(pairs)}
    run_a, run_b, qrels = make_run(ra, 12), make_run(rb, 12), {q: {"rel": 1} for q in ra}
    ab = compare_runs(run_a, run_b, qrels, permutations=200, bootstrap=200)
    ba = compare_runs(run_b, run_a, qrels, permutations=200, bootstrap=200)
    assert (ab.a, ab.b, ab.c, ab.d) == (ba.a, ba.c, ba.b, ba.d)
    assert ab.mcnemar.p_value == ba.mcnemar.p_value
    assert ab.mcnemar.chi2_cc_p == ba.mcnemar.chi2_cc_p
    assert ab.randomization.p_value == ba.randomization.p_value
    assert ab.randomization.mean_diff == pytest.approx(-ba.randomization.mean_diff)
    assert ab.randomization.ci_low == pytest.approx(-ba.randomization.ci_high)
    assert [f.qid for f in ab.improved] == [f.qid for f in ba.worsened]
    assert contingency({"x": True}, {"x": False}) == (0, 1, 0, 0)


# ---------------------------------------------------------------- CLI

def test_cli_compare_text_and_json(tmp_path, capsys):
    run_a, run_b, qrels = _built_case()
    write_run(tmp_path / "a.trec", run_a, "A")
    write_run(tmp_path / "b.trec", run_b, "B")
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                        + "".join(f"{q}\trel\t1\n" for q in qrels))
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": f"about {q}"}) + "\n"
                                                    for q in qrels))
    base = ["compare", str(tmp_path / "a.trec"), str(tmp_path / "b.trec"), "--qrels", str(tmp_path / "qrels.tsv"),
            "--queries", str(tmp_path / "queries.jsonl"), "--permutations", "500"]
    assert eval_main(base) == 0
    out = capsys.readouterr().out
    assert "McNemar (b=3, c=20)" in out and "about q10" in out and "B is better than A" in out
    assert eval_main([*base, "--json", "--success", "recall", "--k", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["k"], data["success"], data["b"], data["c"]) == (1, "recall", 3, 0)
