"""Each document's rank in doc_id order, written once per version at build time.

Score ties are broken by doc_id ascending (as Anserini does); serving compares integer
ranks instead of strings. Sorting every id took the biggest part of opening a large index
(reading the doc_id columns, sorting them and making Python strings of them: ~0.45 s at 1M
synthetic documents), so the build stores the ranks beside the documents and serving
memory-maps them. An index built before this file existed has none, and serving computes
them at open as before, with this same function.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .artifacts import save_npy_atomic
from .shard import shard_name

#: Under the version folder: int64, one entry per document, shards in order.
ID_RANK = os.path.join("docs", "id_rank.npy")


def id_ranks(ids: pa.ChunkedArray) -> np.ndarray:
    """Position of each id in the sorted list of all of them (int64, same order as ``ids``).

    Arrow sorts the UTF-8 bytes, which is code point order, as Python's str compare; in C++
    it takes ~1 s for 3M ids where NumPy's argsort over Python strings took several."""
    rank = np.empty(len(ids), dtype=np.int64)
    if not len(ids):
        return rank
    order = pc.sort_indices(ids)  # uint64, no nulls; read as a view: its to_numpy imports pandas
    rank[np.frombuffer(order.buffers()[1], dtype=np.uint64, count=len(order), offset=8 * order.offset)
         ] = np.arange(len(ids))
    return rank


def read_doc_ids(version_dir: str, n_shards: int) -> pa.ChunkedArray:
    """Every shard's doc_id column of ``docs/shard-NNNN.parquet``, in shard order."""
    chunks = []
    for s in range(n_shards):
        with pq.ParquetFile(os.path.join(version_dir, "docs", f"{shard_name(s)}.parquet")) as f:
            chunks.extend(f.read(columns=["doc_id"]).column("doc_id").chunks)
    return pa.chunked_array(chunks, type=pa.string())


def write_id_ranks(version_dir: str, n_shards: int) -> int:
    """Write :data:`ID_RANK` for the documents of ``version_dir`` (before it is published);
    returns the number of documents."""
    rank = id_ranks(read_doc_ids(version_dir, n_shards))
    save_npy_atomic(os.path.join(version_dir, ID_RANK), rank)
    return len(rank)
