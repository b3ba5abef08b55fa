#!/usr/bin/env bash
# On the lent GPU machine: build (all cores), GPU tests, compute-sanitizer, benchmarks.
#   bash scripts/device_check.sh [build] [test] [sanitize] [cli] [bench-gemm] [bench-quant] [ncu-quant] [bench-layer] [demo]
# cli: every command's GPU path once on a small case (exit status and last lines of each).
# Logs go to $OUT (or out/ when unset). Each stage has its own time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
# Strict GPU mode: on this machine a GPU test that finds no usable sm_90 device fails instead of
# skipping (tests/common/test_util.hpp), so a broken driver cannot pass as "all skipped".
export GROUPMM_REQUIRE_GPU=${GROUPMM_REQUIRE_GPU:-1}
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
  # ctest's summary counts skipped tests as passed: report them on their own.
  skipped=$(grep -c '\*\*\*Skipped' "$OUT/gpu_tests.log" || true)
  echo "gpu tests skipped: ${skipped} (GROUPMM_REQUIRE_GPU=${GROUPMM_REQUIRE_GPU})"
  grep '\*\*\*Skipped' "$OUT/gpu_tests.log" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*/  skipped: \1/' | head -20
fi
if has sanitize; then
  filter=${SANITIZE_FILTER:-"*Offsets*:*ConvertGpu*:*GemmGpuGraph*:*GemmGpuFaults*:*forward_bf16_G128*:*wgrad_bf16_G128*:*dgrad_bf16_G4_*:*QuantizeGpu*:*Swizzle*:*SwiGLU*:*Swiglu*:*Dbias*:*GroupedLinear*:*MoE*:*Router*:*Permute*:*WeightedSwiglu*:*QuantizedGemm*decode*:*QuantizedGemmGpuGraph*:*QuantizedGemmGpuFaults*"}
  timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 ./$B/groupmm_tests_gpu --gtest_filter="$filter" \
    >"$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck exit $? ($(grep -c 'OK \]' "$OUT/sanitizer.log") tests ok)"; tail -4 "$OUT/sanitizer.log"
fi
if has cli; then
  cli() {
    local t0=$(date +%s)
    timeout 120 ./$B/groupmm "$@" >"$OUT/cli_last.txt" 2>&1
    local rc=$?
    echo "[cli rc=$rc $(($(date +%s) - t0))s] groupmm $*" | tee -a "$OUT/cli.log"
    tail -${CLI_TAIL:-4} "$OUT/cli_last.txt" >>"$OUT/cli.log"
  }
  : >"$OUT/cli.log"
  cli demo --iters 3
  cli demo moe --iters 3
  cli bench gemm --case qwen3_decode --iters 3
  cli bench gemm --recipe fp8_current --case qwen3_decode --iters 3
  cli bench gemm --recipe fp8_current --fast-accum --case qwen3_gate_up --pass fwd --pattern zipf --iters 3
  cli bench gemm --recipe fp8_block --case qwen3_down --pattern empty25 --iters 3
  cli bench gemm --recipe mxfp8 --case qwen3_gate_up --pattern balanced --iters 3
  cli bench quantize --iters 2
  cli bench layer --iters 3 --pattern balanced
  cli bench layer --recipe fp8_current --case qwen3 --pattern balanced --iters 3
  cli bench moe --case qwen3 --iters 3 --json "$OUT/moe_cli.json"
  rm -f "$OUT/cli_last.txt"
  grep -c "rc=0" "$OUT/cli.log" | sed 's/^/cli commands with exit 0: /'
fi
if has bench-gemm; then
  timeout 420 ./$B/groupmm bench gemm --json "$OUT/gemm.json" ${BENCH_GEMM_ARGS:-} 2>&1 | tee "$OUT/bench_gemm.txt" | tail -5
  # torch's ratio from one process (--ours), which needs the extension; else from the JSON's times
  ours=""
  GROUPMM_BUILD_DIR=$B timeout 300 bash scripts/build_python.sh >"$OUT/build_python.txt" 2>&1 && ours=--ours
  PYTHONUNBUFFERED=1 PYTHONPATH=python timeout 300 python3 bench/peers_torch.py $ours "$OUT/gemm.json" 2>&1 | tee "$OUT/bench_gemm_torch.txt" | tail -8
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
