#!/usr/bin/env bash
# What issue 33 still needs from a lent GPU, in one call of about 6-9 minutes (the device
# tool's limit is 10): the cuda tests, the summaries and trace suites, and two probes. From
# the repository root, carrying .gpu-data and .whl:
#
#     OUT=$OUT bash benchmarks/gpu_pending.sh
#
# Under $OUT: pytest.txt; t/ (gpu_decode_trace.sh's files for gpu_summaries and gpu_trace);
# blocks.json (gpu_summary_blocks: block sizes, with the context from SDPA, the rows pass,
# and SDPA with its lse, at 32k tokens); gemm.json (gpu_gemm: split products and TF32 for
# the float32 trace, and 3xTF32 Triton linears); gqa.json (gpu_gqa: grouped-query k/v copied
# or handed to SDPA, which decides whether GQA_DEVICES takes cuda).
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
SUITES="gpu_summaries:100" OUT="$OUT/t" bash benchmarks/gpu_decode_trace.sh
step 120 gpu_gemm "$OUT/gemm.txt" python -m benchmarks.gpu_gemm --out "$OUT/gemm.json"
cat "$OUT/gemm.txt"
# after the probe: its 3xTF32 kernels are in triton's cache for gpu_trace's 3xTF32 row
SUITES="gpu_trace:100" OUT="$OUT/t" bash benchmarks/gpu_decode_trace.sh
step 60 gpu_gqa "$OUT/gqa.txt" python -m benchmarks.gpu_gqa --out "$OUT/gqa.json"
cat "$OUT/gqa.txt"
step 90 gpu_summary_blocks "$OUT/blocks.txt" \
  python -m benchmarks.gpu_summary_blocks --out "$OUT/blocks.json"
tail -5 "$OUT/blocks.txt"
