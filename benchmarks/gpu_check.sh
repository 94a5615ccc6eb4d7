#!/usr/bin/env bash
# The one GPU check of attnlab (docs/gpu.md#the-gpu-check). On a CUDA machine, from the
# repository root: `bash benchmarks/gpu_check.sh`. It writes under $OUT (default ./gpu-check):
#   device.txt       the GPU, its driver, torch, and both exit codes
#   pytest-cuda.txt  python -m pytest tests/cuda -m cuda -q: every test marked cuda
#   gpu_train.md     nanoGPT vs attnlab side by side (benchmarks/gpu_train.py), and .json
#   gpu_train.log    the side-by-side's output
# It ends within about 6.5 minutes: pytest is stopped at 120 s, the side-by-side at 240 s.
#
# Needs torch with CUDA, numpy, safetensors, tqdm, matplotlib, tokenizers, transformers,
# httpx, pytest and hypothesis (a GPU image usually has them). FastAPI and uvicorn, for the
# serve test, travel as wheels in .whl/ (docs/gpu.md says how to fetch them); without them
# that test is skipped. Tiny Shakespeare is read from $DATA (default
# .gpu-data/tinyshakespeare.txt, else ../shared/data/tinyshakespeare.txt).
#
# GPU_CHECK_SMOKE=1 runs the same steps on a machine without a GPU: the cuda tests on the CPU
# (ATTNLAB_TEST_DEVICE=cpu, compile and torchrun left out) and the side-by-side at toy sizes.
# That checks the script, not a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/attnlab-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/attnlab-site"
fi
DATA="${DATA:-.gpu-data/tinyshakespeare.txt}"
[ -f "$DATA" ] || DATA=../shared/data/tinyshakespeare.txt

# every test marked cuda (tests/cuda and the few beside their CPU twins); six at a time
# where pytest-xdist is installed (pytest-benchmark refuses to run beside it)
pytest_flags=(-m cuda -q -p no:cacheprovider -p no:benchmark -ra)
"$PY" -c "import xdist" 2>/dev/null && pytest_flags+=(-n 6)
bench_flags=(--data "$DATA" --out "$OUT")
if [ "${GPU_CHECK_SMOKE:-0}" = 1 ]; then
  export ATTNLAB_TEST_DEVICE=cpu
  pytest_flags+=(-k "not compiled and not torchrun")
  bench_flags+=(--smoke)
fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  "$PY" -c 'import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else "(no GPU)")'
} > "$OUT/device.txt"
cat "$OUT/device.txt"

timeout -k 10 120 "$PY" -m pytest "${pytest_flags[@]}" 2>&1 | tee "$OUT/pytest-cuda.txt"
pytest_rc=${PIPESTATUS[0]}

if [ -f "$DATA" ]; then
  timeout -k 10 240 "$PY" -m benchmarks.gpu_train "${bench_flags[@]}" 2>&1 \
    | tee "$OUT/gpu_train.log"
  bench_rc=${PIPESTATUS[0]}
else
  echo "no tiny Shakespeare at $DATA: copy it there (docs/gpu.md#the-gpu-check)" \
    | tee "$OUT/gpu_train.log"
  bench_rc=1
fi

echo "exit codes: pytest $pytest_rc, side-by-side $bench_rc" | tee -a "$OUT/device.txt"
[ "$pytest_rc" = 0 ] && [ "$bench_rc" = 0 ]
