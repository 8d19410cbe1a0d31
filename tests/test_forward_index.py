"""SIRA's forward index (each document's terms, inverted back from the postings) holds exactly
what the analyzer makes of every document, across shards, including documents with no terms
at all (only stopwords) at the end of a shard."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from funnel.jobs.build_index import build
from funnel.pipelines.lexical.shard import flat_document
from funnel.serving.search import open_index

from conftest import write_jsonl

WORDS = "protein cell binding vitamin fracture bone immune response gene receptor signal pathway".split()


@pytest.fixture(scope="module")
def searcher(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forward")
    rows = [{"_id": f"d{i:03d}", "title": f"{WORDS[i % 12]} study",
             "text": " ".join(WORDS[(i * 7 + j) % 12] for j in range(1 + i % 9))} for i in range(60)]
    rows += [{"_id": f"e{i:03d}", "title": "", "text": "the of and to"} for i in range(9)]  # no terms
    write_jsonl(tmp / "corpus.jsonl", rows)
    rows = {r["_id"]: r for r in rows}
    root = str(tmp / "ix")
    build(str(tmp / "corpus.jsonl"), root, shards=3, engine="local")
    return open_index(root), rows


def test_every_documents_terms_and_length(searcher):
    ix, rows = searcher
    v = ix  # attributes reach the current version
    fwd, vocab, analyze = v.forward, v.index.vocab, v.index.analyzer.analyze
    docnos = [(s << 32) + i for s in range(v.index.n_shards) for i in range(v.index.docs.shard_size(s))]
    assert len(docnos) == len(rows)
    g, tf, owner, dl = fwd.rows(docnos)
    for j, n in enumerate(docnos):
        r = rows[v.index.docs.doc_id(n)]
        want = Counter(vocab[t] for t in analyze(flat_document(r["title"], r["text"])))
        got = Counter({int(a): float(b) for a, b in zip(g[owner == j], tf[owner == j])})
        assert got == want, v.index.docs.doc_id(n)
        assert dl[j] == sum(want.values())
    # The case the lengths' reduction must get right: a shard whose last documents have no terms.
    ends_empty = [s for s in range(v.index.n_shards - 1)
                  if not analyze(rows[v.index.docs.doc_id((s << 32) + v.index.docs.shard_size(s) - 1)]["text"])]
    assert ends_empty, "the corpus no longer puts a term-less document last in a shard before the last"
    assert np.count_nonzero(dl == 0) == 9


def test_sira_answers_when_the_last_document_has_no_terms(searcher):
    """Before the forward index was built per shard, a term-less document at the end of the
    last shard made its construction raise IndexError, so every SIRA query on the index failed."""
    ix, rows = searcher
    s = ix.index.n_shards - 1
    last = ix.index.docs.doc_id((s << 32) + ix.index.docs.shard_size(s) - 1)
    assert not ix.index.analyzer.analyze(rows[last]["text"])
    res = ix.search("protein binding", mode="sira", proposer="prf", k=5)
    assert res.hits and all(h.doc_id.startswith("d") for h in res.hits)  # term-less documents never match
    top = rows[res.hits[0].doc_id]
    assert "protein" in top["title"] + " " + top["text"]
