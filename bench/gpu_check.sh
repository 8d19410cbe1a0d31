#!/usr/bin/env bash
# The GPU measurements of issue 42 in one command, for a lent GPU machine with no network.
#
# Needs .gpuchk/ (git-ignored, carried with the call), prepared on a machine with pip:
#   ray-slim.tar.xz    Ray's cp312 wheel unpacked without its Java jars, dashboard front end,
#                      RLlib, Serve and LLM parts (79 MB as a wheel, over the 64 MiB a call carries)
#   faiss-slim.tar.xz  faiss-cpu's cp312 wheel unpacked (no faiss-gpu wheel for CUDA 13 exists)
#   *.whl              jsonschema and what it needs (Ray imports it; the image lacks it)
#   minilm-shape/      all-MiniLM-L6-v2's config.json and tokenizer files, no weights
#   scifact-corpus.jsonl.gz
# Results: $OUT/gpu.json and $OUT/section.md (or ./gpu-out without $OUT). Without CUDA it runs
# the same code on the CPU; pass SMALL=1 for sizes a CPU finishes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
mkdir -p "$SITE"
t0=$(date +%s)
if ! PYTHONPATH=$SITE $PY -c "import ray, faiss" 2>/dev/null; then
  xz -dc .gpuchk/ray-slim.tar.xz | tar x -C "$SITE" || exit 1
  xz -dc .gpuchk/faiss-slim.tar.xz | tar x -C "$SITE" || exit 1
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpuchk/*.whl || exit 1
fi
# funnel's packages install under the `funnel` namespace (pyproject's package-dir): mirror that.
mkdir -p /tmp/fpkg/funnel && touch /tmp/fpkg/funnel/__init__.py
for d in pipelines jobs serving evaluation; do ln -sfn "$PWD/$d" /tmp/fpkg/funnel/$d; done
export PYTHONPATH=$SITE:/tmp/fpkg${PYTHONPATH:+:$PYTHONPATH}
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=true
echo "setup $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version,utilization.gpu --format=csv 2>/dev/null || echo "no nvidia-smi"
$PY -c "import torch, ray, faiss, tokenizers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'ray', ray.__version__, 'faiss', faiss.__version__, 'tokenizers', tokenizers.__version__)"

if [ -n "${ARGS:-}" ]; then  # the sizes and parts, given whole
  SIZES=$ARGS
elif [ "${SMALL:-0}" = 1 ]; then
  SIZES="--docs 16 --encode-docs 8 --sweep-docs 8 --ray-batch 8 --model-batch 4 --forward-batches 4 --tokenize-actors 1 --ray-pretokenized --dense-stage-docs 16 --faiss-n 12000 --faiss-queries 100"
else
  SIZES="--docs ${DOCS:-200000} --encode-docs ${ENCODE_DOCS:-20000} --ray-batch 1024 --model-batch 1024 --forward-batches 64,256,1024 --tokenize-actors ${TOK_ACTORS:-1,4} --dense-stage-docs ${DENSE_DOCS:-100000} --faiss-n ${FAISS_N:-1000000} --faiss-queries 10000"
fi
timeout ${PY_TIMEOUT:-390} $PY bench/bench_dense.py --gpu --corpus .gpuchk/scifact-corpus.jsonl.gz --shape .gpuchk/minilm-shape \
  $SIZES --dense-stage --deadline ${DEADLINE:-260} --json "$OUT/gpu.json" 2>&1 | grep -v -E "Writing model shards|it/s\]" | tee "$OUT/log.txt" | tail -c 200000 > /dev/null
rc=${PIPESTATUS[0]}
sed -n '/<!-- dense-gpu:start -->/,/<!-- dense-gpu:end -->/p' "$OUT/log.txt" > "$OUT/section.md"
cat "$OUT/section.md"
grep -E "Error|Traceback|failed" "$OUT/log.txt" | head -20
echo "total $(( $(date +%s) - t0 )) s, rc $rc"
exit $rc
