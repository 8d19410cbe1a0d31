"""Passage splitting (pipelines/dense/passages.py): hand-built texts (tier 1) and properties (tier 5).

The splitter runs on token spans; these tests use the tokenizer-free counter
(``regex_token_spans``: words and punctuation marks) so that every expected cut can be
counted by hand. ``test_minilm_splitter_*`` checks the real embedder's tokenizer.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funnel.pipelines.dense.passages import (PassageSettings, Splitter, check_passages, line_span, passage_input,
                                       passage_key, read_passages, regex_token_spans, split_spans,
                                       write_passages)


def words(n: int, start: int = 0) -> str:
    return " ".join(f"w{i}" for i in range(start, start + n))


def split(text: str, budget: int, overlap: float = 0.15) -> list[tuple[int, int]]:
    return split_spans(text, regex_token_spans(text), budget, overlap)


def tokens_in(text: str, a: int, b: int) -> int:
    return len(regex_token_spans(text[a:b]))


# -- tier 1: hand-built texts -------------------------------------------------------------


def test_a_text_that_fits_is_one_passage_of_all_of_it():
    text = words(10) + "\n"
    assert split(text, 10) == [(0, len(text))]
    assert split("", 5) == [(0, 0)]
    assert split("   ", 5) == [(0, 3)]


def test_windows_are_balanced_and_never_over_budget():
    text = words(30)  # 30 tokens, budget 20, no overlap: two windows of 15, not 20 + 10
    got = split(text, 20, overlap=0.0)
    assert len(got) == 2
    assert [tokens_in(text, a, b) for a, b in got] == [15, 15]
    assert got[0][0] == 0 and got[-1][1] == len(text) and got[1][0] == got[0][1]


def test_the_cut_goes_to_a_paragraph_break_near_the_window_end():
    # 17 words, a blank line, 13 words: budget 20 would cut after word 15 (balanced); the
    # paragraph end two tokens later is within reach and wins.
    first, second = words(17), words(13, start=17)
    text = f"{first}\n\n{second}"
    got = split(text, 20, overlap=0.0)
    assert got[0] == (0, len(first) + 2)
    assert text[got[1][0]:].startswith("w17")


def test_a_heading_is_a_boundary_and_a_sentence_end_beats_a_space():
    head = words(16) + "\n# Methods\n" + words(14, start=100)
    got = split(head, 20, overlap=0.0)
    assert head[got[1][0]:].startswith("# Methods")
    sent = words(13) + ". " + words(16, start=50)  # "." is a token: the sentence ends at token 14
    got = split(sent, 20, overlap=0.0)
    assert sent[:got[0][1]].rstrip().endswith("w12.")


def test_overlap_repeats_about_fifteen_percent_and_prefers_a_sentence_start():
    text = words(40)
    got = split(text, 20)  # overlap round(0.15 * 20) = 3 tokens
    assert len(got) == 3
    for (a0, b0), (a1, b1) in zip(got, got[1:]):
        assert a1 < b0
        assert tokens_in(text, a1, b0) == 3
    # A sentence start one token further from the target than the exact overlap is taken.
    text = words(17) + ". " + words(25, start=50)
    got = split(text, 24)  # overlap 4; first cut at 21 tokens, target start token 17
    assert text[got[1][0]:].startswith("w50")


def test_passages_start_and_end_at_words_where_one_is_in_reach():
    """Tokens inside a word ('ab-cd-ef' is five) are never a passage's first or last when a
    word boundary is near: a citation does not begin halfway through a word."""
    text = " ".join(["ab-cd-ef"] * 60)
    got = split(text, 40)
    assert len(got) > 5
    for a, b in got:
        assert a == 0 or text[a - 1] == " "
        assert b == len(text) or text[b - 1] == " "


def test_a_word_too_long_for_no_break_is_cut_inside_and_nothing_is_lost():
    text = "x" * 10 + " " + "-" * 30  # 30 punctuation tokens without a space between them
    got = split(text, 8, overlap=0.0)
    assert got[0][0] == 0 and got[-1][1] == len(text)
    assert all(tokens_in(text, a, b) <= 8 for a, b in got)


def test_bad_arguments_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="budget must be >= 1"):
        split("a b", 0)
    with pytest.raises(ValueError, match=r"overlap must be in \[0, 0.5\)"):
        split("a b", 4, overlap=0.5)
    with pytest.raises(ValueError, match="overlap"):
        PassageSettings(overlap=-0.1)
    with pytest.raises(ValueError, match="window must be >= 16"):
        PassageSettings(window=4)
    with pytest.raises(ValueError, match="--passage-tokens"):
        Splitter(regex_token_spans, lambda t: len(regex_token_spans(t)), window=8, specials=2, prompt="a b c")


def test_splitter_budget_takes_out_specials_prompt_and_title():
    count = lambda t: len(regex_token_spans(t))  # noqa: E731
    sp = Splitter(regex_token_spans, count, window=40, specials=2, prompt="query one:")
    assert sp.budget(None) == 40 - 2 - 3
    assert sp.budget("A title of five") == 40 - 2 - 3 - 4
    assert sp.budget(words(100)) == (40 - 2 - 3) // 2  # a title never takes more than half
    text = words(70)
    got = sp("t", text)
    assert all(tokens_in(text, a, b) <= 34 for a, b in got) and len(got) == 3


def test_a_document_of_a_few_windows_is_embedded_whole_by_default():
    """``split_above`` (4 windows by default) keeps collections of abstracts as they ranked
    before passages; 1 splits everything the embedder would truncate."""
    count = lambda t: len(regex_token_spans(t))  # noqa: E731
    text = words(70)  # two windows of 35
    assert split(text, 35) != [(0, len(text))]
    assert split_spans(text, regex_token_spans(text), 35, whole=140) == [(0, len(text))]
    spec = {"tokenizer": "regex", "window": 37, "specials": 2, "prompt": "", "overlap": 0.15}
    from funnel.pipelines.dense.passages import splitter_from_spec
    assert splitter_from_spec(spec)("", text) == [(0, len(text))]  # the default: 4 windows
    assert len(splitter_from_spec({**spec, "split_above": 1.0})("", text)) == 3
    assert len(splitter_from_spec(spec)("", words(141))) == 5  # past 4 windows: split
    with pytest.raises(ValueError, match="split_above must be >= 1 window"):
        PassageSettings(split_above=0.5)
    assert Splitter(regex_token_spans, count, window=37, specials=2, split_above=2.0)("", text) == [(0, len(text))]


def test_passage_key_of_the_whole_text_is_the_document_hash():
    assert passage_key("H" * 32, "t", "abc def", 0, 7) == "H" * 32
    k1 = passage_key("H" * 32, "t", "abc def", 0, 3)
    assert len(k1) == 32 and k1 != "H" * 32
    assert passage_key("other", "t", "zz abc def", 3, 6) == k1  # content, not position or document
    assert passage_key("other", "u", "zz abc def", 3, 6) != k1  # the title is embedded too
    assert passage_input("T", "body") == "T\nbody" and passage_input(None, "body") == "body"


def test_line_span_counts_lines_from_offsets():
    text = "one\ntwo\nthree\n\nfive\n"
    assert line_span(text, 0, 3) == (1, 1)
    assert line_span(text, 0, 4) == (1, 1)  # the newline ending line 1 is not line 2
    assert line_span(text, 4, 13) == (2, 3)
    assert line_span(text, text.index("five"), len(text)) == (5, 5)
    assert line_span(text, 0, len(text)) == (1, 5)


def test_passages_parquet_round_trip_and_order_check(tmp_path):
    path = str(tmp_path / "passages" / "shard-0000.parquet")
    assert write_passages(path, [0, 0, 2], [0, 1, 0], [0, 10, 0], [12, 30, 5]) == 3
    got = read_passages(path)
    assert got["local_id"].tolist() == [0, 0, 2] and got["char_end"].tolist() == [12, 30, 5]
    check_passages(got["local_id"], got["ordinal"])
    with pytest.raises(ValueError, match="local id 0: its passages arrived twice"):
        check_passages([0, 0, 0], [0, 1, 1])
    with pytest.raises(ValueError, match="not sorted"):
        check_passages([1, 0], [0, 0])


def test_minilm_splitter_fits_the_model_window():
    """The default embedder's own tokenizer: every passage plus its title fits 256 pieces."""
    from funnel.pipelines.dense.embed import SentenceTransformerProvider
    from funnel.pipelines.dense.passages import make_splitter
    provider = SentenceTransformerProvider(device="cpu")
    sp = make_splitter(provider, PassageSettings())
    assert sp.window == 256 and sp.specials == 2
    title = "Long document"
    text = "\n\n".join(f"Section {i}. " + " ".join(f"token{j}ization is measured here." for j in range(40))
                      for i in range(12))
    got = sp(title, text)
    assert len(got) > 5 and got[0][0] == 0 and got[-1][1] == len(text)
    tok = provider.model.tokenizer
    for a, b in got:
        assert len(tok(passage_input(title, text[a:b]))["input_ids"]) <= 256
    short = "A short abstract. It fits."
    assert sp(title, short) == [(0, len(short))]


# -- tier 5: properties -------------------------------------------------------------------

_piece = st.sampled_from(["alpha", "beta", "gamma.", "delta,", "x", "Ω", "42", "(e)", "end!", "\n", "\n\n",
                          "# Head", " ", "  ", "—", "word-piece"])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_piece, min_size=0, max_size=400), budget=st.integers(1, 60),
       overlap=st.sampled_from([0.0, 0.1, 0.15, 0.3, 0.45]))
def test_passages_cover_the_text_with_bounded_overlap(parts, budget, overlap):
    text = " ".join(parts)
    spans = regex_token_spans(text)
    got = split_spans(text, spans, budget, overlap)
    assert got[0][0] == 0 and got[-1][1] == len(text)
    starts = [a for a, _ in got]
    assert starts == sorted(set(starts))  # strictly increasing: progress every step
    ov = min(int(round(overlap * budget)), budget - 1)
    for (a0, b0), (a1, b1) in zip(got, got[1:]):
        assert 0 <= a0 < b0 <= len(text) and a1 <= b0  # no gap between passages
        shared = int(((spans[:, 0] >= a1) & (spans[:, 1] <= b0)).sum())
        assert shared <= ov + ov // 2  # overlap bounded
    for a, b in got:
        inside = int(((spans[:, 0] >= a) & (spans[:, 1] <= b)).sum())
        assert inside <= budget  # never more than the window
    if len(spans) <= budget:
        assert got == [(0, len(text))]


@settings(max_examples=300)
@given(st.lists(st.sampled_from(["word", "x", " ", "\n", ".", ",", "(", "é", "\u00a0", "İ", "_", "42"]),
                max_size=300).map("".join),
       st.sampled_from([16, 24, 40, 256]))
def test_default_spans_of_a_short_text_skip_the_token_split_and_agree_with_it(text, window):
    """``citations.default_spans`` answers a text whose whitespace pieces plus twice its
    punctuation marks fit the window as one passage without listing its tokens; that must be
    what the full split (``split_spans`` over ``regex_token_spans``) gives, on either side
    of the bound."""
    from funnel.pipelines.dense.passages import DEFAULT_OVERLAP, regex_token_spans, split_spans
    from funnel.serving.answers.citations import default_spans
    want = split_spans(text, regex_token_spans(text), window, DEFAULT_OVERLAP)
    assert default_spans(text, window).tolist() == [list(s) for s in want]
