"""Opening a published index version: verify the manifest, memory-map the shards.

``IndexVersion`` is read-only and safe to share between threads once opened (the only
mutable state is caches that tolerate races). Serving imports ``funnel.pipelines`` only
for the artifact contract (manifest, stats) and the query-time analyzer.
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import pyarrow.parquet as pq

from funnel.pipelines.analysis import Analyzer, AnalyzerConfig
from funnel.pipelines.artifacts import (IndexFormatError, list_versions, load_manifest, read_current,
                                        verify_files)
from funnel.pipelines.postings import load_shard
from funnel.pipelines.shard import shard_name
from funnel.pipelines.stats import load_vocabulary

from .bm25 import ShardScorer, idf_lucene
from .result import docno, split_docno

log = logging.getLogger(__name__)


def resolve_version_dir(root: str, version: str | None = None) -> str:
    """The directory of ``version`` (default: the one CURRENT names), with clear errors."""
    if not os.path.exists(root):
        raise FileNotFoundError(f"index path {root!r} does not exist; build one with `funnel build --corpus ... --out {root}`")
    if os.path.exists(os.path.join(root, "manifest.json")):
        return root  # a version directory given directly
    if version is None:
        version = read_current(root)
        if version is None:
            found = list_versions(root)
            hint = f" (versions present: {', '.join(found)}; is a build still running?)" if found else ""
            raise IndexFormatError(f"{root!r} is not a funnel index: no CURRENT file{hint}. "
                                   f"Build one with `funnel build --corpus ... --out {root}`")
    vdir = os.path.join(root, version)
    if not os.path.isdir(vdir):
        raise IndexFormatError(f"{root!r}: CURRENT names {version!r}, which does not exist")
    return vdir


class DocStore:
    """Documents by docno, from ``docs/shard-NNNN.parquet``; text columns load lazily per shard."""

    def __init__(self, version_dir: str, n_shards: int):
        self.dir = os.path.join(version_dir, "docs")
        self.n_shards = n_shards
        self.doc_ids: list[np.ndarray] = []
        self._by_id: dict[str, int] = {}
        for s in range(n_shards):
            t = pq.read_table(os.path.join(self.dir, f"{shard_name(s)}.parquet"), columns=["doc_id"])
            ids = np.asarray(t.column("doc_id").to_pylist(), dtype=object)
            self.doc_ids.append(ids)
            for i, d in enumerate(ids):
                self._by_id[d] = docno(s, i)
        # Position of each document's id in the sorted list of all ids: score ties are broken
        # by doc_id ascending (as Anserini does) with integer compares.
        all_ids = np.concatenate(self.doc_ids) if self.doc_ids else np.zeros(0, dtype=object)
        rank = np.empty(len(all_ids), dtype=np.int64)
        rank[np.argsort(all_ids, kind="stable")] = np.arange(len(all_ids))
        bounds = np.cumsum([0] + [len(x) for x in self.doc_ids])
        self.id_rank = [rank[bounds[s]:bounds[s + 1]] for s in range(n_shards)]
        self._all_ids = all_ids
        self._bounds = bounds
        self._text: dict[int, dict[str, list]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_id)

    def doc_id(self, n: int) -> str:
        s, i = split_docno(n)
        return self.doc_ids[s][i]

    def doc_ids_of(self, docnos: np.ndarray) -> list[str]:
        """Vectorized ``doc_id`` for an array of docnos."""
        docnos = np.asarray(docnos, dtype=np.int64)
        return self._all_ids[self._bounds[docnos >> 32] + (docnos & 0xFFFFFFFF)].tolist()

    def docno_of(self, doc_id: str) -> int | None:
        return self._by_id.get(doc_id)

    def _columns(self, shard: int) -> dict[str, list]:
        cols = self._text.get(shard)
        if cols is None:
            with self._lock:
                cols = self._text.get(shard)
                if cols is None:
                    t = pq.read_table(os.path.join(self.dir, f"{shard_name(shard)}.parquet"),
                                      columns=["title", "text", "content_hash"], memory_map=True)
                    cols = {c: t.column(c).to_pylist() for c in ("title", "text", "content_hash")}
                    self._text[shard] = cols
        return cols

    def get(self, n: int) -> dict:
        s, i = split_docno(n)
        cols = self._columns(s)
        return {"doc_id": self.doc_ids[s][i], "title": cols["title"][i], "text": cols["text"][i],
                "content_hash": cols["content_hash"][i], "shard": s, "local_id": i}


class IndexVersion:
    """One opened, verified, immutable index version."""

    def __init__(self, root: str, version: str | None = None, verify: str = "sizes"):
        if verify not in ("none", "sizes", "full"):
            raise ValueError(f"unknown verify mode {verify!r}; choose one of none, sizes, full")
        self.dir = resolve_version_dir(root, version)
        self.root = root
        self.version = os.path.basename(os.path.normpath(self.dir))
        self.manifest = load_manifest(self.dir)
        if verify != "none":
            verify_files(self.dir, self.manifest, full=(verify == "full"))
        acfg = self.manifest["analyzer"]
        self.analyzer = Analyzer(AnalyzerConfig(stopwords=acfg["stopwords"], stemmer=acfg["stemmer"]))
        if self.analyzer.fingerprint() != acfg["fingerprint"]:
            raise IndexFormatError(
                f"analyzer mismatch: the index was built with analyzer fingerprint {acfg['fingerprint']}, "
                f"this funnel's query analyzer has {self.analyzer.fingerprint()}. Queries would not match "
                "the indexed terms; rebuild the index with this funnel version")
        coll = self.manifest["collection"]
        self.n_docs = int(coll["n_docs"])
        self.n_docs_nonempty = int(coll["n_docs_nonempty"])
        self.avgdl = float(coll["avgdl"])
        self.n_shards = int(coll["n_shards"])
        terms, df, cf = load_vocabulary(os.path.join(self.dir, "stats.duckdb"))
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(terms)}
        self.df = df
        self.cf = cf
        self.idf = idf_lucene(df, self.n_docs_nonempty)
        self.shards = [ShardScorer(load_shard(os.path.join(self.dir, "lexical", shard_name(s))), self.avgdl)
                       for s in range(self.n_shards)]
        self.docs = DocStore(self.dir, self.n_shards)
        log.info("opened %s (%d docs, %d shards, %d terms)", self.dir, self.n_docs, self.n_shards, len(self.vocab))
