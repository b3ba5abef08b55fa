// cutlass_sm90 engine: picks an instantiated configuration for (pass, dtype, dims) and runs it.
//
// Heuristic (host-known inputs only, so the choice is the same for every routing a graph sees):
//  - forward with few rows per expert (avg M/G <= 64, the decode case): operands swapped so the
//    weight rows fill the 128-wide M tile and the handful of tokens sit in a 32-wide N tile; the
//    problem is bound by streaming the weights.
//  - otherwise a 128x256x64 cooperative tile; forward and wgrad use a 1x2 cluster (the two CTAs
//    share the activation tile through TMA multicast). dgrad runs without a cluster: its N' is
//    the hidden size K, and K/256 is odd for common shapes (768), where a 1x2 cluster leaves a
//    quarter of the cluster slots idle (measured 0.74x torch on qwen3 down with it).
//  - wgrad reduces over the tokens of each expert (K' = m_g); same tile, fp32 or 16-bit output.
#include "cuda/gemm/kernels.hpp"
#include "cuda/gemm/sm90_grouped.cuh"

namespace groupmm::cuda {
namespace {

sm90::KernelEntry pick(GemmPass pass, const GemmDims& d, DType t, DType out) {
  using namespace sm90;
  const bool bf = t == DType::bf16;
  switch (pass) {
    case GemmPass::forward:
      if (d.M <= 64 * d.G) return bf ? fwdswap_bf16_128x32_pp() : fwdswap_fp16_128x32_pp();
      return bf ? fwd_bf16_128x256_coop() : fwd_fp16_128x256_coop();
    case GemmPass::dgrad:
      return bf ? dgrad_bf16_128x256_coop() : dgrad_fp16_128x256_coop();
    case GemmPass::wgrad:
      if (out == DType::fp32)
        return bf ? wgrad_bf16_f32_128x256_coop() : wgrad_fp16_f32_128x256_coop();
      return bf ? wgrad_bf16_bf16_128x256_coop() : wgrad_fp16_fp16_128x256_coop();
  }
  GROUPMM_CHECK(false, "grouped_gemm: no kernel for pass ", gemm_pass_name(pass));
  return {};
}

DType out_dtype(const GroupedGemmArgs& a) {
  return a.out.present() ? a.out.dtype : a.a.dtype;
}

}  // namespace

size_t cutlass_gemm_workspace_size(const GroupedGemmArgs& args, const GemmDims& dims, int sms) {
  return pick(args.pass, dims, args.a.dtype, out_dtype(args)).workspace_size(dims, sms);
}

void cutlass_grouped_gemm(Context& ctx, const GroupedGemmArgs& args, const GemmDims& dims,
                          void* workspace, size_t workspace_bytes) {
  pick(args.pass, dims, args.a.dtype, out_dtype(args))
      .run(ctx, args, dims, workspace, workspace_bytes);
}

std::string cutlass_config_name(GemmPass pass, const GemmDims& dims, DType dtype) {
  const DType out = pass == GemmPass::wgrad ? DType::fp32 : dtype;
  return pick(pass, dims, dtype, out).name();
}

}  // namespace groupmm::cuda
