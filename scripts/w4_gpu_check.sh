#!/usr/bin/env bash
# Issue 18 (4-bit expert weights) on a lent GPU machine (16 cores, H100/H200), in one call of
# under 9 minutes, build included:
#   1. build the CLI and the GPU tests (all cores, sm_90a) into build-dev/
#   2. the W4 / MXFP4 GPU tests: the GEMM vs the CPU reference (both formats, both paths, every
#      split pattern, G = 1..256, odd N / K, poisoned outputs), graph replay vs eager, faults, the
#      layer recipes, the quantizer bit-exact with the CPU and with the independent oracle,
#      the device numerics of the weight form
#   3. groupmm bench gemm --weights nvfp4, then mxfp4 (decode and prefill vs our bf16 engine)
#   4. compute-sanitizer memcheck on a subset (decode + split-K reduce, dequant + CUTLASS, quantize)
#   5. if time is left: GPU tests of the code this issue touched (quantizer, quantized GEMMs)
# The stages share one time budget; a stage that no longer fits is skipped and says so.
# Run from the repository root with the device tool, e.g.
#   run(command="OUT=$OUT bash scripts/w4_gpu_check.sh", carry=[".deps"], timeout_s=600)
# Writes 7 files to $OUT (summary last: w4_summary.txt).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
# Strict GPU mode: a GPU test that finds no usable sm_90 device fails instead of skipping.
export GROUPMM_REQUIRE_GPU=${GROUPMM_REQUIRE_GPU:-1}
B=build-dev
BUDGET=${BUDGET:-535}  # seconds for everything (the tool's limit is 600)
T0=$(date +%s)
SUMMARY="$OUT/w4_summary.txt"
: >"$SUMMARY"
left() { echo $((BUDGET - ($(date +%s) - T0))); }
say() { echo "$*" | tee -a "$SUMMARY"; }
# run_stage NAME MIN_SECONDS MAX_SECONDS LOG CMD...: CMD under timeout min(MAX, time left),
# appending to LOG.
run_stage() {
  local name=$1 min=$2 max=$3 log=$4
  shift 4
  local l
  l=$(left)
  if [ "$l" -lt "$min" ]; then
    say "[$name] SKIPPED: ${l}s left of the ${BUDGET}s budget (needs ${min}s)"
    return 99
  fi
  local t=$((l < max ? l : max)) s
  s=$(date +%s)
  echo "== $name: $*" >>"$log"
  timeout "$t" "$@" >>"$log" 2>&1
  local rc=$?
  if [ $rc -eq 124 ]; then say "[$name] TIMED OUT after ${t}s (log: $log)"; else
    say "[$name] exit $rc in $(($(date +%s) - s))s (log: $log)"; fi
  return $rc
}
# The PASSED / FAILED / SKIPPED lines of the last run in a log (runs start with "== ").
gtest_counts() {
  awk '/^== /{n=0} /^\[  (PASSED|FAILED|SKIPPED) \]/{l[n++]=$0} END{for(i=0;i<n;i++) printf "%s ", l[i]}' "$1"
}

say "== issue 18 W4 GPU check: $(date -u +%FT%TZ), budget ${BUDGET}s"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1; } 2>&1 | tee -a "$SUMMARY"
say "git: $(git log --oneline -1 2>/dev/null)"

# 1. build (the CLI and the GPU tests only)
BLOG="$OUT/w4_build.log"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B $B "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGROUPMM_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" >"$BLOG" 2>&1
if ! run_stage build 60 420 "$BLOG" cmake --build $B -j "${JOBS:-$(nproc)}" --target groupmm_cli groupmm_tests_gpu; then
  grep -E "error|FAILED" -A3 "$BLOG" | head -40 | tee -a "$SUMMARY"
  say "BUILD FAILED: nothing else runs"
  exit 1
fi
for k in w4_decode_kernel w4_dequant_kernel w4_reduce_kernel; do  # registers / spills
  cuobjdump -res-usage $B/libgroupmm.a 2>/dev/null | grep -A1 "$k" | grep -oE "REG:[0-9]+|STACK:[0-9]+" |
    sort | uniq -c | paste -sd' ' | sed "s/^/  $k: /" | tee -a "$SUMMARY"
done

# 2. the GPU tests of this issue
TLOG="$OUT/w4_tests.log"
W4_FILTER='*W4*:*Mxfp4*:*QuantizeGpuOracle*mxfp4*'
run_stage tests 30 150 "$TLOG" ./$B/groupmm_tests_gpu --gtest_brief=1 --gtest_filter="$W4_FILTER"
say "  w4 tests: $(gtest_counts "$TLOG")"
grep -E '^\[  FAILED  \]|Failure$|error:' -A4 "$TLOG" | head -40 | tee -a "$SUMMARY"

# 3. the benchmark, both formats (decode and prefill cases; each validated before it is timed)
BENCH="$OUT/w4_bench.txt"
for w in nvfp4 mxfp4; do
  run_stage "bench_$w" 40 110 "$BENCH" ./$B/groupmm bench gemm --weights $w --iters "${ITERS:-20}" \
    --json "$OUT/w4_bench_$w.json"
done
grep -E '^groupmm bench|^(decode|prefill)_|^    w4_|FAIL|^ok' "$BENCH" | tee -a "$SUMMARY"

# 4. memcheck on a small subset (every kernel: decode + split-K reduce, dequant + CUTLASS, quantize)
MLOG="$OUT/w4_memcheck.log"
MEM_FILTER='*W4GemmGpu.MatchesCpuReference/*G256*:*W4GemmGpu.MatchesCpuReference/*splitk*'
MEM_FILTER+=':*W4GemmGpu.MatchesCpuReference/*odd_shape*:*W4GemmGpuFaults*'
MEM_FILTER+=':*Mxfp4QuantizeGpu.BitExactWithCpu/odd_and_empty*:*Mxfp4QuantizeGpuWeights*'
run_stage memcheck 40 110 "$MLOG" compute-sanitizer --tool memcheck --error-exitcode 9 \
  ./$B/groupmm_tests_gpu --gtest_filter="$MEM_FILTER"
say "  memcheck: $(grep -c 'OK \]' "$MLOG") tests ok; $(grep -E 'ERROR SUMMARY' "$MLOG" | tail -1)"

# 5. regressions in the code this issue touched (quantizer recipes, quantized GEMMs), if time is left
run_stage regressions 60 200 "$TLOG" ./$B/groupmm_tests_gpu --gtest_brief=1 \
  --gtest_filter='*QuantizeGpu*:*QuantizedGemmGpu*:*QnumGpu*:*QuantizedLayerGpu*'
say "  regressions: $(gtest_counts "$TLOG")"
say "== done in $(($(date +%s) - T0))s; logs: $BLOG $TLOG $MLOG $BENCH $SUMMARY"
