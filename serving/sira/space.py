"""The lexical space SIRA judges and feeds back in: documents, or passages where BM25 scores passages.

An index built with ``--bm25-passages`` scores a document by its best passage (MaxP,
``serving.lexical.passage_bm25``), so SIRA's one weighted BM25 call runs over passages too. Its
expansion vocabulary is then judged and gathered in the same space:

* the **DF filter** keeps a phrase when ``1 <= df <= τ·N`` with df and N over passages (a
  term in every long document can still be in few passages, and discriminate there);
* **feedback** (``prf``, ``dense``) reads the best passage of each feedback document, as
  the passage index stores it (its forward row), not a long document's whole vocabulary.

Everything else (whole-document BM25) keeps the documents' statistics and forward index.
A filtered or restricted search uses the matching mask: the passage mask of its document
mask, so no passage of a document the caller may not read is counted or read.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import filters
from .feedback import ForwardIndex

_FORWARD: "weakref.WeakKeyDictionary[Any, ForwardIndex]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Space:
    """``index``: whose vocab, df, idf and N judge terms; ``forward``: its rows; ``mask``: the
    search's mask in that space (None: unfiltered); ``passages``: True for passages."""

    index: Any
    forward: ForwardIndex
    mask: Any
    passages: bool

    @property
    def n(self) -> int:
        """N of the DF filter: the allowed units (all of them, unfiltered)."""
        return self.index.n_docs if self.mask is None else self.mask.count


def space(searcher) -> Space:
    """The lexical space of ``searcher``'s BM25 (module docstring)."""
    bm = searcher.bm25
    if hasattr(bm, "passage_docnos"):  # --bm25-passages
        with _LOCK:
            fwd = _FORWARD.get(bm)
            if fwd is None:
                fwd = _FORWARD[bm] = ForwardIndex(bm.passages)
        return Space(bm.passages, fwd, bm._passage_mask(), True)
    return Space(searcher.index, searcher.forward, filters.active(), False)


def best_passages(searcher, docnos, terms: dict[str, float], params) -> np.ndarray:
    """The passage-index docnos of each document's best passage for ``terms`` (BM25 over its
    passages, ``PassageBM25.best_passage``'s choice); -1 where none matches."""
    from ..answers.passage_rank import bm25_of_docnos
    bm = searcher.bm25
    out = np.full(len(docnos), -1, dtype=np.int64)
    for i, n in enumerate(np.asarray(docnos, dtype=np.int64).tolist()):
        pdn = bm.passage_docnos(n)
        if len(pdn):
            sc = bm25_of_docnos(bm.inner, terms, pdn, params)
            j = int(np.argmax(sc))
            out[i] = pdn[j] if sc[j] > 0 else -1
    return out
