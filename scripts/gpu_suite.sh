#!/usr/bin/env bash
# Everything that needs a GPU, in one go (one device call): the GPU tests, then the evaluator benchmark.
# Usage: bash scripts/gpu_suite.sh [OUTDIR]   (results: OUTDIR/*.log, bench_eval.md, timing_check.md, build_cost.md)
# Measured on H200 machines: the tests over 5 min, bench_eval 5.6 min, timing_check and build_cost 1.5-2 min
# each; more than one 10-minute device call holds, so run the tests and the scripts in separate calls.
set -u
OUT=${1:-${OUT:-runs/gpu_suite}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PACEVOLVE_GOLDEN_OUT="$OUT/gpu_golden.md"
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
t0=$(date +%s)
# The three GPU test files run side by side: their CUDA builds overlap on the CPU cores, while the
# evaluator's per-GPU lock (shared cache directory) keeps their timings from overlapping.
for f in test_gpu_golden test_evaluate test_cheats; do
  python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs "tests/$f.py" > "$OUT/$f.log" 2>&1 &
done
wait
for f in test_gpu_golden test_evaluate test_cheats; do echo "== $f"; tail -25 "$OUT/$f.log"; done
echo "GPU tests took $(( $(date +%s) - t0 )) s"
python3 scripts/bench_eval.py --out "$OUT/bench_eval.md" --k 8 --repeats 5 --budget-s "${BENCH_BUDGET_S:-300}" \
  > "$OUT/bench.log" 2>&1
tail -40 "$OUT/bench.log"
python3 scripts/timing_check.py > "$OUT/timing_check.md" 2>&1; cat "$OUT/timing_check.md"
python3 scripts/build_cost.py > "$OUT/build_cost.md" 2>&1; cat "$OUT/build_cost.md"
