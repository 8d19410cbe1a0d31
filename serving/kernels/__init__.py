"""Optional numba kernels for the BM25 hot loop; the NumPy path in ``bm25.py`` is the reference.

``search_shards`` answers one query over every shard in one compiled call: it finds each
query term in each shard, scores term-at-a-time into a reused accumulator, and cuts the top
``k`` with the ranking's tie-break (score descending, then doc_id ascending). Exhaustive
scoring reads every posting (over the build's 16-bit impact levels where it can, rescored
exactly); pruning (MaxScore, over exact block maxima with the default parameters) skips
postings that cannot change the top k and gives the same documents and the same bits.
``search_batch`` and its forms run many queries in one call, ``sira_batch`` SIRA's offline
proposers, and ``masked`` the same scoring under an access or filter mask.

One module per role, each with its share of the story in its docstring:

* ``_jit.py``: numba (``HAVE_NUMBA``; ``FUNNEL_NUMBA=0`` turns the kernels off), the ``jit``
  decorator every kernel takes and its disk cache, ``BOUNDS_CHECK``, the LLVM intrinsics.
* ``layout.py``: what the kernels read (the shard / block / impact tables, the stored
  impact levels' format), the fault codes, the tuning constants. Plain NumPy.
* ``checks.py``: damaged files, the compares made before every access ("Damaged files").
* ``decode.py``: a posting's impact, term and posting lookups, the build's per-posting arrays.
* ``heap.py``: the top k (heaps, the quickselect buffer) and the k-th partial score.
* ``exhaustive.py``: term-at-a-time accumulation, the dense read-back, the approximate pass
  over stored levels and its exact rescoring; ``search_shards_plain``.
* ``maxscore.py``: pruning by per-term bounds.  ``blockmax.py``: pruning by block maxima.
* ``search.py``: ``search_shards`` and the batch entry points.  ``sira.py``: ``sira_batch``.
* ``masked.py``: the kernels behind ``serving/lexical/masked.py``.
* ``packed.py``: the codec of packed postings (``funnel build --postings packed``): the build
  packs with it, ``serving/lexical/packed.py`` decodes the terms its cache holds into the plain arrays
  every kernel above reads, and the exhaustive approximate pass reads the other terms of a
  query straight from their blocks (``accumulate_packed``, ``packed_tfs``; ``pk`` in
  ``exhaustive.search_shards_plain``).

The disk cache, solved once: numba's ``cache=True`` keys a compiled function on the hash of
its own source file only, but a kernel's machine code has the helpers it calls from other
modules, and their constants, built in; a change to one of them would leave it stale. So
no kernel uses ``cache=True``: ``_jit.jit`` stamps every kernel's cache entry with a digest of
all of this package's sources, and any change to any module recompiles every kernel
(``_jit.py`` says how; ``tests/test_kernel_cache.py`` shows it).

Tests run these against the NumPy reference (and pruned against exhaustive) and require
identical rankings. Everything callers use is imported here: ``from funnel.serving import
kernels; kernels.search_shards`` (None, as every kernel, where numba is absent).
"""

from __future__ import annotations

from ._jit import BOUNDS_CHECK, HAVE_NUMBA, load_copy, package_stamp
from .layout import (BLOCK, BLOCK_DTYPES, DENSE_DIVISOR, FAULT_BLOCKS, FAULT_DOCS, FAULT_FILES, FAULT_IMPACTS,
                     FAULT_INDPTR, FAULT_NO_SHARD, FAULT_PACKED, FAULT_REASONS, FAULT_TERMS, FAULT_TFS, FIELD_DTYPES,
                     FIELDS, HEAP_K, IMPACT_DTYPE, IMPACT_LEVELS, IMPACT_STEP, KTH_BLOCKS, NEED_DECODED, NO_BLOCKS,
                     NO_IMPACTS, NO_PACKED, PREFETCH_AHEAD, PRUNE_LOOKUP, PRUNE_SKIP, SCAN, SMALL_SORT,
                     block_bounds32, block_table, fault_parts, impact_table, packed_table, shard_table, tf_dtype)

if HAVE_NUMBA:
    from .blockmax import _prune_pays, _score_shard_blocks, _theta_from_blocks, _theta_may_pay, block_maxima
    from .checks import _bad_posting, _blocks_ok, _range_ok
    from .decode import (_impact, _impact_u, _quantize, posting_impacts,
                         posting_levels, term_bounds)
    from .exhaustive import (_accumulate, _accumulate_dense, _approx_keep, _approx_margin, _offer_dense,
                             _search_approx, search_shards_plain)
    from .heap import _new_top, _offer_scores, _top_sorted
    from .masked import search_masked_shards
    from .maxscore import _score_shard
    from .search import (_canonical, _query_weights, search_batch, search_batch_plain, search_batch_weighted,
                         search_batch_weighted_plain, search_shards)
    from .sira import sira_batch
else:
    search_shards = search_batch = search_shards_plain = search_batch_plain = None
    search_batch_weighted = search_batch_weighted_plain = search_masked_shards = None
    term_bounds = block_maxima = sira_batch = posting_impacts = posting_levels = None
