#!/usr/bin/env bash
# On the lent GPU machine: build, FP8 GEMM / quantized-layer tests, sanitizer, FP8 bench.
#   bash scripts/device_fp8.sh [build] [test] [sanitize] [bench] [layer]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
stages=" ${*:-build test sanitize bench} "
has() { [[ "$stages" == *" $1 "* ]]; }
B=build-dev
if has build; then
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/build.log"
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >>"$OUT/build.log" 2>&1
  ( time cmake --build $B -j 16 ) >>"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60; echo BUILD FAILED; exit 1; }
  tail -4 "$OUT/build.log"
fi
if has test; then
  timeout 120 ./$B/groupmm_tests_cpu --gtest_brief=1 --gtest_filter="${CPU_FILTER:-*Quantized*:*Gemm*:*GroupedLinear*}" >"$OUT/cpu_tests.log" 2>&1
  echo "cpu tests exit $?"; tail -3 "$OUT/cpu_tests.log"
  timeout 300 ./$B/groupmm_tests_gpu --gtest_brief=1 --gtest_filter="${GPU_FILTER:-*Quantized*:*Gemm*:*GroupedLinear*}" >"$OUT/gpu_tests.log" 2>&1
  echo "gpu tests exit $?"; grep -E "FAILED|PASSED|Failure|error|accuracy" "$OUT/gpu_tests.log" | head -40
fi
if has sanitize; then
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 ./$B/groupmm_tests_gpu \
    --gtest_filter="${SAN_FILTER:-*QuantizedGemmGpu*zipf*:*QuantizedGemmGpuGraph*:*QuantizedGemmGpuFaults*}" >"$OUT/sanitizer.log" 2>&1
  echo "memcheck exit $?"; tail -3 "$OUT/sanitizer.log"
fi
if has bench; then
  for r in ${RECIPES:-fp8_current fp8_block}; do
    timeout 200 ./$B/groupmm bench gemm --recipe $r ${BENCH_ARGS:-} --json "$OUT/gemm_$r.json" 2>&1 | tee "$OUT/bench_$r.txt" | grep -vE "^$" | tail -40
    PYTHONUNBUFFERED=1 timeout 200 python3 bench/peers_torch.py "$OUT/gemm_$r.json" 2>&1 | tee "$OUT/bench_${r}_torch.txt" | tail -40
  done
fi
if has bench16; then
  timeout 250 ./$B/groupmm bench gemm ${BENCH16_ARGS:-} --json "$OUT/gemm_bf16.json" 2>&1 | tee "$OUT/bench_bf16.txt" | tail -30
fi
if has tune; then  # TUNE="recipe:pass:config ..." on --case ${TUNE_CASE:-dsv3}, balanced
  for t in ${TUNE:-}; do
    IFS=: read -r r p c <<<"$t"
    extra=""; [ "$c" = fast ] && { extra="--fast-accum"; c=""; }
    ./$B/groupmm bench gemm --recipe $r --pass $p ${c:+--config $c} $extra --case ${TUNE_CASE:-dsv3} --pattern balanced --iters 10 2>&1 | grep -E "^(dsv3|mixtral|qwen3|llama|contig)" | sed "s/^/[$r $p ${c:-default}] /"
  done
fi
if has layer; then
  for r in ${RECIPES:-fp8_current fp8_block}; do
    timeout 200 ./$B/groupmm bench layer --recipe $r ${LAYER_ARGS:-} 2>&1 | tee "$OUT/layer_$r.txt" | tail -10
  done
fi
