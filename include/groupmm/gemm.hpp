// groupmm/gemm.hpp: grouped GEMM for the three MoE passes, per-expert row counts on the device.
//
// Weight layout is [G, N, K] row-major (out, in). Activations are [M_total, *] row-major with
// expert g owning rows [start_g, start_g + splits[g]) where start_g = sum_{j<g} splits[j].
//
// clang-format off
//   pass        computes                                a            b              out
//   forward TN  y_g  = alpha * x_g W_g^T + bias_g       x  [M, K]    W [G, N, K]    y  [M, N]
//   dgrad   NN  dx_g = alpha * dy_g W_g                 dy [M, N]    W [G, N, K]    dx [M, K]
//   wgrad   NT  dW_g = alpha * dy_g^T x_g + beta*dW_g   dy [M, N]    x [M, K]       dW [G, N, K]
// clang-format on
//
// dtypes: a and b are both bf16 or both fp16 (or both fp32 on a CPU context: the reference
// backend, for gradient checks); fp32 accumulation. forward/dgrad write out in a's dtype or in
// fp32 (the accumulator without the 16-bit rounding); wgrad writes fp32 (main_grad, beta 0 or 1)
// or a's dtype (beta 0). bias is [G, N] in out's dtype (forward only: 16-bit with a 16-bit out,
// fp32 with an fp32 out), added in fp32 before the output conversion. A zero-row expert gets y/dx
// rows of nothing, dW_g = 0 (beta = 0) or an unchanged dW_g (beta = 1), which is what
// delayed/accumulated wgrad needs.
//
// Alignment (CUDA engines): N and K multiples of 8 (16-byte rows for TMA); every pointer 16-byte
// aligned. Violations throw groupmm::Error naming the argument. Splits need no alignment.
//
// Splits faults: the splits rule of offsets.hpp with M = M_total (negative -> 0, ranges past
// M_total cut short, a sum other than M_total reported; rows past the sum are left unwritten).
//
// Splits short of M_total (GroupedGemmArgs::splits_total = at_most): the activation buffers may
// hold more rows than the experts own, as padded MoE buffers and torch._grouped_mm's `offs` (whose
// last entry may stop short of the grouped extent) do. The rows past S = sum(splits) are then
// neither read (x / dy rows, wgrad's dy and x rows) nor written (y / dx rows), and S < M_total is
// no fault; S > M_total still is (the expert that crosses M_total is cut short there:
// kFaultSplitsOverflow, and kFaultSplitsTotalMismatch as in the strict rule), checked on the
// device like every split. zero_tail (forward and dgrad) writes zeros to the output rows
// [S, M_total) instead of leaving them as they were: one small extra kernel that writes only those
// rows (a gradient w.r.t. padded rows must be 0). Both are graph safe on the cutlass_sm90 engine
// (the sum is read on the device). The default (exact) is the strict rule above.
//
// Graph safety: the cutlass_sm90 engine (the default on sm_90) is graph safe: per-expert
// pointers and problem sizes are built on the device from splits by one small kernel, the GEMM is
// one persistent launch, no host sync, no allocation when a workspace is passed (or reserved on
// the Context before capture). The cublas_loop engine copies splits to the host and is NOT graph
// safe (baseline only). Minimum SM: sm_90 for CUDA; the CPU reference runs anywhere.
#pragma once

#include <string>
#include <vector>

#include "groupmm/core.hpp"

namespace groupmm {

enum class GemmPass : uint8_t { forward, dgrad, wgrad };
const char* gemm_pass_name(GemmPass p);

// SplitsTotal (core.hpp): what sum(splits) may be, exactly M_total (the default) or at most
// M_total (see "Splits short of M_total" above).

enum class GemmEngine : uint8_t {
  automatic,     // cutlass_sm90 on a CUDA context, reference on a CPU context
  cutlass_sm90,  // CUTLASS ptr-array grouped kernels (TMA, warp-specialized), graph safe
  cublas_loop,   // one cuBLAS GEMM per expert after a host read of splits; NOT graph safe
  reference,     // CPU loops (CPU context only)
};
const char* gemm_engine_name(GemmEngine e);

struct GroupedGemmArgs {
  GemmPass pass = GemmPass::forward;
  TensorView a;  // see the table above
  TensorView b;
  TensorView out;
  TensorView splits;  // [G] int32|int64, device (host on a CPU context)
  TensorView bias;    // optional, forward only: [G, N] in out's dtype
  float alpha = 1.0f;
  float beta = 0.0f;  // wgrad only: 0 or 1 (1 = accumulate into out)
  GemmEngine engine = GemmEngine::automatic;
  // exact: sum(splits) == M_total (a short sum is kFaultSplitsTotalMismatch). at_most: sum <=
  // M_total, rows past the sum neither read nor written (zero_tail: forward/dgrad output rows past
  // the sum are written with zeros; needs at_most). See "Splits short of M_total" above.
  SplitsTotal splits_total = SplitsTotal::exact;
  bool zero_tail = false;
  // at_most only: the rows sum(splits) is expected to reach, host-known (e.g. T k routed rows in
  // an expert-parallel capacity buffer of R C_e rows), in [0, M_total]; the heuristic chooses
  // the kernel configuration for it instead of M_total (0: M_total). Which rows are read and
  // written is the splits' business alone, as with config.
  int64_t expected_rows = 0;
  // cutlass_sm90 only: run this kernel configuration instead of the heuristic's choice (names as
  // printed by gemm_config_names(); tuning and tests). Empty = heuristic. A configuration for
  // another pass or dtype is an error. A name (or an empty one) may end in "@along_m" or
  // "@along_n": the order in which the kernel visits each expert's output tiles (the heuristic
  // picks it from the shapes otherwise; results are bit-identical in either order).
  std::string config;
  std::string to_string() const;
};

// The problem dims (M_total, N, K, G) of the args, after validation.
struct GemmDims {
  int64_t M = 0, N = 0, K = 0, G = 0;
};
GemmDims validate_gemm_args(const Context& ctx, const GroupedGemmArgs& args);

// Bytes of device workspace that grouped_gemm needs for these args (host-known: depends on G, N,
// K, dtypes and the engine, never on the split values).
size_t grouped_gemm_workspace_size(const Context& ctx, const GroupedGemmArgs& args);

// Runs the grouped GEMM on ctx's stream. workspace may be null: the Context's workspace is used
// (it grows on demand outside graph capture; reserve it before capturing).
void grouped_gemm(Context& ctx, const GroupedGemmArgs& args, void* workspace = nullptr,
                  size_t workspace_bytes = 0);

// Convenience wrappers.
void gemm_forward(Context& ctx, const TensorView& x, const TensorView& w, const TensorView& splits,
                  const TensorView& y, const TensorView& bias = TensorView());
void gemm_dgrad(Context& ctx, const TensorView& dy, const TensorView& w, const TensorView& splits,
                const TensorView& dx);
void gemm_wgrad(Context& ctx, const TensorView& dy, const TensorView& x, const TensorView& splits,
                const TensorView& dw, bool accumulate);

// The cutlass_sm90 configuration these args run (args.config, or the heuristic's choice), e.g.
// "fwd_bf16_128x256_coop_c12", or "wgrad_bf16_bf16_128x256_coop_c21@along_n" where the tiles
// are visited across N; for logs, benchmarks and tests.
std::string gemm_config_name(const Context& ctx, const GroupedGemmArgs& args);
// Every cutlass_sm90 configuration (for GroupedGemmArgs::config), in every build: a CPU-only
// library (GROUPMM_WITH_CUDA_KERNELS 0) lists the configurations a CUDA build instantiates.
std::vector<std::string> gemm_config_names();

// ================================================================================================
// Quantized operands: FP8 (per-expert current scaling, DeepSeek blockwise) and MXFP8
// ================================================================================================
//
// The same three passes over GroupedTensors written by group_quantize (quantize.hpp). Which copy
// each pass reads (the copies group_quantize writes, used as they are: no host conversion):
//
// clang-format off
//   pass     a                                    b                                    out
//   forward  x  rowwise  [M, K]                   W  rowwise  [G, N, K] (weights)      y  [M, N]
//   dgrad    dy rowwise  [M, N]                   W  columnwise, per expert [K, N]     dx [M, K]
//   wgrad    dy columnwise, per expert [N, m_g]   x  columnwise, per expert [K, m_g]   dW [G, N, K]
// clang-format on
//
// Recipes (a.recipe == b.recipe):
//   fp8_current  one fp32 scale_inv per expert and operand; alpha_g = scale_inv_a[g] *
//                scale_inv_b[g] is computed on the device (never read on the host). a may be e4m3
//                or e5m2 (gradients), b is e4m3 for forward/dgrad, e4m3 or e5m2 for wgrad.
//                fp32 accumulation promoted to fp32 registers every 128 K (training); fast_accum
//                leaves the promotion out (inference; forward only).
//   fp8_block    e4m3 data, fp32 block scales in the plain layout: activations and gradients
//                1x128 along K (rowwise) / 128x1 along tokens (columnwise), weights 128x128
//                (quantized with block_2d). The GEMM applies the scales per 128-deep K block in
//                the mainloop (DeepSeek-V3's recipe). wgrad reads 128-token blocks of both
//                operands; an expert's last block may be partial.
//   mxfp8        no MX math on sm_90: both operands are dequantized exactly to bf16 (every MXFP8
//                value is a bf16 value) in the workspace, then the bf16 engine runs. Numerics
//                parity with Blackwell MXFP8 GEMMs, at bf16 speed plus the dequantize pass.
//
// dtypes: out is bf16 (forward, dgrad) or fp32 / bf16 (wgrad; beta 1 accumulates into fp32).
// bias [G, N] bf16, forward only. alpha multiplies the dequantized product.
// Alignment (recipe_traits in quantize.hpp): on CUDA, N and K multiples of gemm_n_multiple /
// gemm_k_multiple (16 for fp8_current and mxfp8, 128 for fp8_block: the quantizer's own rule);
// 16-byte aligned pointers. The FP8 wgrad reads the columnwise copies with leading dimension m_g,
// so every split must be a multiple of split_multiple (16 for fp8_current and fp8_block; mxfp8,
// dequantized first, has no such rule; the MoE permute pads experts to it) on both backends: an
// expert whose split is not sets kFaultSplitAlignment and its dW_g is left unwritten. Splits
// faults otherwise as grouped_gemm.
// Graph safe as grouped_gemm: one setup kernel builds pointers, scales and alpha on the device.
struct QuantizedGemmArgs {
  GemmPass pass = GemmPass::forward;
  GroupedTensor a;  // see the table; a.splits is ignored (splits below)
  GroupedTensor b;
  TensorView out;
  TensorView splits;  // [G] int32|int64 row counts of the activations, device
  TensorView bias;    // optional, forward only: [G, N] bf16
  float alpha = 1.0f;
  float beta = 0.0f;        // wgrad only: 0 or 1 (1 = accumulate into an fp32 out)
  bool fast_accum = false;  // fp8_current forward only: no periodic fp32 promotion
  GemmEngine engine = GemmEngine::automatic;  // automatic, cutlass_sm90 (CUDA), reference (CPU)
  // As GroupedGemmArgs::splits_total: at_most lets sum(splits) stop short of M_total; the
  // operands' rows past the sum (a's rowwise rows, the columnwise copies' columns past it) are
  // not read and out's rows past it (forward, dgrad) are not written. The operands must have been
  // quantized with the same splits (GroupQuantizeArgs::splits_total = at_most leaves those rows
  // unwritten). No zero_tail here. FP8 wgrad's split_multiple rule applies to each split as is.
  SplitsTotal splits_total = SplitsTotal::exact;
  // As GroupedGemmArgs::expected_rows (at_most only, in [0, M_total]): the rows the heuristic
  // sizes its choice by instead of M_total (the FP8 forward's swap rule; MXFP8's bf16 GEMM).
  int64_t expected_rows = 0;
  std::string config;  // cutlass_sm90 kernel name; empty = heuristic; "@along_m|n" as above
  std::string to_string() const;
};

GemmDims validate_gemm_args(const Context& ctx, const QuantizedGemmArgs& args);
size_t grouped_gemm_workspace_size(const Context& ctx, const QuantizedGemmArgs& args);
void grouped_gemm(Context& ctx, const QuantizedGemmArgs& args, void* workspace = nullptr,
                  size_t workspace_bytes = 0);
std::string gemm_config_name(const Context& ctx, const QuantizedGemmArgs& args);

// ================================================================================================
// 4-bit expert weights x bf16 activations (inference): NVFP4 and MXFP4 weights
// ================================================================================================
//
//   y_g = alpha * x_g dequant(W_g)^T + bias_g      x [M, K] bf16, W [G, N, K] 4-bit, y [M, N] bf16
//
// W is the rowwise copy of [G, N, K] weights from group_quantize (recipe nvfp4: 1x16 blocks, E4M3
// block scales and the fp32 per-expert S_enc in global_scale; recipe mxfp4: 1x32 blocks, E8M0
// scales), or imported from a checkpoint (import_mxfp4_weights). Scales plain or swizzled; nvfp4
// weights in 1x16 blocks (block_2d false). Hopper has no FP4 arithmetic: the weights are
// dequantized exactly (every E2M1 value times its block scale is a bf16 value; NVFP4's 1/S_enc is
// applied to the fp32 accumulator) and multiplied in bf16 with fp32 accumulation:
//   decode   few rows per expert: one persistent kernel streams each active expert's 4-bit
//            weights once (the bytes that bound serving; an expert with more rows than a pass of
//            8/16/32 tokens is read again by adjacent CTAs, from L2), dequantizes them in
//            registers and multiplies with mma.sync; experts are split into 128-row tiles of N,
//            and along K when a balanced routing would not fill the GPU twice, the K ranges'
//            partial sums added in a fixed order (deterministic, no atomics);
//   fused    the middle range: groupmm's own kernel (the RS form) streams each 128-row tile of
//            an expert's 4-bit codes into shared memory, the producer warpgroup's idle warps
//            turn the stage's block scales into multipliers, and the consumer warps dequantize
//            the codes straight into the register operand of wgmma, under the MMAs of the stage
//            before;
//            a tile spans up to 256 of the expert's rows (its wgmma N narrowed to 128 or 64 for
//            an expert's last rows). Each weight tile is dequantized once a 256-row tile, so it
//            wins while experts hold few rows; no workspace; at most kW4FusedMaxGroups experts.
//            config "coop_128x256" runs the kernel layer's variant instead (its producer warps
//            dequantize into a bf16 shared-memory operand; slower on every benchmark shape);
//   prefill  many rows per expert: the active experts' weights are dequantized to bf16 in the
//            workspace (G * N * K * 2 bytes of it), then the bf16 grouped GEMM (cutlass_sm90)
//            runs on them.
// path automatic chooses from host-known values only: decode when M <= kW4DecodeMaxAvgRows * G,
// fused when M <= kW4FusedMaxAvgRows * G (and G <= kW4FusedMaxGroups), else prefill
// (W4GemmArgs::path forces one; docs/performance.md, gemm_w4_fused, has the crossings). All are
// exact up to fp32 summation order.
// Experts with no rows never read their weights (every path). Rows past sum(splits) are left
// unwritten; splits faults as grouped_gemm. splits_total at_most (as GroupedGemmArgs): sum(splits)
// may stop short of M, the rows past it are neither read nor written (every path but the fused
// coop_128x256 kernel, which takes exact splits); expected_rows sizes the path and the decode
// pass by the rows the splits are expected to reach instead of M.
// Shapes and alignment: x and out bf16 (fp16 activations are not served: MXFP4 scales span
// 2^+-127, past fp16's range), K a multiple of 32 (both formats), N a multiple of 8, M, N, K
// below 2^31; 16-byte aligned x, out, w.data and bias (nvfp4 scales: 2-byte aligned). bias [G, N]
// bf16, optional.
// Graph safe: a setup kernel reads splits on the device; grids and workspace are sized from M, N,
// K, G and the SM count; no host sync, no allocation when a workspace of
// grouped_gemm_workspace_size() bytes is passed (or reserved on the Context before capture); the
// first call on a Context sets a kernel attribute (warm up eagerly before capturing).
// Minimum SM: sm_90 (CUDA).
enum class W4Path : uint8_t { automatic, decode, prefill, fused };
const char* w4_path_name(W4Path p);
constexpr int64_t kW4DecodeMaxAvgRows = 32;
constexpr int64_t kW4FusedMaxAvgRows = 512;
constexpr int64_t kW4FusedMaxGroups = 1024;

struct W4GemmArgs {
  TensorView x;        // [M, K] bf16, rows sorted by expert
  GroupedTensor w;     // [G, N, K] nvfp4 or mxfp4 weights (rowwise copy; splits absent)
  TensorView out;      // [M, N] bf16
  TensorView splits;   // [G] int32|int64 row counts, device (host on a CPU context)
  TensorView bias;     // optional [G, N] bf16
  float alpha = 1.0f;  // multiplies the dequantized product
  W4Path path = W4Path::automatic;  // CUDA only: force decode, prefill or fused
  // path fused only: its kernel, "" or "rs_sw_256x128" (the default: the consumers dequantize
  // into wgmma's register operand, 256 rows by 128 columns of y a tile, with the block
  // multipliers computed by the producer warpgroup's idle warps into each stage), "rs_256x128"
  // (the same, the consumers computing the multipliers) or "coop_128x256" (the kernel layer's
  // producer warps dequantize into a bf16 shared-memory operand). Path decode only: "" (tokens
  // a pass from the average expert: 8 up to 8 rows, 16 up to 16, else 32) or "pass8", "pass16",
  // "pass32" (forced; an expert with more rows takes more passes)
  std::string config;
  GemmEngine engine = GemmEngine::automatic;  // automatic, or reference (CPU context)
  // As GroupedGemmArgs: at_most lets sum(splits) stop short of M (rows past it neither read nor
  // written); expected_rows (at_most only, in [1, M]; 0: M) is what the path choice sizes by.
  SplitsTotal splits_total = SplitsTotal::exact;
  int64_t expected_rows = 0;
  std::string to_string() const;
};

GemmDims validate_gemm_args(const Context& ctx, const W4GemmArgs& args);
size_t grouped_gemm_workspace_size(const Context& ctx, const W4GemmArgs& args);
void grouped_gemm(Context& ctx, const W4GemmArgs& args, void* workspace = nullptr,
                  size_t workspace_bytes = 0);
// The path these args run (automatic resolved), and a printable description of the kernels, e.g.
// "w4_decode(nvfp4, 8 tokens, split-K 1)" or "w4_prefill(mxfp4)+fwd_bf16_128x256_coop_c12".
W4Path w4_gemm_path(const Context& ctx, const W4GemmArgs& args);
std::string gemm_config_name(const Context& ctx, const W4GemmArgs& args);

}  // namespace groupmm
