"""``porter_kernel.stem_ascii`` (the build's compiled Porter stemmer) against ``porter_stem``
(the reference, which Lucene's term vectors check in ``test_analysis_lucene.py``): equal on
generated words made to reach every rule of every step, with and without numba."""

from __future__ import annotations

import random
import string

import pytest

from funnel.pipelines import porter_kernel
from funnel.pipelines.porter import _Word, porter_stem


def _suffixes() -> list[str]:
    out = {"s", "ss", "sses", "ies", "eed", "ed", "ing", "at", "bl", "iz", "y", "e", "l", "ll", "le", "ion",
           "sion", "tion", "ly", "ingly", "edly", "ement", "ousli"}
    for table in (_Word._STEP3, _Word._STEP4, _Word._STEP5):
        for rules in table.values():
            out.update(r if isinstance(r, str) else r[0] for r in rules)
    return sorted(out)


def _words(n: int, seed: int) -> list[str]:
    """Stems of 0-7 letters weighted towards vowels and y (the measure and the y rule are
    where stemmers go wrong), then 0-3 suffixes, sometimes a digit."""
    rng = random.Random(seed)
    sufs, alphabet = _suffixes(), "aeiouyybcdlmnrstwxzy"
    words = {"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
             + "".join(rng.choice(sufs) for _ in range(rng.randint(0, 3)))
             + (rng.choice(string.digits) if rng.random() < 0.1 else "") for _ in range(n)}
    words.update(["", "a", "ab", "abc", "yyyy", "ies", "sses", "eed", "ed", "ing", "technology", "possibly",
                  "generalizations", "relational", "happiness", "running", "hopping", "filing", "agreed", "cry"])
    return sorted(words)


def test_the_compiled_stemmer_equals_the_reference_on_every_rule():
    words = _words(150_000, seed=0)
    want = [porter_stem(w) for w in words]
    assert porter_kernel.stem_ascii(words) == want
    # every rule of the three tables fired somewhere (the test reaches what it claims to)
    for table in (_Word._STEP3, _Word._STEP4, _Word._STEP5):
        for rules in table.values():
            for r in rules:
                suffix = r if isinstance(r, str) else r[0]
                assert any(w.endswith(suffix) and s != w for w, s in zip(words, want)), suffix


def test_without_numba_the_reference_stems(monkeypatch):
    words = _words(2_000, seed=1)
    monkeypatch.setattr(porter_kernel, "HAVE_NUMBA", False)
    assert porter_kernel.stem_ascii(words) == [porter_stem(w) for w in words]
    assert porter_kernel.stem_ascii([]) == []


@pytest.mark.parametrize("word, stem", [("technology", "technolog"), ("possibly", "possibl"),
                                        ("analogy", "analog"), ("as", "as"), ("ies", "i"), ("agreed", "agre")])
def test_lucenes_departures_from_the_paper(word, stem):
    assert porter_kernel.stem_ascii([word]) == [stem] == [porter_stem(word)]
