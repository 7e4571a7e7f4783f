#!/usr/bin/env bash
# The GPU issue's steps on a lent GPU machine (the device tool), one short command each, in the
# issue's order. That machine has PyTorch, transformers and pytest but neither Ray nor Optuna
# nor pydantic, and no package index: their wheels travel with the call, and the search runs
# without Ray (--executor local).
#
#   here:   bash scripts/gpu_session.sh wheels          # .whl/ (git-ignored, about 9 MB)
#   there:  run(command="bash scripts/gpu_session.sh tests", carry=[".whl"])
#           ... then memory, search (run it again until it says done: it resumes)
#
# Everything lands under $OUT (the device tool fetches it; here: results/tmp/gpu). The study
# database lives in results/tmp/ (git-ignored), which a warm device machine keeps between calls.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/tmp/gpu}
mkdir -p "$OUT" results/tmp
PY=${PYTHON:-python3}

setup() {
  "$PY" -m pip install -q --no-index --find-links .whl "optuna>=5.0" "pydantic>=2.6" 2>&1 | tail -3
  export PYTHONPATH=$PWD
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/device.txt"
  "$PY" -c "import torch; print('torch', torch.__version__)" >>"$OUT/device.txt"
  cat "$OUT/device.txt"
}

case "${1:-}" in
  wheels)  # here: what the device image lacks, for its Python 3.12 (numpy is there already)
    rm -rf .whl
    "$PY" -m pip download -q -d .whl --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      "optuna>=5.0" "pydantic>=2.6"
    rm -f .whl/numpy-*.whl
    du -sh .whl
    ;;
  tests)  # 1. every gpu test (TF32, expandable segments, fused optimizer, CUDA graphs with
          #    accumulation, FSDP2 resharding, policy and offload, the user's optimizer, ...)
    setup
    "$PY" -m pytest -m gpu tests/runner/test_gpu.py -p no:cacheprovider -q -rA \
      2>&1 | tee "$OUT/gpu_tests.log" | tail -40
    ;;
  memory)  # 2. predicted against the allocator's peak and reserved peak, and the CPU-made trace
    setup
    "$PY" scripts/bench_memory_prediction.py --device cuda --plan-model "" \
      --models workloads.gpt:gpt2_124m workloads.convnet:resnet18 \
      --out "$OUT/memory_prediction_cuda.json" 2>&1 | tee "$OUT/memory_prediction_cuda.log" | tail -60
    ;;
  search)  # 3. a default search of Hugging Face GPT-2 small: recipe, baseline, speed-ups, MFU
    setup
    status=0
    timeout 540 "$PY" -m autotune.cli search --model examples/hf_models.py:gpt2_small \
      --executor local --storage results/tmp/gpu_gpt2_small.db --json \
      --out "$OUT/gpt2_small_best.yaml" --report "$OUT/gpt2_small_report.html" \
      >"$OUT/gpt2_small_search.json" 2>>"$OUT/gpt2_small_search.log" || status=$?
    tail -30 "$OUT/gpt2_small_search.log"
    if [ "$status" = 124 ]; then echo "not done: run the same step again (it resumes)"; else echo "done ($status)"; fi
    ;;
  *)
    echo "usage: bash scripts/gpu_session.sh wheels|tests|memory|search" >&2
    exit 2
    ;;
esac
