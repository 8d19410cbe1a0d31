"""Rank fusion for hybrid retrieval: RRF with a top-rank bonus, convex score fusion, and
the position-aware blend of fused ranks with reranker scores.

Formulas (DESIGN.md "Hybrid retrieval"; the bonus and the blend tiers follow qmd):

* **RRF** (Cormack, Clarke & Büttcher, SIGIR 2009), ranks 1-based::

      rrf(d) = Σ_lists  w_list / (k + rank_list(d))   +   bonus(d)
      bonus(d) = 0.05 if d is rank 1 in any list
               = 0.02 elif its best rank is 2..3
               = 0    otherwise

  k = 60; the original-query lists get weight 2 when LLM expansions are present.
  On SciFact and NFCorpus the bonus measured a small NDCG@10 loss (DESIGN.md): it follows
  qmd by default, and ``top_rank_bonus=None`` turns it off; choose it per index on train/dev.
* **Convex** (min-max normalized score fusion over the union of the lists)::

      convex(d) = Σ_lists  w_list · minmax_list(d),   minmax(s) = (s − min) / (max − min)

  A document missing from a list gets 0 for that list. A list whose scores are all equal
  carries no order among its documents, but they were retrieved while the others were
  not: every one of them normalizes to 1.0 (``ALL_EQUAL_NORMALIZED``).
* **Position-aware blend** on the fused rank r::

      blended(d) = w(r) · 1/r + (1 − w(r)) · rerank_norm(d)
      w(r) = 0.75 for r ≤ 3, 0.60 for 4 ≤ r ≤ 10, 0.40 beyond

  ``rerank_norm`` is the reranker score min-max normalized to [0, 1] over the reranked
  candidates (all-equal scores normalize to 1.0), so the blend does not depend on the
  reranker's scale (logits, probabilities, cosines).

Every result carries its trace (per-list ranks, contributions, bonus, tier weight),
computed by the same code that scores (CONVENTIONS.md: qmd's separate trace drifted).
Sums use ``math.fsum``, which is exactly rounded, so the fused scores and the tie order do
not depend on the order the lists are given in. Layout as in ranx ``fusion/rrf.py``:
kernels first, public wrappers last.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: RRF smoothing constant (Cormack et al. 2009).
RRF_K = 60
#: (bonus for rank 1 in any list, bonus for a best rank 2..BONUS_MAX_RANK) — qmd.
TOP_RANK_BONUS = (0.05, 0.02)
#: The runner-up bonus applies to best ranks 2..BONUS_MAX_RANK.
BONUS_MAX_RANK = 3
#: What every score of a list with all-equal scores normalizes to.
ALL_EQUAL_NORMALIZED = 1.0
#: Position-aware blend tiers: (last fused rank of the tier or None for "beyond", w).
BLEND_TIERS: tuple[tuple[int | None, float], ...] = ((3, 0.75), (10, 0.60), (None, 0.40))


@dataclass(frozen=True)
class Fused:
    """One document after fusion, with the trace of how its score was made.

    ``ranks`` and ``contributions`` are keyed by list name and hold only the lists that
    contain the document; ``score == fsum(contributions.values()) + bonus``. Treat the
    dicts as read-only.
    """

    key: Hashable
    score: float
    rank: int
    ranks: dict[str, int] = field(default_factory=dict, hash=False)
    contributions: dict[str, float] = field(default_factory=dict, hash=False)
    bonus: float = 0.0

    @property
    def best_rank(self) -> int:
        return min(self.ranks.values()) if self.ranks else 0

    def explain(self) -> dict[str, Any]:
        """JSON-ready trace for ``Hit.explain``."""
        return {"fused_rank": self.rank, "fused_score": self.score, "ranks": dict(self.ranks),
                "contributions": dict(self.contributions), "bonus": self.bonus}


@dataclass(frozen=True)
class Blended:
    """One document after the position-aware blend.

    ``reranked`` is False for documents the reranker did not score; they follow the
    reranked ones in fused order, and their ``score`` is the position part ``w·1/r`` only
    (``rerank_score`` and ``rerank_norm`` are None).
    """

    key: Hashable
    score: float
    rank: int
    fused_rank: int
    fused_score: float
    weight: float
    position_score: float
    rerank_score: float | None
    rerank_norm: float | None
    reranked: bool

    def explain(self) -> dict[str, Any]:
        return {"rank": self.rank, "score": self.score, "fused_rank": self.fused_rank,
                "fused_score": self.fused_score, "position_weight": self.weight,
                "position_score": self.position_score, "rerank_score": self.rerank_score,
                "rerank_norm": self.rerank_norm, "reranked": self.reranked}


# --------------------------------------------------------------------------- kernels


def _key_order(key: Hashable) -> tuple[str, Any]:
    # Type name first, so str and int keys mixed in one call still sort deterministically.
    return (type(key).__name__, key)


def rrf_contribution(rank: int, k: float, weight: float) -> float:
    """``weight / (k + rank)``, rank 1-based."""
    return weight / (k + rank)


def rank_bonus(best_rank: int, bonus: tuple[float, float] | None,
               max_rank: int = BONUS_MAX_RANK) -> float:
    """qmd's bonus: ``bonus[0]`` for rank 1 in any list, ``bonus[1]`` for best rank 2..max_rank."""
    if not bonus:
        return 0.0
    if best_rank == 1:
        return float(bonus[0])
    if 2 <= best_rank <= max_rank:
        return float(bonus[1])
    return 0.0


def minmax(scores: Mapping[Hashable, float],
           all_equal: float = ALL_EQUAL_NORMALIZED) -> dict[Hashable, float]:
    """``(s − min) / (max − min)``; every score becomes ``all_equal`` when max == min."""
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    if hi == lo:
        return {key: float(all_equal) for key in scores}
    span = hi - lo
    return {key: (s - lo) / span for key, s in scores.items()}


def _identity(scores: Mapping[Hashable, float], all_equal: float = ALL_EQUAL_NORMALIZED
              ) -> dict[Hashable, float]:
    return dict(scores)


#: Score normalizations for ``convex``; the error message is generated from the keys.
NORMALIZERS: dict[str, Callable[..., dict[Hashable, float]]] = {
    "minmax": minmax, "none": _identity,
}


def blend_weight(rank: int, tiers: Sequence[tuple[int | None, float]] = BLEND_TIERS) -> float:
    """The position weight w of the tier that holds fused rank ``rank``."""
    for max_rank, w in tiers:
        if max_rank is None or rank <= max_rank:
            return float(w)
    raise ValueError(f"blend tiers {tiers!r} do not cover rank {rank}; end them with (None, w)")


def _check_weights(names: Sequence[str], weights: Mapping[str, float] | None,
                   default: float) -> dict[str, float]:
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ValueError(f"weights name lists that were not given: {unknown}; "
                         f"the lists are {sorted(names)}")
    out = {name: float(weights.get(name, default)) for name in names}
    bad = {n: w for n, w in out.items() if not math.isfinite(w) or w < 0}
    if bad:
        raise ValueError(f"fusion weights must be finite and >= 0, got {bad}")
    return out


def _check_tiers(tiers: Sequence[tuple[int | None, float]]) -> None:
    if not tiers or tiers[-1][0] is not None:
        raise ValueError(f"blend tiers must end with (None, w) to cover every rank, got {tiers!r}")
    bounds = [b for b, _ in tiers[:-1]]
    if any(b is None or b < 1 for b in bounds) or bounds != sorted(set(bounds)):
        raise ValueError(f"blend tier bounds must be increasing ranks >= 1, got {bounds}")
    if any(not 0.0 <= w <= 1.0 for _, w in tiers):
        raise ValueError(f"blend tier weights must lie in [0, 1], got {[w for _, w in tiers]}")


def _ranked(entries: list[tuple[Hashable, float, dict[str, int], dict[str, float], float]]
            ) -> list[Fused]:
    # Deterministic order: score desc, then best rank, then key.
    entries.sort(key=lambda e: (-e[1], min(e[2].values()), _key_order(e[0])))
    return [Fused(key=key, score=score, rank=i, ranks=ranks, contributions=contrib, bonus=b)
            for i, (key, score, ranks, contrib, b) in enumerate(entries, start=1)]


def rrf_arrays(ranks: Mapping[str, np.ndarray], k: float = RRF_K,
               weights: Mapping[str, float] | None = None) -> np.ndarray:
    """`rrf`'s scores (no bonus) for items given as arrays: ``ranks[name][i]`` is item
    ``i``'s 1-based rank in list ``name``, 0 where the list lacks it. ``Σ w / (k + rank)``
    over the lists holding each item, in one vectorized pass (passages of a search's top
    documents are fused this way, hundreds at a time)."""
    w = _check_weights(list(ranks), weights, default=1.0)
    n = len(next(iter(ranks.values()))) if ranks else 0
    out = np.zeros(n)
    for name, r in ranks.items():
        r = np.asarray(r, dtype=np.float64)
        out += np.where(r > 0, w[name] / (k + np.maximum(r, 1.0)), 0.0)
    return out


def convex_arrays(scores: Mapping[str, np.ndarray], weights: Mapping[str, float],
                  all_equal: float = ALL_EQUAL_NORMALIZED) -> np.ndarray:
    """`convex`'s scores (min-max) for items given as arrays: ``scores[name][i]`` is
    item ``i``'s score in list ``name``, NaN where the list lacks it (it then adds 0)."""
    w = _check_weights(list(scores), weights, default=0.0)
    n = len(next(iter(scores.values()))) if scores else 0
    out = np.zeros(n)
    for name, s in scores.items():
        s = np.asarray(s, dtype=np.float64)
        have = ~np.isnan(s)
        if not have.any():
            continue
        lo, hi = s[have].min(), s[have].max()
        norm = np.full(n, float(all_equal)) if hi == lo else (s - lo) / (hi - lo)
        out += np.where(have, w[name] * norm, 0.0)
    return out


def ranks_of(scores: np.ndarray) -> np.ndarray:
    """1-based rank of each item by score, best first, ties by position; 0 for NaN."""
    scores = np.asarray(scores, dtype=np.float64)
    have = np.flatnonzero(~np.isnan(scores))
    order = have[np.lexsort((have, -scores[have]))]
    out = np.zeros(len(scores), dtype=np.int64)
    out[order] = np.arange(1, len(order) + 1)
    return out


# --------------------------------------------------------------------------- public API


def rrf(lists: Mapping[str, Sequence[Hashable]], k: float = RRF_K,
        weights: Mapping[str, float] | None = None,
        top_rank_bonus: tuple[float, float] | None = TOP_RANK_BONUS,
        bonus_max_rank: int = BONUS_MAX_RANK) -> list[Fused]:
    """Reciprocal rank fusion with qmd's top-rank bonus.

    Parameters
    ----------
    lists
        List name -> ranked document keys, best first (rank 1-based). A key repeated
        within one list counts once, at its best rank.
    k
        Smoothing constant (60).
    weights
        List name -> weight; lists not named weigh 1.0.
    top_rank_bonus
        ``(rank-1 bonus, rank 2..bonus_max_rank bonus)``; ``None`` or ``(0, 0)`` disables.
    bonus_max_rank
        Last best rank that earns the runner-up bonus (3).

    Returns
    -------
    list[Fused]
        Every document of the union, best first: score desc, then best rank, then key.
    """
    if k < 0 or not math.isfinite(k):
        raise ValueError(f"RRF k must be a finite number >= 0, got {k!r}")
    w = _check_weights(list(lists), weights, default=1.0)
    ranks: dict[Hashable, dict[str, int]] = {}
    for name, keys in lists.items():
        for rank, key in enumerate(keys, start=1):
            per_doc = ranks.setdefault(key, {})
            if name in per_doc:
                logger.debug("key %r repeated in list %r; keeping rank %d", key, name,
                             per_doc[name])
                continue
            per_doc[name] = rank
    entries = []
    for key, doc_ranks in ranks.items():
        contrib = {name: rrf_contribution(r, k, w[name]) for name, r in doc_ranks.items()}
        bonus = rank_bonus(min(doc_ranks.values()), top_rank_bonus, bonus_max_rank)
        score = math.fsum([*contrib.values(), bonus])
        entries.append((key, score, doc_ranks, contrib, bonus))
    return _ranked(entries)


def convex(score_lists: Mapping[str, Mapping[Hashable, float]],
           weights: Mapping[str, float] | None = None, normalize: str = "minmax",
           all_equal: float = ALL_EQUAL_NORMALIZED) -> list[Fused]:
    """Convex combination of normalized scores over the union of the lists.

    Parameters
    ----------
    score_lists
        List name -> {document key: retriever score}.
    weights
        List name -> weight, e.g. ``{"bm25": 0.55, "dense": 0.45}``. ``None`` gives every
        list ``1 / n_lists``; lists not named get 0 when some are named.
    normalize
        One of ``NORMALIZERS`` ("minmax", "none").
    all_equal
        What a list's scores normalize to when they are all equal (1.0).

    Returns
    -------
    list[Fused]
        ``contributions`` hold ``w · normalized score``; ``ranks`` the rank inside each
        list by raw score (ties by key); ``bonus`` is 0.
    """
    if normalize not in NORMALIZERS:
        raise ValueError(f"unknown normalization {normalize!r}; choose one of "
                         f"{', '.join(NORMALIZERS)}")
    default = 1.0 / len(score_lists) if score_lists and weights is None else 0.0
    w = _check_weights(list(score_lists), weights, default=default)
    ranks: dict[Hashable, dict[str, int]] = {}
    contrib: dict[Hashable, dict[str, float]] = {}
    for name, scores in score_lists.items():
        bad = [key for key, s in scores.items() if not math.isfinite(s)]
        if bad:
            raise ValueError(f"list {name!r} has non-finite scores for {bad[:5]}; "
                             "drop or clip them before fusion")
        ordered = sorted(scores, key=lambda key: (-scores[key], _key_order(key)))
        for rank, key in enumerate(ordered, start=1):
            ranks.setdefault(key, {})[name] = rank
        for key, s in NORMALIZERS[normalize](scores, all_equal).items():
            contrib.setdefault(key, {})[name] = w[name] * s
    entries = [(key, math.fsum(contrib[key].values()), ranks[key], contrib[key], 0.0)
               for key in ranks]
    return _ranked(entries)


def position_blend(fused: Sequence[Fused], rerank_scores: Mapping[Hashable, float],
                   tiers: Sequence[tuple[int | None, float]] = BLEND_TIERS,
                   all_equal: float = ALL_EQUAL_NORMALIZED) -> list[Blended]:
    """Blend fused ranks with reranker scores, trusting the fused rank more at the top.

    Parameters
    ----------
    fused
        Output of `rrf` or `convex` (its ``rank`` is the r of the formula).
    rerank_scores
        Document key -> raw reranker score, for the candidates that were reranked
        (usually the top 30-40). Min-max normalized to [0, 1] before blending.
    tiers
        ``((last rank, w), ..., (None, w))``: w for r ≤ 3 is 0.75, 4..10 0.60, else 0.40.

    Returns
    -------
    list[Blended]
        Reranked documents by blended score (ties by fused rank), then the others in
        fused order.
    """
    _check_tiers(tiers)
    known = {f.key for f in fused}
    unknown = [key for key in rerank_scores if key not in known]
    if unknown:
        raise ValueError(f"rerank scores for keys not in the fused list: {unknown[:5]}; "
                         "rerank a subset of the fused candidates")
    bad = [key for key, s in rerank_scores.items() if not math.isfinite(s)]
    if bad:
        raise ValueError(f"non-finite rerank scores for {bad[:5]}")
    norm = minmax(rerank_scores, all_equal)
    rows = []
    for f in fused:
        wt = blend_weight(f.rank, tiers)
        pos = 1.0 / f.rank
        if f.key in norm:
            score = wt * pos + (1.0 - wt) * norm[f.key]
            rows.append((f, wt, pos, score, float(rerank_scores[f.key]), norm[f.key], True))
        else:
            rows.append((f, wt, pos, wt * pos, None, None, False))
    rows.sort(key=lambda r: (not r[6], -r[3] if r[6] else 0.0, r[0].rank))
    return [Blended(key=f.key, score=score, rank=i, fused_rank=f.rank, fused_score=f.score,
                    weight=wt, position_score=pos, rerank_score=raw, rerank_norm=nrm,
                    reranked=done)
            for i, (f, wt, pos, score, raw, nrm, done) in enumerate(rows, start=1)]
