"""A sentence-transformers encoder on onnxruntime: exported once, then run without torch.

Why: importing torch and sentence-transformers costs a one-query process seconds and
hundreds of MiB (DESIGN.md, "Embedding runtime on a CPU"), and on a CPU their fp32 path is
not the fastest way to run a MiniLM-class encoder. Here the model's transformer is exported
to ONNX once per model (torch is needed for that, at build time or on first use), and from
then on a query or a build embeds with onnxruntime, the ``tokenizers`` package and NumPy only.

What has to match torch's vectors, and how:

- tokenizer: the model's own fast tokenizer, serialised at export exactly as the torch
  provider hands it to its CPU stage (``SentenceTransformerProvider.tokenizer_spec``), with
  the same truncation (the model's ``max_seq_length`` word pieces, special tokens counted);
- pooling: the model's ``Pooling`` module's modes, applied by `pool` (the formulas of
  sentence-transformers' ``Pooling._forward_padded``), then L2 normalisation;
- the export checks itself: the ONNX model's vectors for `PROBE_TEXTS` must be within
  `EXPORT_MIN_COSINE` of torch's, or the export is refused (`OnnxUnavailable`).

The exported files live in ``$FUNNEL_CACHE/onnx/<key>/`` (default ``~/.cache/funnel/onnx``),
``key`` from the model folder's file names, sizes and modification times, the export format
and onnxruntime's version: ``model.fp32.onnx`` (attention, layer norm and GELU fused by
onnxruntime's transformer optimizer where the graph allows; weights in ``model.fp32.onnx.data``,
mapped rather than copied when a session loads), ``model.int8.onnx`` (dynamic
int8 quantization of it, made on first request, without torch), ``tokenizer.json``,
``meta.json`` and ``probe.npy`` (torch's vectors of the probe texts). Exports take a file
lock and publish by renaming a finished folder, so concurrent processes (Ray actors, servers)
never see half a model.

Where a model cannot be exported (a pooling mode or a module layout not implemented here,
no ``onnx`` package, an export that disagrees with torch), `OnnxUnavailable` says why;
``embed.make_provider`` then falls back to torch and logs that once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Sequence

import numpy as np

from .embed import (DocumentTokenizer, _l2_normalize, _ProviderBase, canonical_model_name, default_query_threads,
                    resolve_model)

log = logging.getLogger(__name__)

__all__ = ["OnnxProvider", "OnnxUnavailable", "ensure_exported", "onnx_cache_root", "pool", "PRECISIONS"]

#: Bump when the exported files change meaning (a new key: old exports are not reused).
EXPORT_VERSION = 2
#: Precisions an export provides: the fp32 graph, and its dynamic int8 quantization.
PRECISIONS = ("fp32", "int8")
#: Pooling modes `pool` implements (sentence-transformers' names).
POOLING_MODES = ("mean", "mean_sqrt_len_tokens", "cls", "max")
#: Least cosine between the export's and torch's vector of every probe text, per precision.
#: fp32 reproduces torch to float rounding (>= 0.99999 measured on MiniLM); int8 is a
#: different embedder (its index is queried with int8 only) and must still be close.
EXPORT_MIN_COSINE = {"fp32": 0.999, "int8": 0.95}
#: Texts the export is checked on: short and long, padded together in one batch.
PROBE_TEXTS = (
    "What causes rain to fall from clouds?",
    "",
    "COVID-19 vaccines reduce hospitalisation in older adults",
    "Rain forms when water vapour in clouds condenses into droplets heavy enough to fall. " * 30,
    "Naïve café résumé — Ünïcödé, punctuation; and numbers 3.14159 / 2,718.",
    "a",
)


class OnnxUnavailable(RuntimeError):
    """The model cannot run on onnxruntime here; the message says why."""


class ModelNotExportable(OnnxUnavailable):
    """This model's export is refused (its layout, pooling or tokenizer, or a disagreement with
    torch): the verdict is kept beside the cache so later processes do not load torch again."""


def onnx_cache_root() -> str:
    """``$FUNNEL_CACHE/onnx``, else ``~/.cache/funnel/onnx``."""
    base = os.environ.get("FUNNEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "funnel")
    return os.path.join(base, "onnx")


def model_key(model_path: str) -> str:
    """16 hex digits naming one export of the model folder ``model_path``: its files' relative
    names, sizes and modification times, `EXPORT_VERSION` and onnxruntime's version (an
    export fused by one onnxruntime is rebuilt for another)."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise OnnxUnavailable(f"onnxruntime is not installed ({e}): pip install onnxruntime") from e
    files = []
    for d, _, names in os.walk(model_path):
        for n in sorted(names):
            p = os.path.join(d, n)
            st = os.stat(p)
            files.append((os.path.relpath(p, model_path), st.st_size, st.st_mtime_ns))
    blob = json.dumps({"files": sorted(files), "export": EXPORT_VERSION, "onnxruntime": ort.__version__})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def pool(token_embeddings: np.ndarray, lengths: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """Sentence vectors from token vectors, as sentence-transformers' ``Pooling`` computes them.

    ``token_embeddings`` is ``(n, width, dim)`` for right-padded rows of ``lengths`` tokens. Per
    mode, concatenated in order: ``mean`` = Σ_{t<len} h_t / max(len, 1e-9); ``mean_sqrt_len_tokens``
    = Σ h_t / √len; ``cls`` = h_0 (the first unpadded token); ``max`` = max_{t<len} h_t.
    """
    h = np.asarray(token_embeddings, dtype=np.float32)
    lengths = np.asarray(lengths)
    mask = (np.arange(h.shape[1]) < lengths[:, None]).astype(np.float32)[:, :, None]
    count = np.maximum(mask.sum(axis=1), 1e-9)
    out = []
    for mode in modes:
        if mode in ("mean", "mean_sqrt_len_tokens"):
            total = (h * mask).sum(axis=1)
            out.append(total / (count if mode == "mean" else np.sqrt(count)))
        elif mode == "cls":
            out.append(h[:, 0])
        elif mode == "max":
            out.append(np.where(mask > 0, h, -np.inf).max(axis=1))
        else:
            raise ValueError(f"unknown pooling mode {mode!r}; choose one of {', '.join(POOLING_MODES)}")
    return np.concatenate(out, axis=1).astype(np.float32, copy=False)


# -- export (torch: build time or first use) ---------------------------------------------------


def _pooling_modes(module) -> list[str]:
    mode = getattr(module, "pooling_mode", None)
    if mode is None:  # sentence-transformers before 5: pooling_mode_* flags
        cfg = module.get_config_dict()
        names = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens"}
        modes = [v for k, v in names.items() if cfg.get(k)]
        other = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and k not in names]
        return modes + other
    return [mode] if isinstance(mode, str) else list(mode)


def _export(model_path: str, out: str) -> None:
    """Export ``model_path`` into the empty folder ``out`` (fp32 graph, tokenizer, meta, probe
    vectors); raises OnnxUnavailable where the model is not a Transformer -> Pooling ->
    (Normalize) pipeline of implemented modes, or the export disagrees with torch."""
    try:
        import onnx  # noqa: F401 - the optimizer and the quantizer need it; fail before the slow part
        import torch
    except ImportError as e:
        raise OnnxUnavailable(f"exporting to ONNX needs torch and onnx ({e}): pip install onnx") from e
    from .embed import SentenceTransformerProvider
    st = SentenceTransformerProvider(model_path, device="cpu", fp16=False)
    model = st.model
    kinds = [type(m).__name__ for m in model]
    if kinds[:2] != ["Transformer", "Pooling"] or any(k != "Normalize" for k in kinds[2:]):
        raise ModelNotExportable(f"module layout {kinds} is not Transformer, Pooling[, Normalize]")
    modes = _pooling_modes(model[1])
    if not modes or any(m not in POOLING_MODES for m in modes):
        raise ModelNotExportable(f"pooling mode {modes} is not implemented for ONNX (only {', '.join(POOLING_MODES)})")
    spec = st.tokenizer_spec()
    if spec is None:
        raise ModelNotExportable("the model's tokenizer has no fast (Rust) tokenizer, or lower-cases in Python")
    tok = model.tokenizer
    auto = model[0].auto_model
    if hasattr(auto, "set_attn_implementation"):  # the eager graph is what onnxruntime's fusion recognises
        try:
            auto.set_attn_implementation("eager")
        except Exception as e:  # noqa: BLE001 - an unfused graph is still correct
            log.debug("eager attention not available (%s)", e)

    class Encoder(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    raw = os.path.join(out, "raw.onnx")
    ids = torch.ones((2, 8), dtype=torch.int64)  # any ids: the axes are dynamic
    axes = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
            "token_embeddings": {0: "batch", 1: "tokens"}}
    import warnings
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # the tracer's notes on shape-dependent Python code
        torch.onnx.export(Encoder(auto).eval(), (ids, torch.ones_like(ids)), raw, input_names=["input_ids", "attention_mask"],
                          output_names=["token_embeddings"], dynamic_axes=axes, opset_version=17, dynamo=False)
    cfg = auto.config
    fused = _fuse(raw, os.path.join(out, "model.fp32.onnx"), getattr(cfg, "model_type", ""),
                  getattr(cfg, "num_attention_heads", 0), getattr(cfg, "hidden_size", 0))
    os.remove(raw)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        f.write(spec["tokenizer_json"])
    normalize = len(kinds) > 2
    meta = {"export_version": EXPORT_VERSION, "model": model_path, "dim": st.dim, "pooling": modes,
            "normalize_module": normalize, "max_length": spec["max_length"],
            "truncation_side": spec["truncation_side"], "pad_id": spec["pad_id"],
            "special_tokens": int(tok.num_special_tokens_to_add(pair=False)), "fused": fused,
            "versions": _versions()}
    probe = st._encode(list(PROBE_TEXTS))  # torch's vectors, normalised: what the export must reproduce
    np.save(os.path.join(out, "probe.npy"), probe)
    meta["cosine"] = {"fp32": _check(out, meta, "fp32", probe)}
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)


def _versions() -> dict:
    import importlib.metadata as md
    out = {}
    for name in ("torch", "transformers", "sentence-transformers", "onnx", "onnxruntime"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def _fuse(src: str, dst: str, model_type: str, heads: int, hidden: int) -> bool:
    """onnxruntime's transformer optimizer (fused attention, layer norm, GELU) where it knows
    the architecture; the graph unchanged otherwise. Saved with its weights in ``dst + ".data"``
    beside the graph: onnxruntime maps that file instead of copying the weights out of the
    graph, which keeps a query process's peak ~90 MB lower (MiniLM). Returns whether it fused."""
    import onnx
    fused = True
    try:
        from onnxruntime.transformers import optimizer
        if model_type not in ("bert", "roberta", "distilbert", "xlm-roberta", "electra", "mpnet"):
            raise ValueError(f"no fusion for model type {model_type!r}")
        model = optimizer.optimize_model(src, model_type="bert" if model_type in ("xlm-roberta", "electra", "mpnet")
                                         else model_type, num_heads=heads, hidden_size=hidden, opt_level=1).model
    except Exception as e:  # noqa: BLE001 - an unfused graph computes the same vectors, slower
        log.info("ONNX export of this model left unfused (%s: %s)", type(e).__name__, e)
        model, fused = onnx.load(src), False
    onnx.save_model(model, dst, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=os.path.basename(dst) + ".data", size_threshold=1024)
    return fused


def _quantize(out: str) -> None:
    """``model.int8.onnx`` from ``model.fp32.onnx``: dynamic quantization (int8 weights, activations
    quantized per batch at run time); no torch needed."""
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        raise OnnxUnavailable(f"int8 quantization needs the onnx package ({e}): pip install onnx") from e
    tmp = os.path.join(out, f"model.int8.onnx.{uuid.uuid4().hex[:8]}.tmp")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer's advice to pre-process, through the root logger
    try:
        # Per-channel weight scales: per-tensor ones left SciFact queries at cosine 0.92-0.98 to
        # torch, per-channel at 0.988-0.997, at the same speed. Fused ops have no inferred
        # types, hence the float default.
        quantize_dynamic(os.path.join(out, "model.fp32.onnx"), tmp, weight_type=QuantType.QInt8, per_channel=True,
                         extra_options={"DefaultTensorType": 1})
    finally:
        root.setLevel(level)
    meta_path = os.path.join(out, "meta.json")
    meta = json.load(open(meta_path))
    os.replace(tmp, os.path.join(out, "model.int8.onnx"))
    try:
        meta.setdefault("cosine", {})["int8"] = _check(out, meta, "int8", np.load(os.path.join(out, "probe.npy")))
    except OnnxUnavailable:
        os.remove(os.path.join(out, "model.int8.onnx"))
        raise
    tmp_meta = meta_path + f".{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp_meta, "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    os.replace(tmp_meta, meta_path)


def _check(out: str, meta: dict, precision: str, probe: np.ndarray) -> float:
    """The least cosine between the export's and torch's probe vectors; OnnxUnavailable below
    `EXPORT_MIN_COSINE` (the export would not search an index built with torch)."""
    enc = OnnxEncoder(out, precision, threads=1, meta=meta)
    got = _l2_normalize(enc.encode(list(PROBE_TEXTS)))
    cos = float(np.min(np.sum(got * probe, axis=1)))
    if not cos >= EXPORT_MIN_COSINE[precision]:
        raise ModelNotExportable(f"the {precision} ONNX export disagrees with torch (least cosine {cos:.5f} < "
                              f"{EXPORT_MIN_COSINE[precision]})")
    return cos


def ensure_exported(model_path: str, precision: str = "fp32", root: str | None = None) -> str:
    """The folder holding ``model.<precision>.onnx`` for the model folder ``model_path``,
    exported (fp32, with torch) or quantized (int8, from the fp32 export) first where missing.

    Raises
    ------
    OnnxUnavailable
        onnxruntime missing, or the export is impossible or refused (the message says why).
    ValueError
        ``precision`` not one of `PRECISIONS`.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown ONNX precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    root = root or onnx_cache_root()
    final = os.path.join(root, model_key(model_path))
    target = os.path.join(final, f"model.{precision}.onnx")
    if os.path.exists(target):
        return final
    try:
        return _export_locked(model_path, precision, final, target)
    except OSError as e:  # a cache folder this process cannot write, a full disk
        raise OnnxUnavailable(f"cannot write the ONNX export under {root} ({e}): set FUNNEL_CACHE to a "
                              "writable folder") from e


def _export_locked(model_path: str, precision: str, final: str, target: str) -> str:
    os.makedirs(os.path.dirname(final), exist_ok=True)
    with open(final + ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one exporter per model; the others wait, then find it
        try:
            if not os.path.exists(os.path.join(final, "model.fp32.onnx")):
                failed = final + ".failed"
                if os.path.exists(failed):  # refused before in this cache: do not pay torch again
                    raise ModelNotExportable(open(failed).read().strip() + f" (cached verdict: remove {failed} to retry)")
                log.info("exporting %s to ONNX in %s (once per model)", model_path, final)
                tmp = f"{final}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
                os.makedirs(tmp)
                try:
                    try:
                        _export(model_path, tmp)
                    except (OnnxUnavailable, OSError):
                        raise
                    except Exception as e:  # the exporter or the optimizer cannot take this model
                        raise ModelNotExportable(f"exporting failed ({type(e).__name__}: {e})") from e
                except ModelNotExportable as e:  # about the model, not this machine: keep the verdict
                    with open(failed, "w") as f:
                        f.write(str(e))
                    raise
                finally:
                    if not os.path.exists(os.path.join(tmp, "meta.json")):
                        shutil.rmtree(tmp, ignore_errors=True)
                os.rename(tmp, final)
            if precision == "int8" and not os.path.exists(target):
                try:
                    _quantize(final)
                except (OnnxUnavailable, OSError):
                    raise
                except Exception as e:  # noqa: BLE001 - the quantizer cannot take this graph
                    raise OnnxUnavailable(f"int8 quantization failed ({type(e).__name__}: {e})") from e
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final


# -- run (no torch) ----------------------------------------------------------------------------

_SESSIONS: dict[tuple, object] = {}
_SESSIONS_LOCK = threading.Lock()


def _options(threads: int):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    # Waiting threads sleep instead of spinning: CPU time goes to the work, not the wait.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


def _session(path: str, threads: int):
    """One onnxruntime session per (file, threads) in this process; sessions are thread-safe.

    An int8 graph is loaded as `optimized_graph` saved it, with onnxruntime's optimizations
    off (they are in the file): the same operators, so the same vectors bit for bit, and a
    session made in ~30 ms and 70 MiB instead of ~90 ms and 90 MiB (MiniLM), which is most of
    what a one-query process spends on the embedder. The fp32 graph gains nothing from this
    (its load is the weights' pre-packing), so it loads as exported."""
    key = (path, int(threads))
    with _SESSIONS_LOCK:
        if key not in _SESSIONS:
            import onnxruntime as ort
            so = _options(threads)
            opt = optimized_graph(path) if path.endswith(".int8.onnx") else None
            if opt is not None:
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            _SESSIONS[key] = ort.InferenceSession(opt or path, so, providers=["CPUExecutionProvider"])
        return _SESSIONS[key]


def optimized_graph(path: str) -> str | None:
    """``model.<p>.opt.onnx`` beside ``path``: the graph after onnxruntime's extended (hardware
    independent) optimizations, weights in ``model.<p>.opt.onnx.data``; made on first use under
    the export's lock and published by renaming. None where it cannot be made (a read-only
    cache, an onnxruntime that refuses): the caller loads ``path`` and optimizes at load."""
    opt = path[:-len(".onnx")] + ".opt.onnx"
    if os.path.exists(opt):
        return opt
    try:
        import onnxruntime as ort
        with open(os.path.join(os.path.dirname(path), "optimize.lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not os.path.exists(opt):
                    so = _options(1)
                    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
                    tmp = f"{opt}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
                    so.optimized_model_filepath = tmp  # its weights go to the final .data name, under the lock
                    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                                os.path.basename(opt) + ".data")
                    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                                "1024")
                    try:
                        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
                        os.replace(tmp, opt)
                    finally:
                        if os.path.exists(tmp):
                            os.remove(tmp)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return opt
    except Exception as e:  # noqa: BLE001 - the unoptimized file computes the same vectors, loading slower
        log.info("cannot save an optimized onnxruntime graph beside %s (%s: %s); optimizing at each load",
                 path, type(e).__name__, e)
        return None


class OnnxEncoder:
    """Texts or token ids -> pooled (not yet normalised) vectors, on onnxruntime.

    Parameters
    ----------
    directory : str
        An export (`ensure_exported`).
    precision : {"fp32", "int8"}
    threads : int
        onnxruntime intra-op threads (0: its default, one per core); ``run`` and ``encode`` take
        another count per call. A session per count is made on first use, so a process that
        only embeds queries holds one copy of the weights.

    Texts run one per call, never batched. On a CPU that is the faster way: a batch's
    activations (64 passages of 256 word pieces: ~100 MB in the feed-forward layers) leave the
    caches, and fp32 ran 7-10 passages per CPU second at 64 a call against 15-18 at one. For
    int8 it is also the correct way: dynamic quantization scales each activation tensor by its
    own range, so in a batch a text's vector would depend on the texts (and padding) beside it
    (cosine 0.990 between two batchings of the same SciFact abstracts) and a document's vector
    would differ from the same text's as a query.

    Documents run one at a time on one intra-op thread per core (``threads`` 0), not side by
    side on one thread each: measured by bench_cpu_embed.py on the shared 2-core machine, texts
    side by side embedded 28-30 passages per CPU second and 4-7 per second of wall, against
    31-35 and 9-16 for one text on two intra-op threads (one thread alone: 28-35 and 3-11).
    """

    def __init__(self, directory: str, precision: str, threads: int, meta: dict | None = None):
        self.meta = meta or json.load(open(os.path.join(directory, "meta.json")))
        self.path = os.path.join(directory, f"model.{precision}.onnx")
        self.threads = int(threads)
        with open(os.path.join(directory, "tokenizer.json")) as f:
            self.tokenizer_json = f.read()
        self.tokenize = DocumentTokenizer(self.tokenizer_json, self.meta["max_length"], self.meta["truncation_side"],
                                          self.meta["pad_id"])
        self.modes = list(self.meta["pooling"])

    def run(self, ids: np.ndarray, lengths: np.ndarray, threads: int | None = None) -> np.ndarray:
        """Token ids ``(n, max_length)`` and lengths -> ``(n, dim)`` pooled vectors, in input
        order, one text per onnxruntime call (see the class docstring)."""
        session = _session(self.path, self.threads if threads is None else threads)
        lengths = np.asarray(lengths, dtype=np.int64)
        out = np.zeros((len(lengths), int(self.meta["dim"])), dtype=np.float32)
        for i, n in enumerate(lengths.tolist()):
            x = np.ascontiguousarray(ids[i:i + 1, :max(1, n)], dtype=np.int64)
            h = session.run(None, {"input_ids": x, "attention_mask": np.ones_like(x)})[0]
            out[i] = pool(h, lengths[i:i + 1], self.modes)[0]
        return out

    def encode(self, texts: Sequence[str], threads: int | None = None) -> np.ndarray:
        return self.run(*self.tokenize(list(texts)), threads=threads)


class OnnxProvider(_ProviderBase):
    """A sentence-transformers model run on onnxruntime (no torch once exported).

    The same vectors as `SentenceTransformerProvider` to float
    rounding in fp32 (cosine >= `EXPORT_MIN_COSINE`, checked at export); int8 is a
    faster, slightly different embedder whose fingerprint says so (``precision``).

    Parameters
    ----------
    model : str
        A path or name, resolved by `resolve_model` (offline).
    precision : {"fp32", "int8"}
    normalize, batch_size, query_prompt, document_prompt
        As for the torch provider.
    num_threads : int, optional
        onnxruntime threads for documents (default: one per core).
    query_threads : int, optional
        Threads for one query (default ``$FUNNEL_QUERY_THREADS`` or 1).
    cache_root : str, optional
        Where exports live (default `onnx_cache_root`).

    Raises
    ------
    OnnxUnavailable
        Where the model cannot be exported or onnxruntime is missing.
    """

    kind = "sentence-transformers"
    runtime = "onnx"

    def __init__(self, model: str = "all-MiniLM-L6-v2", precision: str = "fp32", normalize: bool = True,
                 batch_size: int = 64, query_prompt: str = "", document_prompt: str = "",
                 num_threads: int | None = None, query_threads: int | None = None, cache_root: str | None = None):
        self.path = resolve_model(model)
        self.name = canonical_model_name(model)
        self.precision = precision
        self.dir = ensure_exported(self.path, precision, cache_root)
        self.normalize = bool(normalize)
        self.batch_size = int(batch_size)
        self.query_prompt = query_prompt
        self.document_prompt = document_prompt
        self.num_threads = int(num_threads or 0)
        self.query_threads = int(query_threads or default_query_threads())
        self._docs = OnnxEncoder(self.dir, precision, self.num_threads)
        self.meta = self._docs.meta
        self.dim = int(self.meta["dim"])

    def _finish(self, pooled: np.ndarray) -> np.ndarray:
        if self.normalize or self.meta["normalize_module"]:
            pooled = _l2_normalize(pooled)
        return np.ascontiguousarray(pooled, dtype=np.float32)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._finish(self._docs.encode(texts))

    def embed_query(self, text: str) -> np.ndarray:
        """One query -> ``(dim,)`` float32, on ``query_threads`` onnxruntime threads (a session
        of its own, made on the first query)."""
        return self._finish(self._docs.encode([self.query_prompt + text], threads=self.query_threads))[0]

    def embed_tokens(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Token ids from `DocumentTokenizer` -> ``(n, dim)`` vectors."""
        if len(lengths) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._finish(self._docs.run(ids, lengths))

    def tokenizer_spec(self) -> dict:
        """`DocumentTokenizer`'s arguments (the export's tokenizer)."""
        return {"tokenizer_json": self._docs.tokenizer_json, "max_length": int(self.meta["max_length"]),
                "truncation_side": self.meta["truncation_side"], "pad_id": int(self.meta["pad_id"])}

    def splitter_tokenizer(self) -> tuple[str, int, int]:
        """(tokenizer JSON, window in word pieces, special tokens per window) for the passage
        splitter: the same values the torch provider's model gives it."""
        return self._docs.tokenizer_json, int(self.meta["max_length"]), int(self.meta["special_tokens"])
