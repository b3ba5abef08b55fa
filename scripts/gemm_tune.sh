#!/usr/bin/env bash
# GEMM tuning runs on the lent GPU (device tool; issue 22): stages as arguments, e.g.
#   TESTS=ON GTEST_FILTER="*GemmGpu*" bash scripts/gemm_tune.sh build gtest sweep bench peers
#   build: library + CLI into build-dev (TESTS=ON: the test binaries too)
#   sweep: interleaved --quick sweeps of the heuristic against the candidate tiles
#   order: the same for the wgrad tile order (the heuristic, then each order forced)
#   gtest: the GPU GoogleTest binary in one process (GTEST_FILTER), sanitize: memcheck on a filter
#   bench: the full bf16 suite (validated) as JSON; peers: torch._grouped_mm on the same cases
#   (bench and peers in one call: $OUT is new on every call)
set -uo pipefail
export PATH="/usr/local/cuda/bin:$PATH"
OUT=${OUT:-out}; mkdir -p "$OUT"
B=./build-dev/groupmm
t0=$(date +%s)
stamp() { echo "[$1 $(( $(date +%s) - t0 )) s]"; }
for stage in "$@"; do
case $stage in
build)
  cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DGROUPMM_BUILD_TESTS=${TESTS:-OFF} > "$OUT/build.log" 2>&1
  cmake --build build-dev -j 16 ${TARGET:+--target $TARGET} >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  stamp build; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader ;;
sweep)
  W=auto,wgrad_bf16_bf16_128x256_coop_c21,wgrad_bf16_bf16_128x128_pp_c21
  W32=auto,wgrad_bf16_f32_128x256_coop_c21,wgrad_bf16_f32_128x128_pp_c21
  { timeout 150 $B bench gemm --quick --suite all --pass wgrad --config $W
    timeout 100 $B bench gemm --quick --suite moe --pass wgrad --out fp32 --config $W32; } > "$OUT/sweep.txt" 2>&1
  stamp sweep ;;
order)
  O=auto,auto@along_m,auto@along_n
  { timeout 150 $B bench gemm --quick --suite all --pass wgrad --config $O
    timeout 100 $B bench gemm --quick --suite moe --pass wgrad --out fp32 --config $O; } > "$OUT/order.txt" 2>&1
  stamp order ;;
gtest)
  timeout ${GTEST_TIMEOUT:-300} ./build-dev/groupmm_tests_gpu --gtest_brief=1 ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} > "$OUT/gtest.log" 2>&1
  echo "gtest rc $?"; stamp gtest; grep -E "PASSED|FAILED|tests ran" "$OUT/gtest.log" | tail -8 ;;
sanitize)
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 ./build-dev/groupmm_tests_gpu --gtest_brief=1 --gtest_filter="$SANITIZE_FILTER" > "$OUT/sanitizer.log" 2>&1
  echo "memcheck rc $?"; stamp sanitize; tail -3 "$OUT/sanitizer.log" ;;
bench)
  timeout 300 $B bench gemm --suite ${SUITE:-all} --json "$OUT/gemm.json" > "$OUT/bench_gemm.txt" 2>&1
  stamp bench; tail -2 "$OUT/bench_gemm.txt" ;;
peers)
  PYTHONUNBUFFERED=1 timeout 240 python3 bench/peers_torch.py "$OUT/gemm.json" > "$OUT/bench_gemm_torch.txt" 2>&1
  stamp peers; tail -4 "$OUT/bench_gemm_torch.txt" ;;
esac
done
