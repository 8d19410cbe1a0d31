"""The values of per-query search options: each number finite and in range, checked once.

``VersionSearcher._check_options`` calls `check_option_values` before any mode reads
an option, and every front end reaches it (Python ``search``/``search_batch``, the CLI's
flags, HTTP ``/search``, the MCP ``search`` tool), so a bad value is one
`SearchError` naming the option (HTTP 400, an MCP tool
error, CLI exit 2) and never a silent wrong answer: ``k1`` = inf or nan scores every
document 0 or nan, so the result was empty with a false note ("none of the query's terms
occur"), and ``context_tokens`` = inf raised OverflowError (HTTP 500).

A number may come as an int, a float or text that reads as one (``"0.9"``, as JSON
clients and the sira options always allowed); a bool, ``None``, text that does not read
as a number and anything that reads as inf or nan (``Infinity``, ``"nan"``, ``"1e999"``)
are refused. Integer options take integral floats (``5.0``). Each upper bound is either
the option's meaning (``b``, ``alpha``: [0, 1]) or, where the formula has none, a bound
against abuse far above any useful value (``k1``: beyond ~100 BM25 is already linear in
tf; a huge one overflows the length normalization to inf).

SIRA's own options (``lambda``, ``tau``, ``max_n``, ``fb_docs``, ``fb_terms``) are checked
the same way by ``sira.mode.SiraConfig.from_options``, which ``_check_options`` also runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import SearchError

__all__ = ["NUMBERS", "Number", "check_option_values"]

#: Longest rendering of a refused value in a message (a 5,000-digit number is cut).
_MAX_SHOWN = 60


@dataclass(frozen=True)
class Number:
    """The range of one numeric option; ``capped``: ``hi`` bounds abuse, not meaning."""

    lo: float
    hi: float
    integer: bool = False
    capped: bool = False

    def span(self) -> str:
        if self.integer:
            return f"in {int(self.lo)}..{int(self.hi)}"
        if self.capped:
            return f">= {self.lo:g} and at most {self.hi:g}"
        return f"in [{self.lo:g}, {self.hi:g}]"

    def kind(self) -> str:
        return f"an integer {self.span()}" if self.integer else f"a finite number {self.span()}"


#: Every numeric per-query option outside SIRA's, with its range.
NUMBERS: dict[str, Number] = {
    "k1": Number(0.0, 1000.0, capped=True),
    "b": Number(0.0, 1.0),
    "nprobe": Number(1, 1_000_000, integer=True),          # clipped to the index's list count
    "alpha": Number(0.0, 1.0),
    "rrf_k": Number(0.0, 1e6, capped=True),
    "bm25_weight": Number(0.0, 1e6, capped=True),
    "dense_weight": Number(0.0, 1e6, capped=True),
    "candidates": Number(1, 1000, integer=True),
    "rerank_depth": Number(1, 1000, integer=True),
    "chunk_tokens": Number(2, 65_536, integer=True),       # windows start every chunk_tokens // 2
    "expand": Number(0, 10, integer=True),                 # LLM expansions, each two more searches
    "context_tokens": Number(0, 1_000_000, integer=True),  # 0: no context
}
#: ``top_rank_bonus``: a pair of these, or off (None, false, 0, "none").
BONUS = Number(0.0, 1.0)
#: ``blend_tiers``: [[last rank, weight], ..., [null, weight]].
TIER_RANK = Number(1, 1_000_000, integer=True)
TIER_WEIGHT = Number(0.0, 1.0)
#: Options that are switches: true or false, nothing else ("false" would read as true).
SWITCHES = ("rerank",)


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int too long for repr (over 4,300 digits)
        text = f"<an integer of about {value.bit_length() * 0.30103:.0f} digits>"
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN - 1] + "…"


def check_number(name: str, value: Any, spec: Number) -> int | float:
    """``value`` as the number option ``name`` takes, or SearchError naming it."""
    bad = SearchError(f"{name} must be {spec.kind()}, got {_shown(value)}")
    if isinstance(value, bool) or value is None:
        raise bad
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise bad from None
    if not math.isfinite(x) or (spec.integer and not x.is_integer()):
        raise bad
    if not spec.lo <= x <= spec.hi:
        raise SearchError(f"{name} must be {spec.span()}, got {_shown(value)}")
    if spec.integer:
        return int(value) if isinstance(value, int) else int(x)
    return x


def _top_rank_bonus(value: Any) -> Any:
    if not isinstance(value, (list, tuple)) and (
            value is None or value == "none" or (isinstance(value, (bool, int, float)) and value == 0)):
        return value  # off
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise SearchError(f"top_rank_bonus must be two numbers [rank 1, ranks 2-3] each {BONUS.span()}, "
                          f"or null for none, got {_shown(value)}")
    return tuple(check_number(f"top_rank_bonus[{i}]", v, BONUS) for i, v in enumerate(value))


def _blend_tiers(value: Any) -> Any:
    if not isinstance(value, (list, tuple)) or not value:
        raise SearchError(f"blend_tiers must be a list of [last rank, weight] pairs ending with [null, weight], "
                          f"got {_shown(value)}")
    out = []
    for i, tier in enumerate(value):
        if not isinstance(tier, (list, tuple)) or len(tier) != 2:
            raise SearchError(f"blend_tiers[{i}] must be a [last rank, weight] pair, got {_shown(tier)}")
        rank, w = tier
        out.append((None if rank is None else check_number(f"blend_tiers[{i}] rank", rank, TIER_RANK),
                    check_number(f"blend_tiers[{i}] weight", w, TIER_WEIGHT)))
    return tuple(out)


def check_option_values(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with every numeric value checked and converted (see the module docstring).

    Names are not checked here (``_check_options`` does that against the mode); options
    this module does not know pass unchanged.

    Raises
    ------
    SearchError
        A value that is not a finite number in its option's range, naming the option.
    """
    out = dict(options)
    for name, value in options.items():
        if name in NUMBERS:
            out[name] = check_number(name, value, NUMBERS[name])
        elif name == "top_rank_bonus":
            out[name] = _top_rank_bonus(value)
        elif name == "blend_tiers":
            out[name] = _blend_tiers(value)
        elif name in SWITCHES and not isinstance(value, bool):
            raise SearchError(f"{name} must be true or false, got {_shown(value)}")
    return out
