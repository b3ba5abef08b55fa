#!/usr/bin/env bash
# CTest cli.command_line: the `groupmm` tool's contract, one check per defect of issue 21.
#   exit 0 success and --help/--version, 1 a failed run, 2 a usage error naming the option;
#   errors as "groupmm: error: ..." without source locations; --help of every command without a GPU.
# Usage: test_cli.sh path/to/groupmm
set -uo pipefail
bin=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/groupmm_cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0 failed=0

# expect RC NEEDLE -- ARGS...: runs `groupmm ARGS` (60 s at most), checks the exit status and that
# the output contains NEEDLE (an extended regex; "" for any), and that no message has a location.
expect() {
  local want=$1 needle=$2; shift 3
  local out rc
  out=$(timeout 60 "$bin" "$@" 2>&1); rc=$?
  local why=""
  [ "$rc" = "$want" ] || why="exit $rc, expected $want"
  [ -z "$needle" ] || grep -Eq -- "$needle" <<<"$out" || why="${why:+$why; }output lacks /$needle/"
  grep -Eq '\[[A-Za-z0-9_]+\.(cpp|cu|hpp|cuh):[0-9]+\]' <<<"$out" && why="${why:+$why; }a source location is printed"
  if [ "$want" != 0 ] && [ "$rc" != 124 ]; then
    grep -q "^groupmm: error: " <<<"$out" || why="${why:+$why; }no 'groupmm: error:' prefix"
  fi
  if [ -z "$why" ]; then
    pass=$((pass + 1))
  else
    failed=$((failed + 1))
    printf 'FAIL: groupmm %s: %s\n--- output:\n%s\n---\n' "$*" "$why" "$(head -c 2000 <<<"$out")"
  fi
  LAST_OUT=$out
}
tiny=(--experts 8 --hidden 64 --width 32 --tokens 64 --topk 2)

# ---- iteration counts: no crash on 0 / -1, no silent truncation or garbage
expect 2 "--iters: 0 is out of range \(accepted: \[1, 100000\]\)" -- demo --cpu --iters 0
expect 2 "--iters: -1 is out of range" -- demo --cpu --iters -1
expect 2 "--iters: 0 is out of range" -- bench layer --cpu --iters 0
expect 2 "--iters: 'abc' is not an integer" -- demo --cpu --iters abc
expect 2 "--iters: '2.5' is not an integer" -- demo --cpu --iters 2.5
expect 2 "--iters: '3x' is not an integer" -- demo --cpu --iters 3x
expect 2 "--iters" -- demo --cpu --iters
# ---- unknown flags, commands, suites and values
expect 2 "not expected: --bogus" -- demo --cpu --bogus
expect 2 "unknown command 'nope' \(commands: bench, demo, info\)" -- nope
expect 2 "unknown bench suite 'nope' \(suites: ep, gemm, layer, moe, quantize\)" -- bench nope
expect 2 "--pattern: 'foo' is not one of balanced, zipf, empty25" -- bench layer --cpu --pattern foo
expect 2 "--pattern: 'foo' is not one of" -- bench layer --cpu --pattern zipf,foo
expect 2 "--pass: 'up' is not one of fwd, dgrad, wgrad" -- bench gemm --pass up
expect 2 "--recipe: 'int4' is not one of" -- bench quantize --recipe int4
expect 2 "--amax: 'fused:0' is not one of" -- bench quantize --amax fused:0
expect 2 "--recipe: 'int4' is not one of bf16, fp8_current, fp8_block, mxfp8" -- bench gemm --recipe int4
expect 2 "--fast-accum needs --recipe fp8_current" -- bench gemm --recipe fp8_block --fast-accum
expect 2 "--weights: 'int4' is not one of nvfp4, mxfp4" -- bench gemm --weights int4
expect 2 "--weights nvfp4 does not combine with --recipe fp8_block" -- bench gemm --weights nvfp4 --recipe fp8_block
expect 2 "--pass does not apply to --weights mxfp4" -- bench gemm --weights mxfp4 --pass fwd
expect 2 "--case 'llama' matches no --weights case \(cases: decode_" -- bench gemm --weights nvfp4 --case llama
expect 2 "--suite: 'big' is not one of moe, ragged, fine, all" -- bench gemm --suite big
expect 2 "--case 'nope' matches no case \(cases: fine_g512_r64, fine_g2048_r16\)" -- bench gemm --recipe fp8_block --suite fine --case nope
expect 2 "--case 'fine' matches no case \(cases: dsv3_gate_up, " -- bench gemm --recipe fp8_current --case fine
expect 2 "--case 'ragged' matches no case \(cases: dsv3_gate_up, " -- bench gemm --suite moe --case ragged
expect 2 "--config 'fwd_x' is not a kernel configuration" -- bench gemm --config auto,fwd_x
expect 2 "--config 'fwd_x@along_n' is not a kernel configuration" -- bench gemm --config fwd_x@along_n
expect 2 "--config 'auto@along_k': a tile order suffix is @along_m or @along_n" -- bench gemm --config auto@along_k
# The configurations come from the table (src/gemm/cuda/configs.def), a CPU-only library too.
expect 2 "--config wgrad_bf16_bf16_128x256_coop_c21 is not a configuration of --pass fwd" -- bench gemm --pass fwd --config auto,wgrad_bf16_bf16_128x256_coop_c21
expect 2 "--config dgrad_e4m3_bf16_block_128x192_coop_c11 is not a configuration of --pass wgrad" -- bench gemm --recipe fp8_block --pass wgrad --config dgrad_e4m3_bf16_block_128x192_coop_c11
expect 2 "--config with several names is a bf16 sweep" -- bench gemm --recipe fp8_current --config a,b
expect 2 "--config 'fwd_x' is not a kernel configuration" -- bench gemm --recipe fp8_block --config fwd_x
expect 2 "--out fp32 with --recipe mxfp8 needs --pass wgrad" -- bench gemm --recipe mxfp8 --out fp32
expect 2 "--quick applies to the bf16 suite" -- bench gemm --recipe fp8_current --quick
expect 2 "--recipe: 'nvfp4' is not one of" -- bench layer --recipe nvfp4
expect 2 "--recipe fp8_current needs a GPU" -- bench layer --cpu --recipe fp8_current
expect 2 "--case needs a quantized --recipe" -- bench layer --cpu --case qwen3
expect 2 "--case: 'llama' is not one of qwen3, dsv3, mixtral" -- bench moe --case qwen3,llama
expect 2 "--case: 'llama' is not one of dsv3, qwen3" -- bench ep --cpu --case llama
expect 2 "--capacity-factor" -- bench ep --cpu --capacity-factor 0.5
expect 2 "--topk 5 must be at most --experts 4" -- demo moe --cpu --experts 4 --topk 5
expect 2 "--hidden: 4 is out of range" -- demo moe --cpu --hidden 4
# ---- the library's limits (groupmm/moe.hpp: E <= 1024, k <= 32; gemm.hpp: N, K multiples of 8)
expect 2 "--experts: 1025 is out of range \(accepted: \[1, 1024\]\)" -- demo moe --cpu --experts 1025
expect 2 "--topk: 33 is out of range \(accepted: \[1, 32\]\)" -- demo moe --cpu --experts 64 --topk 33
expect 2 "--hidden: 100 is not a multiple of 8" -- demo moe --cpu --hidden 100
expect 2 "--width: 60 is not a multiple of 8" -- demo moe --cpu --width 60
expect 2 "--shared: 12 is not a multiple of 8" -- demo moe --cpu --shared 12
# every size of demo moe is checked against the memory before anything runs, not --tokens alone
start=$SECONDS
expect 2 "demo moe needs about .* of host memory.*reduce --tokens, --experts, --hidden, --width or --shared" -- demo moe --cpu --experts 1024 --hidden 65536 --width 65536
[ $((SECONDS - start)) -le 10 ] || { failed=$((failed + 1)); echo "FAIL: demo moe's memory check took $((SECONDS - start)) s"; }
# bench moe --cpu estimates from the CPU cases' shapes, not the GPU's (it ran out of GiB at once)
expect 2 "bench moe: case dsv3 needs about [0-9]{1,3}\.[0-9] GiB of host memory" -- bench moe --cpu --case dsv3 --tokens 16777216
expect 0 "mixtral: T=2048 " -- bench moe --cpu --case mixtral --tokens 2048
# options are never silently ignored: a non-number, a non-finite number, an option that does not
# apply, an empty path
expect 2 "--capacity-factor: 'abc' is not a number" -- bench ep --cpu --capacity-factor abc
expect 2 "--capacity-factor: 'nan' is not a finite number" -- bench moe --cpu --ep capacity --capacity-factor nan
expect 2 "--capacity-factor: 'inf' is not a finite number" -- bench ep --cpu --capacity-factor inf
expect 2 "--rank does not apply to --cpu" -- bench ep --cpu --ranks 2 --rank 1
expect 2 "--id-file does not apply to --cpu" -- bench ep --cpu --id-file "$tmp/id"
expect 2 "--id-file does not apply to --cpu" -- bench moe --cpu --ep capacity --id-file "$tmp/id"
expect 2 "--rank does not apply to --cpu" -- bench moe --cpu --ep throughput --rank 0
# ranks that cannot divide the experts, or buffers that cannot fit, are refused before any rank
# starts (a thread per rank; the ranks of a failed allocation used to wait forever)
expect 2 "bench ep: --ranks 1024 must divide the experts of every chosen case \(case dsv3 has E=32\)" -- bench ep --cpu --ranks 1024
expect 2 "bench moe: --ranks 1024 must divide the experts of every chosen case" -- bench moe --cpu --ep capacity --ranks 1024
expect 2 "--recipe mxfp8 does not apply to --ep" -- bench moe --cpu --ep capacity --recipe mxfp8
expect 0 "experts fp8_block" -- bench moe --cpu --case mixtral --recipe fp8_block
expect 0 "experts fp8_block\(bf16 wgrad\)" -- bench moe --cpu --case mixtral --recipe fp8_block --high-precision-wgrad
expect 2 "--high-precision-wgrad needs a quantized --recipe" -- bench moe --cpu --high-precision-wgrad
expect 0 "experts fp8_current, quantized from x and dy" -- bench moe --cpu --case mixtral --recipe fp8_current
expect 0 "experts fp8_current$" -- bench moe --cpu --case mixtral --recipe fp8_current --permuted-copies
expect 2 "bench ep needs about .* of host memory, more than the .* available; reduce --tokens or --ranks" -- bench ep --cpu --ranks 32 --case dsv3 --tokens 1048576
# an address-space limit counts as what is available (not under AddressSanitizer, whose shadow
# memory needs terabytes of address space)
if [ -z "${ASAN_OPTIONS:-}" ]; then
  printf '#!/usr/bin/env bash\nulimit -v 8000000\nexec %q "$@"\n' "$bin" >"$tmp/limited" && chmod +x "$tmp/limited"
  full_bin=$bin bin=$tmp/limited
  expect 2 "bench ep needs about .* of host memory, more than the 7.6 GiB available" -- bench ep --cpu --ranks 16 --case qwen3 --tokens 300000
  bin=$full_bin
fi
expect 2 "--json: an empty PATH" -- bench layer --cpu --json ''
expect 2 "--json: an empty PATH" -- bench moe --cpu --json ''
# ---- sizes: range checks, and limits that would exhaust memory say so (at once)
expect 2 "--experts: 99999999999999 is out of range" -- demo --cpu --experts 99999999999999
expect 2 "--experts: 0 is out of range" -- demo --cpu --experts 0
expect 2 "--tokens: 0 is out of range" -- demo --cpu --tokens 0
expect 2 "--topk 5 is more than --experts 4" -- demo --cpu --experts 4 --topk 5
start=$SECONDS
expect 2 "needs about .* of host memory, more than the .* available; reduce --tokens" -- demo --cpu --tokens 100000000
[ $((SECONDS - start)) -le 10 ] || { failed=$((failed + 1)); echo "FAIL: the memory limit took $((SECONDS - start)) s"; }
expect 2 "of host memory, more than .*; reduce --rows" -- bench layer --cpu --rows 2000000000
# ---- --json into a folder that does not exist fails before any work
expect 2 "--json $tmp/missing/l.json: cannot write the file" -- bench layer --cpu --rows 64 --iters 1 --json "$tmp/missing/l.json"
# ---- help and version: exit 0, no GPU needed, nothing runs
expect 0 "Usage: groupmm \[OPTIONS\]" -- --help
expect 0 "^groupmm [0-9]+\.[0-9]+\.[0-9]+$" -- --version
expect 0 "Usage: groupmm demo" -- demo --help
grep -q "demo passed" <<<"$LAST_OUT" && { failed=$((failed + 1)); echo "FAIL: demo --help ran the demo"; }
for c in info "bench ep" "bench gemm" "bench quantize" "bench layer" "bench moe" "demo moe"; do
  # shellcheck disable=SC2086
  expect 0 "Usage: groupmm $c" -- $c --help
done
expect 0 "--config NAME" -- bench gemm --help
expect 0 "--list-configs" -- bench gemm --help
expect 0 "^fwd_bf16_" -- bench gemm --list-configs
expect 0 "^suites:" -- bench
grep -Ezq "gemm .*layer .*moe .*quantize " <<<"$LAST_OUT" || { failed=$((failed + 1)); echo "FAIL: groupmm bench does not list its suites"; }
expect 2 "no command given \(commands: bench, demo, info\)" --
# ---- commands that need a GPU say so (where none is visible), with the prefix, without location
if "$bin" info | grep -q "GPUs: none visible"; then
  expect 1 "groupmm: error: bench gemm: needs an sm_90 GPU \(none visible\)$" -- bench gemm --iters 1
  expect 1 "groupmm: error: bench gemm: needs an sm_90 GPU \(none visible\)$" -- bench gemm --weights mxfp4
  expect 1 "groupmm: error: bench quantize: needs an sm_90 GPU \(none visible\)$" -- bench quantize
  expect 1 "groupmm: error: bench layer: needs an sm_90 GPU" -- bench layer
  expect 1 "groupmm: error: bench moe: needs an sm_90 GPU" -- bench moe --iters 1
  expect 1 "groupmm: error: bench ep: needs an sm_90 GPU" -- bench ep --iters 1
fi
# ---- the CPU runs: the demo is checked against naive loops (not the backend against itself)
expect 0 "demo passed" -- demo --cpu "${tiny[@]}"
grep -q "against naive double-precision loops" <<<"$LAST_OUT" || { failed=$((failed + 1)); echo "FAIL: demo check is not the naive one"; }
grep -Eq "rows  worst rel err [1-9]\.[0-9]+e-0[3-9]" <<<"$LAST_OUT" ||
  { failed=$((failed + 1)); echo "FAIL: no sampled expert shows a rounding-size error (a self-comparison?)"; echo "$LAST_OUT"; }
expect 0 "demo moe passed" -- demo moe --cpu --experts 8 --hidden 64 --width 32 --tokens 64 --topk 2
grep -q "routing differs on 0 of 8 tokens" <<<"$LAST_OUT" || { failed=$((failed + 1)); echo "FAIL: demo moe routing check"; }
# times print in a unit that reads (the CPU's stages take milliseconds to seconds)
expect 0 "demo passed" -- demo --cpu --experts 8 --hidden 256 --width 128 --tokens 512 --topk 2
grep -Eq "gate_up forward +[0-9.]+ (ms|s) " <<<"$LAST_OUT" && ! grep -Eq "[0-9]{5,}\.[0-9] us" <<<"$LAST_OUT" ||
  { failed=$((failed + 1)); echo "FAIL: demo --cpu times not in ms / s"; echo "$LAST_OUT"; }
expect 0 "case +pattern .* GFLOP/s" -- bench layer --cpu --rows 64 --iters 1 --json "$tmp/layer.json"
grep -q "TFLOP/s" <<<"$LAST_OUT" && { failed=$((failed + 1)); echo "FAIL: bench layer --cpu prints TFLOP/s"; }
if python3 - "$tmp/layer.json" <<'PY'; then pass=$((pass + 1)); else failed=$((failed + 1)); echo "FAIL: bench layer --json"; fi
import json, sys
d = json.load(open(sys.argv[1]))
assert d["suite"] == "layer" and len(d["cases"]) == 6, d
assert all(c["layer_us"] > 0 and c["fwd_us"] > 0 for c in d["cases"])
PY
# bench ep: ranks as threads; every mode's check is combine(dispatch(x)) == x bit for bit (FP8
# dispatch: the received operand == quantizing the 16-bit dispatch's rows)
expect 0 "throughput .* ok" -- bench ep --cpu --ranks 4 --json "$tmp/ep.json"
if python3 - "$tmp/ep.json" <<'PY'; then pass=$((pass + 1)); else failed=$((failed + 1)); echo "FAIL: bench ep --json"; fi
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ranks"] == 4 and len(d["cases"]) == 5, d
assert all(c["valid"] and not c["overflow"] and c["dispatch_us"] > 0 for c in d["cases"]), d
assert {c["mode"] for c in d["cases"]} == {"throughput", "capacity", "throughput_fp8"}, d
fp8 = [c for c in d["cases"] if c["mode"] == "throughput_fp8"]
assert len(fp8) == 1 and fp8[0]["case"] == "dsv3", d  # H = 128 on the CPU; qwen3's 32 is no fp8
PY
expect 2 "bench ep: --ranks 3 must divide the experts of every chosen case \(case dsv3 has E=32\)" -- bench ep --cpu --ranks 3 --case dsv3
# bench moe --ep: the block over ranks as threads (the block's EP numerics are the unit tests'
# MoeEp suites; this checks the command runs every case in both modes and reports them)
expect 0 "qwen3 +96 +16 +8 +4 .* C=96 C_e=384$" -- bench moe --cpu --ep capacity --json "$tmp/moe_ep.json"
if python3 - "$tmp/moe_ep.json" <<'PY'; then pass=$((pass + 1)); else failed=$((failed + 1)); echo "FAIL: bench moe --ep --json"; fi
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ranks"] == 2 and d["ep"] == "capacity" and len(d["cases"]) == 3, d
assert all(c["fwd_us"] > 0 and c["fwd_bwd_us"] > 0 and not c["overflow"] for c in d["cases"]), d
PY
expect 0 "mixtral +64 +4 +1 +2 .* -$" -- bench moe --cpu --ep throughput --ranks 4 --case mixtral
expect 2 "--ranks, --rank, --id-file and --capacity-factor need --ep" -- bench moe --cpu --ranks 2
expect 2 "--capacity-factor applies to --ep capacity" -- bench moe --cpu --ep throughput --capacity-factor 3
expect 2 "--ep: 'dense' is not one of capacity, throughput" -- bench moe --ep dense
expect 2 "bench moe: --ranks 3 must divide the experts of every chosen case \(case qwen3 has E=16\)" -- bench moe --cpu --ep capacity --ranks 3
# --ep-chunks: the overlap breakdown per rank; a bad N named with its value
expect 0 "qwen3 +1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" -- bench moe --cpu --ep capacity --ep-chunks 2 --case qwen3 --json "$tmp/moe_ep_chunks.json"
if python3 - "$tmp/moe_ep_chunks.json" <<'PY'; then pass=$((pass + 1)); else failed=$((failed + 1)); echo "FAIL: bench moe --ep-chunks --json"; fi
import json, sys
d = json.load(open(sys.argv[1]))
c = d["cases"][0]
assert c["chunks"] == 2 and c["exchange_us"] > 0 and c["experts_us"] > 0 and 0 <= c["exposed_share"] <= 1, d
PY
expect 2 "--ep-chunks 3 must be at most the local experts E / R of every chosen case \(case mixtral: E=4 over 2 ranks = 2\)" -- bench moe --cpu --ep throughput --ep-chunks 3
expect 2 "--ep-chunks: 0 is out of range" -- bench moe --cpu --ep capacity --ep-chunks 0
expect 2 "--ep-chunks 2 needs --ep capacity\|throughput" -- bench moe --cpu --ep-chunks 2
expect 2 "--ep-exchange-sms 8 needs --ep-chunks > 1" -- bench moe --cpu --ep capacity --ep-exchange-sms 8
expect 0 "overlap, 2 chunk\(s\), 16 SM\(s\) left to the exchanges" -- bench moe --cpu --ep capacity --ep-chunks 2 --ep-exchange-sms 16 --case qwen3

echo "cli: $pass checks passed, $failed failed"
[ "$failed" = 0 ]
