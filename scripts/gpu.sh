#!/usr/bin/env bash
# The GPU machine's script: stages run in the order given, logs and JSON under ${OUT:-out}.
#   bash scripts/gpu.sh build test sanitize cli bench-gemm bench-quantize bench-layer bench-moe \
#                       bench-ep bench-w4 python ncu tune ab demo
#   bash scripts/gpu.sh                 # build test sanitize bench-gemm
#   bash scripts/gpu.sh --list          # the stages and their knobs
#   bash scripts/gpu.sh prepare-ab REV  # here, where git works: REV's source for the ab stage
# Every stage runs under a time limit, min(its own, what is left of BUDGET seconds, default 570):
# a stage that no longer fits is skipped and says so. A summary line per stage goes to
# $OUT/summary.txt. Tests run in strict GPU mode (GROUPMM_REQUIRE_GPU=1): a GPU test that finds
# no usable sm_90 device fails instead of skipping.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-out}
B=${BUILD_DIR:-build-dev}
BIN=./$B/groupmm
AB_OLD=${AB_OLD:-build-ab-old}
export PATH="/usr/local/cuda/bin:$PATH" GROUPMM_REQUIRE_GPU=${GROUPMM_REQUIRE_GPU:-1}
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1 PYTHONUNBUFFERED=1

stages_help() {
  cat <<'EOF'
stages (knobs are environment variables):
  build           configure $BUILD_DIR (build-dev) for sm_90a and build it all (JOBS, TARGETS)
  test            the GPU tests, one process per GPU (gtest shards; FILTER), CTEST=1: ctest -L gpu
  sanitize        compute-sanitizer memcheck on SANITIZE_FILTER; racecheck on RACECHECK_FILTER
  cli             every command's GPU path once on a small case (exit status, last lines)
  bench-gemm      bench gemm per recipe of RECIPES (bf16) --json, bench/peers_torch.py (BENCH_GEMM_ARGS)
  bench-quantize  bench quantize --json (BENCH_QUANTIZE_ARGS)
  bench-layer     bench layer, and --recipe per quantized recipe of RECIPES (BENCH_LAYER_ARGS)
  bench-moe       bench moe --json, then bench/peers_torch_moe.py (BENCH_MOE_ARGS)
  bench-ep        bench ep, bench moe --ep capacity: a process per GPU (torchrun) when several
  bench-w4        bench gemm --weights nvfp4, then mxfp4 --json (ITERS)
  peers           bench/peers_w4.py, peers_serving_w4.py, peers_deepgemm.py --json (+ .peers on PYTHONPATH)
  python          the torch extension against $BUILD_DIR, then pytest tests/python on the GPU
  ncu             Nsight Compute: NCU_KERNEL of NCU_CMD (bench quantize) per NCU_CASES, NCU_SOURCE=1: + SASS regions
  tune            bench gemm --quick sweeps: TUNE ("ARGS;ARGS;...", default the wgrad tiles)
  ab              $AB_OLD (prepare-ab REV) vs this tree, old new new old: quantize, AB_GEMM_CASES
  demo            demo and demo moe at their GPU sizes
EOF
}
log() { echo "$*" | tee -a "$OUT/summary.txt"; }
BUDGET=${BUDGET:-570}
T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0))); }
# run NAME LIMIT LOG CMD...: CMD under timeout min(LIMIT, time left), output appended to LOG.
run() {
  local name=$1 limit=$2 out=$3 l s rc
  shift 3
  l=$(left)
  if [ "$l" -lt 20 ]; then log "[$name] SKIPPED: ${l}s left of ${BUDGET}s"; return 99; fi
  s=$(date +%s)
  echo "== $*" >>"$out"
  timeout $((limit < l ? limit : l)) "$@" >>"$out" 2>&1
  rc=$?
  log "[$name] exit $rc in $(($(date +%s) - s))s: $* (log: $out)"
  return $rc
}
gtest_counts() { grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$1" | tail -3 | tr '\n' ' '; }
torch_peers() {  # JSON: torch._grouped_mm's ratio, in the same process (--ours) when it builds
  local ours=""
  GROUPMM_BUILD_DIR=$B timeout 300 bash scripts/build_python.sh >"$OUT/build_python.log" 2>&1 && ours=--ours
  run peers 300 "$OUT/bench_gemm_torch.txt" python3 bench/peers_torch.py $ours "$1"
}

stage_build() {
  { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1
    git log --oneline -1 2>/dev/null; } 2>&1 | tee -a "$OUT/summary.txt"
  local gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$B" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGROUPMM_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" >"$OUT/build.log" 2>&1
  # shellcheck disable=SC2086
  run build 540 "$OUT/build.log" cmake --build "$B" -j "${JOBS:-$(nproc)}" ${TARGETS:+--target $TARGETS} ||
    { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40; log "BUILD FAILED: nothing else runs"; exit 1; }
  "$BIN" info | tee -a "$OUT/summary.txt"
}
stage_test() {  # one process per GPU, the tests sharded over them (ctest's process per test is slow)
  local n s
  if [ -n "${CTEST:-}" ]; then
    run test 400 "$OUT/gpu_tests.log" ctest --test-dir "$B" -L gpu --output-on-failure --timeout 150
    grep -E "tests passed|tests failed|\(Failed\)" "$OUT/gpu_tests.log" | tail -15 | tee -a "$OUT/summary.txt"
    log "  gpu tests skipped: $(grep -c '\*\*\*Skipped' "$OUT/gpu_tests.log") (strict mode: expect 0)"
    return
  fi
  # The multi-GPU tests first, with every GPU visible; then the rest sharded, one GPU a shard.
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "$n" -ge 1 ] || n=1
  local multi='*MultiGpu*'
  if [ "$n" -gt 1 ] && [ -z "${FILTER:-}" ]; then
    run test-multi-gpu 120 "$OUT/gpu_tests_multi.log" "./$B/groupmm_tests_gpu" --gtest_filter="$multi"
    log "  multi-GPU: $(gtest_counts "$OUT/gpu_tests_multi.log")"
  fi
  local filter=${FILTER:-"-$multi"}
  for ((s = 0; s < n; s++)); do
    CUDA_VISIBLE_DEVICES=$s GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$s \
      run "test shard $s" 420 "$OUT/gpu_tests_$s.log" "./$B/groupmm_tests_gpu" --gtest_filter="$filter" &
  done
  wait
  for ((s = 0; s < n; s++)); do log "  shard $s: $(gtest_counts "$OUT/gpu_tests_$s.log")"; done
}
stage_sanitize() {
  local mem=${SANITIZE_FILTER:-"*Offsets*:*ConvertGpu*:*GemmGpuGraph*:*GemmGpuFaults*:*forward_bf16_G128*:*wgrad_bf16_G128*:*dgrad_bf16_G4_*:*QuantizeGpu*:*Swizzle*:*SwiGLU*:*Swiglu*:*Dbias*:*GroupedLinear*:*MoE*:*Router*:*Permute*:*WeightedSwiglu*:*QuantizedGemm*decode*:*QuantizedGemmGpuGraph*:*QuantizedGemmGpuFaults*:*W4GemmGpuFaults*:*Mxfp4QuantizeGpuWeights*:*GateUpGpuFaults*:*GateUpGpuGraph*:*GateUpGpu.*t1_k1_e1*:*GateUpGpu.*padded_16*:*DownDgradGpuFaults*:*DownDgradGpuGraph*:*DownDgradGpu.*t1_k1_e1*:*DownDgradGpu.*padded_16*:*DownDgradGpu.*f_24*"}
  run memcheck 400 "$OUT/memcheck.log" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "./$B/groupmm_tests_gpu" --gtest_brief=1 --gtest_filter="$mem"
  log "  memcheck: $(gtest_counts "$OUT/memcheck.log") $(grep 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  [ -z "${RACECHECK_FILTER:-}" ] && return
  run racecheck 200 "$OUT/racecheck.log" compute-sanitizer --tool racecheck --error-exitcode 9 \
    "./$B/groupmm_tests_gpu" --gtest_brief=1 --gtest_filter="$RACECHECK_FILTER"
  log "  racecheck: $(grep 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1)"
}
stage_cli() {
  local c
  while read -r c; do
    # shellcheck disable=SC2086
    run cli 120 "$OUT/cli.log" "$BIN" $c && tail -3 "$OUT/cli.log"
  done <<EOF
demo --iters 3
demo moe --iters 3
bench gemm --case qwen3_decode --iters 3
bench gemm --recipe fp8_current --fast-accum --case qwen3_gate_up --pass fwd --pattern zipf --iters 3
bench gemm --recipe fp8_block --case qwen3_down --pattern empty25 --iters 3
bench gemm --recipe mxfp8 --case qwen3_gate_up --pattern balanced --iters 3
bench gemm --weights nvfp4 --case decode_qwen3_8rows --iters 3
bench quantize --iters 2 --shape 32768x2048
bench layer --iters 3 --pattern balanced
bench layer --recipe fp8_current --case qwen3 --pattern balanced --iters 3
bench moe --case qwen3 --iters 3
bench ep --iters 3
EOF
}
stage_bench_gemm() {
  local r
  for r in ${RECIPES:-bf16}; do
    # shellcheck disable=SC2086
    run "bench-gemm $r" 420 "$OUT/bench_gemm_$r.txt" "$BIN" bench gemm --recipe "$r" \
      --json "$OUT/gemm_$r.json" ${BENCH_GEMM_ARGS:-} && tail -3 "$OUT/bench_gemm_$r.txt"
    [ -f "$OUT/gemm_$r.json" ] && torch_peers "$OUT/gemm_$r.json"
  done
}
stage_bench_quantize() {
  # shellcheck disable=SC2086
  run bench-quantize 240 "$OUT/bench_quantize.txt" "$BIN" bench quantize --json "$OUT/quantize.json" \
    ${BENCH_QUANTIZE_ARGS:-} && tail -20 "$OUT/bench_quantize.txt"
}
stage_bench_layer() {
  local r
  # shellcheck disable=SC2086
  run bench-layer 240 "$OUT/bench_layer.txt" "$BIN" bench layer --json "$OUT/layer.json" ${BENCH_LAYER_ARGS:-}
  for r in ${RECIPES:-}; do
    [ "$r" = bf16 ] || run "bench-layer $r" 240 "$OUT/bench_layer.txt" "$BIN" bench layer --recipe "$r"
  done
  tail -20 "$OUT/bench_layer.txt"
}
stage_bench_moe() {
  # shellcheck disable=SC2086
  run bench-moe 240 "$OUT/bench_moe.txt" "$BIN" bench moe --json "$OUT/moe.json" ${BENCH_MOE_ARGS:-}
  grep -E '^== |check:|forward|eager step|row movers' "$OUT/bench_moe.txt" | tee -a "$OUT/summary.txt"
  [ -f "$OUT/moe.json" ] && run peers-moe 180 "$OUT/bench_moe_torch.txt" python3 bench/peers_torch_moe.py "$OUT/moe.json"
}
stage_bench_ep() {  # one process per GPU over NCCL when several are visible (torchrun)
  local n pre=() id=()
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "$n" -gt 1 ] && command -v torchrun >/dev/null; then
    pre=(torchrun --no-python --nproc-per-node "$n") id=(--id-file "$OUT/nccl_$RANDOM.id")
  fi
  run bench-ep 240 "$OUT/bench_ep.txt" "${pre[@]}" "$BIN" bench ep "${id[@]}" --json "$OUT/ep.json" &&
    tail -12 "$OUT/bench_ep.txt"
  [ ${#id[@]} -gt 0 ] && id=(--id-file "$OUT/nccl_$RANDOM.id")
  run bench-moe-ep 240 "$OUT/bench_moe_ep.txt" "${pre[@]}" "$BIN" bench moe --ep capacity "${id[@]}" \
    --json "$OUT/moe_ep.json" && tail -6 "$OUT/bench_moe_ep.txt"
}
stage_bench_w4() {
  local w
  for w in nvfp4 mxfp4; do
    run "bench-w4 $w" 150 "$OUT/bench_w4.txt" "$BIN" bench gemm --weights $w --iters "${ITERS:-20}" \
      --json "$OUT/w4_$w.json"
  done
  grep -E '^groupmm bench|^(decode|prefill)_|FAIL|^ok' "$OUT/bench_w4.txt" | tee -a "$OUT/summary.txt"
}
# The torch extension against $B, in place (python/groupmm/).
build_extension() {
  run python-build 400 "$OUT/python.log" env GROUPMM_BUILD_DIR="$B" PYTHON="${PYTHON:-python3}" \
    bash scripts/build_python.sh
}
# The same-process peer scripts; a peer that is missing is reported by the script, not fatal.
# .peers (scripts/peer_kernels.sh: vLLM's vendored triton_kernels, carried) goes on PYTHONPATH.
stage_peers() {
  local py=${PYTHON:-python3} pp=python s
  [ -d .peers ] && pp=python:.peers
  build_extension || return
  for s in peers_w4 peers_serving_w4 peers_deepgemm; do
    run "$s" 240 "$OUT/$s.txt" env PYTHONPATH="$pp" "$py" "bench/$s.py" --json "$OUT/$s.json"
    grep -E "^peer |FAIL" "$OUT/$s.txt" | head -5 | tee -a "$OUT/summary.txt"
  done
}
stage_python() {
  local py=${PYTHON:-python3}
  "$py" -c "import pytest" 2>/dev/null || ! ls .whl/pytest-*.whl >/dev/null 2>&1 ||
    "$py" -m pip install -q --no-index --find-links .whl pytest  # wheels carried: pip download -d .whl pytest
  build_extension &&
    run pytest 420 "$OUT/python.log" env PYTHONPATH=python "$py" -m pytest tests/python -q -rs -p no:cacheprovider
  tail -3 "$OUT/python.log" | tee -a "$OUT/summary.txt"
}
stage_ncu() {
  local c n
  for c in ${NCU_CASES:-mxfp8/both nvfp4/rowwise}; do
    n=${c%/*}_${c#*/}
    # shellcheck disable=SC2086
    run "ncu $c" 240 "$OUT/ncu_$n.txt" ncu --clock-control none -k "regex:${NCU_KERNEL:-quantize_tile_kernel}" \
      --launch-skip 2 --launch-count 1 --set full ${NCU_SOURCE:+-o "$OUT/ncu_$n"} \
      "$BIN" ${NCU_CMD:-bench quantize --recipe ${c%/*} --direction ${c#*/} --shape 65536x7168 --iters 1}
    grep -E "Duration|DRAM Throughput|Executed Ipc A|Issue Slots Busy|No Eligible" "$OUT/ncu_$n.txt" | head -8
    if [ -n "${NCU_SOURCE:-}" ]; then  # the report went to a file: its details page, then the SASS
      ncu -i "$OUT/ncu_$n.ncu-rep" --page details >>"$OUT/ncu_$n.txt" 2>&1
      grep -E "Duration|DRAM Throughput|Executed Ipc A|Issue Slots Busy|No Eligible" "$OUT/ncu_$n.txt" | head -8
      ncu -i "$OUT/ncu_$n.ncu-rep" --page source --print-source sass --csv >"$OUT/src_$n.csv" 2>&1
      python3 bench/ncu_sass_regions.py "$OUT/src_$n.csv" | tee -a "$OUT/ncu_$n.txt" | head -14
    fi
  done
}
stage_tune() {
  local args
  IFS=';' read -ra sweeps <<<"${TUNE:-"--suite all --pass wgrad --config auto,wgrad_bf16_bf16_128x256_coop_c21,wgrad_bf16_bf16_128x128_pp_c21;--suite all --pass wgrad --config auto,auto@along_m,auto@along_n"}"
  for args in "${sweeps[@]}"; do
    # shellcheck disable=SC2086
    run tune 200 "$OUT/tune.txt" "$BIN" bench gemm --quick $args
  done
}
stage_ab() {
  [ -f "$AB_OLD/CMakeLists.txt" ] || { log "[ab] no old tree in $AB_OLD: run 'bash scripts/gpu.sh prepare-ab REV' where git works, carry it"; return 1; }
  [ -e "$AB_OLD/.deps" ] || ln -s "$ROOT/.deps" "$AB_OLD/.deps"
  cmake -S "$AB_OLD" -B build-ab/old -G Ninja -DCMAKE_BUILD_TYPE=Release >"$OUT/ab_build.log" 2>&1
  run ab-build 400 "$OUT/ab_build.log" cmake --build build-ab/old -j "${JOBS:-$(nproc)}" --target groupmm_cli || return 1
  local b c side i=0 rev benches=("quantize --pattern balanced" "quantize --pattern zipf")
  rev=$(cat "$AB_OLD/.ab_rev" 2>/dev/null)
  for c in ${AB_GEMM_CASES:-qwen3_decode qwen3_down}; do benches+=("gemm --case $c --iters 10"); done
  rm -rf "$OUT/ab" && mkdir -p "$OUT/ab"
  for b in "${benches[@]}"; do
    for side in old new new old; do
      i=$((i + 1))
      # shellcheck disable=SC2086
      run "ab $side" 240 "$OUT/ab.log" "$([ $side = old ] && echo build-ab/old/groupmm || echo "$BIN")" \
        bench $b --json "$OUT/ab/$i.$side.json"
    done
  done
  python3 - "$OUT/ab" "$rev" <<'PY' | tee "$OUT/ab_table.txt"  # the faster run of each side
import collections, glob, json, os, sys
best = collections.defaultdict(dict)
for f in glob.glob(os.path.join(sys.argv[1], "*.json")):
    for c in json.load(open(f)).get("cases", []):
        key = " ".join(str(c.get(k, "")) for k in ("recipe", "direction", "shape", "case", "pass", "pattern"))
        side = best[key].setdefault(os.path.basename(f).split(".")[1], [])
        side.append(float(c["us"]))
print(f"old = {sys.argv[2] or '?'}: case, old us, new us, new/old (> 1.02: slower)")
for key, v in sorted(best.items()):
    if "old" in v and "new" in v:
        print(f"{key:60s} {min(v['old']):10.1f} {min(v['new']):10.1f} {min(v['new']) / min(v['old']):8.3f}")
PY
}
stage_demo() {
  run demo 180 "$OUT/demo.txt" "$BIN" demo && tail -25 "$OUT/demo.txt"
  run demo-moe 120 "$OUT/demo_moe.txt" "$BIN" demo moe && tail -25 "$OUT/demo_moe.txt"
}

case "${1:-}" in
  --list | -h | --help) stages_help; exit 0 ;;
  prepare-ab)
    rev=${2:-HEAD~1}
    rm -rf "$AB_OLD" && mkdir -p "$AB_OLD" && git archive "$rev" | tar -x -C "$AB_OLD" || exit 1
    echo "$rev" >"$AB_OLD/.ab_rev"
    echo "gpu.sh: $rev's source in $AB_OLD; carry it (and .deps) and run the ab stage"; exit 0 ;;
esac
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build test sanitize bench-gemm)
for s in "${stages[@]}"; do  # every name first: a typo fails before an hour of work
  declare -F "stage_${s//-/_}" >/dev/null || { echo "gpu.sh: unknown stage '$s'" >&2; stages_help >&2; exit 2; }
done
mkdir -p "$OUT"
: >"$OUT/summary.txt"
log "== gpu.sh ${stages[*]}: $(date -u +%FT%TZ), budget ${BUDGET}s, logs in $OUT"
for s in "${stages[@]}"; do "stage_${s//-/_}"; done
log "== done in $(($(date +%s) - T0))s"
