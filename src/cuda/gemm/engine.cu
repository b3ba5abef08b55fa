// cutlass_sm90 engine: picks an instantiated configuration for (pass, dtype, dims) and runs it.
//
// Heuristic (host-known inputs only, so the choice is the same for every routing a graph sees):
//  - forward with few rows per expert (avg M/G <= 64, the decode case): operands swapped so the
//    weight rows fill the 128-wide M tile and the handful of tokens sit in a 32-wide N tile; the
//    problem is bound by streaming the weights.
//  - otherwise a 128x256x64 cooperative tile. The cluster pairs CTAs along the dimension that is
//    an even number of tiles for MoE shapes, so multicast never leaves a CTA idle: forward pairs
//    along N (1x2, sharing the activation tile), wgrad along M' = N (2x1, sharing the x tile),
//    dgrad runs without a cluster (its N' is the hidden size K, and K/256 is odd for common sizes
//    such as 768: a 1x2 cluster measured 0.74x torch on qwen3 down).
//  - wgrad reduces over each expert's tokens (K' = m_g); fp32 or 16-bit output.
#include <algorithm>

#include "cuda/gemm/kernels.hpp"
#include "cuda/gemm/sm90_grouped.cuh"

namespace groupmm::cuda {
namespace {

struct TableEntry {
  const char* name;
  GemmPass pass;
  DType in, out;
  sm90::KernelEntry (*make)();
};

const TableEntry kTable[] = {
#define GROUPMM_TABLE_ROW(name, pass, in, out) \
  {#name, GemmPass::pass, DType::in, DType::out, &sm90::name},
    GROUPMM_FOR_EACH_SM90_KERNEL(GROUPMM_TABLE_ROW)
#undef GROUPMM_TABLE_ROW
};

const TableEntry& by_name(const std::string& name) {
  for (const auto& e : kTable)
    if (name == e.name) return e;
  GROUPMM_CHECK(false, "grouped_gemm: config '", name, "' is not an instantiated kernel");
  return kTable[0];
}

std::string heuristic(GemmPass pass, const GemmDims& d, DType t, DType out) {
  const bool bf = t == DType::bf16;
  switch (pass) {
    case GemmPass::forward:
      if (d.M <= 64 * d.G) return bf ? "fwdswap_bf16_128x32_pp_c11" : "fwdswap_fp16_128x32_pp_c11";
      return bf ? "fwd_bf16_128x256_coop_c12" : "fwd_fp16_128x256_coop_c12";
    case GemmPass::dgrad:
      return bf ? "dgrad_bf16_128x256_coop_c11" : "dgrad_fp16_128x256_coop_c11";
    case GemmPass::wgrad:
      if (out == DType::fp32)
        return bf ? "wgrad_bf16_f32_128x256_coop_c21" : "wgrad_fp16_f32_128x256_coop_c21";
      return bf ? "wgrad_bf16_bf16_128x256_coop_c21" : "wgrad_fp16_fp16_128x256_coop_c21";
  }
  return "";
}

sm90::KernelEntry pick(const GroupedGemmArgs& a, const GemmDims& d) {
  const DType out = a.out.present() ? a.out.dtype : a.a.dtype;
  const std::string name = a.config.empty() ? heuristic(a.pass, d, a.a.dtype, out) : a.config;
  const TableEntry& e = by_name(name);
  GROUPMM_CHECK(e.pass == a.pass && e.in == a.a.dtype && e.out == out, "grouped_gemm: config '",
                name, "' computes ", gemm_pass_name(e.pass), " ", dtype_name(e.in), "->",
                dtype_name(e.out), ", not ", gemm_pass_name(a.pass), " ", dtype_name(a.a.dtype),
                "->", dtype_name(out));
  return e.make();
}

}  // namespace

size_t cutlass_gemm_workspace_size(const GroupedGemmArgs& args, const GemmDims& dims, int sms) {
  return pick(args, dims).workspace_size(dims, sms);
}

void cutlass_grouped_gemm(Context& ctx, const GroupedGemmArgs& args, const GemmDims& dims,
                          void* workspace, size_t workspace_bytes) {
  pick(args, dims).run(ctx, args, dims, workspace, workspace_bytes);
}

std::string cutlass_config_name(const GroupedGemmArgs& args, const GemmDims& dims) {
  const DType out = args.out.present() ? args.out.dtype : args.a.dtype;
  return args.config.empty() ? heuristic(args.pass, dims, args.a.dtype, out) : args.config;
}

std::vector<std::string> cutlass_config_names() {
  std::vector<std::string> v;
  for (const auto& e : kTable) v.push_back(e.name);
  return v;
}

}  // namespace groupmm::cuda
