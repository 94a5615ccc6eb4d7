#!/usr/bin/env bash
# What a lent GPU can still run for issue 33, in one call of about 4 minutes: the cuda tests,
# the weights pass against the explicit path from 1k to 8k tokens (7 alternating rounds a
# way), GPT-2 small's trace in bfloat16 beside Hugging Face's (never run on a GPU yet), and a
# soft-capped forward whole or in tiles (whether explicit.TILE_DEVICES should take cuda).
# From the repository root, carrying .whl:
#
#     OUT=$OUT bash benchmarks/gpu_pending.sh
#
# Under $OUT: pytest.txt; weights.md and weights.json (gpu_weights_pass); trace_bf16.md and
# trace_bf16.json (gpu_trace in bfloat16); capped.md and capped.json (gpu_capped).
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
step 150 gpu_weights_pass "$OUT/weights.md" \
  python -m benchmarks.gpu_weights_pass --out "$OUT/weights.json"
cat "$OUT/weights.md"
GPU_TRACE_DTYPE=bfloat16 step 150 gpu_trace_bf16 "$OUT/trace_bf16.md" \
  python -m benchmarks.gpu_trace --out "$OUT/trace_bf16.json"
cat "$OUT/trace_bf16.md"
step 90 gpu_capped "$OUT/capped.md" \
  python -m benchmarks.gpu_capped --out "$OUT/capped.json"
cat "$OUT/capped.md"
