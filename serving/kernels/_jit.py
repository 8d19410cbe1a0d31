"""numba for the kernels: the import, the one decorator every kernel takes, its disk cache,
and the few low-level primitives (LLVM intrinsics) the kernels share.

Every kernel of the package is compiled with `jit` (``nogil=True``; ``jit(inline="always")``
for the small helpers), never with ``numba.njit(cache=True)``. numba's own disk cache keys a
compiled function on its own source file only (numba 0.68, ``numba/core/caching.py``:
``_SourceFileBackedLocatorMixin.get_source_stamp`` hashes that one file), while the machine
code it stores has every helper it called or inlined from the package's other modules, and
their constants, built in: a change to ``heap.py`` would leave every cached kernel that
uses its heap stale. `jit` gives each function a cache (`_PackageCache`) whose stamp is a
digest of every ``.py`` file of this package (`package_stamp`), so any change anywhere in
the package recompiles every kernel, and nothing else does. The cache files go where numba
puts them (``NUMBA_CACHE_DIR`` when the user sets it, else the package's ``__pycache__``,
else the user's cache folder). Only this package's functions get it: numba's global
settings (``NUMBA_CACHE_LOCATOR_CLASSES``) are left alone. Where numba lacks the private
API this needs (another version), the kernels are compiled in every process instead, with
one log line.

``BOUNDS_CHECK``: whether the kernels compare the values they index with (``checks.py``).
A copy of the package loaded by `load_copy(name, unchecked=True)` compiles without them and
is not cached on disk (its functions would share the checked ones' cache files): the
baseline of ``bench/bench_workloads.py --bounds-check-cost``. Never for serving.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys

log = logging.getLogger(__name__)

try:  # numba is an accelerator, never a requirement
    if os.environ.get("FUNNEL_NUMBA", "1") == "0":
        raise ImportError("disabled by FUNNEL_NUMBA=0")
    from llvmlite import ir as llvmir
    from numba import carray, njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic
    HAVE_NUMBA = True
except ImportError as e:  # pragma: no cover - exercised where numba is absent
    log.info("numba unavailable (%s): using the NumPy BM25 path", e)
    HAVE_NUMBA = False

#: Whether the kernels check the values they index with (``checks.py``). `load_copy` sets
#: ``_UNCHECKED`` in a copy's namespace before running it; nothing else does.
BOUNDS_CHECK = not globals().get("_UNCHECKED", False)
_CACHE = BOUNDS_CHECK

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def package_stamp(folder: str = PACKAGE_DIR) -> bytes:
    """SHA-256 over the name and bytes of every ``.py`` file of the package (sorted by name):
    the disk cache's source stamp for every kernel (module docstring)."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            h.update(b"%d:%s\0%d:" % (len(name), name.encode(), len(data)))
            h.update(data)
    return h.digest()


def _package_cache_class():
    """The ``numba.core.caching.FunctionCache`` subclass `jit` attaches (module docstring):
    numba's own locators (user-provided folder, in-tree ``__pycache__``, user-wide), each
    with `package_stamp` as the source stamp. None where numba lacks what it needs."""
    try:
        from numba.core import caching
        bases = (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator)
        function_cache, impl_base = caching.FunctionCache, caching.CompileResultCacheImpl
    except (ImportError, AttributeError) as e:
        log.info("numba %s has no cache API this package knows (%s): kernels compile in every process",
                 getattr(sys.modules.get("numba"), "__version__", "?"), e)
        return None
    stamp = package_stamp()

    class _Stamped:
        def get_source_stamp(self):
            return stamp

    class _PackageCacheImpl(impl_base):
        _locator_classes = [type(f"Package{b.__name__}", (_Stamped, b), {}) for b in bases]

    class _PackageCache(function_cache):
        _impl_class = _PackageCacheImpl

    return _PackageCache


_PackageCache = _package_cache_class() if HAVE_NUMBA and _CACHE else None


def _with_cache(disp):
    """``disp`` with `_PackageCache` in place of its null cache, as numba's own
    ``Dispatcher.enable_caching`` attaches ``FunctionCache``; unchanged (no disk cache)
    where that cannot be done."""
    global _PackageCache
    if _PackageCache is None or not hasattr(disp, "_cache"):
        return disp
    try:
        disp._cache = _PackageCache(disp.py_func)
    except Exception as e:  # noqa: BLE001 - never fail an import over a cache: compile instead
        log.info("numba disk cache unavailable (%s): kernels compile in every process", e)
        _PackageCache = None
    return disp


if HAVE_NUMBA:
    def jit(func=None, *, inline: str = "never"):
        """``numba.njit(nogil=True, inline=inline)`` with the package's disk cache (module
        docstring); ``@jit`` or ``@jit(inline="always")``."""
        def wrap(f):
            return _with_cache(njit(nogil=True, inline=inline)(f))
        return wrap(func) if func is not None else wrap

    @intrinsic
    def _voidptr(typingctx, addr):
        """An int64 address as a void pointer (for ``carray`` over arrays the caller keeps alive)."""
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], cgutils.voidptr_t)
        return types.voidptr(types.int64), codegen

    @jit(inline="always")
    def _view(meta, s, f, dtype):
        """Field ``f`` of shard ``s`` in an (address, length) table (``layout.shard_table``)."""
        return carray(_voidptr(meta[s, 2 * f]), meta[s, 2 * f + 1], dtype)

    @intrinsic
    def _prefetch(typingctx, arr, idx):
        """Ask the CPU to bring arr[idx]'s cache line in (``llvm.prefetch``: a hint; it never
        faults, so idx may lie past the array's end)."""
        def codegen(context, builder, signature, args):
            a = context.make_array(signature.args[0])(context, builder, args[0])
            i8p = llvmir.IntType(8).as_pointer()
            i32 = llvmir.IntType(32)
            fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p],
                                                  fnty=llvmir.FunctionType(llvmir.VoidType(), [i8p, i32, i32, i32]))
            # read, keep in all cache levels, data cache
            builder.call(fn, [builder.bitcast(builder.gep(a.data, [args[1]]), i8p), i32(0), i32(3), i32(1)])
            return context.get_dummy_value()
        return types.void(arr, idx), codegen

    @jit(inline="always")
    def _prefetch_block(docs, tfs, q0, block):
        """Prefetch the ``block`` docs and tfs from q0 on (int32: 16 to a 64-byte line)."""
        for x in range(0, block, 16):
            _prefetch(docs, q0 + x)
            _prefetch(tfs, q0 + x)


def load_copy(name: str, unchecked: bool = True):
    """The package imported again, from the same files, as the module ``name`` (e.g.
    ``funnel.serving._kernels_unchecked``; its parent package must be imported): a second
    set of kernels, compiled separately. With ``unchecked`` its ``BOUNDS_CHECK`` is off and
    nothing of it is cached on disk. For the benchmark's baseline only (module docstring)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(PACKAGE_DIR, "__init__.py"),
                                                  submodule_search_locations=[PACKAGE_DIR])
    pkg = importlib.util.module_from_spec(spec)
    jspec = importlib.util.spec_from_file_location(f"{name}._jit", os.path.abspath(__file__))
    jit_mod = importlib.util.module_from_spec(jspec)
    jit_mod._UNCHECKED = unchecked
    sys.modules[name] = pkg
    sys.modules[f"{name}._jit"] = jit_mod
    try:
        jspec.loader.exec_module(jit_mod)
        pkg._jit = jit_mod
        spec.loader.exec_module(pkg)
    except BaseException:
        for m in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[m]
        raise
    return pkg
