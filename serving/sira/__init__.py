"""SIRA retrieval, the query side: one expert lexical action instead of many rounds.

    proposers  ->  DF filter  ->  score(d) = BM25(q, d) + λ · BM25(e, d), one weighted call

* `.proposers`  where expansion vocabulary comes from (``prf``, ``dense``, ``llm``)
* `.feedback`   the RM3 relevance model over a doc-major view of the postings
* `.dffilter`   keep a phrase when a sub-n-gram has 1 ≤ df ≤ τ·N
* `.mode`       settings, the weighted query, the mode function and its explanations

Corpus enrichment (the build-time side) is not here: it lives with the build pipeline.
"""

from .dffilter import Verdict, df_filter, ngram_key, sub_ngrams
from .feedback import ForwardIndex, rm3_weights, select_terms
from .mode import (OPTIONS, PROPOSER_CHOICES, Expansion, Prepared, SiraConfig, expand, expansion_terms,
                   prepare, resolve_proposer, run_sira, sira_arrays, weighted_query)
from .proposers import PROPOSERS, Proposal, ProposalContext, evidence_sketch, sketch_schema

__all__ = ["OPTIONS", "PROPOSERS", "PROPOSER_CHOICES", "Expansion", "ForwardIndex", "Prepared", "Proposal",
           "ProposalContext", "SiraConfig", "Verdict", "df_filter", "evidence_sketch", "expand",
           "expansion_terms", "ngram_key", "prepare", "resolve_proposer", "rm3_weights", "run_sira",
           "select_terms", "sira_arrays", "sketch_schema", "sub_ngrams", "weighted_query"]
