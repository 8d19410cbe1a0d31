"""The embedder on onnxruntime (pipelines/dense/onnx_embed.py): the same vectors as torch's, a search
process that imports no torch, runtimes that never mix in one index, and the fallback to torch.

One export of the bundled MiniLM serves the whole session (``onnx``): it lands in the ONNX
cache under ``$FUNNEL_CACHE`` like the embedding cache, so a rerun on the same machine finds
it. Everything here runs the real model, onnxruntime and torch; no fakes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from funnel.pipelines.dense.embed import (CPU_RUNTIME, EmbeddingCache, SentenceTransformerProvider, fingerprint_key,
                                    make_provider, resolve_model)
from funnel.pipelines.dense.onnx_embed import OnnxProvider, pool
from funnel.serving.dense import check_fingerprint, query_spec

from conftest import write_jsonl

TEXTS = ["What causes rain to fall from clouds?",
         "Rain forms when water vapour in clouds condenses into droplets heavy enough to fall.",
         "",
         "Naïve café résumé — Ünïcödé; numbers 3.14159 and 2,718.",
         "mitochondria " * 400]  # far past the 256-piece window: truncation must match


@pytest.fixture(scope="module")
def torch_provider():
    return SentenceTransformerProvider("all-MiniLM-L6-v2", device="cpu", batch_size=4)


@pytest.fixture(scope="module")
def onnx():
    return OnnxProvider("all-MiniLM-L6-v2", batch_size=4)


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_pooling_formulas_on_a_hand_built_batch():
    # Two rows, width 3, dim 2; the second row has one real token and two padding rows of junk.
    h = np.array([[[1, 2], [3, 4], [5, 9]], [[7, -1], [100, 100], [-100, 100]]], dtype=np.float32)
    lengths = np.array([3, 1])
    assert np.allclose(pool(h, lengths, ["mean"]), [[3, 5], [7, -1]])
    assert np.allclose(pool(h, lengths, ["mean_sqrt_len_tokens"]), [[9 / np.sqrt(3), 15 / np.sqrt(3)], [7, -1]])
    assert np.allclose(pool(h, lengths, ["cls"]), [[1, 2], [7, -1]])
    assert np.allclose(pool(h, lengths, ["max"]), [[5, 9], [7, -1]])
    assert pool(h, lengths, ["cls", "mean"]).shape == (2, 4)
    with pytest.raises(ValueError, match="unknown pooling mode 'lasttoken'; choose one of mean"):
        pool(h, lengths, ["lasttoken"])


def test_onnx_vectors_match_torch(onnx, torch_provider):
    """fp32: queries and documents (padded together, one truncated) at cosine >= 0.999 to torch."""
    docs = _cos(onnx.embed_documents(TEXTS), torch_provider.embed_documents(TEXTS))
    queries = _cos(np.vstack([onnx.embed_query(t) for t in TEXTS]),
                   np.vstack([torch_provider.embed_query(t) for t in TEXTS]))
    assert docs.min() >= 0.999 and queries.min() >= 0.999, (docs, queries)
    assert np.allclose(np.linalg.norm(onnx.embed_documents(TEXTS), axis=1), 1, atol=1e-5)


def test_int8_is_close_but_its_own_embedder(onnx, torch_provider):
    int8 = make_provider({"model": "all-MiniLM-L6-v2", "runtime": "onnx", "precision": "int8"})
    assert isinstance(int8, OnnxProvider) and int8.precision == "int8"
    batched = int8.embed_documents(TEXTS)
    cos = _cos(batched, torch_provider.embed_documents(TEXTS))
    assert cos.min() >= 0.95, cos
    assert int8.fingerprint() != onnx.fingerprint()
    # Dynamic quantization scales a batch by its range: int8 embeds one text at a time, so a
    # text's vector does not depend on its neighbours, and a query equals the same document.
    alone = np.vstack([int8.embed_documents([t]) for t in TEXTS])
    assert _cos(batched, alone).min() >= 0.99999
    assert _cos(int8.embed_query(TEXTS[1]), batched[1]) >= 0.99999
    # The intra-op thread count does not change a text's arithmetic: documents (default
    # threads), one thread and two give the same vectors bit for bit, and so does the query path.
    ids, lengths = int8._docs.tokenize(TEXTS)
    for threads in (1, 2):
        assert np.array_equal(int8._docs.run(ids, lengths, threads=threads), int8._docs.run(ids, lengths))
    assert all(np.array_equal(int8.embed_query(t), v) for t, v in zip(TEXTS, batched))


def test_int8_loads_a_saved_optimized_graph_with_the_same_vectors(tmp_path):
    """The int8 session is made from ``model.int8.opt.onnx`` (saved once, beside the export) with
    onnxruntime's optimizations off: its vectors are bit for bit those of the exported graph
    optimized at load, which the index's documents may have been embedded with."""
    import onnxruntime as ort

    from funnel.pipelines.dense import onnx_embed
    int8 = make_provider({"model": "all-MiniLM-L6-v2", "runtime": "onnx", "precision": "int8"})
    exported = os.path.join(int8.dir, "model.int8.onnx")
    opt = onnx_embed.optimized_graph(exported)
    assert opt == os.path.join(int8.dir, "model.int8.opt.onnx") and os.path.exists(opt + ".data")
    session = onnx_embed._session(exported, 1)
    assert session.get_session_options().graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so = onnx_embed._options(1)
    at_load = ort.InferenceSession(exported, so, providers=["CPUExecutionProvider"])
    ids, lengths = int8._docs.tokenize(TEXTS)
    for i, n in enumerate(lengths.tolist()):
        x = np.ascontiguousarray(ids[i:i + 1, :n], dtype=np.int64)
        feed = {"input_ids": x, "attention_mask": np.ones_like(x)}
        assert np.array_equal(session.run(None, feed)[0], at_load.run(None, feed)[0])
    # Where the optimized graph cannot be saved, the exported one is loaded as before.
    assert onnx_embed.optimized_graph(str(tmp_path / "missing" / "model.int8.onnx")) is None


def test_fingerprints_and_cache_keys_name_runtime_and_precision(onnx, torch_provider, tmp_path):
    int8 = make_provider({"model": "all-MiniLM-L6-v2", "runtime": "onnx", "precision": "int8"})
    fps = [torch_provider.fingerprint(), onnx.fingerprint(), int8.fingerprint()]
    assert [(f["runtime"], f["precision"]) for f in fps] == [("torch", "fp32"), ("onnx", "fp32"), ("onnx", "int8")]
    assert len({fingerprint_key(f) for f in fps}) == 3
    caches = [EmbeddingCache(str(tmp_path), f) for f in fps]
    caches[0].put_many(["h1"], torch_provider.embed_documents(["x"]))
    assert [c.get_many(["h1"])[0][0] for c in caches] == [True, False, False]  # never served across runtimes
    # A fingerprint is a spec that rebuilds the same provider.
    assert make_provider(onnx.fingerprint()).fingerprint() == onnx.fingerprint()


def test_query_runtime_follows_the_index(onnx, torch_provider):
    torch_fp, onnx_fp = torch_provider.fingerprint(), onnx.fingerprint()
    int8_fp = {**onnx_fp, "precision": "int8"}
    legacy = {k: v for k, v in torch_fp.items() if k not in ("runtime", "precision")}  # before runtimes
    for fp in (torch_fp, legacy, {**torch_fp, "precision": "fp16"}, onnx_fp):
        assert query_spec(fp)["runtime"] == "onnx" and query_spec(fp)["precision"] == "fp32"
        check_fingerprint(fp, onnx_fp)  # float vectors: any float runtime queries them
        check_fingerprint(fp, torch_fp)
    assert query_spec(int8_fp)["precision"] == "int8"
    check_fingerprint(int8_fp, int8_fp)
    for other in (onnx_fp, torch_fp):
        with pytest.raises(ValueError, match="int8 and float vectors are different embedders"):
            check_fingerprint(int8_fp, other)
    with pytest.raises(ValueError, match="int8 and float vectors"):
        check_fingerprint(onnx_fp, int8_fp)


def test_unknown_runtime_or_precision_is_refused():
    with pytest.raises(ValueError, match="unknown embedding runtime 'tpu'; choose one of auto, torch, onnx"):
        make_provider({"model": "all-MiniLM-L6-v2", "runtime": "tpu"})
    with pytest.raises(ValueError, match="runtime 'torch' has no precision 'int8'; choose one of fp32, fp16"):
        make_provider({"model": "all-MiniLM-L6-v2", "runtime": "torch", "precision": "int8"})
    with pytest.raises(ValueError, match="use runtime 'torch' for a GPU"):
        make_provider({"model": "all-MiniLM-L6-v2", "runtime": "onnx", "device": "cuda"})


def test_a_model_onnx_cannot_run_falls_back_to_torch_once(tmp_path, caplog, monkeypatch):
    """The fallback, forced the way the docstring of make_provider says: a real model whose
    pooling mode (lasttoken) the ONNX runtime does not implement. Its export is refused, the
    provider is torch's (and says so in its fingerprint), and the warning comes once."""
    monkeypatch.setenv("FUNNEL_CACHE", str(tmp_path / "cache"))
    src = resolve_model("all-MiniLM-L6-v2")
    model = tmp_path / "minilm-lasttoken"
    for d, _, names in os.walk(src):
        rel = os.path.relpath(d, src)
        os.makedirs(model / rel, exist_ok=True)
        for n in names:
            os.symlink(os.path.join(d, n), model / rel / n)
    pooling = model / "1_Pooling" / "config.json"
    pooling.unlink()
    pooling.write_text('{"word_embedding_dimension": 384, "pooling_mode_lasttoken": true}')
    spec = {"model": str(model), "runtime": "onnx", "device": "cpu"}
    with caplog.at_level(logging.WARNING, logger="funnel.pipelines.dense.embed"):
        first, second = make_provider(spec), make_provider(spec)
    assert isinstance(first, SentenceTransformerProvider) and isinstance(second, SentenceTransformerProvider)
    assert (first.fingerprint()["runtime"], first.fingerprint()["precision"]) == ("torch", "fp32")
    warnings = [r.getMessage() for r in caplog.records if "ONNX runtime unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "pooling mode ['lasttoken'] is not implemented" in warnings[0], warnings
    v = first.embed_query("rain")
    assert v.shape == (384,) and abs(float(np.linalg.norm(v)) - 1) < 1e-5


#: The small_dense index built with int8 (by default where int8 is the CPU default).
INT8 = "auto" if CPU_RUNTIME == "onnx-int8" else "onnx-int8"


@pytest.fixture(scope="module")
def small_dense(tmp_path_factory):
    from funnel.jobs.build_index import build
    tmp = tmp_path_factory.mktemp("onnx-ix")
    words = ("rain clouds water vapour droplets condense fall weather storm thunder lightning "
             "protein folding enzyme cell membrane vaccine immune antibody virus").split()
    rows = [{"_id": f"d{i:03d}", "title": f"doc {i}", "text": " ".join(words[(i * 7 + j) % len(words)] for j in range(30))}
            for i in range(40)]
    corpus = write_jsonl(tmp / "c.jsonl", rows)
    roots = {}
    for runtime in ("auto", "torch", "onnx" if CPU_RUNTIME == "onnx-int8" else "onnx-int8"):
        roots[runtime] = str(tmp / runtime)
        build(corpus, roots[runtime], shards=1, dense=True, engine="local", embed_runtime=runtime)
    return roots


def test_builds_record_their_runtime(small_dense):
    from funnel.serving.search import open_index
    got = {}
    for runtime, root in small_dense.items():
        manifest = open_index(root).index.manifest
        fp = manifest["dense"]["fingerprint"]
        got[runtime] = (fp["runtime"], fp["precision"])
        # The engine line estimates the embedding apart (the lexical estimate says it leaves it out).
        reason = manifest["build"]["engine"]["reason"]
        assert reason.startswith("set by --engine local; embedding (--dense, ") and "on a CPU" in reason, reason
    from funnel.jobs.build_index import choose_engine
    assert "in-process without embedding" in choose_engine("auto", 1 << 20, 1, cpus=2)[1]
    names = {"torch": ("torch", "fp32"), "onnx": ("onnx", "fp32"), "onnx-int8": ("onnx", "int8")}
    assert got == {r: names[CPU_RUNTIME if r == "auto" else r] for r in small_dense}  # auto on a CPU: CPU_RUNTIME


def test_a_hybrid_search_process_imports_no_torch(small_dense):
    """`funnel search --mode hybrid` on a CPU-built index (and on a torch-built one: the same
    vectors, queried through onnxruntime) answers without torch, sentence_transformers or
    transformers in the process."""
    for runtime in ("auto", "torch"):
        code = ("import sys; from funnel.serving.frontends.cli import main; "
                f"rc = main(['search', {small_dense[runtime]!r}, 'rain clouds storm', '--mode', 'hybrid', '--k', '3']); "
                "print('MODULES', [m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules], "
                "rc, file=sys.stderr)")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert "MODULES [] 0" in p.stderr, p.stdout[-2000:] + p.stderr[-3000:]
        assert "doc " in p.stdout  # it found documents


def test_queries_embed_with_the_index_runtime_family(small_dense, torch_provider):
    """A torch-built index is served through onnxruntime fp32 with the same rankings as through
    torch; an int8 index is served with int8, and a float query embedder is refused for it."""
    from funnel.serving.search import open_index
    q = "rain clouds storm"
    served = open_index(small_dense["torch"])
    hits = [(h.doc_id, round(h.score, 4)) for h in served.search(q, mode="dense", k=10).hits]
    assert isinstance(served.dense_mode.dense().provider, OnnxProvider)
    by_torch = open_index(small_dense["torch"], embedder=torch_provider)
    assert [(h.doc_id, round(h.score, 4)) for h in by_torch.search(q, mode="dense", k=10).hits] == hits
    int8 = open_index(small_dense[INT8])
    assert int8.search(q, mode="dense", k=3).hits
    assert int8.dense_mode.dense().provider.precision == "int8"
    with pytest.raises(ValueError, match="int8 and float vectors are different embedders"):
        open_index(small_dense[INT8], embedder=torch_provider).search(q, mode="dense", k=3)


def test_warm_loads_the_query_embedder(small_dense):
    """A server's warm-up (VersionSearcher.warm, before it listens) leaves nothing for the first
    hybrid request to load: the dense index is open and its embedder has a session, so that
    request creates no onnxruntime session."""
    from funnel.pipelines.dense import onnx_embed
    from funnel.serving.search import open_index
    ix = open_index(small_dense[INT8])
    assert ix.warm() > 0
    assert ix.dense_mode._dense is not None
    sessions = dict(onnx_embed._SESSIONS)
    assert any(path.endswith("model.int8.onnx") for path, _ in sessions)
    assert ix.search("thunder and lightning", mode="hybrid", k=3).hits
    assert onnx_embed._SESSIONS == sessions


def test_progress_counts_passages_as_they_are_embedded(onnx):
    """What the in-process build's progress line reads (issue 49: a dense build of long documents
    showed 0 passages for 24 minutes): embed_passages reports every ``batch_size`` passages, and
    a document where its last passage is embedded, not when its whole batch is."""
    from funnel.pipelines.dense.embed import EmbedBatch
    from funnel.pipelines.dense.passages import PassageSettings, embed_passages, splitter_spec
    embed = EmbedBatch({"model": "all-MiniLM-L6-v2", "runtime": "onnx", "batch_size": 8})
    spec = splitter_spec(embed.provider, PassageSettings(window=32, split_above=1.0))
    long = " ".join(f"word{i} rain cloud" for i in range(120))
    texts = [long, "a short one", long + " storm"]
    batch = {"title": np.array(["", "", ""], dtype=object), "text": np.array(texts, dtype=object),
             "content_hash": np.array(["h0", "h1", "h2"], dtype=object), "local_id": np.arange(3)}
    calls = []
    vecs, rows = embed_passages(embed, spec, batch, 8, progress=lambda p, d: calls.append((p, d)))
    n = len(vecs)
    assert n > 16 and [p for p, _ in calls] == [min(8, n - j) for j in range(0, n, 8)]
    last = np.flatnonzero(np.append(rows[1][1:] == 0, True))  # a document's last passage
    assert len(last) == 3
    assert [d for _, d in calls] == [int(((last >= j) & (last < j + 8)).sum()) for j in range(0, n, 8)]
    assert calls[0] == (8, 0)  # the first passages of a long document finish no document
