#!/usr/bin/env bash
# What issue 33 still needs from a lent GPU, in one call of about 5-7 minutes (the device
# tool's limit is 10): the cuda tests, the weights pass at long context, decode of the
# grouped-query Qwen shape (its heads now handed to SDPA uncopied on CUDA), and the trace
# suite. From the repository root, carrying .gpu-data and .whl:
#
#     OUT=$OUT bash benchmarks/gpu_pending.sh
#
# Under $OUT: pytest.txt; weights.md and weights.json (gpu_weights_pass: is the weights pass
# worth turning on for bfloat16 at 4k and 8k tokens?); t/ (gpu_decode_trace.sh's files:
# gpu_decode for the Qwen shape alone, which needs more than the default 150 s, and
# gpu_trace).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench-results/pending}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" > /dev/null; then
  python -m pip install -q --no-index --no-deps --no-compile --upgrade \
    --target /tmp/attnlab-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/attnlab-site"
fi
step() {  # step LIMIT_SECONDS NAME LOG COMMAND...: its output in LOG, its exit code and time here
  local limit=$1 name=$2 log=$3 start=$SECONDS
  shift 3
  timeout --signal=INT --kill-after=10 "$limit" "$@" > "$log" 2>&1
  echo "$name: exit $? after $(( SECONDS - start )) s (limit $limit s)"
}
xdist=()
python -c "import xdist" 2>/dev/null && xdist=(-n 6)
step 120 pytest "$OUT/pytest.txt" \
  python -m pytest -m cuda -q "${xdist[@]}" -p no:benchmark -p no:cacheprovider -ra
tail -3 "$OUT/pytest.txt"
step 100 gpu_weights_pass "$OUT/weights.md" \
  python -m benchmarks.gpu_weights_pass --out "$OUT/weights.json"
cat "$OUT/weights.md"
GPU_DECODE_SHAPES=qwen2.5-0.5b SUITES="gpu_decode:220 gpu_trace:120" OUT="$OUT/t" \
  bash benchmarks/gpu_decode_trace.sh
