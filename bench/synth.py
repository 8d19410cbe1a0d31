"""Seeded synthetic BEIR corpus: Zipfian pseudo-words, log-normal document lengths, generated queries.

    .venv/bin/python bench/synth.py --docs 1000000 --out .funnel/synth/1m [--seed 0] [--queries 1000]

Writes a BEIR folder: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl``
(``_id``, ``text``), ``qrels/test.tsv`` and ``meta.json`` (the parameters and counts;
`ensure` regenerates only when they differ). For scale benchmarks only: the words
mean nothing and the qrels are pseudo (each query's source document), so metrics on it
say nothing about quality.

The model, in brief:

- Vocabulary: ``vocab_size`` distinct lower-case pseudo-words built from consonant-vowel
  syllables, kept only where both Porter stemmers in use (funnel's Lucene variant and
  PyStemmer's, which bm25s uses) leave the word unchanged and no stopword list removes it,
  so every system indexes the same terms. Shorter words get the frequent ranks (Zipf's law
  of abbreviation).
- Words: a mixture. With probability ``1 - topical`` a token is drawn from one global Zipf
  law, p(r) ∝ 1 / (r + 2.7)^s (Zipf-Mandelbrot, s = ``zipf_s``); otherwise from the
  document's topic: one of ``n_topics`` topics, each a Zipf law over its own 400 words drawn
  from the rarer ranks. Topics make rare words bursty (tf > 1) and co-occur, as in text.
- Lengths: log-normal words per document (mean ``mean_len``, sigma ``len_sigma``), clipped
  to [8, 4000]; titles of 2-8 words taken from the document.
- Queries: from ``n_queries`` documents picked at random, 2-8 distinct terms of the
  document, half (rounded up) from its rarer half of terms and the rest from its more
  common half, in random order.

Documents are generated in blocks of ``BLOCK`` with one seeded stream per block, so a corpus
is a prefix of any larger one with the same seed and parameters (the 100K corpus is the
first 100K documents of the 1M one); the queries differ by size. 1M documents take about a
minute on one core.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np

BLOCK = 50_000
VERSION = 1  # bump on any change that alters the output for the same parameters
DEFAULTS = {"vocab_size": 300_000, "zipf_s": 1.05, "zipf_q": 2.7, "topical": 0.25, "n_topics": 2000,
            "topic_words": 400, "mean_len": 150.0, "len_sigma": 0.8, "min_len": 8, "max_len": 4000,
            "n_queries": 1000}

_CONSONANTS = list("bdfgklmnprstvz")
_VOWELS = list("aiou")  # no 'e': Porter rewrites many words that end in e
_FINALS = ["", "", "", "n", "r", "l", "k", "t", "m"]


def vocabulary(n_words: int, rng: np.random.Generator) -> np.ndarray:
    """``n_words`` distinct pseudo-words, shortest first (rank order), as an object array."""
    import Stemmer
    from bm25s.stopwords import STOPWORDS_EN, STOPWORDS_EN_PLUS

    from funnel.pipelines.lexical.analysis import LUCENE_ENGLISH_STOPWORDS
    from funnel.pipelines.lexical.porter import porter_stem

    stop = set(LUCENE_ENGLISH_STOPWORDS) | set(STOPWORDS_EN) | set(STOPWORDS_EN_PLUS)
    syll = np.array([c + v for c in _CONSONANTS for v in _VOWELS], dtype=object)
    stem = Stemmer.Stemmer("porter")
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < n_words:
        m = 2 * n_words
        n_syl = rng.choice([1, 2, 3, 4], size=m, p=[0.04, 0.30, 0.46, 0.20])
        parts = rng.integers(0, len(syll), size=(m, 4))
        finals = rng.integers(0, len(_FINALS), size=m)
        cand = ["".join(syll[parts[i, :n_syl[i]]]) + _FINALS[finals[i]] for i in range(m)]
        stems = stem.stemWords(cand)
        for w, s in zip(cand, stems):
            if w == s and w not in seen and w not in stop and porter_stem(w) == w:
                seen.add(w)
                words.append(w)
                if len(words) == n_words:
                    break
    words_arr = np.array(words, dtype=object)
    lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    order = np.lexsort((rng.random(len(words)), lengths))  # shortest first, ties in random order
    return words_arr[order]


def zipf_cdf(n: int, s: float, q: float = 0.0) -> np.ndarray:
    """Cumulative probabilities of ranks 0..n-1 under p(r) ∝ 1 / (r + 1 + q)^s."""
    w = 1.0 / np.power(np.arange(1, n + 1, dtype=np.float64) + q, s)
    c = np.cumsum(w)
    return c / c[-1]


class Model:
    """Everything shared by all blocks: vocabulary, global and topic laws."""

    def __init__(self, seed: int, p: dict):
        self.p = p
        rng = np.random.default_rng([seed, 0])
        self.words = vocabulary(p["vocab_size"], rng)
        self.global_cdf = zipf_cdf(p["vocab_size"], p["zipf_s"], p["zipf_q"])
        # Topic words from the rarer ranks (log-uniform over [200, V)), Zipf within each topic.
        lo, hi = math.log(200), math.log(p["vocab_size"])
        self.topic_words = np.exp(rng.uniform(lo, hi, size=(p["n_topics"], p["topic_words"]))).astype(np.int64)
        self.topic_cdf = zipf_cdf(p["topic_words"], 1.0)

    def block(self, seed: int, b: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Block ``b`` of ``n`` documents: (token ranks, doc offsets, title ranks, title offsets)."""
        p = self.p
        rng = np.random.default_rng([seed, 1, b])
        mu = math.log(p["mean_len"]) - p["len_sigma"] ** 2 / 2
        lens = np.clip(np.rint(rng.lognormal(mu, p["len_sigma"], size=n)), p["min_len"], p["max_len"]).astype(np.int64)
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        total = int(off[-1])
        topic = rng.integers(0, p["n_topics"], size=n)
        toks = np.searchsorted(self.global_cdf, rng.random(total), side="right")
        topical = np.flatnonzero(rng.random(total) < p["topical"])
        tok_topic = np.repeat(topic, lens)[topical]
        within = np.searchsorted(self.topic_cdf, rng.random(len(topical)), side="right")
        toks[topical] = self.topic_words[tok_topic, within]
        np.minimum(toks, p["vocab_size"] - 1, out=toks)
        tl = rng.integers(2, 9, size=n)
        toff = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(tl, out=toff[1:])
        doc_of = np.repeat(np.arange(n), tl)
        pos = off[doc_of] + (rng.random(int(toff[-1])) * lens[doc_of]).astype(np.int64)
        return toks.astype(np.int32), off, toks[pos].astype(np.int32), toff


def query_terms(ranks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """2-8 distinct ranks of one document: ceil(n/2) from its rarer half, the rest from its commoner half."""
    distinct = np.unique(ranks)  # ascending rank: common first
    n = min(int(rng.integers(2, 9)), len(distinct))
    half = len(distinct) // 2
    common, rare = distinct[:half], distinct[half:]
    n_rare = min(len(rare), -(-n // 2))
    n_common = min(len(common), n - n_rare)
    pick = np.concatenate([rng.choice(rare, n_rare, replace=False), rng.choice(common, n_common, replace=False)])
    rng.shuffle(pick)
    return pick


def generate(n_docs: int, out: str, seed: int = 0, progress: bool = True, **params) -> dict:
    """Write the corpus, queries and qrels under ``out`` (atomically); returns meta.json's content."""
    p = {**DEFAULTS, **params}
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown parameter(s) {sorted(unknown)}; choose from {', '.join(DEFAULTS)}")
    t0 = time.time()
    model = Model(seed, p)
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
            toks, off, tt, toff = model.block(seed, b, n)
            n_tokens += len(toks) + len(tt)
            words = model.words[toks]
            twords = model.words[tt]
            # Letters and spaces only: nothing to escape, so the JSON is written directly.
            f.writelines(f'{{"_id": "doc{start + i}", "title": "{" ".join(twords[toff[i]:toff[i + 1]])}", '
                         f'"text": "{" ".join(words[off[i]:off[i + 1]])}"}}\n' for i in range(n))
            for d in qdocs[(qdocs >= start) & (qdocs < start + n)]:
                i = int(d) - start
                queries.append((f"q{len(queries)}", f"doc{d}",
                                " ".join(model.words[query_terms(toks[off[i]:off[i + 1]], qrng)])))
            if progress:
                print(f"\r{start + n:,} / {n_docs:,} documents, {time.time() - t0:.0f}s", end="", file=sys.stderr)
    if progress:
        print(file=sys.stderr)
    with open(os.path.join(tmp, "queries.jsonl"), "w") as f:
        f.writelines(json.dumps({"_id": qid, "text": text}) + "\n" for qid, _, text in queries)
    with open(os.path.join(tmp, "qrels", "test.tsv"), "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(f"{qid}\t{did}\t1\n" for qid, did, _ in queries)
    meta = {"generator": "bench/synth.py", "version": VERSION, "n_docs": n_docs, "seed": seed, "params": p,
            "n_queries": len(queries), "n_tokens": n_tokens,
            "corpus_bytes": os.path.getsize(os.path.join(tmp, "corpus.jsonl")),
            "seconds": round(time.time() - t0, 1)}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return meta


def ensure(n_docs: int, out: str, seed: int = 0, **params) -> dict:
    """The corpus at ``out``, generated unless its meta.json already matches (a cache)."""
    want = {"version": VERSION, "n_docs": n_docs, "seed": seed, "params": {**DEFAULTS, **params}}
    try:
        with open(os.path.join(out, "meta.json")) as f:
            meta = json.load(f)
        if all(meta.get(k) == v for k, v in want.items()):
            return meta
    except (OSError, ValueError):
        pass
    return generate(n_docs, out, seed, **params)


def parse_count(text: str) -> int:
    """``100k`` / ``1m`` / ``3M`` / ``250000`` as a number of documents."""
    t = text.strip().lower().replace("_", "")
    mult = {"k": 1_000, "m": 1_000_000}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a document count: {text!r} (e.g. 100000, 100k, 1m)") from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--docs", type=parse_count, required=True, help="number of documents (e.g. 1000000 or 1m)")
    p.add_argument("--out", required=True, help="output folder (replaced)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--queries", type=int, default=DEFAULTS["n_queries"], help="number of queries (default %(default)s)")
    p.add_argument("--vocab", type=int, default=DEFAULTS["vocab_size"], help="vocabulary size (default %(default)s)")
    p.add_argument("--zipf-s", type=float, default=DEFAULTS["zipf_s"], help="Zipf exponent (default %(default)s)")
    p.add_argument("--mean-len", type=float, default=DEFAULTS["mean_len"],
                   help="mean words per document (default %(default)s)")
    a = p.parse_args(argv)
    meta = generate(a.docs, a.out, a.seed, n_queries=a.queries, vocab_size=a.vocab, zipf_s=a.zipf_s,
                    mean_len=a.mean_len)
    print(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
