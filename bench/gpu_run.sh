#!/usr/bin/env bash
# The one prepared device script of the GPU levers (`make gpu-run`): on a lent GPU with no network, in under 10 minutes,
#   1. bench/gpu_check.py's checks of every lever next to the paths they replace (groups levers, attention, packing,
#      compile; `make gpu-check` runs the rest);
#   2. bench/bench_gpu.py over the 10 cells (5 pairs x lengths 512 and 128): our side without levers, with the target
#      buffer, and with the buffer and the unpadded encoder, side by side with the references, its results written
#      after every cell and no cell started once its share of the time is spent (regional compilation, 10 steps);
#   3. if time is left: CUDA graphs on bert@512 (the buffer at one shape, compiled whole, mode="reduce-overhead").
# Everything goes to OUT (default bench/results/gpu_<date>_<gpu>/); the exit status is 1 if a step failed.
# SMOKE=1 runs the same steps on CPU at tiny sizes (tests/test_levers.py does) into runs/gpu_run/ (git-ignored).
# CHECKS (gpu_check groups) and PAIRS (bench_gpu pairs) narrow the steps; BUDGET_S is the time they share.
# Offline installs: wheels carried in .whl/ (git-ignored) are installed first when encoder_zoo is not importable.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
if [ -n "${SMOKE:-}" ]; then BUDGET_S=${BUDGET_S:-3600}; else BUDGET_S=${BUDGET_S:-540}; fi
read -r -a checks <<< "${CHECKS:-levers attention packing compile}"
read -r -a pairs <<< "${PAIRS:-spanbert bert teams electra cloze}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONWARNINGS=ignore
started=$SECONDS
if ! "$PYTHON" -c "import encoder_zoo" 2>/dev/null; then
    if [ -d .whl ]; then "$PYTHON" -m pip install -q --no-index --no-deps .whl/*.whl || exit 1; fi
    "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
fi
if [ -n "${SMOKE:-}" ]; then
    smoke=(--smoke)
    OUT=${OUT:-runs/gpu_run}
else
    smoke=()
    gpu=$("$PYTHON" -c "import re, torch; print(re.sub('[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()))")
    OUT=${OUT:-bench/results/gpu_$(date -u +%F)_${gpu%-}}
fi
mkdir -p "$OUT"
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    | tee "$OUT/environment.txt"
status=0
left() { echo $((BUDGET_S - (SECONDS - started))); }

echo "== 1. gpu_check: ${checks[*]} ($(left) s left)"
"$PYTHON" bench/gpu_check.py "${smoke[@]}" --only "${checks[@]}" --results_dir "$OUT" || status=1

echo "== 2. bench_gpu: 10 cells, levers off and on, next to the references ($(left) s left)"
"$PYTHON" bench/bench_gpu.py "${smoke[@]}" --pairs "${pairs[@]}" --compile_scope layers --steps 10 --warmup 3 --keep_going \
    --variants base buffer unpad+buffer --time_limit $(($(left) - 150)) --output "$OUT/bench_levers.json" || status=1

if [ "$(left)" -gt 120 ] || [ -n "${SMOKE:-}" ]; then
    echo "== 3. bench_gpu: CUDA graphs on bert@512 ($(left) s left)"
    "$PYTHON" bench/bench_gpu.py "${smoke[@]}" --pairs bert --seq_lengths 512 --steps 10 --warmup 3 --keep_going \
        --variants buffer buffer+cudagraphs --output "$OUT/bench_cudagraphs.json" || status=1
else
    echo "== 3. skipped: $(left) s left" | tee "$OUT/cudagraphs_skipped.txt"
fi
echo "== done in $((SECONDS - started)) s, exit status $status; results in $OUT"
exit $status
