"""Analyzer parity on 100% of two corpora: our term counts equal the term vectors that real
Lucene 9.9.1 indexed for every SciFact and NFCorpus document (../shared/data/reference/lucene)."""

import gzip
import json
from collections import Counter

import pytest

from funnel.pipelines.lexical.analysis import Analyzer

from conftest import need_shared


@pytest.mark.parametrize("ds", ["scifact", "nfcorpus"])
def test_term_vectors_equal_lucene(ds):
    tv = need_shared("reference", "lucene", f"{ds}.lucene-termvectors.tsv.gz")
    corpus = need_shared("beir", ds, "corpus.jsonl")
    ref = {}
    with gzip.open(tv, "rt") as f:
        for line in f:
            did, _, rest = line.rstrip("\n").partition("\t")
            ref[did] = Counter({t: int(n) for t, _, n in (x.rpartition(":") for x in rest.split(" ") if x)})
    a = Analyzer()
    mismatched = []
    with open(corpus) as f:
        for line in f:
            d = json.loads(line)
            if a.term_counts(d["title"] + "\n" + d["text"]) != ref[d["_id"]]:
                mismatched.append(d["_id"])
    assert len(ref) > 3000
    assert mismatched == []
