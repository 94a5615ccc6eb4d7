#!/usr/bin/env bash
# What issue 33 still needs from a lent GPU, in one call of about 4-6 minutes (the device
# tool's limit is 10): the cuda tests, then the summaries, trace and decode suites. From the
# repository root, carrying .gpu-data and .whl:
#
#     OUT=$OUT bash benchmarks/gpu_pending.sh
#
# Under $OUT: pytest.txt; t/ (gpu_decode_trace.sh's files: gpu_summaries with the forward's
# lse measured (LSE_FROM_FORWARD), gpu_trace with the weights pass (WEIGHTS_FROM_LSE) and its
# tiles, gpu_decode with grouped-query heads handed to SDPA on CUDA).
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
SUITES="gpu_summaries:100 gpu_trace:120 gpu_decode:150" OUT="$OUT/t" \
  bash benchmarks/gpu_decode_trace.sh
