// The MoE block's pieces that `bench moe` and `demo moe` share: the block's inputs, the
// per-stage timer, the sampled-token check against the CPU reference ops, and the memory a block
// allocates. Public API only.
#pragma once

#include <cstdint>

#include "groupmm/nn/moe.hpp"

namespace groupmm::tool {

// Per-stage medians (us) over `iters` eager steps (forward, then backward when dy is present),
// measured through the layer's stage hook: CUDA events on a CUDA context, the host clock on a CPU
// one. Index by MoEStage; total_us is the median of whole steps.
inline constexpr int kMoeStages = 7;
struct StageTimes {
  double fwd[kMoeStages] = {}, bwd[kMoeStages] = {};
  double total_us = 0;
};
StageTimes time_stages(Context& ctx, nn::MoE& moe, const TensorView& x, const TensorView& dy,
                       int warmup, int iters);
// Prints the per-stage table of one case (each stage's share of the eager step) and returns the
// non-GEMM share of the step (%).
double print_moe_stages(const StageTimes& st, bool gpu, int iters);

// The block's inputs: x [T, H] ~ U(-1, 1) and dy [T, H] ~ U(-0.01, 0.01), bf16, on ctx's device.
struct BlockInputs {
  Tensor x, dy;
};
BlockInputs block_inputs(Context& ctx, int64_t T, int64_t H, uint64_t seed);

// Recomputes the outputs of `samples` tokens of the last forward of `moe` (spread over [0, T)) with
// the CPU reference ops from the layer's parameters and routing, and compares: routing (ids and
// weights from the router on the CPU) and y. Returns the worst relative error of y and prints a
// line per token when `verbose`; *routing_mismatches counts tokens whose CPU routing differs (a
// near-tie in the logits: reported, not an error).
double check_sampled_tokens(Context& ctx, nn::MoE& moe, const TensorView& x, const TensorView& y,
                            int samples, bool verbose, int* routing_mismatches);

// Bytes an nn::MoE of `c` (its max_tokens) allocates with its inputs x and dy: the routed rows'
// activations and gradients, the token-sized buffers, the parameters with their gradients (fp32
// main grads when accumulating), the shared expert; for the memory check before a run.
double moe_block_bytes(const nn::MoEConfig& c);

// n elements of v starting at element `first`, as host bytes (any device).
std::vector<uint8_t> fetch_bytes(const TensorView& v, int64_t first, int64_t n);
// n elements of a host buffer of dtype t (fp32, bf16 or fp16) as floats.
std::vector<float> as_floats(std::vector<uint8_t>& b, DType t, int64_t n);

}  // namespace groupmm::tool
