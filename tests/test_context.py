"""Context optimizer: the budget is never exceeded, U-shaped order, merging of
overlapping/adjacent chunks, duplicate removal, truncation at a sentence boundary."""

from __future__ import annotations

import pytest
from funnel.serving.answers.context import (
    Passage,
    approx_tokens,
    merge_passages,
    pack_context,
    pack_ranked,
    truncate_to_budget,
    u_shape,
)
from hypothesis import given, settings
from hypothesis import strategies as st

DOC = ("Vitamin D regulates calcium. It is made in the skin. Deficiency weakens bones. "
       "Supplements help older adults. Sunlight exposure varies by season.")


def span(doc_id, text, start, end, score):
    return Passage(doc_id, start, end, text[start:end], score)


def test_approx_tokens_is_four_thirds_of_the_words_rounded_up():
    assert approx_tokens("") == 0
    assert approx_tokens("one two three") == 4
    assert approx_tokens("a b c d e f") == 8


def test_merge_overlapping_and_adjacent_chunks_of_one_document():
    a = span("d", DOC, 0, 40, 0.5)
    b = span("d", DOC, 30, 78, 0.9)   # overlaps a
    c = span("d", DOC, 79, 110, 0.2)  # one character (a space) after b
    far = span("d", DOC, 125, 140, 0.1)
    other = span("e", DOC, 0, 40, 0.3)
    merged = {(p.doc_id, p.start): p for p in merge_passages([c, far, a, other, b])}
    m = merged[("d", 0)]
    assert (m.end, m.score) == (110, 0.9)
    assert m.text == DOC[0:110]
    assert merged[("d", 125)].text == DOC[125:140]
    assert merged[("e", 0)].text == DOC[0:40]
    assert len(merged) == 3


def test_contained_chunk_is_absorbed():
    [m] = merge_passages([span("d", DOC, 0, 80, 0.4), span("d", DOC, 10, 20, 0.8)])
    assert (m.start, m.end, m.score, m.text) == (0, 80, 0.8, DOC[:80])


def test_u_shape_order():
    ps = [Passage(f"d{i}", 0, 1, "x", s) for i, s in enumerate([0.1, 0.9, 0.5, 0.7, 0.3])]
    assert [p.score for p in u_shape(ps)] == [0.9, 0.5, 0.3, 0.1, 0.7]
    assert [p.score for p in u_shape(ps[:2])] == [0.9, 0.1]


def test_pack_context_dedups_prunes_truncates_and_orders():
    texts = {f"d{i}": " ".join(f"w{i}x{j}." for j in range(30)) for i in range(4)}
    ps = [Passage(d, 0, len(t), t, s) for (d, t), s in zip(texts.items(), [0.9, 0.8, 0.7, 0.6])]
    dup = Passage("copy", 0, len(texts["d1"]), texts["d1"].upper(), 0.5)
    budget = 3 * approx_tokens(texts["d0"]) - 10
    out = pack_context(ps + [dup], budget)
    assert sum(approx_tokens(p.text) for p in out) <= budget
    assert "copy" not in {p.doc_id for p in out}
    assert [p.doc_id for p in out] == ["d0", "d2", "d1"]  # U-shape: best, rest, second
    cut = out[1]
    assert texts["d2"].startswith(cut.text) and cut.text.endswith(".")
    assert cut.end == cut.start + len(cut.text) < len(texts["d2"])


def test_truncate_prefers_a_sentence_end():
    text = "First sentence is here. Second one runs on and on and on"
    assert truncate_to_budget(text, 10, approx_tokens) == "First sentence is here."
    assert truncate_to_budget("no sentence end in this text", 4, approx_tokens) == "no sentence end"
    assert truncate_to_budget("word", 0, approx_tokens) == ""


def test_passage_validates_its_span():
    with pytest.raises(ValueError, match="document\\[start:end\\]"):
        Passage("d", 0, 5, "abc", 1.0)
    with pytest.raises(ValueError, match="start <= end"):
        Passage("d", 5, 2, "", 1.0)
    with pytest.raises(ValueError, match="budget_tokens"):
        pack_context([], -1)


words = st.lists(st.sampled_from(["alpha", "beta.", "gamma", "delta!", "eps", "zeta?"]),
                 min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), words,
                          st.floats(0, 1, allow_nan=False)), max_size=8),
       st.integers(0, 200))
def test_budget_is_never_exceeded(raw, budget):
    ps = []
    for i, (doc, ws, score) in enumerate(raw):
        text = " ".join(ws)
        start = i * 1000  # distinct, non-overlapping spans
        ps.append(Passage(doc, start, start + len(text), text, score))
    out = pack_context(ps, budget)
    assert sum(approx_tokens(p.text) for p in out) <= budget
    if len(out) >= 2:
        ranked = sorted(out, key=lambda p: -p.score)
        assert out[0].score == ranked[0].score and out[-1].score == ranked[1].score
        middle = [p.score for p in out[1:-1]]
        assert middle == sorted(middle, reverse=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), words, st.floats(0, 1, allow_nan=False)), min_size=1, max_size=10),
       st.integers(0, 300))
def test_pack_ranked_keeps_the_best_passage_whole_and_the_budget(raw, budget):
    """Overlapping passages of one document in priority order: the first is never lost behind
    the neighbours it merges with, and the packed text stays within the budget."""
    doc = " ".join(f"w{i}." for i in range(700))
    ps = []
    for start, ws, score in raw:
        end = min(len(doc), start + 10 * len(ws))
        ps.append(Passage("d", start, end, doc[start:end], score))
    out = pack_ranked(ps, budget)
    assert sum(approx_tokens(p.text) for p in out) <= budget
    first = ps[0]
    if approx_tokens(first.text) <= budget:
        assert any(p.start <= first.start and first.end <= p.end for p in out)


def _pack_ranked_by_remerging(passages, budget):
    """What pack_ranked computes, by re-merging a document's whole selection for every
    passage (the quadratic way it was written first): the reference for the incremental one."""
    from dataclasses import replace
    chosen = []

    def cost(sel):
        return sum(approx_tokens(p.text) for p in merge_passages(sel))

    for p in passages:
        if cost(chosen + [p]) <= budget:
            chosen.append(p)
            continue
        left = budget - cost(chosen)
        if left >= 8:
            text = truncate_to_budget(p.text, left, approx_tokens).rstrip()
            if text and approx_tokens(text) >= 8:
                cut = replace(p, end=p.start + len(text), text=text)
                if cost(chosen + [cut]) <= budget:
                    chosen.append(cut)
        break
    return pack_context(chosen, budget)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 600), st.integers(1, 120),
                          st.floats(0, 1, allow_nan=False)), min_size=1, max_size=25),
       st.integers(0, 400))
def test_pack_ranked_merges_incrementally_as_a_whole_re_merge_would(raw, budget):
    """Passages of three documents, overlapping, touching (MERGE_GAP apart) or apart, in
    priority order: the incremental merge packs exactly what re-merging the selection does."""
    doc = " ".join(f"w{i}." for i in range(200))
    ps = [Passage(d, a, min(len(doc), a + n), doc[a:min(len(doc), a + n)], score) for d, a, n, score in raw]
    assert pack_ranked(ps, budget) == _pack_ranked_by_remerging(ps, budget)


@settings(max_examples=300)
@given(st.lists(st.sampled_from(list("ab .!\n\t") + ["xyzzy" * 9, "İ", "\u00a0", "\u2003"]),
                max_size=200).map("".join),
       st.integers(min_value=0, max_value=60), st.sampled_from([0.0, 0.5, 1.1]))
def test_truncating_with_the_default_counter_cuts_as_counting_each_prefix_would(text, budget, fraction):
    """``truncate_to_budget`` counts ``approx_tokens`` from word ends alone and scans at most
    ``budget * CHARS_PER_TOKEN`` characters; it must cut where counting every prefix with the
    same counter (any other callable takes that path) cuts, including a first word longer
    than the scan and Unicode spaces."""
    slow = truncate_to_budget(text, budget, lambda t: approx_tokens(t), min_sentence_fraction=fraction)
    assert truncate_to_budget(text, budget, approx_tokens, min_sentence_fraction=fraction) == slow
