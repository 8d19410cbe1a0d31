"""The text an agent reads: the ranked hits with their best passages quoted, within a token budget.

DESIGN.md "The result an agent gets": most agents read a search tool's text and answer
from it, so the text carries the evidence itself, says where it is, fits a budget and ends
with how to fetch more::

    Found 3 documents for 'pool size' (hybrid):

    1. [docs/limits.md] Resource limits [lines 40-52, start=1834, end=2410]
       lines 41-44, start=1901, end=2210:
       > The connection pool holds 10 connections by default; set pool_size to change it.
    2. [docs/tuning.md] Tuning [lines 1-9, page 2, start=0, end=812]
    (1 more document in the structured hits)

    To read more: get_document(doc_id, start, end) ...

* Every listed hit gives its rank, id, title and its best passage's place: lines, the PDF
  page where the text has page breaks (form feeds), and the character range ``get_document``
  takes.
* Excerpts are chosen across the hits by passage priority (``passage_rank``: a passage's
  rank among all candidate passages fused with its document's rank), so a strong document
  can show two passages before a weak one shows any. An excerpt is the passage's best
  sentence or line (most query-term weight, w·idf) and its neighbours, up to
  `excerpt_tokens`; excerpts of one document that overlap or touch are merged.
* The hit lines first take up to `HIT_LINES_SHARE` of the budget, then excerpts take
  what is left, then further hits are listed while they fit; hits left out are counted.

Every line is counted with the budget's counter (``context.approx_tokens`` by default:
subadditive, so the whole counts at most the sum of its lines) and a last check cuts the
text at the budget, so it never exceeds the budget, whatever the titles, ids or passages.
Only the hits are read: their documents are the ones the caller's filter and access allow.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from typing import Callable, Sequence

from funnel.pipelines.dense.passages import line_span

from .citations import last_visible
from .context import CHARS_PER_TOKEN, approx_tokens, truncate_to_budget
from .passage_rank import PassageRanking, sentence_bounds, units
from ..result import Hit

#: Tokens of the text when a search names no budget.
DEFAULT_BUDGET = 1000
#: Bounds on a requested budget: below the minimum a text cannot hold one quoted line.
MIN_BUDGET = 100
MAX_BUDGET = 32_000
#: Share of the budget the hit lines may take before any excerpt is placed.
HIT_LINES_SHARE = 0.3
#: A title is shown up to this many characters.
MAX_TITLE_CHARS = 120
#: An excerpt cut to fit the budget's end is kept only with at least this many tokens.
MIN_EXCERPT_TOKENS = 12
#: The quote marker before each line of an excerpt.
QUOTE = "   > "
#: The query is shown up to this many characters.
MAX_QUERY_CHARS = 200


def excerpt_tokens(budget: int) -> int:
    """The most tokens one excerpt takes: an eighth of the budget, 40..400 (125 at 1,000 tokens:
    a few sentences). Smaller excerpts cover more passages: on 60 of SciFact's train questions over
    its abstracts packed into long documents, evidence at 1,000 tokens was 0.63 / 0.67 / 0.72 /
    0.75 with a third / sixth / eighth / tenth of the budget; on the package-README questions
    (``bench/evidence_packages.json``, whose answers are exact lines) 0.83 / 0.85 / 0.85 / 0.83.
    An eighth holds up on both."""
    return int(min(400, max(40, budget // 8)))


def where(text: str, a: int, b: int, lines: tuple[int, int] | None = None) -> str:
    """``lines 3-9, page 2, start=120, end=560`` of ``text[a:b]`` (page: where the text has
    PDF page breaks, form feeds; ``get_document`` takes start and end as they are).
    ``lines``: its first and last line where known already (a citation's)."""
    first, last = lines or line_span(text, a, b)
    out = f"line {first}" if first == last else f"lines {first}-{last}"
    if "\f" in text:
        # The last page as the citation's page_end counts it (documents.page_span).
        p, q = text.count("\f", 0, a) + 1, text.count("\f", 0, last_visible(text, a, b)) + 1
        out += f", page {p}" if p == q else f", pages {p}-{q}"
    return f"{out}, start={a}, end={b}"


def _title(h: Hit) -> str:
    t = " ".join((h.title or "").split())
    return t if len(t) <= MAX_TITLE_CHARS else t[:MAX_TITLE_CHARS - 1].rstrip() + "…"


def _head(h: Hit, text: str) -> str:
    head = f"{h.rank}. [{h.doc_id}] {_title(h)}".rstrip()
    if h.passage is not None:
        c = h.passage
        head += f" [{where(text, c.start, c.end, (c.line_start, c.line_end))}]"
    return head


def _quote(text: str, a: int, b: int, cited: tuple[int, int] | None = None) -> list[str]:
    """An excerpt's lines: where it is (unless it is the hit's cited passage, placed on the
    hit's line already), then its text quoted line by line."""
    head = [] if (a, b) == cited else [f"   {where(text, a, b)}:"]
    lines = [QUOTE + line.strip() for line in text[a:b].splitlines() if line.strip()]
    if lines and b < len(text) and text[b - 1] not in ".!?:;)\"'" and text[b] not in "\r\n":
        lines[-1] += "…"  # cut inside a sentence: the text goes on
    return head + lines


def _weight_sum(w: list[float], columns) -> float:
    """The weights of ``columns`` added in order from 0.0 (numpy's sum of so few adds them the
    same way, so a unit's score is what it was)."""
    total = 0.0
    for c in columns:
        total += w[c]
    return total


def excerpt_span(ranking: PassageRanking, i: int, j: int, cap: int, count: Callable[[str], int]) -> tuple[int, int]:
    """The excerpt of passage ``j`` of document ``i`` (widened to whole sentences): its best
    unit (sentence or line: most distinct query-term weight, the first on ties) and the units
    around it, the next one first, while the whole stays within ``cap`` tokens: first those of
    the best unit's paragraph (and, across a blank line, units with query terms, or the list
    or code a line ending in a colon introduces), then the rest of the passage. A best unit
    longer than ``cap`` is cut (at a sentence end or word) to ``cap``."""
    d = ranking.docs[i]
    s, e = d.spans[j]
    a, b = sentence_bounds(d.text, int(s), int(e))
    us = units(d.text, a, b)
    if not us:
        return a, a
    starts, cols, w = ranking.term_positions(i)  # lists: for a few units, bisect beats NumPy calls
    scores = [_weight_sum(w, set(cols[bisect_left(starts, x):bisect_left(starts, y)])) for x, y, _ in us]
    best = max(range(len(scores)), key=scores.__getitem__)  # the first of the highest
    x, y, _ = us[best]
    # The default counter counts at least a token per CHARS_PER_TOKEN characters, so a longer
    # unit is over the cap uncounted (a long line of code, a transcript without full stops).
    too_long = count is approx_tokens and y - x > cap * CHARS_PER_TOKEN
    best_size = cap + 1 if too_long else count(d.text[x:y])
    if best_size > cap:
        cut = truncate_to_budget(d.text[x:y], cap, count)
        return x, x + len(cut)
    # A span's count is at most the sum of its units'.
    sizes = [count(d.text[u[0]:u[1]]) if k != best else best_size for k, u in enumerate(us)]

    def grow(lo: int, hi: int, used: int, near: bool) -> tuple[int, int, int]:
        """Add neighbours, the next one first, while within ``cap``; ``near``: only those in the
        best unit's paragraph, those holding query terms, or the lines a colon introduces."""
        while True:
            for nxt, prev in ((hi + 1, hi), (lo - 1, lo)):
                if not 0 <= nxt < len(us) or used + sizes[nxt] > cap:
                    continue
                if near and not (us[nxt][2] == us[best][2] or scores[nxt] > 0
                                 or (nxt > prev and d.text[us[prev][0]:us[prev][1]].endswith(":"))):
                    continue
                used += sizes[nxt]
                lo, hi = min(lo, nxt), max(hi, nxt)
                break
            else:
                return lo, hi, used

    lo, hi, used = grow(best, best, sizes[best], True)  # the best unit's paragraph first,
    lo, hi, _ = grow(lo, hi, used, False)               # then the rest of the passage around it
    return us[lo][0], us[hi][1]


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def fit(text: str, budget: int, count: Callable[[str], int] = approx_tokens) -> str:
    """``text`` cut to ``budget`` tokens at a word (or character) if it is over."""
    if count(text) <= budget:
        return text
    return truncate_to_budget(text, budget, count, min_sentence_fraction=1.1)


def fetch_hint(doc_id: str, a: int, b: int) -> str:
    """The last line: how to read more, with the top hit's range as the example."""
    return (f"More: get_document({json.dumps(doc_id)}, start={a}, end={b}) returns that text; widen start/end "
            "for its surroundings, or leave them out for the whole document (HTTP: GET /documents/ID?start=&end=).")


def _normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


def evidence_summary(query: str, mode: str, hits: Sequence[Hit], texts: dict[int, str],
                     ranking: PassageRanking | None, budget: int = DEFAULT_BUDGET, note: str = "",
                     count: Callable[[str], int] = approx_tokens) -> str:
    """The evidence-bearing text of a search (module docstring), at most ``budget`` tokens.

    Parameters
    ----------
    hits
        The ranked hits, each with its citation (``Hit.passage``).
    texts
        docno -> the hit document's text (the only texts read).
    ranking
        The hits' passages scored and fused (``passage_rank.rank_passages``).
    budget
        The most tokens the text may take, as ``count`` counts them.
    note
        A sentence for the reader (a mode's note), after the first line.
    """
    if not hits:
        msg = f"No documents found for {query!r} ({mode})."
        return fit(f"{msg} {note}".strip(), budget, count)

    def cost(lines: list[str]) -> int:
        return sum(count(line + "\n") for line in lines)

    n = len(hits)
    shown = query if len(query) <= MAX_QUERY_CHARS else query[:MAX_QUERY_CHARS - 1] + "…"
    header = [f"Found {n} document{'s' if n != 1 else ''} for {shown!r} ({mode}):"] + ([note] if note else []) + [""]
    top = hits[0]
    a0, b0 = (top.passage.start, top.passage.end) if top.passage is not None else (0, 0)
    footer = ["", fetch_hint(top.doc_id, a0, b0)]
    used = cost(header) + cost(footer)
    heads = [_head(h, texts.get(h.docno, "")) for h in hits]
    head_cost = [count(x + "\n") for x in heads]

    def more_line(left: int) -> str:
        return f"({left} more document{'s' if left != 1 else ''} in the structured hits)"

    listed = 0
    share = used + int(HIT_LINES_SHARE * budget)
    while listed < n:
        reserve = count(more_line(n - listed - 1) + "\n") if listed + 1 < n else 0
        if used + head_cost[listed] + reserve > min(budget, max(share, used + head_cost[0])):
            break
        used += head_cost[listed]
        listed += 1
    reserve = count(more_line(n - listed) + "\n") if listed < n else 0
    used += reserve

    chosen: dict[int, list[tuple[int, int]]] = {}
    cited = {h.docno: (h.passage.start, h.passage.end) for h in hits if h.passage is not None}
    # The same text under two ids is quoted once: quoted texts by their first word, compared
    # whitespace- and case-normalized only where a first word is shared (rarely).
    quoted: dict[str, list[str]] = {}
    quotes: dict[tuple[int, int, int], tuple[list[str], int]] = {}

    def quote(i: int, a: int, b: int) -> tuple[list[str], int]:
        """The lines quoting ``[a, b)`` of document ``i`` and their cost, each made once."""
        q = quotes.get((i, a, b))
        if q is None:
            d = ranking.docs[i]
            lines = _quote(d.text, a, b, cited.get(d.docno))
            q = quotes[(i, a, b)] = (lines, cost(lines))
        return q

    if ranking is not None and listed:
        cap = excerpt_tokens(budget)
        index = {d.docno: i for i, d in enumerate(ranking.docs)}
        listed_docs = {index[h.docno] for h in hits[:listed] if h.docno in index}
        for _, i, j in ranking.pool():
            if i not in listed_docs:
                continue
            left = budget - used
            if left < MIN_EXCERPT_TOKENS:
                break
            d = ranking.docs[i]
            x, y = excerpt_span(ranking, i, j, cap, count)
            if y <= x:
                continue
            said = d.text[x:y]
            first = (said.split(None, 1) or [""])[0].casefold()
            if first in quoted and _normalized(said) in {_normalized(t) for t in quoted[first]}:
                continue
            old = chosen.get(i, [])
            new = _merge(old + [(x, y)])
            if new == old:
                continue
            old_cost = sum(quote(i, a, b)[1] for a, b in old)
            delta = sum(quote(i, a, b)[1] for a, b in new) - old_cost
            if delta <= left:
                chosen[i] = new
                used += delta
                quoted.setdefault(first, []).append(said)
                continue
            # The last excerpt: cut to what is left, if that still says something.
            room = left
            for _ in range(6):
                text = truncate_to_budget(said, room, count, min_sentence_fraction=0.0)
                if count(text) < MIN_EXCERPT_TOKENS:
                    break
                trial = _merge(old + [(x, x + len(text))])
                delta = sum(quote(i, a, b)[1] for a, b in trial) - old_cost
                if delta <= left:
                    chosen[i] = trial
                    used += delta
                    break
                room -= max(1, delta - left)
            break

    # Leftover budget lists further hits.
    used -= reserve
    while listed < n:
        reserve = count(more_line(n - listed - 1) + "\n") if listed + 1 < n else 0
        if used + head_cost[listed] + reserve > budget:
            break
        used += head_cost[listed]
        listed += 1

    lines = list(header)
    index = {d.docno: i for i, d in enumerate(ranking.docs)} if ranking is not None else {}
    for h, head in zip(hits[:listed], heads):
        lines.append(head)
        i = index.get(h.docno)
        for a, b in chosen.get(i, []) if i is not None else []:
            lines += quote(i, a, b)[0]
    if listed < n:
        lines.append(more_line(n - listed))
    lines += footer
    return fit("\n".join(lines), budget, count)
