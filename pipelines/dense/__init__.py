"""Dense retrieval, the build side: passages embedded into FAISS IVF shards.

* `.passages`    each document split into windows the embedder reads whole
* `.embed`       embedding providers, model resolution, the Ray batch callable, the cache
* `.onnx_embed`  a sentence-transformers encoder on onnxruntime, run without torch
* `.vectors`     one coarse quantizer, one IVF index per shard
"""
