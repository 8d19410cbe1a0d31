"""The context optimizer: turn ranked passages into the context an LLM reads.

DESIGN.md "Hybrid retrieval", step 6 (after qmd): merge overlapping or adjacent chunks of
the same document, drop duplicates, fit a token budget, and order the result "U-shaped".

* **Merge**: passages of one document whose character spans overlap or are at most
  ``merge_gap`` characters apart become one passage; its score is the maximum of theirs.
* **Deduplicate**: passages whose whitespace- and case-normalized text is identical (the
  same text under two document ids) keep only the best-scoring one.
* **Budget**: passages are taken best-first while ``Σ count_tokens(text) ≤ budget``; the
  first one that does not fit is cut at the last sentence end (or else word boundary)
  that fits, and packing stops there.
* **U-shape** (Liu et al. 2023, "Lost in the Middle": models use the start and the end of
  a context best): for passages p1 ≥ p2 ≥ ... ≥ pn by score the order is
  ``p1, p3, p4, ..., pn, p2``.

The default token counter is ``approx_tokens``: ``ceil(4/3 · words)``, OpenAI's rule of
thumb of ~0.75 English words per BPE token, and at least ``ceil(characters / 6)``, so text
with few spaces (a URL, a base64 blob, a language written without spaces) still counts for
its length; pass a real tokenizer's counter for exactness.
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

logger = logging.getLogger(__name__)

#: Tokens per whitespace word in ``approx_tokens``.
TOKENS_PER_WORD = 4 / 3
#: ``approx_tokens`` counts at least one token per this many characters. English prose
#: averages ~6 characters a word with its space, so the word count decides there; a long
#: run without spaces is counted by its length instead.
CHARS_PER_TOKEN = 6
#: Passages at most this many characters apart in one document are merged.
MERGE_GAP = 1
#: Text put between two merged passages that do not touch.
GAP_SEPARATOR = " "
#: A truncated last passage shorter than this many tokens is dropped instead.
MIN_TRUNCATED_TOKENS = 8
#: Cut at a sentence end only if that keeps at least this fraction of the words that fit.
MIN_SENTENCE_FRACTION = 0.5

_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s)")
_WORD_RUN = re.compile(r"\S+")


def approx_tokens(text: str, tokens_per_word: float = TOKENS_PER_WORD) -> int:
    """``max(ceil(tokens_per_word · whitespace words), ceil(characters / CHARS_PER_TOKEN))``.

    Subadditive: a text joined from parts with whitespace counts at most the sum of the
    parts' counts, each part counted with its separator (what budget fitting relies on)."""
    return max(math.ceil(len(text.split()) * tokens_per_word), -(-len(text) // CHARS_PER_TOKEN))


@dataclass(frozen=True)
class Passage:
    """A span ``[start, end)`` of a document's text; ``text`` is exactly that span."""

    doc_id: str
    start: int
    end: int
    text: str
    score: float

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"passage of {self.doc_id!r} has span [{self.start}, {self.end}); "
                             "need 0 <= start <= end")
        if len(self.text) != self.end - self.start:
            raise ValueError(
                f"passage of {self.doc_id!r} has {len(self.text)} characters of text for span "
                f"[{self.start}, {self.end}); text must be document[start:end] "
                "(use start=0, end=len(text) for a passage without offsets)")


# --------------------------------------------------------------------------- kernels


def merge_passages(passages: list[Passage], merge_gap: int = MERGE_GAP,
                   separator: str = GAP_SEPARATOR) -> list[Passage]:
    """Merge overlapping or near-adjacent spans of the same document (score = max)."""
    by_doc: dict[str, list[Passage]] = {}
    for p in passages:
        by_doc.setdefault(p.doc_id, []).append(p)
    out = []
    for doc_id, ps in by_doc.items():
        ps.sort(key=lambda p: (p.start, -p.end))
        cur = ps[0]
        for p in ps[1:]:
            if p.start > cur.end + merge_gap:
                out.append(cur)
                cur = p
            elif p.end <= cur.end:  # contained
                cur = replace(cur, score=max(cur.score, p.score))
            else:
                if p.start >= cur.end:  # touching or within the gap
                    gap = p.start - cur.end
                    # The gap's characters are unknown: stand in a separator, keeping
                    # len(text) == end - start.
                    filler = (separator * gap)[:gap] if gap else ""
                    text = cur.text + filler + p.text
                else:
                    text = cur.text + p.text[cur.end - p.start:]
                cur = Passage(doc_id, cur.start, p.end, text, max(cur.score, p.score))
        out.append(cur)
    return out


def _normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


def drop_duplicates(passages: list[Passage]) -> list[Passage]:
    """Keep the best-scoring passage of each normalized text."""
    best: dict[str, Passage] = {}
    for p in sorted(passages, key=_best_first):
        best.setdefault(_normalized(p.text), p)
    dropped = len(passages) - len(best)
    if dropped:
        logger.debug("context: dropped %d duplicate passages", dropped)
    return list(best.values())


def _best_first(p: Passage) -> tuple:
    return (-p.score, p.doc_id, p.start)


def truncate_to_budget(text: str, budget: int, count_tokens: Callable[[str], int],
                       min_sentence_fraction: float = MIN_SENTENCE_FRACTION) -> str:
    """The longest prefix of ``text`` within ``budget`` tokens, cut at a sentence end if
    one keeps at least ``min_sentence_fraction`` of it, else at a word boundary; where not
    even the first word fits (a run of characters without spaces), at a character."""
    if count_tokens is approx_tokens:
        # The default counter, counted from the word ends alone: the first i words count
        # max(ceil(i * TOKENS_PER_WORD), ceil(chars / CHARS_PER_TOKEN)), so the most that fit
        # are the first `_most_words(budget)` words, or fewer where they end past budget *
        # CHARS_PER_TOKEN characters. One bounded regex match finds their end.
        limit = budget * CHARS_PER_TOKEN
        end = _first_words(_most_words(budget)).match(text, 0, limit).end()
        if end == limit < len(text) and not text[limit].isspace():
            head = text[:end].rsplit(None, 1)  # the last word was cut at the limit: drop it
            end = len(head[0]) if len(head) == 2 else 0
        lo = None  # the words that fit: counted only where a sentence end is weighed
    else:
        ends = [m.end() for m in _WORD_RUN.finditer(text)]
        lo, hi = 0, len(ends)  # binary search the number of words that fit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count_tokens(text[:ends[mid - 1]]) <= budget:
                lo = mid
            else:
                hi = mid - 1
        end = ends[lo - 1] if lo else 0
    if end == 0:
        first = _WORD_RUN.search(text)  # the whole first word (the scan may have cut it)
        return _longest_prefix(text[:first.end()] if first else "", budget, count_tokens)
    prefix = text[:end]
    sentence_ends = [m.end() for m in _SENTENCE_END.finditer(prefix + " ")]
    if sentence_ends:
        cut = sentence_ends[-1]
        if lo is None:
            lo = len(prefix.split())
        if len(prefix[:cut].split()) >= min_sentence_fraction * lo:
            return prefix[:cut]
    return prefix


@functools.lru_cache(maxsize=256)
def _most_words(budget: int) -> int:
    """The most whitespace words ``approx_tokens`` counts within ``budget`` (by its words alone)."""
    n = int(budget / TOKENS_PER_WORD) + 1
    while n > 0 and math.ceil(n * TOKENS_PER_WORD) > budget:
        n -= 1
    return n


@functools.lru_cache(maxsize=256)
def _first_words(n: int) -> re.Pattern:
    """Matches up to ``n`` whitespace words from where it starts, the whitespace before each
    included (``\\S+`` as `_WORD_RUN` finds words); greedy, so it ends after the last of them."""
    return re.compile(r"(?:\s*\S+){0,%d}" % n)


def _longest_prefix(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    """The longest character prefix of ``text`` within ``budget`` tokens (binary search)."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(text[:mid]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo].strip()


def u_shape(passages: list[Passage]) -> list[Passage]:
    """Best first, second-best last, the rest in the middle in descending order."""
    ranked = sorted(passages, key=_best_first)
    if len(ranked) < 3:
        return ranked
    return [ranked[0], *ranked[2:], ranked[1]]


# --------------------------------------------------------------------------- public API


def pack_ranked(passages: list[Passage], budget_tokens: int,
                count_tokens: Callable[[str], int] = approx_tokens,
                min_truncated_tokens: int = MIN_TRUNCATED_TOKENS, max_chars: int | None = None) -> list[Passage]:
    """`pack_context` for passages already in priority order (best first): each is taken
    while the merged selection stays within ``budget_tokens``, the first that does not fit is
    cut to what is left and packing stops. Unlike `pack_context`, which merges first and
    cuts a merged span from its start, a passage is never lost behind the neighbours it merges
    with. ``max_chars``: packing also stops once the selection holds that many characters
    (what an answer can show, ``bounds.MAX_ANSWER_CHARS``), whatever the token budget."""
    if budget_tokens < 0:
        raise ValueError(f"budget_tokens must be >= 0, got {budget_tokens}")
    # Each document's selection is kept merged (sorted, disjoint spans, each with its cost).
    # A new passage merges only with the spans within MERGE_GAP of it, a contiguous run found
    # by bisection, so taking one costs its merged span's counting, not a re-merge of the
    # document's whole selection (quadratic: thousands of passages of one huge text took
    # 40 s).
    docs: dict[str, tuple[list[int], list[int], list[Passage], list[int]]] = {}
    used = chars = 0

    def take(q: Passage) -> bool:
        """Take q if the selection stays within the budget: q merges with spans[lo:hi]."""
        nonlocal used, chars
        starts, ends, ps, costs = docs.get(q.doc_id) or ([], [], [], [])
        lo = bisect.bisect_left(ends, q.start - MERGE_GAP)
        hi = bisect.bisect_right(starts, q.end + MERGE_GAP)
        merged = merge_passages(ps[lo:hi] + [q])[0] if hi > lo else q
        cost = count_tokens(merged.text)
        total = used - sum(costs[lo:hi]) + cost
        if total > budget_tokens:
            return False
        starts, ends, ps, costs = docs.setdefault(q.doc_id, (starts, ends, ps, costs))
        chars += len(merged.text) - sum(len(p.text) for p in ps[lo:hi])
        starts[lo:hi], ends[lo:hi], ps[lo:hi], costs[lo:hi] = [merged.start], [merged.end], [merged], [cost]
        used = total
        return True

    for p in passages:
        if max_chars is not None and chars >= max_chars:
            break
        if take(p):
            continue
        left = budget_tokens - used
        if left >= min_truncated_tokens:
            text = truncate_to_budget(p.text, left, count_tokens).rstrip()
            if text and count_tokens(text) >= min_truncated_tokens:
                take(replace(p, end=p.start + len(text), text=text))
        break
    chosen = [p for _, _, ps, _ in docs.values() for p in ps]  # merged already: pack_context keeps them
    return pack_context(chosen, budget_tokens, count_tokens, min_truncated_tokens=min_truncated_tokens)


def pack_context(passages: list[Passage], budget_tokens: int,
                 count_tokens: Callable[[str], int] = approx_tokens,
                 merge_gap: int = MERGE_GAP, min_truncated_tokens: int = MIN_TRUNCATED_TOKENS,
                 u_shaped: bool = True) -> list[Passage]:
    """Merge, deduplicate, fit to ``budget_tokens`` and order passages for an LLM.

    Parameters
    ----------
    passages
        Candidate passages with their retrieval (or rerank) scores.
    budget_tokens
        Upper bound on ``Σ count_tokens(p.text)`` over the result (separators the caller
        adds between passages are not counted).
    count_tokens
        Token counter; ``approx_tokens`` by default (see the module docstring).
    merge_gap
        Spans of one document at most this many characters apart are merged.
    min_truncated_tokens
        A truncated last passage smaller than this is dropped.
    u_shaped
        Order "U-shaped" (default) or plainly best first.

    Returns
    -------
    list[Passage]
        The packed passages; a truncated one has ``end`` moved to its new length.
    """
    if budget_tokens < 0:
        raise ValueError(f"budget_tokens must be >= 0, got {budget_tokens}")
    candidates = sorted(drop_duplicates(merge_passages(list(passages), merge_gap))
                        if passages else [], key=_best_first)
    kept: list[Passage] = []
    used = 0
    for p in candidates:
        n = count_tokens(p.text)
        if used + n <= budget_tokens:
            kept.append(p)
            used += n
            continue
        left = budget_tokens - used
        if left >= min_truncated_tokens:
            text = truncate_to_budget(p.text, left, count_tokens).rstrip()
            if text and count_tokens(text) >= min_truncated_tokens:
                kept.append(replace(p, end=p.start + len(text), text=text))
        logger.debug("context: budget %d reached after %d of %d passages", budget_tokens,
                     len(kept), len(candidates))
        break
    return u_shape(kept) if u_shaped else kept
