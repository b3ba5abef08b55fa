#!/usr/bin/env bash
# Issue 19 (MoE block) on the lent GPU machine, in one call of under 9 minutes:
#   1. build (all cores) into build-dev/          4. bench moe (qwen3, dsv3, mixtral) -> JSON
#   2. the MoE GPU tests (GPU vs CPU, graphs)     5. the PyTorch peer on the same shapes
#   3. compute-sanitizer memcheck on them         6. demo moe (Qwen3-30B-A3B sized)
# The stages share one time budget; a stage that no longer fits is skipped and says so.
# Usage: OUT=/some/dir bash scripts/moe_gpu_check.sh      (logs and the summary go to $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
B=build-dev
BUDGET=${BUDGET:-530}  # seconds for everything
T0=$(date +%s)
SUMMARY="$OUT/moe_summary.txt"
: >"$SUMMARY"
left() { echo $((BUDGET - ($(date +%s) - T0))); }
say() { echo "$*" | tee -a "$SUMMARY"; }
# run_stage NAME MIN_SECONDS MAX_SECONDS LOG CMD...: runs CMD under timeout min(MAX, time left)
run_stage() {
  local name=$1 min=$2 max=$3 log=$4; shift 4
  local l; l=$(left)
  if [ "$l" -lt "$min" ]; then say "[$name] SKIPPED: ${l}s left of the ${BUDGET}s budget (needs ${min}s)"; return 99; fi
  local t=$((l < max ? l : max)) s=$(date +%s)
  timeout "$t" "$@" >"$log" 2>&1
  local rc=$?
  local d=$(($(date +%s) - s))
  if [ $rc -eq 124 ]; then say "[$name] TIMED OUT after ${t}s (log: $log)";
  else say "[$name] exit $rc in ${d}s (log: $log)"; fi
  return $rc
}

say "== issue 19 MoE GPU check: $(date -u +%FT%TZ), budget ${BUDGET}s"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1; } 2>&1 | tee -a "$SUMMARY"
say "git: $(git log --oneline -1 2>/dev/null)"

# 1. build
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B $B "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >"$OUT/moe_cmake.log" 2>&1
if ! run_stage build 60 330 "$OUT/moe_build.log" cmake --build $B -j 16; then
  tail -40 "$OUT/moe_build.log" | tee -a "$SUMMARY"; say "BUILD FAILED: nothing else runs"; exit 1
fi

# 2. GPU tests of the MoE ops and layer (each compares with the CPU reference; names say what)
FILTER='*RouterGpu*:*RouterGemmGpu*:*PermuteGpu*:*WeightedSwigluGpu*:*MoEGpu*'
run_stage tests 30 120 "$OUT/moe_gpu_tests.log" ./$B/groupmm_tests_gpu --gtest_filter="$FILTER"
say "  $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$OUT/moe_gpu_tests.log" | tr '\n' ' ')"
grep -E '^\[  FAILED  \]|Failure|error' "$OUT/moe_gpu_tests.log" | head -30 | tee -a "$SUMMARY"

# 3. compute-sanitizer memcheck: the ops (every case), then the layer's smallest case and the graph test
memcheck() {  # name filter max_seconds
  run_stage "memcheck_$1" 30 "$3" "$OUT/moe_memcheck_$1.log" compute-sanitizer --tool memcheck \
    --error-exitcode 9 ./$B/groupmm_tests_gpu --gtest_filter="$2"
  say "  memcheck $1: $(grep -c 'OK \]' "$OUT/moe_memcheck_$1.log") tests ok; $(grep -E 'ERROR SUMMARY' "$OUT/moe_memcheck_$1.log" | tail -1)"
}
memcheck ops '*RouterGpu*:*RouterGemmGpu*:*PermuteGpu*:*WeightedSwigluGpu*' 100
memcheck layer '*MoEGpu.*/plain:*MoEGpuGraph*' 100

# 4. the benchmark (forward / forward+backward graphs, stage breakdown, row movers vs copy)
run_stage bench 40 150 "$OUT/moe_bench.txt" ./$B/groupmm bench moe --iters 10 --json "$OUT/moe.json"
grep -E '^== |check:|forward|eager step|permute|unpermute|row movers' "$OUT/moe_bench.txt" | tee -a "$SUMMARY"

# 5. the PyTorch peer on the same shapes, our times next to it
if [ -f "$OUT/moe.json" ]; then
  PYTHONUNBUFFERED=1 run_stage torch_peer 30 120 "$OUT/moe_torch.txt" python3 bench/peers_torch_moe.py "$OUT/moe.json"
  cat "$OUT/moe_torch.txt" | tail -8 | tee -a "$SUMMARY"
else
  say "[torch_peer] SKIPPED: no $OUT/moe.json from the bench"
fi

# 6. the demo (whole block, per-stage table, sampled tokens vs the CPU reference)
run_stage demo 20 60 "$OUT/moe_demo.txt" ./$B/groupmm demo moe
tail -25 "$OUT/moe_demo.txt" | tee -a "$SUMMARY"
say "== done in $(($(date +%s) - T0))s; summary in $SUMMARY"
