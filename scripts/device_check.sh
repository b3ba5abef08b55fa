#!/usr/bin/env bash
# On the lent GPU machine: build (all cores), GPU tests, compute-sanitizer, benchmarks.
#   bash scripts/device_check.sh [build] [test] [sanitize] [bench-gemm] [bench-quant] [ncu-quant] [bench-layer] [demo]
# Logs go to $OUT (or out/ when unset). Each stage has its own time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
stages=" ${*:-build test sanitize bench-gemm} "
has() { [[ "$stages" == *" $1 "* ]]; }
B=build-dev

if has build; then
  { nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv; nvcc --version | tail -1; } 2>&1 | tee "$OUT/build.log"
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B $B "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >>"$OUT/build.log" 2>&1
  ( time cmake --build $B -j "$(nproc)" ) >>"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; echo BUILD FAILED; exit 1; }
  tail -3 "$OUT/build.log"
  ./$B/groupmm info
fi
if has test; then
  (cd $B && timeout 400 ctest -L gpu --output-on-failure -j 1 --timeout 150) >"$OUT/gpu_tests.log" 2>&1
  grep -E "tests passed|tests failed|Failed|\*\*\*|Not Run" "$OUT/gpu_tests.log" | grep -v "Skipped" | tail -25
fi
if has sanitize; then
  filter=${SANITIZE_FILTER:-"*Offsets*:*ConvertGpu*:*GemmGpuGraph*:*GemmGpuFaults*:*forward_bf16_G128*:*wgrad_bf16_G128*:*dgrad_bf16_G4_*:*Quant*:*Swizzle*:*SwiGLU*:*Swiglu*:*Dbias*:*GroupedLinear*"}
  timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 ./$B/groupmm_tests_gpu --gtest_filter="$filter" \
    >"$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck exit $? ($(grep -c 'OK \]' "$OUT/sanitizer.log") tests ok)"; tail -4 "$OUT/sanitizer.log"
fi
if has bench-gemm; then
  timeout 420 ./$B/groupmm bench gemm --json "$OUT/gemm.json" ${BENCH_GEMM_ARGS:-} 2>&1 | tee "$OUT/bench_gemm.txt" | tail -5
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers_torch.py "$OUT/gemm.json" 2>&1 | tee "$OUT/bench_gemm_torch.txt" | tail -8
fi
if has bench-quant; then timeout 200 ./$B/groupmm bench quantize 2>&1 | tee "$OUT/bench_quant.txt" | tail -30; fi
if has ncu-quant; then  # NCU_CASES="recipe/direction ..." on [65536, 7168]
  for c in ${NCU_CASES:-mxfp8/both nvfp4/rowwise}; do
    timeout 240 ncu --clock-control none -k regex:quantize_tile_kernel --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
      --section MemoryWorkloadAnalysis --section Occupancy --section SourceCounters \
      ./$B/groupmm bench quantize --recipe "${c%/*}" --direction "${c#*/}" --shape 65536x7168 --iters 1 \
      >"$OUT/ncu_${c%/*}_${c#*/}.txt" 2>&1
    echo "ncu $c: exit $?"; grep -E "Duration|DRAM Throughput|Executed Ipc A|Issue Slots Busy|No Eligible" "$OUT/ncu_${c%/*}_${c#*/}.txt" | head -8
  done
fi
if has bench-layer; then timeout 200 ./$B/groupmm bench layer 2>&1 | tee "$OUT/bench_layer.txt" | tail -20; fi
if has demo; then timeout 120 ./$B/groupmm demo 2>&1 | tee "$OUT/demo.txt" | tail -30; fi
