"""``PostingsBuilder.add_text`` (what the build inverts documents with: word -> term ids once,
a pending id stream turned into postings by NumPy, a counting sort at ``finish``) against
``add(analyzer.analyze(text))`` (the token lists it replaces): the same terms, df, cf, CSR
arrays and document lengths, with texts that take the whole-text analysis, empty and
stopword-only documents, stream flushes in the middle, the two methods mixed, and the
sort without numba."""

from __future__ import annotations

import numpy as np
import pytest

from funnel.pipelines import postings
from funnel.pipelines.analysis import Analyzer
from funnel.pipelines.postings import PostingsBuilder
from funnel.serving import kernels


def _texts(n=400, seed=3):
    rng = np.random.default_rng(seed)
    words = [f"w{i:03d}" for i in range(150)] + ["The", "of", "running", "runs", "Dr.", "U.S.A.", "x-ray", "it's",
                                                  "naïve", "café", "ÅNGSTRÖM", "3.14", "e-mail", "a"]
    out = []
    for i in range(n):
        k = int(rng.integers(0, 40))
        toks = rng.choice(words, size=k, p=None)
        seps = rng.choice([" ", "  ", "\n", "\t", ", ", "-", "/"], size=k)
        out.append("".join(t + s for t, s in zip(toks, seps)))
    # whole-text analysis (a combining mark next to whitespace), empty, stopwords only, one word
    out += ["e\u0301 te\u0301 \u0301x", "", "   ", "the of a and", "w001", "naïve café " * 5]
    return out


def _same(a, b):
    return (a.terms == b.terms and all(np.array_equal(getattr(a, f), getattr(b, f))
                                       for f in ("df", "cf", "indptr", "docs", "tfs", "doclen")))


def _reference(texts, analyzer):
    b = PostingsBuilder()
    for t in texts:
        b.add(analyzer.analyze(t))
    return b.finish()


@pytest.mark.parametrize("stream_tokens", [7, 1000, 1 << 22])
def test_add_text_equals_adding_the_analyzed_tokens(monkeypatch, stream_tokens):
    monkeypatch.setattr(PostingsBuilder, "STREAM_TOKENS", stream_tokens)
    texts = _texts()
    assert any(Analyzer().split_words(t) is None for t in texts)  # the whole-text path is taken
    want = _reference(texts, Analyzer())
    b = PostingsBuilder()
    a = Analyzer()
    for t in texts:
        b.add_text(t, a)
    assert _same(b.finish(), want)
    # the two methods mixed: documents keep their order and ids
    b, a = PostingsBuilder(), Analyzer()
    for i, t in enumerate(texts):
        if i % 3:
            b.add_text(t, a)
        else:
            b.add(a.analyze(t))
    assert _same(b.finish(), want)


def test_the_counting_sort_equals_lexsort(monkeypatch):
    """``finish`` places postings with ``kernels.place_values`` where numba is present, and
    with NumPy's lexsort otherwise: the same arrays."""
    texts = _texts(seed=9)
    got = _reference(texts, Analyzer())
    monkeypatch.setattr(kernels, "HAVE_NUMBA", False)
    assert _same(_reference(texts, Analyzer()), got)
    assert got.docs.dtype == np.int32 and got.tfs.dtype == np.uint16  # narrowed as tfs.npy stores them
    assert postings.build_postings([["a", "b", "a"], [], ["b"]]).docs.tolist() == [0, 0, 2]


def test_a_tf_above_uint16_keeps_int32_tfs(monkeypatch):
    """``finish`` narrows tfs to uint16 before its sort only where every tf fits: a document
    repeating a term 70,000 times keeps int32 tfs, with the same postings either way."""
    docs = [["a"] * 70_000 + ["b"], ["b", "c"], ["a", "c", "c"]]
    got = postings.build_postings(docs)
    assert got.tfs.dtype == np.int32 and got.tfs.tolist() == [70_000, 1, 1, 1, 1, 2]
    assert got.docs.tolist() == [0, 2, 0, 1, 1, 2] and got.cf.tolist() == [70_001, 2, 3]
    monkeypatch.setattr(kernels, "HAVE_NUMBA", False)
    assert _same(postings.build_postings(docs), got)
