"""Passage-level BM25 (``funnel build --dense --bm25-passages``): the passages as a corpus of their own.

BM25 stays whole-document by default, as Lucene scores it (Lucene parity). With the option
the build also indexes every passage the dense stage split (``passages/shard-NNNN.parquet``)
as one document of a second, ordinary BM25 index, built by the same builder into the
version's `SUBDIR` folder, and serving scores a document by its best passage (MaxP,
``funnel.serving.lexical.passage_bm25``). Why passages: BM25's length normalisation divides a long
document's term frequencies by its length, so a few query words in one section of a
10,000-word report score low against a short document holding them; scored by its best
passage, the report competes with what it says where it says it.

A passage row (`passage_table`): ``_id`` names the passage's document and ordinal
(`passage_id`: the document's shard and local id, which make its docno, and the
passage's ordinal in ``passages/``), ``title`` is the document's title and ``text`` the
passage's characters ``text[char_start:char_end]``. So a passage is indexed as ``title +
"\\n" + passage``, the way a whole document is and the way its passage is embedded, and a
document of one passage (every document of at most ``--passage-split-above`` windows) is
indexed exactly as its whole. The passage index's collection statistics are its own: N is
the number of passages, avgdl their mean length, a term's df the passages holding it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SUBDIR", "passage_id", "parse_passage_ids", "passage_table", "check_options"]

#: The passage index's folder inside an index version (a version folder of its own: manifest,
#: docs, lexical shards, statistics). The parent version's manifest checksums its files too.
SUBDIR = "bm25-passages"


def passage_id(shard: int, local_id: int, ordinal: int) -> str:
    """The passage index's id of passage ``ordinal`` of the document at (``shard``,
    ``local_id``): ``"shard:local:ordinal"``, decimal."""
    return f"{int(shard)}:{int(local_id)}:{int(ordinal)}"


def parse_passage_ids(ids) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shard, local id, ordinal) int64 arrays of `passage_id` strings (a pyarrow
    array or a list); ``ValueError`` naming the first id that is not one."""
    import pyarrow as pa
    import pyarrow.compute as pc
    arr = pa.chunked_array([ids]) if not isinstance(ids, (pa.Array, pa.ChunkedArray)) else ids
    if isinstance(arr, pa.Array):
        arr = pa.chunked_array([arr])
    if len(arr) == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z.copy(), z.copy()
    parts = pc.split_pattern(arr, ":")
    sizes = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
    try:
        if (sizes != 3).any():
            raise ValueError("not three parts")
        flat = pc.cast(pc.list_flatten(parts), pa.int64()).to_numpy(zero_copy_only=False).reshape(-1, 3)
    except (ValueError, pa.ArrowInvalid) as e:
        bad = next((s for s in arr.to_pylist() if not _is_passage_id(s)), None)
        raise ValueError(f"passage id {bad!r} is not 'shard:local:ordinal'") from e
    return flat[:, 0].copy(), flat[:, 1].copy(), flat[:, 2].copy()


def _is_passage_id(s) -> bool:
    parts = str(s).split(":")
    return len(parts) == 3 and all(p.isdigit() for p in parts)


def passage_table(shard: int, docs: dict, passages: dict):
    """One shard's passages as the passage index's corpus rows: a pyarrow table of ``_id``,
    ``title``, ``text`` (`passage_id`), in the order of ``passages``.

    Parameters
    ----------
    shard : int
        The shard both inputs belong to.
    docs : dict
        The shard's documents: ``local_id``, ``title``, ``text`` (``docs/shard-NNNN.parquet``).
    passages : dict
        Its passages: ``local_id``, ``ordinal``, ``char_start``, ``char_end``
        (``pipelines.dense.passages.read_passages``).
    """
    import pyarrow as pa
    row_of = {int(local): i for i, local in enumerate(np.asarray(docs["local_id"]).tolist())}
    titles, texts = list(docs["title"]), list(docs["text"])
    ids, out_titles, out_texts = [], [], []
    for local, o, a, b in zip(*(np.asarray(passages[c]).tolist()
                                for c in ("local_id", "ordinal", "char_start", "char_end"))):
        i = row_of.get(local)
        if i is None:
            raise ValueError(f"shard {shard}: a passage of local id {local}, which has no document; rebuild")
        text = texts[i] or ""
        ids.append(passage_id(shard, local, o))
        out_titles.append(titles[i] or "")
        out_texts.append(text[a:b])
    return pa.table({"_id": pa.array(ids, pa.string()), "title": pa.array(out_titles, pa.string()),
                     "text": pa.array(out_texts, pa.string())})


def check_options(dense: bool, passages_enabled: bool, enrich: bool) -> None:
    """``ValueError`` naming the fix where ``--bm25-passages`` cannot run with the other options."""
    if not dense:
        raise ValueError("--bm25-passages indexes the passages the dense stage splits: add --dense")
    if not passages_enabled:
        raise ValueError("--bm25-passages needs passages: drop --passages off (passages are on by default)")
    if enrich:
        raise ValueError("--bm25-passages does not take --enrich (SIRA enrichment adds its phrases to whole "
                         "documents, not to their passages): build with one of the two")
