#!/usr/bin/env bash
# A/B of the quantize (and GEMM) speed between an old revision and this tree, in one device call.
#
#   bash scripts/ab_quant.sh --prepare [REV]  # here, where git works: REV's source (default
#                                             # df5b0c9) into build-ab-old/ (ignored: /build*/)
#   bash scripts/ab_quant.sh                  # on the GPU machine, carrying .deps, build-ab-old
#
# On the GPU machine it builds this tree (cmake --build -j16: the CLI and the GPU tests), runs
# compute-sanitizer memcheck and racecheck on the quantize GPU tests while the old tree builds
# (its CLI), then runs `groupmm bench quantize` (balanced and --pattern zipf) and `groupmm bench
# gemm` (the cases in AB_GEMM_CASES) on the old and the new binary alternating old, new, new,
# old, and prints a table with each case's time ratio new / old (the faster of the two runs of
# each side). Logs under $OUT (or out/ab): ab.log, build.log, bench.log, ab_table.txt,
# memcheck.log, racecheck.log. A time guard keeps the call under AB_BUDGET_S seconds (default
# 530): the sanitizers stop at their time limits (AB_MEMCHECK_S 120, AB_RACECHECK_S 60), and a
# benchmark run is skipped when less than 45 s are left.
# Builds go to build-ab/. Knobs: AB_OLD (old source, default build-ab-old), AB_GEMM_CASES (default "qwen3_decode
# qwen3_down"), AB_GEMM_ARGS (default "--iters 10"), AB_ROUNDS (ABBA rounds, default 1),
# AB_BUDGET_S, AB_JOBS (default 16), AB_MEMCHECK_FILTER, AB_RACECHECK_FILTER.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
AB=build-ab
OLD=${AB_OLD:-build-ab-old}

if [ "${1:-}" = "--prepare" ]; then
  rev=${2:-df5b0c9}
  rm -rf "$OLD" && mkdir -p "$OLD"
  git archive "$rev" | tar -x -C "$OLD" || { echo "ab: git archive $rev failed" >&2; exit 1; }
  echo "$rev" >"$OLD/.ab_rev"
  echo "ab: $rev's source in $OLD; now run scripts/ab_quant.sh on the GPU machine, carrying .deps and $OLD"
  exit 0
fi

OUT=${OUT:-out/ab}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
BUDGET=${AB_BUDGET_S:-530}
JOBS=${AB_JOBS:-16}
ROUNDS=${AB_ROUNDS:-1}
T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0))); }
log() { echo "[ab +$(($(date +%s) - T0))s] $*" | tee -a "$OUT/ab.log"; }

[ -f "$OLD/CMakeLists.txt" ] || {
  echo "ab: no old tree at $OLD: run 'bash scripts/ab_quant.sh --prepare REV' first and carry $OLD" >&2
  exit 1
}
[ -e .deps/cutlass/include/cutlass/version.h ] || { echo "ab: .deps (CUTLASS headers) missing: carry .deps" >&2; exit 1; }
[ -e "$OLD/.deps" ] || ln -s "$ROOT/.deps" "$OLD/.deps"
log "old: $OLD ($(cat "$OLD/.ab_rev" 2>/dev/null || echo '?')), new: this tree; budget ${BUDGET}s"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -1; } 2>&1 | tee -a "$OUT/ab.log"

# ---- build this tree; sanitizers while the old tree builds ------------------------------------------
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cli_target() {  # the CLI's target name in a configured build dir
  cmake --build "$1" --target help 2>/dev/null | grep -qE '^(\.\.\. )?groupmm_cli' && echo groupmm_cli || echo groupmm
}
build() {  # src dir, build dir, log, extra targets...
  local src=$1 dir=$2 blog=$3
  shift 3
  cmake -S "$src" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >>"$blog" 2>&1 &&
    cmake --build "$dir" -j "$JOBS" --target "$(cli_target "$dir")" "$@" >>"$blog" 2>&1
}
log "building new"
build "$ROOT" "$AB/build-new" "$OUT/build.log" groupmm_tests_gpu ||
  { tail -40 "$OUT/build.log"; log "NEW BUILD FAILED"; exit 1; }
log "building old, sanitizers meanwhile"
build "$OLD" "$AB/build-old" "$AB/build-old.log" &
old_build=$!
TESTS=$AB/build-new/groupmm_tests_gpu
# The exhaustive arithmetic sweeps (BlockScaleGpu, QnumGpu.Mxfp8*) touch no memory worth checking.
MEM_FILTER=${AB_MEMCHECK_FILTER:-"*Quant*:*QnumGpu*:*DbiasOrder*-*Mxfp8BlockScalesEqual*"}
RACE_FILTER=${AB_RACECHECK_FILTER:-"*QuantizeGpuColumnwise*:*QuantizeGpuFusedAmax*:*QuantizeGpuGraph*"}
timeout "${AB_MEMCHECK_S:-120}" compute-sanitizer --tool memcheck --error-exitcode 9 "$TESTS" \
  --gtest_filter="$MEM_FILTER" >"$OUT/memcheck.log" 2>&1
log "memcheck exit $? ($(grep -c 'OK \]' "$OUT/memcheck.log") tests ok): $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/memcheck.log" | tail -2 | tr '\n' ' ')"
timeout "${AB_RACECHECK_S:-60}" compute-sanitizer --tool racecheck --error-exitcode 9 "$TESTS" \
  --gtest_filter="$RACE_FILTER" >"$OUT/racecheck.log" 2>&1
log "racecheck exit $? ($(grep -c 'OK \]' "$OUT/racecheck.log") tests ok): $(grep -E 'RACECHECK SUMMARY|PASSED|FAILED' "$OUT/racecheck.log" | tail -2 | tr '\n' ' ')"
wait $old_build || { cat "$AB/build-old.log" >>"$OUT/build.log"; tail -40 "$AB/build-old.log"; log "OLD BUILD FAILED"; exit 1; }
cat "$AB/build-old.log" >>"$OUT/build.log"
OLD_BIN=$AB/build-old/groupmm
NEW_BIN=$AB/build-new/groupmm
log "built; $(left)s left"

# ---- benchmarks, alternating old / new / new / old -------------------------------------------------
# run NAME SIDE TAG ARGS...: raw output to bench.log, JSON to $AB/json/NAME.SIDE.TAG.json
rm -rf "$AB/json" && mkdir -p "$AB/json"
run() {
  local name=$1 side=$2 tag=$3
  shift 3
  local bin=$OLD_BIN
  [ "$side" = new ] && bin=$NEW_BIN
  local json="$AB/json/$name.$side.$tag.json"
  echo "== $name $side $tag: $*" >>"$OUT/bench.log"
  case $name in
    quant_*) timeout 240 "$bin" bench quantize --json "$@" >"$json" 2>>"$OUT/bench.log" ;;
    gemm_*) timeout 240 "$bin" bench gemm --json "$json" "$@" >>"$OUT/bench.log" 2>&1 ;;
  esac
  local rc=$?
  case $name in quant_*) cat "$json" >>"$OUT/bench.log" ;; esac
  [ $rc -eq 0 ] || log "$name $side $tag: exit $rc"
}
benches=("quant_balanced|--pattern balanced" "quant_zipf|--pattern zipf")
for c in ${AB_GEMM_CASES:-qwen3_decode qwen3_down}; do
  benches+=("gemm_$c|--case $c ${AB_GEMM_ARGS:---iters 10}")
done
for ((r = 1; r <= ROUNDS; ++r)); do
  for b in "${benches[@]}"; do
    name=${b%%|*}
    args=${b#*|}
    i=0
    for side in old new new old; do
      i=$((i + 1))
      if [ "$(left)" -lt 45 ]; then log "skipping $name $side $r$i (time)"; continue; fi
      # shellcheck disable=SC2086
      run "$name" "$side" "$r$i" $args
    done
    log "$name round $r done"
  done
done
# ---- the A/B table ----------------------------------------------------------------------------------
python3 - "$AB/json" >"$OUT/ab_table.txt" 2>&1 <<'PY'
import collections, glob, json, os, sys
d = sys.argv[1]
best = collections.defaultdict(dict)  # (bench, case) -> side -> min us
for f in sorted(glob.glob(os.path.join(d, "*.json"))):
    name, side = os.path.basename(f).split(".")[:2]
    try:
        data = json.load(open(f))
    except Exception as e:
        print(f"(unreadable {f}: {e})")
        continue
    for c in data.get("cases", []):
        if name.startswith("quant"):
            key = (name, f"{c['recipe']} {c['direction']} {c['shape']}")
        else:
            key = (name, f"{c['case']} {c['pass']} {c['pattern']} G={c['G']}")
        us = float(c["us"])
        best[key][side] = min(us, best[key].get(side, us))
    if "host_us_per_call" in data:  # bench gemm: host time of one grouped_gemm call
        key, us = (name, "host us per call (decode shape)"), float(data["host_us_per_call"])
        best[key][side] = min(us, best[key].get(side, us))
print(f"{'bench':16s} {'case':52s} {'old us':>10s} {'new us':>10s} {'new/old':>8s}")
worst, n, slower = 0.0, 0, []
for (bench, case), v in sorted(best.items()):
    if "old" not in v or "new" not in v:
        print(f"{bench:16s} {case:52s} (missing a side)")
        continue
    r = v["new"] / v["old"] if v["old"] > 0 else float("nan")
    n += 1
    worst = max(worst, r)
    flag = "  <-- slower" if r > 1.02 else ""
    if flag: slower.append(case)
    print(f"{bench:16s} {case:52s} {v['old']:10.1f} {v['new']:10.1f} {r:8.3f}{flag}")
print(f"{n} cases; worst new/old {worst:.3f}; {len(slower)} more than 2% slower"
      " (min of the two runs per side; copy rows are the same memcpy on both)")
PY
cat "$OUT/ab_table.txt"
log "table written; $(left)s left"

log "done in $(($(date +%s) - T0))s"
