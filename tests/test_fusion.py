"""Fusion formulas on hand-built lists (expected values written as the formulas), and
Hypothesis properties: input-order independence, deterministic ties, all-equal scores."""

from __future__ import annotations

import math
import random

import pytest
from funnel.serving.fusion import (
    BLEND_TIERS,
    Fused,
    blend_weight,
    convex,
    minmax,
    position_blend,
    rrf,
)
from hypothesis import given, settings
from hypothesis import strategies as st

BM25 = ["d1", "d2", "d3", "d4"]
DENSE = ["d3", "d5", "d1"]


def by_key(fused):
    return {f.key: f for f in fused}


def test_rrf_scores_equal_the_written_formula():
    got = by_key(rrf({"bm25": BM25, "dense": DENSE}))
    expected = {
        "d1": 1 / (60 + 1) + 1 / (60 + 3) + 0.05,
        "d2": 1 / (60 + 2) + 0.02,
        "d3": 1 / (60 + 3) + 1 / (60 + 1) + 0.05,
        "d4": 1 / (60 + 4),
        "d5": 1 / (60 + 2) + 0.02,
    }
    assert set(got) == set(expected)
    for key, score in expected.items():
        assert got[key].score == pytest.approx(score, abs=1e-15)
    assert got["d1"].ranks == {"bm25": 1, "dense": 3}
    assert got["d1"].contributions["dense"] == pytest.approx(1 / 63)
    assert got["d4"].bonus == 0.0 and got["d2"].bonus == 0.02


def test_rrf_weights_k_and_no_bonus():
    got = by_key(rrf({"bm25": BM25, "dense": DENSE}, k=10, weights={"bm25": 2.0},
                     top_rank_bonus=None))
    assert got["d1"].score == pytest.approx(2 / 11 + 1 / 13)
    assert got["d5"].score == pytest.approx(1 / 12)
    assert all(f.bonus == 0.0 for f in got.values())
    same = by_key(rrf({"bm25": BM25, "dense": DENSE}, k=10, weights={"bm25": 2.0},
                      top_rank_bonus=(0, 0)))
    assert {k: f.score for k, f in same.items()} == {k: f.score for k, f in got.items()}


def test_rrf_order_ties_and_explain():
    fused = rrf({"bm25": BM25, "dense": DENSE})
    # d1 and d3 tie exactly (1/61 + 1/63 + 0.05), best rank 1 both: key order decides.
    # d2 and d5 tie too (1/62 + 0.02), best rank 2 both.
    assert [f.key for f in fused] == ["d1", "d3", "d2", "d5", "d4"]
    assert [f.rank for f in fused] == [1, 2, 3, 4, 5]
    e = fused[0].explain()
    assert e["fused_score"] == math.fsum([*e["contributions"].values(), e["bonus"]])


def test_rrf_repeated_key_counts_once_at_best_rank():
    got = by_key(rrf({"a": ["x", "y", "x"]}, top_rank_bonus=None))
    assert got["x"].score == pytest.approx(1 / 61)
    assert got["x"].ranks == {"a": 1}


def test_rrf_rejects_bad_input_with_the_valid_names():
    with pytest.raises(ValueError, match=r"\['bm25', 'dense'\]"):
        rrf({"bm25": BM25, "dense": DENSE}, weights={"bm2": 2.0})
    with pytest.raises(ValueError, match=">= 0"):
        rrf({"bm25": BM25}, weights={"bm25": -1.0})


def test_convex_is_weighted_minmax_over_the_union():
    bm25 = {"a": 10.0, "b": 5.0, "c": 0.0}
    dense = {"b": 0.9, "d": 0.5}
    got = by_key(convex({"bm25": bm25, "dense": dense}, weights={"bm25": 0.55, "dense": 0.45}))
    assert got["a"].score == pytest.approx(0.55 * 1.0)
    assert got["b"].score == pytest.approx(0.55 * 0.5 + 0.45 * 1.0)
    assert got["c"].score == pytest.approx(0.0)
    assert got["d"].score == pytest.approx(0.45 * 0.0)
    assert got["b"].ranks == {"bm25": 2, "dense": 1}
    assert [f.key for f in convex({"bm25": bm25, "dense": dense},
                                  weights={"bm25": 0.55, "dense": 0.45})][:2] == ["b", "a"]
    with pytest.raises(ValueError, match="minmax, none"):
        convex({"bm25": bm25}, normalize="zscore")


def test_minmax_of_all_equal_scores_is_one():
    assert minmax({"a": 3.0, "b": 3.0}) == {"a": 1.0, "b": 1.0}
    assert minmax({"a": -2.0}) == {"a": 1.0}


def test_blend_tiers_at_the_boundaries():
    assert [blend_weight(r) for r in (1, 3, 4, 10, 11, 500)] == [0.75, 0.75, 0.6, 0.6, 0.4, 0.4]


def test_position_blend_formula_and_unreranked_tail():
    fused = rrf({"a": [f"d{i}" for i in range(1, 13)]}, top_rank_bonus=None)
    raw = {f"d{i}": float(i) for i in (3, 4, 10, 11)}  # normalized: (i - 3) / 8
    out = position_blend(fused, raw)
    got = {b.key: b for b in out}
    for r in (3, 4, 10, 11):
        w = dict(zip((3, 4, 10, 11), (0.75, 0.60, 0.60, 0.40)))[r]
        assert got[f"d{r}"].weight == w
        assert got[f"d{r}"].score == pytest.approx(w / r + (1 - w) * (r - 3) / 8)
    assert all(b.reranked for b in out[:4]) and not any(b.reranked for b in out[4:])
    assert [b.fused_rank for b in out[4:]] == [1, 2, 5, 6, 7, 8, 9, 12]
    assert [b.rank for b in out] == list(range(1, 13))
    scores = [b.score for b in out[:4]]
    assert scores == sorted(scores, reverse=True)


def test_position_blend_rejects_unknown_keys_and_bad_tiers():
    fused = rrf({"a": ["x", "y"]})
    with pytest.raises(ValueError, match="not in the fused list"):
        position_blend(fused, {"z": 1.0})
    with pytest.raises(ValueError, match="None"):
        position_blend(fused, {"x": 1.0}, tiers=((3, 0.75),))


# --------------------------------------------------------------------------- properties

keys = st.integers(min_value=0, max_value=30)
ranked_lists = st.dictionaries(st.sampled_from(["bm25", "dense", "splade", "exp1"]),
                               st.lists(keys, max_size=15, unique=True), min_size=1)


def _shuffled(d: dict, seed: int) -> dict:
    items = list(d.items())
    random.Random(seed).shuffle(items)
    return dict(items)


def _as_tuples(fused: list[Fused]):
    return [(f.key, f.score, f.rank, f.ranks, f.bonus) for f in fused]


@settings(max_examples=60, deadline=None)
@given(ranked_lists, st.integers(0, 1000),
       st.dictionaries(st.sampled_from(["bm25", "dense", "splade", "exp1"]),
                       st.floats(0, 3), max_size=4))
def test_rrf_independent_of_list_order(lists, seed, weights):
    weights = {k: v for k, v in weights.items() if k in lists}
    assert _as_tuples(rrf(lists, weights=weights)) == \
        _as_tuples(rrf(_shuffled(lists, seed), weights=_shuffled(weights, seed + 1)))


@settings(max_examples=60, deadline=None)
@given(st.lists(keys, min_size=1, max_size=20, unique=True), st.integers(0, 1000))
def test_rrf_ties_are_broken_by_key(keys_a, seed):
    # Two lists that are each other's reverse give many exact ties.
    lists = {"a": keys_a, "b": keys_a[::-1]}
    fused = rrf(lists)
    order = [(-f.score, f.best_rank, f.key) for f in fused]
    assert order == sorted(order)
    assert _as_tuples(fused) == _as_tuples(rrf(_shuffled(lists, seed)))


score_maps = st.dictionaries(keys, st.floats(-50, 50, allow_nan=False), max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["bm25", "dense", "splade"]), score_maps, min_size=1),
       st.integers(0, 1000))
def test_convex_independent_of_list_order_and_bounded(lists, seed):
    a, b = convex(lists), convex(_shuffled(lists, seed))
    assert _as_tuples(a) == _as_tuples(b)
    assert all(-1e-12 <= f.score <= 1 + 1e-12 for f in a)  # equal weights sum to 1


@settings(max_examples=40, deadline=None)
@given(st.lists(keys, min_size=1, max_size=12, unique=True), st.floats(-5, 5))
def test_convex_all_equal_scores_normalize_to_one(doc_keys, value):
    fused = convex({"only": {k: value for k in doc_keys}})
    assert all(f.score == 1.0 for f in fused)
    assert [f.key for f in fused] == sorted(doc_keys)


@settings(max_examples=40, deadline=None)
@given(st.lists(keys, min_size=1, max_size=25, unique=True), st.data())
def test_blend_keeps_every_doc_and_uses_the_tier_of_its_fused_rank(doc_keys, data):
    fused = rrf({"a": doc_keys})
    chosen = data.draw(st.lists(st.sampled_from(doc_keys), unique=True))
    scores = {k: data.draw(st.floats(-10, 10)) for k in chosen}
    out = position_blend(fused, scores)
    assert sorted(b.key for b in out) == sorted(doc_keys)
    for b in out:
        assert b.weight == blend_weight(b.fused_rank, BLEND_TIERS)
        assert b.reranked == (b.key in scores)
        if b.reranked:
            assert 0.0 <= b.rerank_norm <= 1.0
