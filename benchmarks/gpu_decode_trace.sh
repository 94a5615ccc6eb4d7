#!/usr/bin/env bash
# Issue 33's GPU suites on one lent GPU, in about six minutes: tracing, the profile note,
# summaries at long context, decode against the bandwidth, decode against Hugging Face. Run from anywhere in the checkout:
#
#     OUT=/some/dir bash benchmarks/gpu_decode_trace.sh
#
# Per suite, under $OUT (default bench-results/gpu): SUITE.json (the result, rewritten as
# the suite goes, so one stopped by its time limit keeps what it measured), SUITE.md (the
# tables), SUITE.log (stderr). Each suite runs under its own limit (seconds, below; SCALE=2
# doubles them all). Record a result afterwards by copying SUITE.json to benchmarks/results/
# and running python -m benchmarks.report. Without a GPU every suite says so in one line.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench-results/gpu}"
SCALE="${SCALE:-1}"
mkdir -p "$OUT"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
# compiled kernels land here, outside $OUT (they are large and not results)
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/attnlab-inductor}"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
python -c "import torch, transformers; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'transformers', transformers.__version__)" > "$OUT/versions.txt" 2>&1

run() {  # run SUITE LIMIT_SECONDS
  local suite=$1 limit=$(( $2 * SCALE )) start=$SECONDS
  timeout --signal=INT --kill-after=15 "$limit" \
    python -m "benchmarks.$suite" --out "$OUT/$suite.json" > "$OUT/$suite.md" 2> "$OUT/$suite.log"
  local rc=$?
  echo "$suite: exit $rc after $(( SECONDS - start )) s (limit $limit s)$( \
    [ $rc -eq 124 ] && echo ': stopped by its limit; the JSON holds what it finished')"
}

# SUITES picks some, as NAME:SECONDS words, e.g. SUITES="gpu_trace:30 gpu_decode:150"
for item in ${SUITES:-gpu_trace:30 gpu_profile:45 gpu_summaries:90 gpu_bandwidth:75 gpu_decode:150}; do
  run "${item%%:*}" "${item##*:}"
done
# gpu_trace:     GPT-2 small, T=1024, 20 rounds: seconds
# gpu_profile:   four profiled calls; one small compilation (a decode step)
# gpu_summaries: Llama-3.2-1B shape at 8k and 32k, HF eager at 8k
# gpu_bandwidth: 16 GB model drawn on the GPU, one compilation of 32 layers
# gpu_decode:    compilations dominate: 2 shapes x (attnlab + Hugging Face)
echo "results in $OUT"
