"""Every document's id and its rank in doc_id order, written once per version at build time.

Score ties are broken by doc_id ascending (as Anserini does); serving compares integer
ranks instead of strings. Reading every shard's doc_id column from the parquet files
(~4,000 row groups at 1M documents) and sorting the ids was most of opening a large index
(~0.45 s at 1M synthetic documents), so the build writes both into one uncompressed Arrow
IPC file that serving memory-maps: no copy, no parse. An index built before this file
existed has none; serving then reads the columns and sorts at open, with `id_ranks`.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .artifacts import save_arrow_atomic
from ..lexical.shard import shard_name

#: Under the version folder: columns doc_id (string) and rank (int64), one row per
#: document in docno order (shard by shard, each in its parquet file's order).
DOC_IDS = os.path.join("docs", "ids.arrow")
SCHEMA = pa.schema([("doc_id", pa.string()), ("rank", pa.int64())])


def id_ranks(ids: pa.ChunkedArray) -> np.ndarray:
    """Position of each id in the sorted list of all of them (int64, same order as ``ids``).

    Arrow sorts the UTF-8 bytes, which is code point order, as Python's str compare; in C++
    it takes ~1 s for 3M ids where NumPy's argsort over Python strings took several."""
    rank = np.empty(len(ids), dtype=np.int64)
    if not len(ids):
        return rank
    import pyarrow.compute as pc  # ~0.05 s to import; a search process does not sort ids
    order = pc.sort_indices(ids)  # uint64, no nulls; read as a view: its to_numpy imports pandas
    rank[int64_view(order)] = np.arange(len(ids))
    return rank


def int64_view(arr: pa.Array) -> np.ndarray:
    """A null-free 64-bit integer Arrow array as a NumPy view of its buffer (no copy; Arrow's
    own ``to_numpy`` imports pandas, ~0.2 s of a search process)."""
    dtype = np.uint64 if arr.type == pa.uint64() else np.int64
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=8 * arr.offset)


def int64_column(col: pa.ChunkedArray) -> np.ndarray:
    """A null-free int64 column as one writable NumPy array (a copy of its chunks: numba
    compiles another version of a kernel for a read-only array)."""
    chunks = [c for c in col.chunks if len(c)]
    return np.concatenate([int64_view(c) for c in chunks]) if chunks else np.zeros(0, np.int64)


def _read_columns(path: str, columns: list[str]) -> pa.Table:
    with pq.ParquetFile(path) as f:
        return f.read(columns=columns)


def read_doc_ids(version_dir: str, n_shards: int,
                 read: Callable[[str, list[str]], pa.Table] = _read_columns) -> pa.ChunkedArray:
    """Every shard's doc_id column of ``docs/shard-NNNN.parquet``, in shard order; ``read``
    reads one file's columns (serving passes one whose errors name the file)."""
    chunks = []
    for s in range(n_shards):
        chunks.extend(read(os.path.join(version_dir, "docs", f"{shard_name(s)}.parquet"), ["doc_id"])
                      .column("doc_id").chunks)
    return pa.chunked_array(chunks, type=pa.string())


def write_doc_ids(version_dir: str, n_shards: int) -> int:
    """Write `DOC_IDS` for the documents of ``version_dir`` (before it is published);
    returns the number of documents (``artifacts.save_arrow_atomic``)."""
    ids = read_doc_ids(version_dir, n_shards).combine_chunks()
    table = pa.table([ids, pa.array(id_ranks(pa.chunked_array([ids])), type=pa.int64())], schema=SCHEMA)
    save_arrow_atomic(os.path.join(version_dir, DOC_IDS), table)
    return len(table)


def open_doc_ids(path: str, n_docs: int) -> tuple[pa.ChunkedArray, np.ndarray]:
    """(doc_id column, memory-mapped; rank array, a writable copy: numba compiles another
    version of a kernel for a read-only array) of a `DOC_IDS` file. Raises ValueError
    where it is not one row per document of that schema."""
    table = pa.ipc.open_file(pa.memory_map(path)).read_all()
    if table.schema != SCHEMA or table.num_rows != n_docs:
        raise ValueError(f"holds {table.num_rows} rows of ({', '.join(f'{f.name} {f.type}' for f in table.schema)}); "
                         f"expected one row per document ({n_docs}) of (doc_id string, rank int64)")
    if table.column("rank").null_count or table.column("doc_id").null_count:
        raise ValueError("has empty doc_ids or ranks")
    return table.column("doc_id"), int64_column(table.column("rank"))
