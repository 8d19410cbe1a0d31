"""BM25, the query side: how the lexical mode finds and scores documents.

* `.bm25`          Lucene 9's BM25 over one shard's term-major postings, the NumPy reference
* `.retriever`     the BM25 retriever: analyzed (or weighted) terms in, ranked docnos out,
                   over every shard, through the compiled kernels (``serving/kernels/``)
* `.packed`        packed postings (``--postings packed``): the bounded cache of decoded terms
* `.masked`        BM25 under a filter or access mask: the top k of the allowed documents
* `.passage_bm25`  a document scored by its best passage (MaxP)
"""
