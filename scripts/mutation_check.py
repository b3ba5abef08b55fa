#!/usr/bin/env python3
"""Mutation check of the CPU test suite: plants each listed bug, one at a time, into a scratch copy
of the tree, rebuilds only groupmm_tests_cpu, runs it, and reports which bugs the tests catch.

The worktree is never modified: the scratch copy (MUTATION_DIR, default /tmp/groupmm-mutation-<id>)
is synced from the tracked and untracked-not-ignored files of the worktree at every run, mutated
there, and the mutated file is restored after each mutation (also on Ctrl-C). Each mutation is a
list of (old, new) replacements keyed on a distinctive code fragment; a fragment that does not
occur exactly once stops that mutation with "MUTATION DID NOT APPLY" (the code moved: re-key it).

By default the scratch build is the CPU-only library (-DGROUPMM_CUDA_KERNELS=OFF: no source under
src/kernels/ or src/<family>/cuda/ is compiled; the CPU tests never call the CUDA backend).
MUTATION_FULL_LIB=1 builds the real CUDA sources (slow: a mutation in a shared header recompiles
the kernels).

  python3 scripts/mutation_check.py [--list] [--all-failures] [--report FILE] [NAME_GLOB...]
"""
import argparse
import fnmatch
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NUM = "src/numerics/quantize.hpp"
CONV = "include/groupmm/convert.hpp"
CPU_Q = "src/quantize/cpu/quantize.cpp"
GEOM = "src/quantize/cpu/geom.hpp"
LAYOUT = "src/numerics/quantize_layout.hpp"
CPU_UTIL = "src/base/cpu_util.hpp"
GEMM = "src/gemm/cpu/gemm.cpp"
SWIGLU = "src/moe/swiglu_backends.hpp"
BF16 = "bf16_bits_to_float(float_to_bf16_bits({}))"  # rounds an fp32 expression to bf16


def bf16(expr):
    return BF16.format(expr)


# (name, what the bug is, file, [(old, new), ...])
MUTATIONS = [
    # ---- the five bugs of issue 24 --------------------------------------------------------------
    ("mxfp8_e5m2_uses_e4m3_max", "MXFP8 E8M0 exponent of e5m2 data computed with 448", NUM,
     [("return float_to_e8m0_roundup(amax * (e5m2 ? (1.0f / kE5M2Max) : (1.0f / kE4M3Max)));",
       "return float_to_e8m0_roundup(amax * (1.0f / kE4M3Max));")]),
    ("swizzle_column_tiles_reversed", "128x4 swizzle: column-tile term (c/4)*512 reversed", LAYOUT,
     [("(r / 128) * 128 * Kp + (c / 4) * 512 + (r % 32) * 16",
       "(r / 128) * 128 * Kp + (Kp / 4 - 1 - c / 4) * 512 + (r % 32) * 16")]),
    ("gemm_forward_accumulates_in_bf16", "CPU GEMM forward sums in bf16", GEMM,
     [("for (int64_t k = 0; k < K; ++k) s += Acc(in[k]) * Acc(W[n * K + k]);",
       "for (int64_t k = 0; k < K; ++k) s = " + bf16("float(s + Acc(in[k]) * Acc(W[n * K + k]))")
       + ";")]),
    ("fp8_codes_times_0_97", "every fp8 element multiplied by 0.97 before encoding", NUM,
     [("return e5m2 ? float_to_e5m2(v) : float_to_e4m3(v);",
       "return e5m2 ? float_to_e5m2(v * 0.97f) : float_to_e4m3(v * 0.97f);")]),
    ("columnwise_swizzle_padding_dropped", "columnwise swizzled padding left unwritten", CPU_Q,
     [("a.out.columnwise_scale_inv\n                  .ptr<uint8_t>()"
       "[qnum::col_scale_index_swizzled(L, g, nb, k, j)] = 0;", "(void)0;")]),
    # ---- conversions ----------------------------------------------------------------------------
    ("bf16_rounds_half_up", "fp32 -> bf16 rounds ties up instead of to even", CONV,
     [("const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);",
       "const uint32_t rounded = u + 0x8000u;")]),
    ("fp16_overflow_saturates", "fp32 -> fp16 saturates at 65504 instead of Inf", CONV,
     [("if (code >= 0x7C00u) code = 0x7C00u;", "if (code >= 0x7C00u) code = 0x7BFFu;")]),
    ("minifloat_ties_away", "e4m3/e5m2/e2m1/fp16 ties round away from zero", CONV,
     [("if (rem > half || (rem == half && (q & 1u))) ++q;", "if (rem >= half) ++q;")]),
    ("e8m0_rounds_down", "E8M0 exponent not rounded up for a non-zero mantissa", CONV,
     [("if (u & 0x7FFFFFu) ++e;", "(void)0;")]),
    ("e5m2_overflows_to_inf", "fp32 -> e5m2 overflows to Inf instead of saturating", CONV,
     [("if (code > 0x7Bu) code = 0x7Bu;", "if (code > 0x7Bu) code = 0x7Cu;")]),
    ("e2m1_nan_keeps_sign", "e2m1 encodes -NaN as -6", CONV,
     [("if (a > 0x7F800000u) return 0x7u;", "if (a > 0x7F800000u) return sign | 0x7u;")]),
    ("fp8_decode_times_0_97", "every fp8 value multiplied by 0.97 when dequantized", NUM,
     [("return e5m2 ? e5m2_to_float(c) : e4m3_to_float(c);",
       "return 0.97f * (e5m2 ? e5m2_to_float(c) : e4m3_to_float(c));")]),
    # ---- each recipe's scale rule ---------------------------------------------------------------
    ("fp8_current_pow2_rounds_up", "fp8_current power-of-two scale rounded up", NUM,
     [("if (pow2) s = bits_float(float_bits(s) & 0xFF800000u);",
       "if (pow2) s = bits_float((float_bits(s) & 0xFF800000u) + 0x00800000u);")]),
    ("fp8_current_keeps_infinite_scale", "fp8_current scale fmax/amax kept when not finite", NUM,
     [("if (!is_finite(s)) s = 1.0f;", "(void)0;")]),
    ("fp8_block_pow2_rounds_down", "fp8_block power-of-two scale_inv rounded down", NUM,
     [("v = bits_float(((vb & 0x7FFFFFu) ? (vb >> 23) + 1u : (vb >> 23)) << 23);",
       "v = bits_float((vb >> 23) << 23);")]),
    ("fp8_block_keeps_subnormal_scale", "fp8_block subnormal scale_inv not replaced by 1", NUM,
     [("if ((vb >> 23) == 0) return {1.0f, 1.0f};", "(void)0;")]),
    ("mx_multiplier_e254_flushes", "MXFP8 multiplier of e = 254 flushed to 0", NUM,
     [("if (e == 254) return bits_float(0x00400000u);", "if (e == 254) return 0.0f;")]),
    ("nvfp4_zero_amax_zero_global_scale", "NVFP4 S_enc of an all-zero expert is 0, not 1", NUM,
     [("    if (is_finite(s)) return s;\n  }\n  return 1.0f;",
       "    if (is_finite(s)) return s;\n  }\n  return amax == 0.0f ? 0.0f : 1.0f;")]),
    ("nvfp4_multiplier_not_saturated", "NVFP4 S_enc / s_b not saturated to FLT_MAX", NUM,
     [("return s > 3.40282347e38f ? 3.40282347e38f : s;", "return s;")]),
    ("nvfp4_zero_block_scale_not_zeroed", "NVFP4 elements of an s_b = 0 block not zeroed", NUM,
     [("if ((s_b & 0x7Fu) == 0) return 0;", "(void)0;")]),
    ("amax_drops_nan", "a NaN in a block does not make its amax NaN", NUM,
     [("return abs > 0x7F800000u ? 0x7FC00000u : abs;", "return abs > 0x7F800000u ? 0u : abs;")]),
    # ---- block boundaries at expert edges, layouts ----------------------------------------------
    ("columnwise_amax_skips_last_row", "columnwise block amax misses the expert's last row",
     CPU_Q, [("return Q.amax(g, r0, std::min(r0 + L.cb, g.rows), k, k + 1);",
              "return Q.amax(g, r0, std::min(r0 + L.cb, g.rows - 1), k, k + 1);")]),
    ("block_2d_covers_half_the_rows", "2D block amax over half of the block's rows", CPU_Q,
     [("return Q.amax(g, r0, std::min(r0 + bs, g.rows), k0, k0 + bs);",
       "return Q.amax(g, r0, std::min(r0 + bs / 2, g.rows), k0, k0 + bs);")]),
    ("rowwise_swizzle_column_padding_dropped", "rowwise swizzled padding columns unwritten",
     CPU_Q, [("if (r >= g.rows || c >= ncols)", "if (r >= g.rows)")]),
    ("columnwise_swizzle_offsets_unpadded", "expert offsets of columnwise swizzled scales "
     "count blocks, not blocks padded to 4", GEOM,
     [("cs4 += qnum::round_up(nb, 4);", "cs4 += nb;")]),
    ("column_block_offsets_count_tiles", "expert offsets of columnwise scales count 128-row "
     "tiles, not column blocks", GEOM,
     [("cbs += nb;", "cbs += qnum::ceil_div(e.rows, qnum::kTileRows);")]),
    # ---- offsets, dbias order -------------------------------------------------------------------
    ("offsets_scale_rows_overpadded", "group_offsets pads 128-row multiples one tile more",
     "src/offsets/cpu/offsets.cpp",
     [("wrap_add(r.rows, a.pad_rows - 1) / a.pad_rows", "wrap_add(r.rows, a.pad_rows) / a.pad_rows")]),
    ("bgrad_dbias_order", "bgrad dbias sums 16-row segments straight into the expert sum "
     "(not per 128-row tile)", CPU_UTIL,
     [("tile[static_cast<size_t>(n)] += segment[static_cast<size_t>(n)];",
       "out[n] += segment[static_cast<size_t>(n)];")]),
    ("group_dbias_accumulates_in_bf16", "dbias (group_dbias and bgrad) sums in bf16", CPU_UTIL,
     [("segment[static_cast<size_t>(n)] += value(r, n);",
       "segment[static_cast<size_t>(n)] = " +
       bf16("segment[static_cast<size_t>(n)] + value(r, n)") + ";")]),
    # ---- GEMM accumulation ----------------------------------------------------------------------
    ("gemm_wgrad_accumulates_in_bf16", "CPU GEMM wgrad sums in bf16 (fp32 main_grad out)", GEMM,
     [("for (int64_t k = 0; k < K; ++k) row[k] += dv * Acc(x[k]);",
       "for (int64_t k = 0; k < K; ++k) row[k] = " + bf16("float(row[k] + dv * Acc(x[k]))") +
       ";")]),
    ("gemm_forward_drops_k_tail", "CPU GEMM forward skips K % 8 tail columns", GEMM,
     [("for (int64_t k = 0; k < K; ++k) s += Acc(in[k]) * Acc(W[n * K + k]);",
       "for (int64_t k = 0; k < K / 8 * 8; ++k) s += Acc(in[k]) * Acc(W[n * K + k]);")]),
    ("gemm_bias_of_expert_0", "CPU GEMM adds expert 0's bias to every expert", GEMM,
     [("v += load_f(o.bias, g * N + j);", "v += load_f(o.bias, j);")]),
    # ---- SwiGLU ---------------------------------------------------------------------------------
    ("swiglu_sigmoid_in_bf16", "SwiGLU sigmoid rounded to bf16", SWIGLU,
     [('#include "groupmm/moe.hpp"', '#include "groupmm/convert.hpp"\n#include "groupmm/moe.hpp"'),
      ("  return 1.0f / (1.0f + std::exp(-g));",
       "  return " + bf16("1.0f / (1.0f + std::exp(-g))") + ";")]),
    ("swiglu_backward_du_from_bf16_silu", "SwiGLU backward du from a bf16-rounded silu", SWIGLU,
     [('#include "groupmm/moe.hpp"', '#include "groupmm/convert.hpp"\n#include "groupmm/moe.hpp"'),
      ("du = dout * silu;", "du = dout * " + bf16("silu") + ";")]),
]



def sh(cmd, cwd, log=None, timeout=None, env=None):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout, env=env)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (
            e.stdout or ""), 124
    if log:
        with open(log, "w") as f:
            f.write(out)
    return rc, out, time.time() - t0


def sync_tree(src, dst):
    """Copies the worktree's files into dst, writing only files whose content changed (so ninja
    rebuilds only what differs); removes files that are no longer in the worktree."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=src,
                           stdout=subprocess.PIPE, check=True).stdout.decode().split("\0")
    files = [f for f in files if f and os.path.isfile(os.path.join(src, f))]
    keep = set(files)
    for f in files:
        data = open(os.path.join(src, f), "rb").read()
        out = os.path.join(dst, f)
        if os.path.exists(out) and open(out, "rb").read() == data:
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as fh:
            fh.write(data)
    for dirpath, dirnames, filenames in os.walk(dst):
        rel = os.path.relpath(dirpath, dst)
        if rel == "." and ".deps" in dirnames:
            dirnames.remove(".deps")
        for fn in filenames:
            r = os.path.normpath(os.path.join(rel, fn))
            if r not in keep:
                os.remove(os.path.join(dirpath, fn))
    deps = os.path.join(dst, ".deps")  # CUTLASS headers (configure checks them), not copied
    if not os.path.lexists(deps) and os.path.exists(os.path.join(src, ".deps")):
        os.symlink(os.path.realpath(os.path.join(src, ".deps")), deps)


def failing_tests(out):
    """Names of the failed tests in gtest output (the per-test result lines)."""
    names = []
    for line in out.splitlines():
        if line.startswith("[  FAILED  ] ") and line.endswith(" ms)"):
            names.append(line[13:].split(", where")[0].split(" (")[0].strip())
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="mutation names or globs (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--all-failures", action="store_true",
                    help="run the whole suite for each mutation (default: stop at the first "
                    "failing test)")
    ap.add_argument("--report", help="also write the result table (markdown) to this file")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATION_JOBS", "0")) or
                    os.cpu_count())
    ap.add_argument("--timeout", type=int, default=600, help="seconds per test run")
    args = ap.parse_args()

    muts = [m for m in MUTATIONS
            if not args.names or any(fnmatch.fnmatch(m[0], n) for n in args.names)]
    if args.list:
        for name, what, path, _ in muts:
            print(f"{name:42s} {path:34s} {what}")
        return 0
    if not muts:
        print("no mutation matches", args.names)
        return 2

    cpu_only = os.environ.get("MUTATION_FULL_LIB", "0") in ("", "0")
    tag = hashlib.sha1(ROOT.encode()).hexdigest()[:8]
    work = os.environ.get("MUTATION_DIR") or f"/tmp/groupmm-mutation-{tag}"
    tree, build = os.path.join(work, "tree"), os.path.join(work, "build" + ("" if cpu_only else
                                                                          "-full"))
    os.makedirs(tree, exist_ok=True)
    print(f"mutation_check: {len(muts)} mutations; scratch tree {tree}, build {build} "
          f"({'CPU only' if cpu_only else 'full library'})", flush=True)
    sync_tree(ROOT, tree)

    env = dict(os.environ)
    env.setdefault("CCACHE_BASEDIR", os.path.dirname(work))
    if not os.path.exists(os.path.join(build, "build.ninja")):
        cfg = ["cmake", "-S", tree, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"]
        if cpu_only:
            cfg.append("-DGROUPMM_CUDA_KERNELS=OFF")
        rc, out, _ = sh(cfg, tree, os.path.join(work, "configure.log"), env=env)
        if rc:
            print(out[-3000:])
            print("mutation_check: configure failed")
            return 2
    build_cmd = ["cmake", "--build", build, "-j", str(args.jobs), "--target", "groupmm_tests_cpu"]
    test_cmd = [os.path.join(build, "groupmm_tests_cpu"), "--gtest_brief=1"]
    if not args.all_failures:
        test_cmd.append("--gtest_fail_fast")

    rc, out, bt = sh(build_cmd, tree, os.path.join(work, "baseline_build.log"), env=env)
    if rc:
        print(out[-3000:])
        print("mutation_check: the unmutated tree does not build")
        return 2
    rc, out, tt = sh(test_cmd[:2], tree, os.path.join(work, "baseline_test.log"),
                     timeout=args.timeout, env=env)
    if rc:
        print(out[-3000:])
        print("mutation_check: the unmutated CPU tests fail (failing: %s); fix that first, or "
              "try MUTATION_FULL_LIB=1" % ", ".join(failing_tests(out)[:5]))
        return 2
    print(f"baseline: built in {bt:.0f} s, tests pass in {tt:.1f} s", flush=True)

    current = {}  # path -> original bytes of the file being mutated

    def restore():
        for path, data in current.items():
            with open(path, "wb") as fh:
                fh.write(data)
        current.clear()

    def on_signal(signum, _frame):
        restore()
        print(f"\nmutation_check: interrupted (signal {signum}); scratch tree restored")
        sys.exit(130)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    rows, t_all = [], time.time()
    for i, (name, what, rel, edits) in enumerate(muts, 1):
        path = os.path.join(tree, rel)
        status, detail, secs = "", "", 0.0
        t0 = time.time()
        try:
            if not os.path.exists(path):
                status, detail = "NOT APPLIED", f"MUTATION DID NOT APPLY: {rel} does not exist"
            else:
                orig = open(path, "rb").read()
                text = orig.decode()
                for old, new in edits:
                    n = text.count(old)
                    if n != 1:
                        status = "NOT APPLIED"
                        detail = f"MUTATION DID NOT APPLY: fragment found {n} times in {rel}: " \
                                 f"{old.splitlines()[0][:70]!r}"
                        break
                    text = text.replace(old, new)
                if not status:
                    current[path] = orig
                    with open(path, "w") as fh:
                        fh.write(text)
                    log = os.path.join(work, f"{name}.build.log")
                    rc, out, _ = sh(build_cmd, tree, log, env=env)
                    if rc:
                        status, detail = "BUILD FAILED", f"mutated tree does not build ({log})"
                    else:
                        log = os.path.join(work, f"{name}.test.log")
                        rc, out, _ = sh(test_cmd, tree, log, timeout=args.timeout, env=env)
                        failed = failing_tests(out)
                        if rc == 0:
                            status, detail = "SURVIVED", "every CPU test passed"
                        elif rc == 124:
                            status, detail = "caught", "test run timed out"
                        else:
                            status = "caught"
                            detail = f"{len(failed)}: " + ", ".join(failed[:3]) + (
                                " ..." if len(failed) > 3 else "") if failed else \
                                f"test binary exit {rc} ({log})"
        finally:
            restore()
        secs = time.time() - t0
        rows.append((name, rel, what, status, detail, secs))
        print(f"[{i:2d}/{len(muts)}] {status:12s} {name:42s} {secs:5.0f} s  {detail}", flush=True)

    # Rebuild the restored tree so the next run starts from the baseline objects.
    sh(build_cmd, tree, os.path.join(work, "restore_build.log"), env=env)

    caught = sum(r[3] == "caught" for r in rows)
    survived = [r[0] for r in rows if r[3] == "SURVIVED"]
    broken = [r[0] for r in rows if r[3] in ("NOT APPLIED", "BUILD FAILED")]
    table = ["| mutation | file | bug | result | failing tests: count, first ones |",
             "|---|---|---|---|---|"]
    for name, rel, what, status, detail, _ in rows:
        table.append(f"| {name} | {rel} | {what} | {status} | {detail} |")
    summary = (f"{caught} caught, {len(survived)} survived, {len(broken)} not applied/broken, "
               f"of {len(rows)} mutations in {(time.time() - t_all) / 60:.1f} min")
    print("\n" + "\n".join(table) + "\n\n" + summary)
    if survived:
        print("survivors: " + ", ".join(survived))
    if broken:
        print("re-key or fix: " + ", ".join(broken))
    if args.report:
        with open(args.report, "w") as fh:
            fh.write("\n".join(table) + "\n\n" + summary + "\n")
    return 0 if not survived and not broken else 1


if __name__ == "__main__":
    sys.exit(main())
