"""The text an agent reads: the hits' best passages quoted, where they are, within a token budget.

Real indexes built in this process (local engine): a small corpus with long documents, a
PDF-like text (form-feed page breaks), a huge passage without spaces and a huge title; and
the shared access-control corpus (fields, ACLs, dense vectors). Budgets are counted with
``context.approx_tokens``, the counter the summary fits with.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fields_corpus import FINANCE, TEAM, acl_dense_index
from funnel.jobs.build_index import build
from funnel.serving.answers.context import approx_tokens
from funnel.serving.errors import SearchError
from funnel.serving.answers.passage_rank import DocPassages, PassageRanking, fuse
from funnel.serving.principals import principal
from funnel.serving.result import Citation, Hit
from funnel.serving.search import open_index
from funnel.serving.answers.summary import DEFAULT_BUDGET, evidence_summary

ALICE = principal("alice", ["eng"])
BOB = principal("bob", ["sales"])
READS = {"alice": {"public", "alice", "eng"}, "bob": {"public"}}
BUDGETS = (100, 137, 250, 600, 1000, 2500)


def _paragraphs(topic: str, n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    filler = ("system data value process model result method table level point order group rate time "
              "number field state change part form line case area step").split()
    return [f"Section {i} on {topic}. " + " ".join(rng.choice(filler, 40)) + "." for i in range(n)]


@pytest.fixture(scope="module")
def long_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("evidence")
    paras = _paragraphs("storage", 60, 1)
    paras[37] = ("The connection pool holds twelve sockets by default; set pool_size to change how many "
                 "sockets the pool keeps open.")
    garden = _paragraphs("gardens", 3, 3)
    pdf_pages = [f"Page one talks about gardens and their soil. {garden[0]}",
                 f"{garden[1]} Page two: the quarterly harvest yield of tomatoes was nine tonnes.",
                 f"Page three closes with irrigation notes. {garden[2]}"]
    rows = [
        {"_id": "long-a", "title": "Storage manual", "text": "\n\n".join(paras)},
        {"_id": "long-b", "title": "Network manual", "text": "\n\n".join(_paragraphs("network", 40, 2))},
        {"_id": "pdf-1", "title": "Harvest report", "text": "\n\f\n".join(pdf_pages)},
        {"_id": "blob", "title": "x" * 5000, "text": "pool " + "Z" * 120_000 + " sockets pool size"},
        {"_id": "short", "title": "Pool notes", "text": "A pool of sockets. Size it well."},
    ]
    corpus = d / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    build(str(corpus), str(d / "ix"), engine="local")
    return {r["_id"]: r for r in rows}, open_index(str(d / "ix"), kernels=False)


def _quoted(summary: str) -> str:
    return "\n".join(line[len("   > "):] for line in summary.splitlines() if line.startswith("   > "))


def test_the_summary_quotes_the_answering_passage_and_says_where_it_is(long_index):
    rows, ix = long_index
    res = ix.search("how many sockets does the connection pool keep", k=5)
    assert res.mode == "bm25"  # no vectors: the default is bm25
    top = res.hits[0]
    assert top.doc_id == "long-a" and "twelve sockets" in top.passage.text
    assert "twelve sockets by default" in _quoted(res.summary)  # the answer is in the text itself
    text = rows["long-a"]["text"]
    head = next(line for line in res.summary.splitlines() if line.startswith("1. [long-a] Storage manual"))
    first, last = text.count("\n", 0, top.passage.start) + 1, None
    assert f"lines {first}-" in head and f"start={top.passage.start}, end={top.passage.end}]" in head
    for m in re.finditer(r"start=(\d+), end=(\d+)", res.summary):  # every range is a range of its document
        a, b = int(m.group(1)), int(m.group(2))
        assert 0 <= a < b <= max(len(r["text"]) for r in rows.values())
    assert res.summary.splitlines()[-1].startswith(f'More: get_document("long-a", start={top.passage.start}, '
                                                   f"end={top.passage.end})")
    assert ix.get_document("long-a", top.passage.start, top.passage.end)["text"] == top.passage.text


def test_a_pdf_page_is_named_where_the_text_has_page_breaks(long_index):
    _, ix = long_index
    res = ix.search("quarterly harvest yield of tomatoes", k=1)
    assert res.hits[0].doc_id == "pdf-1"
    assert "nine tonnes" in _quoted(res.summary)
    quote = next(line for line in res.summary.splitlines() if line.startswith("   line") and "page" in line)
    assert re.search(r"\bpages? 2\b", quote), quote  # the answer is on page 2


def test_a_range_ending_on_a_page_break_stays_on_its_page():
    """The text's pages are the citation's (documents.page_span): a range whose last
    characters are a page break and white space ends on the page before the break."""
    from funnel.serving.documents import page_span
    from funnel.serving.answers.summary import where
    text = "alpha beta.\n\f\ngamma delta.\n\f\nepsilon"
    a, b = 0, text.index("gamma")  # page 1's text, the form feed and nothing of page 2
    assert where(text, a, b).split(", ")[1] == "page 1" and page_span({}, text, a, b) is None
    assert page_span({"format": "pdf"}, text, a, b) == (1, 1)
    c = text.index("delta") + 6
    assert ", pages 1-2," in where(text, a, c) and page_span({"format": "pdf"}, text, a, c) == (1, 2)


def test_passages_per_hit_and_the_packed_context_take_several_passages_of_a_document(long_index):
    rows, ix = long_index
    res = ix.search("connection pool sockets storage section", k=2, passages_per_hit=3, context_tokens=600)
    top = res.hits[0]
    assert top.passage == top.passages[0] and 1 < len(top.passages) <= 3
    assert len({(c.start, c.end) for c in top.passages}) == len(top.passages)
    text = rows[top.doc_id]["text"]
    assert all(c.text == text[c.start:c.end] for c in top.passages)
    ctx = res.trace["context"]
    assert sum(approx_tokens(c["text"]) for c in ctx) <= 600
    # Not one passage per document: more of the top document than its best passage (its
    # overlapping passages merged into one span, or apart).
    covered = sum(c["end"] - c["start"] for c in ctx if c["doc_id"] == top.doc_id)
    assert covered > max(c.end - c.start for c in top.passages)


@pytest.mark.parametrize("mode", ["bm25", "sira"])
def test_the_summary_never_exceeds_its_budget_on_real_searches(long_index, mode):
    _, ix = long_index
    for query in ("pool sockets size", "storage section system data value", "harvest tomatoes", "Z" * 30):
        for budget in BUDGETS:
            res = ix.search(query, mode=mode, k=10, budget=budget)
            assert approx_tokens(res.summary) <= budget, (query, budget)
            assert res.trace["summary"]["tokens"] <= budget
    res = ix.search("pool sockets size", k=10, budget=DEFAULT_BUDGET)
    assert "ZZZZ" not in res.summary or approx_tokens(res.summary) <= DEFAULT_BUDGET


def test_budget_and_passages_per_hit_are_checked(long_index):
    _, ix = long_index
    for bad in (99, 32_001, "500", True, 1.5):
        with pytest.raises(SearchError, match="budget is the most tokens of the summary"):
            ix.search("pool", budget=bad)
    for bad in (0, 11, "2"):
        with pytest.raises(SearchError, match="passages_per_hit must be a whole number in 1..10"):
            ix.search("pool", passages_per_hit=bad)


# -- the budget as a property, over synthetic hits ------------------------------------------

_words = st.one_of(st.sampled_from(["pool", "size", "sockets.", "default", "Set", "it!", "\n", "\n\n", "a"]),
                   st.text(alphabet="xyzé", min_size=1, max_size=40),
                   st.text(alphabet="Q", min_size=500, max_size=20_000))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(_words, min_size=1, max_size=80), st.text(max_size=300),
                          st.text(alphabet="abc/-_. ", min_size=1, max_size=300)),
                min_size=1, max_size=12),
       st.integers(100, 3000), st.text(max_size=500))
def test_the_summary_never_exceeds_its_budget(docs, budget, query):
    hits, texts, passages = [], {}, []
    for i, (words, title, doc_id) in enumerate(docs):
        text = " ".join(words)
        n = len(text)
        cuts = sorted({0, n, *range(0, n, max(1, n // 3))})
        spans = np.asarray([[a, min(n, b + 10)] for a, b in zip(cuts, cuts[1:])] or [[0, n]], dtype=np.int64)
        cite = Citation(text[spans[0][0]:spans[0][1]], int(spans[0][0]), int(spans[0][1]), 1, 1, 0, 1.0, "terms")
        hits.append(Hit(doc_id=doc_id, rank=i + 1, score=1.0, title=title, docno=i, passage=cite, passages=(cite,)))
        texts[i] = text
        lexical = np.linspace(3.0, 0.0, len(spans))
        passages.append(DocPassages(i, i + 1, text, spans, None, lexical))
    fuse(passages, "convex", 0.55, 60)
    ranking = PassageRanking(passages, ("terms",), "convex", {"pool": 2.0, "size": 1.0, "default": 1.5},
                             lambda w: [w.lower().rstrip(".!")])
    text = evidence_summary(query or "q", "bm25", hits, texts, ranking, budget)
    assert approx_tokens(text) <= budget


def test_the_same_text_under_two_ids_is_quoted_once():
    """A document stored twice (another id, other spacing and case) is listed as a hit but its
    text is not quoted twice; a different text that starts with the same word still is."""
    texts = {0: "Pool size sets the connections held. It defaults to ten.",
             1: "pool  SIZE sets the\nconnections held.   It defaults to TEN.",
             2: "Pool workers are started lazily, one per core."}
    hits, passages = [], []
    for i, text in texts.items():
        n = len(text)
        cite = Citation(text, 0, n, 1, text.count("\n") + 1, 0, 1.0, "terms")
        hits.append(Hit(doc_id=f"d{i}", rank=i + 1, score=1.0, title=f"t{i}", docno=i, passage=cite, passages=(cite,)))
        passages.append(DocPassages(i, i + 1, text, np.asarray([[0, n]], dtype=np.int64), None, np.asarray([1.0])))
    fuse(passages, "convex", 0.55, 60)
    ranking = PassageRanking(passages, ("terms",), "convex", {"pool": 2.0, "size": 1.0},
                             lambda w: [w.lower().rstrip(".!")])
    text = evidence_summary("pool size", "bm25", hits, texts, ranking, 1000)
    quoted = [line for line in text.splitlines() if line.startswith("   > ")]
    assert sum("connections held" in line for line in quoted) == 1
    assert sum("workers are started lazily" in line for line in quoted) == 1
    assert "[d0]" in text and "[d1]" in text and "[d2]" in text


# -- filters and access ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl(tmp_path_factory):
    corpus, root = acl_dense_index(tmp_path_factory)
    rows = {r["_id"]: r for r in map(json.loads, open(corpus))}
    return rows, open_index(root)


def _readable(row: dict, who: str) -> bool:
    return (row.get("acl") or ["public"])[0] in READS[who]


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid", "sira"])
def test_the_summary_never_shows_a_document_outside_the_callers_acl_or_filter(acl, mode):
    rows, ix = acl
    hidden_words = {"alice": set(FINANCE), "bob": set(FINANCE) | set(TEAM)}
    for who, p in (("alice", ALICE), ("bob", BOB)):
        hidden = [r for r in rows.values() if not _readable(r, who)]
        for query in ("vexillar river apple", "zephyrine stone lemon caldrune", "market signal"):
            for flt in (None, {"cat": "memo"}):
                res = ix.search(query, mode=mode, k=8, filter=flt, principal=p, budget=2000)
                ids = set(re.findall(r"\[((?:pub|hid)-\d{5})\]", res.summary))
                assert ids and all(_readable(rows[i], who) for i in ids), (who, query, ids)
                if flt:
                    assert all(rows[i].get("cat") == "memo" for i in ids)
                quoted = _quoted(res.summary)
                assert quoted and not any(r["text"] in res.summary for r in hidden)
                for w in hidden_words[who] - set(query.split()):
                    assert not re.search(rf"\b{w}\b", res.summary), (who, query, w)


def test_the_default_mode_is_hybrid_where_the_index_has_vectors(acl, long_index):
    _, ix = acl
    assert ix.default_mode() == "hybrid" and ix.search("river market", k=3).mode == "hybrid"
    assert long_index[1].default_mode() == "bm25"


def test_a_filter_that_matches_nothing_says_so_in_counts_the_caller_may_see(acl):
    rows, ix = acl
    res = ix.search("river market", filter={"cat": "no-such-category"})
    assert res.hits == ()
    assert f"The filter matched no documents: none of the {len(rows):,} documents passes it." in res.summary
    assert "None of the query's terms occur" not in res.summary
    bob_sees = sum(_readable(r, "bob") for r in rows.values())
    res = ix.search("river market", filter={"cat": "no-such-category"}, principal=BOB)
    assert f"none of the {bob_sees:,} documents you may read passes it" in res.summary
    assert f"{len(rows):,}" not in res.summary  # the whole collection's size is not the caller's to know
    # A filter that allows some documents, none of which holds the query's words:
    memo = [r for r in rows.values() if r.get("cat") == "memo" and _readable(r, "bob")]
    res = ix.search("zephyrine", mode="bm25", filter={"cat": "memo"}, principal=BOB)
    assert res.hits == () and f"None of the {len(memo):,} documents the filter allows (of {bob_sees:,} you may " \
                               "read) matches the query" in res.summary


_vocab = ["Running", "runner's", "RUNS", "eyes", "Connection", "connected", "pool_size", "p53", "TP53", "简体中文",
          "über", "İstanbul", "x", "a", "hypoxia-inducible", "1α", "ﬁle", "C++", "e.g.", "\n", "\n\n", ".", ","]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(_vocab), max_size=60), st.lists(st.sampled_from(_vocab), min_size=1, max_size=4))
def test_term_positions_find_every_word_that_analyzes_to_a_query_term(words, query):
    """Only words holding a term's first letters are analyzed: the same positions as analyzing
    every word (the Lucene analyzer's own output is the oracle)."""
    from funnel.pipelines.lexical.analysis import Analyzer
    from funnel.serving.answers.passage_rank import term_positions
    analyze = Analyzer().analyze
    text = " ".join(words)
    terms = {t: 1.0 for w in query for t in analyze(w)}
    names = sorted(terms)
    want = [(m.start(), names.index(t)) for m in re.finditer(r"\w+", text)
            for t in dict.fromkeys(analyze(m.group())) if t in terms]
    starts, cols, got_names = term_positions(text, terms, analyze)
    assert got_names == names and list(zip(starts.tolist(), cols.tolist())) == want


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ab .!?\n\t\f\"')]") + [" \n\n ", "e.g. ", "3.14", "\u00a0", "\u2003"]),
                max_size=80).map("".join), st.data())
def test_units_are_the_sentences_and_lines_the_plain_patterns_find(text, data):
    """A quote's units (`passage_rank.units`) are found with one character-class-led pattern
    and trimmed without copies: the same (start, end, paragraph) as cutting at every match of
    the plain sentence-end and line-break patterns and stripping each piece."""
    from funnel.serving.answers.passage_rank import units
    a = data.draw(st.integers(0, len(text)))
    b = data.draw(st.integers(a, len(text)))
    piece = text[a:b]
    cuts = {a, b} | {a + m.end() for m in re.finditer(r"[.!?][\"')\]]*(?=\s)", piece)} \
        | {a + m.start() for m in re.finditer(r"\n", piece)}
    breaks = [a + m.start() for m in re.finditer(r"\n[ \t\f]*\n", piece)]
    edges = sorted(cuts)
    want = []
    for x, y in zip(edges, edges[1:]):
        seg = text[x:y]
        lo, hi = x + len(seg) - len(seg.lstrip()), y - (len(seg) - len(seg.rstrip()))
        if hi > lo:
            want.append((lo, hi, sum(1 for p in breaks if p <= lo)))
    assert units(text, a, b) == want
