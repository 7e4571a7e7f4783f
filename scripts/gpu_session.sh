#!/usr/bin/env bash
# The GPU issue's steps on a lent GPU machine (the device tool), in the issue's order, sized for
# a lease of 15 minutes of device time. That machine has PyTorch, transformers and pytest but
# neither Ray nor Optuna nor pydantic, and no package index: their wheels travel with the call,
# and the search runs without Ray (--executor local).
#
#   here:   bash scripts/gpu_session.sh wheels          # .whl/ (git-ignored, about 9 MB)
#   there:  run(command="bash scripts/gpu_session.sh lease", carry=[".whl"], timeout_s=600)
#           then, at once (a machine left idle 30 s goes back), what it says is left:
#           run(command="bash scripts/gpu_session.sh search", carry=[".whl"], timeout_s=...)
#   or one step at a time: tests | memory | search (run search again until it says done: it
#   resumes from its study, which a warm machine keeps in results/tmp/) | landscape (step 4:
#   records as much of a landscape as fits and stops; its state comes back in $OUT: copy it to
#   results/gpu/ and commit it, and the next lease, on the same kind of GPU, goes on from it)
#
# What one lease measured (H200, 2026-11-26; results/gpu/): the machine started in about 30 s;
# the gpu tests ran 17 in about 110 s (the CUDA-graph, FSDP and TF32 ones are the slow ones);
# the memory grid took about 15 s a configuration (a third of it the trace, which now runs
# here: --measure-only there, --rescore here); a search of GPT-2 small
# took 17 s for its fp32 baseline and 25-48 s for each compiled trial (9 trials in 290 s). So a
# default search (20 trials, the race, the verification) does not fit beside the rest: `lease`
# runs the tests not yet seen passing first, then a search of fewer trials.
#
# Everything lands under $OUT (the device tool fetches at most 8 files; here: results/tmp/gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/tmp/gpu}
mkdir -p "$OUT" results/tmp
PY=${PYTHON:-python3}
MODEL=${MODEL:-examples/hf_models.py:gpt2_small_1k}
NOT_YET_SEEN="matmul_precision or gathered or offloading or one_block or expandable or cuda_graphs or optimizer"

setup() {
  if [ ! -d /tmp/site/optuna ]; then  # beside the image's packages, not over them
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      .whl/*.whl 2>&1 | tail -3
  fi
  export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/device.txt"
  "$PY" -c "import torch; print('torch', torch.__version__)" >>"$OUT/device.txt"
  cat "$OUT/device.txt"
}

tests() {  # 1. the gpu tests (TESTS: a -k expression; default all)
  timeout "${TESTS_S:-540}" "$PY" -m pytest -m gpu tests/runner/test_gpu.py -p no:cacheprovider \
    -q -rA --timeout 90 -k "${TESTS:-gpu or not gpu}" 2>&1 | tee -a "$OUT/gpu_tests.log" \
    | tail -30 || true
}

memory() {  # 2. the allocator's peak and reserved peak of a grid, measured; traced and scored
            #    back here: bench_memory_prediction.py --rescore memory_prediction_cuda.json
  timeout "${MEMORY_S:-540}" "$PY" scripts/bench_memory_prediction.py --device cuda \
    --measure-only --plan-model "" \
    --models ${MEMORY_MODELS:-workloads.convnet:resnet18 workloads.gpt:gpt2_124m} \
    --amp ${MEMORY_AMP:-off bf16} --out "$OUT/memory_prediction_cuda.json" 2>&1 \
    | tee "$OUT/memory_prediction_cuda.log" | tail -40 || true
}

search() {  # 3. a search of GPT-2 small (1,024 tokens): recipe, baseline, speed-ups, MFU
  local status=0
  timeout "${SEARCH_S:-540}" "$PY" -m autotune.cli search --model "$MODEL" \
    --executor local --storage results/tmp/gpu_search.db --json ${SEARCH_ARGS:-} \
    --out "$OUT/search_best.yaml" --report "$OUT/search_report.html" \
    >"$OUT/search.json" 2>>"$OUT/search.log" || status=$?
  tail -30 "$OUT/search.log"
  if [ "$status" = 124 ]; then echo "not done: run the same step again (it resumes)"; else echo "done ($status)"; fi
}

landscape() {  # 4. one device's knobs for that model (search_spaces/gpu_single.yaml), over leases
  local tag state status=0
  tag=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h[0-9]{3}' \
    | tr 'H' 'h' || echo gpu)
  state=results/gpu/${tag}_$(basename "${MODEL##*:}")_landscape_state.json
  timeout "${LANDSCAPE_S:-580}" "$PY" scripts/record_landscape.py --model "$MODEL" \
    --space search_spaces/gpu_single.yaml --device cuda --until-s "${LANDSCAPE_UNTIL_S:-540}" \
    --state "$state" --out "$OUT/${tag}_$(basename "${MODEL##*:}").json" 2>&1 \
    | tee -a "$OUT/landscape.log" | tail -30 || status=$?
  if [ -f "$state" ]; then cp "$state" "$OUT/"; fi
  echo "landscape: exit $status (3: runs left; the state is in \$OUT, copy it to $state)"
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
  lease)  # one call of at most 600 s: unseen tests, then a search of 8 trials
    start=$SECONDS
    setup
    TESTS=${TESTS:-$NOT_YET_SEEN} TESTS_S=150 tests
    SEARCH_S=$((570 - (SECONDS - start))) SEARCH_ARGS=${SEARCH_ARGS:---trials 8} search
    ;;
  tests) setup; tests ;;
  memory) setup; memory ;;
  search) setup; search ;;
  landscape) setup; landscape ;;
  *)
    echo "usage: bash scripts/gpu_session.sh wheels|lease|tests|memory|search|landscape" >&2
    exit 2
    ;;
esac
