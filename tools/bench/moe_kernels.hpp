// `groupmm bench moe`: the kernel layer's fused expert projections timed alone on a layer's
// routing, next to the unfused chains they replace, the chains' stock GEMMs and the dense cuBLAS
// GEMMs of their shapes (moe.cpp prints them with each case).
#pragma once

#include "bench/harness.hpp"
#include "groupmm/nn/moe.hpp"

namespace groupmm::tool {

// The printed timings' JSON records: gate_up (moe_gate_up_swiglu) and down_dgrad
// (moe_down_dgrad_swiglu); zeros where the fused op does not take the case (dtype, sizes, recipe).
struct MoeKernelRecords {
  JsonRecord gate_up, down_dgrad;
};
MoeKernelRecords time_moe_kernels(Context& ctx, nn::MoE& moe, const TensorView& x,
                                  const TensorView& dy, int iters);

}  // namespace groupmm::tool
