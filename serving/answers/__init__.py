"""What an agent reads, made from the ranked hits: their passages, quoted and bounded.

* `.summary`       the ranked hits with their best passages quoted, within a token budget
* `.citations`     the passage of a hit an agent quotes, and ranges of a document's text
* `.passage_rank`  passages ranked as passages, by both signals, fused
* `.context`       the context optimizer: ranked passages into the context an LLM reads
* `.bounds`        answers bounded in characters, whatever the corpus holds
* `.paging`        paging through a ranking and counting its matches
"""
