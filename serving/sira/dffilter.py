"""The query-side DF filter: keep a proposed phrase only when the index knows it and it
is not too common.

    keep(p)  ⇔  ∃ window w of 1..max_n analyzed tokens of p, w holding a token the query
                lacks, with  1 ≤ df(w) ≤ τ·N

(DESIGN.md "SIRA retrieval"; the reference code keeps a phrase when any 1..max_n window
has ``0 < df <= int(ratio * N)``, the same test for integer df). A window of one token is
a unigram term; a longer window is looked up as an atomic n-gram term under
`ngram_key`, which only a corpus-enriched index holds: on a plain index every
n-gram has df 0 and the unigrams decide. Windows made only of query tokens do not count,
so a phrase cannot pass on the strength of a word the query already has.

A kept phrase contributes every token (and n-gram) the index knows and the query lacks,
including tokens above τ·N (as the reference, which appends the whole phrase; their low
idf keeps them weak).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Sequence

#: Valid ``max_n`` values (the reference chooses 1 or 2 per dataset).
MAX_N_RANGE = (1, 3)


def ngram_key(tokens: Sequence[str]) -> str:
    """The vocabulary key of an atomic n-gram term: analyzed tokens joined by one space.

    The analyzer never emits a space inside a token, so a key cannot collide with a
    unigram. Corpus enrichment must inject n-grams under this same key.
    """
    return " ".join(tokens)


def sub_ngrams(tokens: Sequence[str], max_n: int) -> list[tuple[str, ...]]:
    """Every window of 1..``max_n`` consecutive tokens, shortest first, left to right."""
    return [tuple(tokens[i:i + n]) for n in range(1, max_n + 1) for i in range(len(tokens) - n + 1)]


@dataclass(slots=True)
class Verdict:
    """What the filter decided for one phrase, with the numbers behind it.

    Not frozen: a frozen dataclass costs ~0.6 µs more to construct, and every SIRA query
    makes one verdict per proposal. Treat it as read-only.
    """

    kept: bool
    reason: str
    df: dict[str, int]                # df of every window that holds a new token
    terms: tuple[str, ...] = ()       # what a kept phrase adds to the expansion query


def df_filter(tokens: Sequence[str], query_terms: Collection[str], df_of: Callable[[str], int],
              n_docs: int, tau: float, max_n: int) -> Verdict:
    """Decide one phrase; ``tokens`` are its analyzed tokens (see the module docstring).

    Parameters
    ----------
    tokens
        The phrase after the index's analyzer (stopwords removed, stemmed).
    query_terms
        The query's analyzed terms (a set or dict is used as is): windows made only of
        them do not count.
    df_of
        Document frequency of a vocabulary key (0 when the index lacks it).
    n_docs, tau, max_n
        N, the ceiling ratio τ, and the longest window.
    """
    if not tokens:
        return Verdict(False, "no searchable words (stopwords or punctuation only)", {})
    qset = query_terms if isinstance(query_terms, (set, frozenset, dict)) else set(query_terms)
    df: dict[str, int] = {}  # every window holding a new token: sub_ngrams' order, each key once
    # Plain loops, no generators: this runs for every proposal of every SIRA query.
    for t in tokens:  # the windows of one token come first
        if t not in qset and t not in df:
            df[t] = int(df_of(t))
    if max_n > 1 and len(tokens) > 1:
        new = [t not in qset for t in tokens]
        for n in range(2, max_n + 1):
            for i in range(len(tokens) - n + 1):
                if True in new[i:i + n]:
                    key = ngram_key(tokens[i:i + n])
                    if key not in df:
                        df[key] = int(df_of(key))
    if not df:
        return Verdict(False, "adds nothing: every word is already in the query", df)
    rarest, terms = 0, []
    for key, d in df.items():
        if d >= 1:
            terms.append(key)
            if rarest == 0 or d < rarest:
                rarest = d
    if not rarest:
        return Verdict(False, "not in the index (df 0)", df)
    ceiling = tau * n_docs
    if rarest > ceiling:
        return Verdict(False, f"too common: df {rarest} > tau*N = {ceiling:g}", df)
    return Verdict(True, f"kept: df {rarest} <= tau*N = {ceiling:g}", df, tuple(terms))
