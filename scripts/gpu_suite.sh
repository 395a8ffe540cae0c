#!/usr/bin/env bash
# Everything that needs a GPU, in stages that each fit one 10-minute device call.
# Usage: bash scripts/gpu_suite.sh OUTDIR [STAGE ...]     (default: all stages, in this order)
#   tests   the GPU tests (test_gpu_golden, test_evaluate -m gpu, test_cheats -m gpu side by side) and
#           scripts/timing_check.py                                              (~6-8 min on one H200)
#   bench   scripts/bench_eval.py: cost per candidate, repeatability, agreement, candidates per hour
#   build   scripts/build_cost.py: whole builds under the four build option sets, nvcc's phases
#   multi   on a machine with 2+ GPUs: the 2-GPU test and bench_eval's throughput rounds
# Results: OUTDIR/*.log and *.md.
set -u
OUT=${1:-${OUT:-runs/gpu_suite}}
shift || true
STAGES=${*:-tests bench build multi}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PACEVOLVE_GOLDEN_OUT="$OUT/gpu_golden.md"
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
for stage in $STAGES; do
  t0=$(date +%s)
  case $stage in
    tests)
      # Side by side: their CUDA builds overlap on the CPU cores, while the evaluator's per-GPU file lock
      # keeps their timings apart.
      for f in test_gpu_golden test_evaluate test_cheats test_light_headers test_gpu_precision test_background; do
        timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs "tests/$f.py" > "$OUT/$f.log" 2>&1 &
      done
      wait
      for f in test_gpu_golden test_evaluate test_cheats test_light_headers test_gpu_precision test_background; do echo "== $f"; tail -15 "$OUT/$f.log"; done
      timeout 180 python3 scripts/timing_check.py --protocols-s 20 --config default > "$OUT/timing_check.md" 2>&1
      cat "$OUT/timing_check.md" ;;
    bench)
      timeout 560 python3 scripts/bench_eval.py --out "$OUT/bench_eval.md" --k 6 --budget-s 330 > "$OUT/bench.log" 2>&1
      tail -30 "$OUT/bench.log" ;;
    build)
      timeout 560 python3 scripts/build_cost.py > "$OUT/build_cost.md" 2>&1
      cat "$OUT/build_cost.md" ;;
    multi)
      timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_evaluate.py -k multi_gpu \
        > "$OUT/multi_gpu.log" 2>&1
      tail -5 "$OUT/multi_gpu.log"
      timeout 360 python3 scripts/bench_eval.py --only-throughput --out "$OUT/bench_multi.md" --k 8 --budget-s 300 \
        > "$OUT/bench_multi.log" 2>&1
      tail -12 "$OUT/bench_multi.log" ;;
    *) echo "unknown stage $stage" ;;
  esac
  echo "stage $stage took $(( $(date +%s) - t0 )) s"
done
