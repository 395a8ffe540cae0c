#!/usr/bin/env bash
# Everything that needs a GPU, in stages of at most about 10 minutes each, so that each stage fits a job
# time limit (docs/testing.md); its bench, agree, build and multi stages produce BENCHMARKS.md's GPU figures.
# Usage: bash scripts/gpu_suite.sh OUTDIR [STAGE ...]     (default: all stages but quick, in this order)
#   quick   the checks that fit one short job (~7 min on one H100): the GPU cheats beside their
#           twins, bench_eval's single-candidate figures, bench_agreement on conv_groupnorm and softmax@v0
#   tests   the GPU tests (test_gpu_golden, test_evaluate -m gpu, test_cheats -m gpu side by side)
#   small   test_gpu_small_calls alone: three launch-bound problems against bench_agreement's timer,
#           three interleaved rounds each                                           (~5-7 min, estimated)
#   bench   scripts/bench_eval.py: cost per candidate, repeatability, agreement, candidates per hour
#   agree   scripts/bench_agreement.py: the three runtime figures against independent timers (small calls)
#   build   scripts/build_cost.py: whole builds under the four build option sets, nvcc's phases
#   multi   on a machine with 2+ GPUs: the 2-GPU test and bench_eval's throughput rounds
# Results: OUTDIR/*.log and *.md.
set -u
case ${1:-} in -h|--help) sed -n '2,/^# Results/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
OUT=${1:-${OUT:-runs/gpu_suite}}
shift || true
STAGES=${*:-tests small bench agree build multi}
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfEs"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PACEVOLVE_GOLDEN_OUT="$OUT/gpu_golden.md"
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
for stage in $STAGES; do
  t0=$(date +%s)
  case $stage in
    quick)
      timeout 150 $PYTEST -s -m gpu tests/test_cheats.py -k "batch_ or tail_ or twin or slow_reference or oom_ or padded_output" \
        > "$OUT/cheats_gpu.log" 2>&1
      echo "== cheats (GPU)"; grep -E "OBSERVED|twin|passed|failed|Error" "$OUT/cheats_gpu.log" | tail -40
      timeout 120 python3 scripts/bench_eval.py --out "$OUT/bench_eval.md" --new 1 --repeats 4 --budget-s 60 \
        > "$OUT/bench.log" 2>&1
      tail -14 "$OUT/bench.log"
      timeout 200 python3 scripts/bench_agreement.py --problems conv_groupnorm,softmax@v0 --out "$OUT/agreement.md" \
        > "$OUT/agreement.log" 2>&1
      tail -12 "$OUT/agreement.log" ;;
    tests)
      # Side by side: their CUDA builds overlap on the CPU cores, while the evaluator's per-GPU file lock
      # keeps their timings apart.
      for f in test_gpu_golden test_evaluate test_cheats test_light_headers test_gpu_precision test_prompt_background; do
        timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs "tests/$f.py" > "$OUT/$f.log" 2>&1 &
      done
      wait
      for f in test_gpu_golden test_evaluate test_cheats test_light_headers test_gpu_precision test_prompt_background; do echo "== $f"; tail -15 "$OUT/$f.log"; done
      timeout 240 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_build_marker.py > "$OUT/test_build_marker.log" 2>&1
      echo "== test_build_marker (namespace with the hidden key)"; tail -5 "$OUT/test_build_marker.log"
      # A CPU test whose check of a builder's /dev (no GPU node) bites only where the GPU's nodes exist.
      timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_forkserver.py > "$OUT/test_forkserver.log" 2>&1
      echo "== test_forkserver (a builder's /dev on a GPU machine)"; tail -3 "$OUT/test_forkserver.log" ;;
    small)
      # Alone: small calls are timed on the host clock, which builds beside them would disturb.
      timeout 480 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -s tests/test_gpu_small_calls.py > "$OUT/test_gpu_small_calls.log" 2>&1
      echo "== test_gpu_small_calls"; tail -15 "$OUT/test_gpu_small_calls.log" ;;
    bench)
      timeout 560 python3 scripts/bench_eval.py --out "$OUT/bench_eval.md" --k 6 --budget-s 330 > "$OUT/bench.log" 2>&1
      tail -30 "$OUT/bench.log" ;;
    agree)
      timeout 400 python3 scripts/bench_agreement.py --out "$OUT/agreement.md" > "$OUT/agreement.log" 2>&1
      tail -45 "$OUT/agreement.log" ;;
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
