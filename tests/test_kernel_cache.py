"""The kernels' disk cache is stamped with every source of the package (``serving/kernels/_jit.py``).

Real numba, real disk cache, real processes: a private copy of ``serving/kernels/`` is
imported as the top-level package ``kcopy`` from a temporary folder (its cache files go to
that copy's ``__pycache__``), and each step runs in a fresh Python process that calls one
kernel (``decode.posting_levels``, whose compiled ``_fill_impacts`` and ``_quantize`` read
``layout.IMPACT_LEVELS`` and inline ``checks._bad_posting``) and reports the dispatcher's
own cache hits and misses. With numba's plain ``cache=True`` the entry of a function in
``decode.py`` is stamped with ``decode.py`` alone, so the edit of ``layout.py`` below would
load the stale machine code and return the old levels (seen with numba 0.68.1, the same copy
decorated with ``njit(cache=True)``: a cache hit after the edit, and the old levels).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from funnel.serving import kernels

KERNELS = Path(__file__).resolve().parent.parent / "serving" / "kernels"

RUN = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import kcopy
from kcopy import decode
table = np.linspace(0.5, 3.0, 256)
cap = 4
itab = np.array([t / (t + table[c]) for t in range(cap) for c in range(256)])
docs = np.arange(6, dtype=np.int32)
tfs = np.array([1, 2, 3, 5, 9, 40], dtype=np.int32)
code = np.array([0, 7, 100, 255, 3, 50], dtype=np.uint8)
levels = decode.posting_levels(docs, tfs, code, table, itab)
st = [decode._fill_impacts.stats, decode._quantize.stats]
print(json.dumps({"levels": levels.tolist(), "hits": sum(sum(s.cache_hits.values()) for s in st),
                  "misses": sum(sum(s.cache_misses.values()) for s in st),
                  "cache": decode._fill_impacts._cache.cache_path}))
"""


def expected_levels(n_levels: int) -> list[int]:
    """The least q with q / n_levels >= each posting's impact (``decode._quantize``), in NumPy."""
    table = np.linspace(0.5, 3.0, 256)
    tfs = np.array([1, 2, 3, 5, 9, 40], dtype=np.float64)
    code = np.array([0, 7, 100, 255, 3, 50])
    v = tfs / (tfs + table[code])
    q = np.maximum(np.ceil(v * n_levels), 1.0)
    q = np.where((q - 1) / n_levels >= v, q - 1, q)
    q = np.where(q / n_levels < v, q + 1, q)
    return q.astype(int).tolist()


@pytest.mark.skipif(not kernels.HAVE_NUMBA, reason="numba absent: there is no compiled cache to test")
def test_a_change_to_any_module_of_the_package_recompiles_every_kernel(tmp_path):
    root = tmp_path / "pkg"
    pkg = root / "kcopy"
    pkg.mkdir(parents=True)
    for f in KERNELS.glob("*.py"):
        shutil.copy(f, pkg / f.name)
    (tmp_path / "run.py").write_text(RUN)
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "FUNNEL_NUMBA")}

    def run() -> dict:
        out = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(root)], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run()  # nothing cached yet: compiled, then saved in the copy's own __pycache__
    assert first["misses"] > 0 and first["hits"] == 0
    assert first["levels"] == expected_levels(65535)
    assert Path(first["cache"]) == pkg / "__pycache__" and list((pkg / "__pycache__").glob("decode._fill_impacts*.nbi"))

    again = run()  # no source changed: loaded from disk, not compiled
    assert again["hits"] > 0 and again["misses"] == 0 and again["levels"] == first["levels"]

    # Only layout.py changes (a constant the decode kernels are compiled with); decode.py is
    # byte for byte the same, yet its kernels are compiled again and read the new value.
    layout = pkg / "layout.py"
    src = layout.read_text()
    assert "IMPACT_LEVELS = int(np.iinfo(IMPACT_DTYPE).max)\n" in src
    layout.write_text(src.replace("IMPACT_LEVELS = int(np.iinfo(IMPACT_DTYPE).max)\n",
                                  "IMPACT_LEVELS = int(np.iinfo(IMPACT_DTYPE).max) // 2\n"))
    changed = run()
    assert changed["misses"] > 0 and changed["hits"] == 0
    assert changed["levels"] == expected_levels(32767) != first["levels"]
    assert run()["hits"] > 0  # and cached again

    # A comment in heap.py, a module this kernel does not use: every kernel recompiles all the same.
    heap = pkg / "heap.py"
    heap.write_text(heap.read_text() + "\n# a comment\n")
    touched = run()
    assert touched["misses"] > 0 and touched["hits"] == 0 and touched["levels"] == changed["levels"]
