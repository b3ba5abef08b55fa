// cutlass_sm90 engine: picks an instantiated configuration for (pass, operand dtypes, scaling,
// dims) and runs it.
//
// Heuristic (host-known inputs only, so the choice is the same for every routing a graph sees):
//  - 16-bit forward with few rows per expert (avg M/G <= 64, the decode case): operands swapped so
//    the weight rows fill the 128-wide M tile and the handful of tokens sit in a 32-wide N tile;
//    the problem is bound by streaming the weights. Only with a 16-bit out: the swapped kernel is
//    instantiated for 16-bit D only (one more TU for a rare case), so a decode-sized forward into
//    fp32 runs the cooperative kernel below (correct, with idle rows of its 128-row M tile).
//  - otherwise a 128x256 cooperative tile (K 64 for 16-bit, 128 for FP8). The cluster pairs CTAs
//    along the dimension that is an even number of tiles for MoE shapes, so multicast never leaves
//    a CTA idle: forward pairs along N (1x2, sharing the activation tile), wgrad along M' = N
//    (2x1, sharing the x tile), dgrad runs without a cluster (its N' is the hidden size K, and
//    K/256 is odd for common sizes such as 768).
//  - FP8: 128x128x128. Promotion to fp32 every 128 K keeps a second accumulator set in
//    registers, and a 128x256 tile spilled; blockwise scales have a granularity of 128 along N
//    anyway. Clusters as measured on the DeepSeek-V3 shapes: forward 2x1, per-expert dgrad 1x1,
//    blockwise dgrad and wgrad 1x2, per-expert wgrad 2x1. Fast accumulation (inference) has no
//    second accumulator set and runs the 128x256 tile.
//  - forward/dgrad with an fp32 out: the tiles and clusters of their 16-bit-out kernels, not tuned
//    separately (the fp32 epilogue's larger shared memory is carved out of the mainloop stages).
//  - wgrad reduces over each expert's tokens (K' = m_g); fp32 or 16-bit output.
#include <algorithm>

#include "cuda/gemm/kernels.hpp"
#include "cuda/gemm/sm90_grouped.cuh"

namespace groupmm::cuda {
namespace {

struct TableEntry {
  const char* name;
  GemmPass pass;
  DType a, b, out;
  QuantRecipe recipe;
  bool fast_accum;
  sm90::KernelEntry (*make)();
};

const TableEntry kTable[] = {
#define GROUPMM_TABLE_ROW(name, pass, in, out) \
  {#name, GemmPass::pass, DType::in, DType::in, DType::out, QuantRecipe::none, false, &sm90::name},
    GROUPMM_FOR_EACH_SM90_KERNEL(GROUPMM_TABLE_ROW)
#undef GROUPMM_TABLE_ROW
#define GROUPMM_TABLE_ROW(name, pass, a, b, out, recipe, fast) \
  {#name, GemmPass::pass, DType::a, DType::b, DType::out, QuantRecipe::recipe, fast, &sm90::name},
        GROUPMM_FOR_EACH_SM90_FP8_KERNEL(GROUPMM_TABLE_ROW)
#undef GROUPMM_TABLE_ROW
};

const TableEntry& by_name(const std::string& name) {
  for (const auto& e : kTable)
    if (name == e.name) return e;
  GROUPMM_CHECK(false, "grouped_gemm: config '", name, "' is not an instantiated kernel");
  return kTable[0];
}

bool serves(const TableEntry& e, const GemmLaunch& l) {
  return e.pass == l.pass && e.a == l.a_dtype && e.b == l.b_dtype && e.out == l.out_dtype &&
         e.recipe == l.recipe && e.fast_accum == l.fast_accum;
}

// "bf16->fp32" for 16-bit operands, "fp8e5m2 x fp8e4m3->bf16 (fp8_current)" for quantized ones.
std::string describe(GemmPass pass, DType a, DType b, DType out, QuantRecipe r) {
  return detail::cat(gemm_pass_name(pass), " ", dtype_name(a),
                     a == b ? "" : detail::cat(" x ", dtype_name(b)), "->", dtype_name(out),
                     r == QuantRecipe::none ? "" : detail::cat(" (", recipe_name(r), ")"));
}

std::string heuristic_16bit(const GemmLaunch& l) {
  const bool bf = l.a_dtype == DType::bf16;
  const bool f32 = l.out_dtype == DType::fp32;
  const GemmDims& d = l.dims;
  switch (l.pass) {
    case GemmPass::forward:
      if (f32) return bf ? "fwd_bf16_f32_128x256_coop_c12" : "fwd_fp16_f32_128x256_coop_c12";
      if (d.M <= 64 * d.G) return bf ? "fwdswap_bf16_128x32_pp_c11" : "fwdswap_fp16_128x32_pp_c11";
      return bf ? "fwd_bf16_128x256_coop_c12" : "fwd_fp16_128x256_coop_c12";
    case GemmPass::dgrad:
      if (f32) return bf ? "dgrad_bf16_f32_128x256_coop_c11" : "dgrad_fp16_f32_128x256_coop_c11";
      return bf ? "dgrad_bf16_128x256_coop_c11" : "dgrad_fp16_128x256_coop_c11";
    case GemmPass::wgrad:
      if (f32) return bf ? "wgrad_bf16_f32_128x256_coop_c21" : "wgrad_fp16_f32_128x256_coop_c21";
      return bf ? "wgrad_bf16_bf16_128x256_coop_c21" : "wgrad_fp16_fp16_128x256_coop_c21";
  }
  return "";
}

std::string heuristic(const GemmLaunch& l) {
  if (l.recipe == QuantRecipe::none) return heuristic_16bit(l);
  // FP8: one kernel per (pass, dtypes, recipe), plus the swapped forward for decode (few rows per
  // expert, as for 16-bit operands); the first that serves the launch.
  const bool decode = l.pass == GemmPass::forward && l.dims.M <= 64 * l.dims.G;
  for (const auto& e : kTable)
    if (serves(e, l) && (std::string(e.name).rfind("fwdswap", 0) == 0) == decode) return e.name;
  for (const auto& e : kTable)
    if (serves(e, l)) return e.name;
  GROUPMM_CHECK(false, "grouped_gemm: no scaled kernel computes ",
                describe(l.pass, l.a_dtype, l.b_dtype, l.out_dtype, l.recipe),
                l.fast_accum ? " with fast accumulation" : "");
  return "";
}

sm90::KernelEntry pick(const GemmLaunch& l) {
  const std::string name = l.config.empty() ? heuristic(l) : l.config;
  const TableEntry& e = by_name(name);
  GROUPMM_CHECK(serves(e, l), "grouped_gemm: config '", name, "' computes ",
                describe(e.pass, e.a, e.b, e.out, e.recipe), ", not ",
                describe(l.pass, l.a_dtype, l.b_dtype, l.out_dtype, l.recipe));
  return e.make();
}

}  // namespace

size_t cutlass_gemm_workspace_size(const GemmLaunch& l, int sms) {
  return pick(l).workspace_size(l.dims, sms);
}

void cutlass_grouped_gemm(Context& ctx, const GemmLaunch& l, void* workspace,
                          size_t workspace_bytes) {
  pick(l).run(ctx, l, workspace, workspace_bytes);
}

std::string cutlass_config_name(const GemmLaunch& l) {
  return l.config.empty() ? heuristic(l) : l.config;
}

std::vector<std::string> cutlass_config_names() {
  std::vector<std::string> v;
  for (const auto& e : kTable) v.push_back(e.name);
  return v;
}

}  // namespace groupmm::cuda
