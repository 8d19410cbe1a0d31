"""BM25, the build side: Lucene's analysis, each shard's postings, the global statistics.

* `.analysis`      Lucene-compatible English analysis (Anserini's ``DefaultEnglishAnalyzer``)
* `.porter`        the Porter stemmer exactly as Lucene implements it
* `.shard`         one lexical shard from its rows: dedupe, analyze, invert, write
* `.postings`      per-shard term-major arrays, memory-mappable ``.npy`` files (plain or packed)
* `.stats`         the DF reduce across shards, written to ``stats.duckdb``
* `.passage_bm25`  passage-level BM25: the passages as a corpus of their own
"""
