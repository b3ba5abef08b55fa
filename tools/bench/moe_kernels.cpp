// The kernel layer's fused expert projections timed alone (moe_kernels.hpp).
#include "bench/moe_kernels.hpp"

#include <cstdio>

#include "groupmm/gemm.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::tool {
namespace {

using nn::MoE;
using nn::MoEConfig;

// The fused gate_up projection of the layer's current map: x gathered through src, the weighted
// SwiGLU into h and the pre-activation into gu (the default configuration).
MoeGateUpArgs gate_up_args(MoE& moe, const TensorView& x, const TensorView& src,
                           const TensorView& prob, const TensorView& h, const TensorView& gu) {
  return MoeGateUpArgs{.x = x,
                       .src_row = src,
                       .splits = moe.permute_map().splits,
                       .w = moe.gate_up().weight(),
                       .prob = prob,
                       .out = h,
                       .gate_up = gu,
                       .config = {}};
}

// The gate_up projection three ways on the layer's current map, each alone, against the dense
// cuBLAS GEMM of its shape (T k rows): the fused op (gathered x, weighted-SwiGLU epilogue, on the
// kernel layer), the unfused chain (permute, grouped GEMM, weighted SwiGLU) and the grouped GEMM
// of that chain alone. {fused, unfused, gemm alone, dense} in us; zeros when the fused op does not
// take the case (dtype, sizes).
struct GateUpTimes {
  double fused = 0, fused_h_only = 0, pingpong = 0, coop = 0, coop_c2 = 0, unfused = 0, gemm = 0,
         dense = 0;
};
GateUpTimes time_gate_up(Context& ctx, MoE& moe, const TensorView& x, int iters) {
  const MoEConfig& c = moe.config();
  const PermuteMap& m = moe.permute_map();
  GateUpTimes r;
  if (c.recipe || c.bias ||
      !moe_gate_up_swiglu_supported(ctx, c.dtype, c.hidden, c.ffn_hidden, c.experts))
    return r;
  const int64_t R = m.rows, H = c.hidden, F = c.ffn_hidden;
  const Device d = ctx.device();
  cudaStream_t s = ctx.stream();
  Tensor src = Tensor::empty({R}, DType::int32, d, s), pr = Tensor::empty({R}, DType::fp32, d, s);
  Tensor xp = Tensor::empty({R, H}, c.dtype, d, s), gu = Tensor::empty({R, 2 * F}, c.dtype, d, s);
  Tensor h = Tensor::empty({R, F}, c.dtype, d, s);
  const TensorView w1 = moe.gate_up().weight(), wt = moe.router_weights();
  moe_permute_sources(ctx, m, src, wt, pr);
  const MoeGateUpArgs a = gate_up_args(moe, x, src, pr, h, gu);
  r.fused = time_us(ctx, 2, iters, [&](int) { moe_gate_up_swiglu(ctx, a); });
  MoeGateUpArgs h_only = a;  // a forward that recomputes the pre-activation in backward
  h_only.gate_up = {};
  r.fused_h_only = time_us(ctx, 2, iters, [&](int) { moe_gate_up_swiglu(ctx, h_only); });
  if (F % 128 == 0) {  // the other schedules, for the record
    MoeGateUpArgs o = a;
    o.config = "pingpong_128x128";
    r.pingpong = time_us(ctx, 2, iters, [&](int) { moe_gate_up_swiglu(ctx, o); });
    o.config = "coop_128x256";
    r.coop = time_us(ctx, 2, iters, [&](int) { moe_gate_up_swiglu(ctx, o); });
    o.config = "coop_128x256_c2";
    r.coop_c2 = time_us(ctx, 2, iters, [&](int) { moe_gate_up_swiglu(ctx, o); });
  }
  r.unfused = time_us(ctx, 2, iters, [&](int) {
    moe_permute(ctx, x, m, xp, wt, pr);
    gemm_forward(ctx, xp, w1, m.splits, gu);
    weighted_swiglu_forward(ctx, gu, pr, h);
  });
  r.gemm = time_us(ctx, 2, iters, [&](int) { gemm_forward(ctx, xp, w1, m.splits, gu); });
  if (d == Device::CUDA)
    r.dense = 1e3 * dense_gemm_ms(ctx, GemmPass::forward, x.dim(0) * c.topk, 2 * F, H, iters);
  ctx.check();
  return r;
}

// The down projection's backward two ways on the layer's current map, each alone, against the
// dense cuBLAS dgrad of its shape (T k rows): the fused op (gathered dy, N-major weight, weighted
// SwiGLU backward in the epilogue, on the kernel layer) and the unfused chain (unpermute's
// backward, grouped dgrad, weighted SwiGLU backward), and the chain's grouped dgrad alone. Zeros
// when the fused op does not take the case.
struct DownDgradTimes {
  double fused = 0, epi_warps = 0, unfused = 0, gemm = 0, dense = 0;
};
DownDgradTimes time_down_dgrad(Context& ctx, MoE& moe, const TensorView& x, const TensorView& dy,
                               int iters) {
  const MoEConfig& c = moe.config();
  const PermuteMap& m = moe.permute_map();
  DownDgradTimes r;
  if (c.recipe || c.bias ||
      !moe_down_dgrad_swiglu_supported(ctx, c.dtype, c.hidden, c.ffn_hidden, c.experts) ||
      !moe_gate_up_swiglu_supported(ctx, c.dtype, c.hidden, c.ffn_hidden, c.experts))
    return r;
  const int64_t R = m.rows, H = c.hidden, F = c.ffn_hidden;
  const Device d = ctx.device();
  cudaStream_t s = ctx.stream();
  auto t = [&](std::initializer_list<int64_t> dims, DType dt) {
    return Tensor::empty(dims, dt, d, s);
  };
  Tensor src = t({R}, DType::int32), pr = t({R}, DType::fp32), gu = t({R, 2 * F}, c.dtype),
         h = t({R, F}, c.dtype), dgu = t({R, 2 * F}, c.dtype), dp = t({R}, DType::fp32),
         dyp = t({R, H}, c.dtype), da = t({R, F}, c.dtype);
  const TensorView wt = moe.router_weights(), w2 = moe.down().weight();
  moe_permute_sources(ctx, m, src, wt, pr);
  // the pre-activation of this routing, as forward keeps it
  moe_gate_up_swiglu(ctx, gate_up_args(moe, x, src, pr, h, gu));
  const MoeDownDgradArgs a{.dy = dy,
                           .src_row = src,
                           .splits = m.splits,
                           .w = w2,
                           .gate_up = gu,
                           .prob = pr,
                           .dgate_up = dgu,
                           .dprob = dp};
  r.fused = time_us(ctx, 2, iters, [&](int) { moe_down_dgrad_swiglu(ctx, a); });
  MoeDownDgradArgs ew = a;
  ew.config = "epi_warps";
  r.epi_warps = time_us(ctx, 2, iters, [&](int) { moe_down_dgrad_swiglu(ctx, ew); });
  r.unfused = time_us(ctx, 2, iters, [&](int) {
    moe_unpermute_backward(ctx, dy, m, dyp);
    gemm_dgrad(ctx, dyp, w2, m.splits, da);
    weighted_swiglu_backward(ctx, da, gu, pr, dgu, dp);
  });
  r.gemm = time_us(ctx, 2, iters, [&](int) { gemm_dgrad(ctx, dyp, w2, m.splits, da); });
  if (d == Device::CUDA)
    r.dense = 1e3 * dense_gemm_ms(ctx, GemmPass::dgrad, dy.dim(0) * c.topk, H, F, iters);
  ctx.check();
  return r;
}

}  // namespace

MoeKernelRecords time_moe_kernels(Context& ctx, MoE& moe, const TensorView& x, const TensorView& dy,
                                  int iters) {
  const MoEConfig& c = moe.config();
  const int64_t T = x.dim(0), H = c.hidden;
  const GateUpTimes gt = time_gate_up(ctx, moe, x, iters);
  if (gt.fused > 0) {
    const double flops = 2.0 * double(T * c.topk) * double(2 * c.ffn_hidden) * double(H);
    std::printf(
        "  gate_up projection alone (median of %d):\n"
        "    fused (gathered x + weighted SwiGLU epilogue) %9.1f us %6.0f TFLOP/s\n"
        "      the same without the pre-activation output  %9.1f us %6.0f TFLOP/s\n"
        "      its ping-pong 128x128 schedule              %9.1f us\n"
        "      its cooperative 128x256 without cluster     %9.1f us\n"
        "      its cooperative 128x256 on 2-CTA clusters   %9.1f us\n"
        "    unfused (permute, grouped GEMM, SwiGLU)       %9.1f us   fused speedup %.2fx\n"
        "    its grouped GEMM alone                        %9.1f us %6.0f TFLOP/s\n"
        "    dense cuBLAS GEMM of T k rows                 %9.1f us %6.0f TFLOP/s: fused at "
        "%.0f%%\n",
        iters, gt.fused, flops / (gt.fused * 1e6), gt.fused_h_only, flops / (gt.fused_h_only * 1e6),
        gt.pingpong, gt.coop, gt.coop_c2, gt.unfused, gt.unfused / gt.fused, gt.gemm,
        flops / (gt.gemm * 1e6), gt.dense, gt.dense > 0 ? flops / (gt.dense * 1e6) : 0.0,
        gt.dense > 0 ? 100 * gt.dense / gt.fused : 0.0);
  }
  const DownDgradTimes dt = time_down_dgrad(ctx, moe, x, dy, iters);
  if (dt.fused > 0) {
    const double flops = 2.0 * double(T * c.topk) * double(c.ffn_hidden) * double(H);
    std::printf(
        "  down projection's backward alone (median of %d):\n"
        "    fused (gathered dy + SwiGLU backward epilogue) %8.1f us %6.0f TFLOP/s\n"
        "      its epilogue warps under the next mainloop   %8.1f us %6.0f TFLOP/s\n"
        "    unfused (gather dy, grouped dgrad, SwiGLU bwd) %8.1f us   fused speedup %.2fx\n"
        "    its grouped dgrad alone                        %8.1f us %6.0f TFLOP/s\n"
        "    dense cuBLAS dgrad of T k rows                 %8.1f us %6.0f TFLOP/s: fused at "
        "%.0f%%\n",
        iters, dt.fused, flops / (dt.fused * 1e6), dt.epi_warps, flops / (dt.epi_warps * 1e6),
        dt.unfused, dt.unfused / dt.fused, dt.gemm, flops / (dt.gemm * 1e6), dt.dense,
        dt.dense > 0 ? flops / (dt.dense * 1e6) : 0.0,
        dt.dense > 0 ? 100 * dt.dense / dt.fused : 0.0);
  }
  return {JsonRecord()
              .add("fused_us", gt.fused)
              .add("fused_h_only_us", gt.fused_h_only)
              .add("pingpong_us", gt.pingpong)
              .add("coop_us", gt.coop)
              .add("coop_c2_us", gt.coop_c2)
              .add("unfused_us", gt.unfused)
              .add("gemm_us", gt.gemm)
              .add("dense_us", gt.dense),
          JsonRecord()
              .add("fused_us", dt.fused)
              .add("epi_warps_us", dt.epi_warps)
              .add("unfused_us", dt.unfused)
              .add("gemm_us", dt.gemm)
              .add("dense_us", dt.dense)};
}

}  // namespace groupmm::tool
