"""Seeded *topical* BEIR corpus: documents drawn from topic mixtures fitted to SciFact + NFCorpus.

    .venv/bin/python bench/synth_topical.py --docs 1m --out .funnel/synth-topical/1m [--seed 0]

``bench/synth.py`` spreads every word evenly over random text, the worst case for dynamic
pruning; here terms co-occur as they do in the real collections, so a query's terms meet in
the same documents and a top-k forms early. Writes a BEIR folder (``corpus.jsonl`` with
``_id``, ``title``, ``text``; ``queries.jsonl`` and ``qrels/test.tsv`` of pseudo queries;
``meta.json``, which `ensure` compares to regenerate only when it differs).

The model:

- Vocabulary: the terms funnel's Lucene English analyzer makes of the real documents, kept
  where a term is lower-case letters only (2 or more), a fixed point of both Porter
  stemmers in use (funnel's and PyStemmer's, which bm25s uses) and in no stopword list
  (Lucene's, bm25s's): every system then indexes the same terms from the same text, and
  a query written in these terms reaches every system unchanged (``analyze_query``).
- Topics: the real documents' l2-normalised tf-idf rows clustered by k-means into
  ``n_topics`` clusters; a topic's term law is the pooled term counts of its documents
  (real within-topic frequencies, common words included). The background law is the
  whole collection's term counts.
- A document: a primary topic (drawn in proportion to its cluster's size), a secondary
  topic (uniform), log-normal length (mean ``mean_len``, clipped to [8, 4000]); each token
  from the primary topic with probability ``p_primary``, the secondary with
  ``p_secondary``, the background otherwise. Titles: 2-8 words of the document.

The vocabulary is the real collections' (~20K terms), so at 1M documents a term has a
larger document frequency than it would in 1M real documents, whose vocabulary keeps
growing: the query terms' postings lists are long, which is the hard case for scoring.
Generated in blocks with one seeded stream each, so a corpus is a prefix of any larger one
with the same seed and parameters.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from results import DEFAULT_DATA  # noqa: E402
from synth import parse_count  # noqa: E402

BLOCK = 50_000
VERSION = 1  # bump on any change that alters the output for the same parameters
SOURCES = ("scifact", "nfcorpus")
DEFAULTS = {"n_topics": 200, "p_primary": 0.6, "p_secondary": 0.15, "mean_len": 150.0, "len_sigma": 0.8,
            "min_len": 8, "max_len": 4000, "n_queries": 1000}
_WORD = re.compile(r"[a-z]{2,}")


def _vocab_filter():
    """A predicate: is this analyzed term kept (letters only, fixed by both stemmers, no stopword)?"""
    import Stemmer
    from bm25s.stopwords import STOPWORDS_EN, STOPWORDS_EN_PLUS

    from funnel.pipelines.lexical.analysis import LUCENE_ENGLISH_STOPWORDS
    from funnel.pipelines.lexical.porter import porter_stem

    stop = set(LUCENE_ENGLISH_STOPWORDS) | set(STOPWORDS_EN) | set(STOPWORDS_EN_PLUS)
    stem = Stemmer.Stemmer("porter")
    memo: dict[str, bool] = {}

    def keep(t: str) -> bool:
        got = memo.get(t)
        if got is None:
            got = memo[t] = (_WORD.fullmatch(t) is not None and t not in stop and porter_stem(t) == t
                             and stem.stemWord(t) == t)
        return got
    return keep


def read_sources(data: str = DEFAULT_DATA) -> tuple[list[list[str]], list[str]]:
    """(each real document's kept terms, the source each came from), SciFact then NFCorpus."""
    from funnel.pipelines.lexical.analysis import Analyzer
    an = Analyzer()
    keep = _vocab_filter()
    docs, src = [], []
    for name in SOURCES:
        path = os.path.join(data, name, "corpus.jsonl")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: pass --data BEIR_FOLDER (the folder holding "
                                    f"{', '.join(SOURCES)})")
        with open(path) as f:
            for line in f:
                d = json.loads(line)
                docs.append([t for t in an.analyze(d.get("title", "") + " " + d["text"]) if keep(t)])
                src.append(name)
    return docs, src


def analyze_query(text: str, analyzer, keep) -> list[str]:
    """A real query's terms in the topical vocabulary's form (funnel's analysis, kept terms only)."""
    return [t for t in analyzer.analyze(text) if keep(t)]


class Model:
    """Vocabulary, topic laws (sparse CDFs) and topic weights fitted to the real documents."""

    def __init__(self, seed: int, p: dict, data: str = DEFAULT_DATA):
        from scipy import sparse
        from sklearn.cluster import MiniBatchKMeans
        from sklearn.feature_extraction.text import TfidfTransformer

        docs, _ = read_sources(data)
        vocab = sorted({t for d in docs for t in d})
        index = {t: i for i, t in enumerate(vocab)}
        rows = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
        cols = np.fromiter((index[t] for d in docs for t in d), dtype=np.int64, count=len(rows))
        counts = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(docs), len(vocab)))
        counts.sum_duplicates()
        x = TfidfTransformer(sublinear_tf=True).fit_transform(counts)
        km = MiniBatchKMeans(n_clusters=p["n_topics"], random_state=seed, n_init=3, batch_size=1024)
        label = km.fit_predict(x)
        self.words = np.array(vocab, dtype=object)
        self.topic_weight = np.bincount(label, minlength=p["n_topics"]).astype(np.float64)
        self.topic_weight /= self.topic_weight.sum()
        self.topic_terms, self.topic_cdf = [], []
        for c in range(p["n_topics"]):
            tc = np.asarray(counts[label == c].sum(axis=0)).ravel()
            self._add_law(tc)
        self._add_law(np.asarray(counts.sum(axis=0)).ravel())  # the background, last
        self.df = np.diff(counts.tocsc().indptr)  # real document frequency per term
        self.n_real = len(docs)

    def _add_law(self, tc: np.ndarray) -> None:
        nz = np.flatnonzero(tc)
        if len(nz) == 0:  # an empty cluster: fall back on the term counts of nothing -> skip by weight 0
            nz = np.zeros(1, dtype=np.int64)
            tc = np.ones(1)
        c = np.cumsum(tc[nz].astype(np.float64))
        self.topic_terms.append(nz.astype(np.int32))
        self.topic_cdf.append(c / c[-1])

    def block(self, seed: int, b: int, n: int, p: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Block ``b`` of ``n`` documents: (token term ids, doc offsets, title term ids, title offsets)."""
        rng = np.random.default_rng([seed, 1, b])
        mu = math.log(p["mean_len"]) - p["len_sigma"] ** 2 / 2
        lens = np.clip(np.rint(rng.lognormal(mu, p["len_sigma"], size=n)), p["min_len"], p["max_len"]).astype(np.int64)
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        total = int(off[-1])
        nt = p["n_topics"]
        prim = rng.choice(nt, size=n, p=self.topic_weight)
        sec = rng.integers(0, nt, size=n)
        u = rng.random(total)
        comp = np.where(u < p["p_primary"], np.repeat(prim, lens),
                        np.where(u < p["p_primary"] + p["p_secondary"], np.repeat(sec, lens), nt))
        order = np.argsort(comp, kind="stable")
        bounds = np.searchsorted(comp[order], np.arange(nt + 2))
        toks = np.empty(total, dtype=np.int32)
        for c in range(nt + 1):
            lo, hi = bounds[c], bounds[c + 1]
            if hi > lo:
                pick = np.searchsorted(self.topic_cdf[c], rng.random(hi - lo), side="right")
                np.minimum(pick, len(self.topic_terms[c]) - 1, out=pick)
                toks[order[lo:hi]] = self.topic_terms[c][pick]
        tl = rng.integers(2, 9, size=n)
        toff = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(tl, out=toff[1:])
        doc_of = np.repeat(np.arange(n), tl)
        pos = off[doc_of] + (rng.random(int(toff[-1])) * lens[doc_of]).astype(np.int64)
        return toks, off, toks[pos], toff


def generate(n_docs: int, out: str, seed: int = 0, data: str = DEFAULT_DATA, progress: bool = True,
             **params) -> dict:
    """Write the corpus, pseudo queries and qrels under ``out`` (atomically); returns meta.json's content.
    The pseudo queries (``n_queries``, each 4-12 distinct terms of one document drawn as its
    tokens fall, so common words come in as they do in questions) exist so the folder is a
    complete BEIR set; ``bench/bench_workloads.py`` makes its own query sets."""
    p = {**DEFAULTS, **params}
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown parameter(s) {sorted(unknown)}; choose from {', '.join(DEFAULTS)}")
    t0 = time.time()
    model = Model(seed, p, data)
    qrng = np.random.default_rng([seed, 2, n_docs])
    n_q = min(p["n_queries"], n_docs)
    qdocs = np.sort(qrng.choice(n_docs, n_q, replace=False))
    tmp = out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "qrels"))
    queries = []
    n_tokens = 0
    with open(os.path.join(tmp, "corpus.jsonl"), "w") as f:
        for b, start in enumerate(range(0, n_docs, BLOCK)):
            n = min(BLOCK, n_docs - start)
            toks, off, tt, toff = model.block(seed, b, n, p)
            n_tokens += len(toks) + len(tt)
            words = model.words[toks]
            twords = model.words[tt]
            f.writelines(f'{{"_id": "doc{start + i}", "title": "{" ".join(twords[toff[i]:toff[i + 1]])}", '
                         f'"text": "{" ".join(words[off[i]:off[i + 1]])}"}}\n' for i in range(n))
            for d in qdocs[(qdocs >= start) & (qdocs < start + n)]:
                i = int(d) - start
                terms = list(dict.fromkeys(words[off[i]:off[i + 1]][qrng.permutation(off[i + 1] - off[i])]))
                queries.append((f"q{len(queries)}", f"doc{d}", " ".join(terms[:int(qrng.integers(4, 13))])))
            if progress:
                print(f"\r{start + n:,} / {n_docs:,} documents, {time.time() - t0:.0f}s", end="", file=sys.stderr)
    if progress:
        print(file=sys.stderr)
    with open(os.path.join(tmp, "queries.jsonl"), "w") as f:
        f.writelines(json.dumps({"_id": qid, "text": text}) + "\n" for qid, _, text in queries)
    with open(os.path.join(tmp, "qrels", "test.tsv"), "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(f"{qid}\t{did}\t1\n" for qid, did, _ in queries)
    meta = {"generator": "bench/synth_topical.py", "version": VERSION, "n_docs": n_docs, "seed": seed, "params": p,
            "sources": list(SOURCES), "n_real_docs": model.n_real, "vocab_size": len(model.words),
            "n_queries": len(queries), "n_tokens": n_tokens,
            "corpus_bytes": os.path.getsize(os.path.join(tmp, "corpus.jsonl")),
            "seconds": round(time.time() - t0, 1)}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return meta


def ensure(n_docs: int, out: str, seed: int = 0, data: str = DEFAULT_DATA, **params) -> dict:
    """The corpus at ``out``, generated unless its meta.json already matches (a cache)."""
    want = {"version": VERSION, "n_docs": n_docs, "seed": seed, "params": {**DEFAULTS, **params}}
    try:
        with open(os.path.join(out, "meta.json")) as f:
            meta = json.load(f)
        if all(meta.get(k) == v for k, v in want.items()):
            return meta
    except (OSError, ValueError):
        pass
    return generate(n_docs, out, seed, data, **params)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--docs", type=parse_count, required=True, help="number of documents (e.g. 1000000 or 1m)")
    p.add_argument("--out", required=True, help="output folder (replaced)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=DEFAULT_DATA, help="the BEIR folder holding scifact/ and nfcorpus/ "
                   "(default %(default)s)")
    p.add_argument("--topics", type=int, default=DEFAULTS["n_topics"], help="k-means topics (default %(default)s)")
    a = p.parse_args(argv)
    print(json.dumps(generate(a.docs, a.out, a.seed, a.data, n_topics=a.topics), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
