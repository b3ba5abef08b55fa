// CUDA moe_router_backward: one warp per token. Scores are
// recomputed from the logits (as the forward did), d scores gathered from d weights (through the
// renormalization), plus the aux loss's and z-loss's terms, then through softmax / sigmoid. Every
// operation mirrors the CPU reference (src/moe/cpu/router.cpp) in order and rounding.
#include "moe/backends.hpp"
#include "moe/cuda/router_common.cuh"

namespace groupmm::cuda {
namespace {

using namespace moe;
using Cfg = RouterKernelConfig;

struct RouterBwdParams {
  const float* logits;
  const int32_t* ids;
  const int32_t* counts;  // null without aux loss
  const float* d_weights;
  float* d_logits;
  StatusBlock* status;
  int64_t T;
  int E, k;
  bool softmax_score, renorm, z;
  float scale;
  float aux_scale;  // coeff E / (k T^2): a_e = aux_scale * counts_e
  float z_scale;    // 2 coeff / T
};

template <int kPer>
__global__ void __launch_bounds__(Cfg::kThreads) router_bwd_kernel(RouterBwdParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * Cfg::kWarps + warp;
  if (t >= p.T) return;
  float a[kPer];  // aux-loss gradient of each owned expert's P
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    a[i] = p.counts != nullptr && e < p.E ? rn::mul(p.aux_scale, float(p.counts[e])) : 0.0f;
  }
  {
    TokenScores<kPer> ts;
    ts.load(p.logits + t * p.E, lane, p.E);
    ts.scores(p.softmax_score, p.z, lane, p.E);
    // lane j < k holds choice j: its expert, d weight and raw weight s[id]
    int my_id = -1;
    float my_dw = 0.0f;
    if (lane < p.k) {
      my_id = p.ids[t * p.k + lane];
      my_dw = p.d_weights[t * p.k + lane];
      if (my_id < 0 || my_id >= p.E) {
        report_fault(p.status, kFaultBadIndex, OpId::moe_router, int32_t(t), my_id);
        my_id = -1;
      }
    }
    float sum = 0.0f, my_wr = 0.0f;
    for (int j = 0; j < p.k; ++j) {  // raw weights and their sum in choice order
      const int id = __shfl_sync(kFullMask, my_id, j);
      const float wr = id >= 0 ? warp_item<kPer>(ts.s, id) : 0.0f;
      if (lane == j) my_wr = wr;
      sum = rn::add(sum, wr);
    }
    sum = rn::add(sum, rn::kRenormEps);
    float dot = 0.0f;
    if (p.renorm)
      for (int j = 0; j < p.k; ++j) {
        const float dw = __shfl_sync(kFullMask, my_dw, j), wr = __shfl_sync(kFullMask, my_wr, j);
        dot = rn::add(dot, rn::mul(rn::mul(dw, p.scale), rn::div(wr, sum)));
      }
    float ds[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) ds[i] = 0.0f;
    for (int j = 0; j < p.k; ++j) {
      const int id = __shfl_sync(kFullMask, my_id, j);
      const float g = rn::mul(__shfl_sync(kFullMask, my_dw, j), p.scale);
      const float d = p.renorm ? rn::div(rn::sub(g, dot), sum) : g;
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        if (id >= 0 && lane + 32 * i == id) ds[i] = rn::add(ds[i], d);
    }
    if (p.counts != nullptr) {  // aux loss
      if (p.softmax_score) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) ds[i] = rn::add(ds[i], a[i]);
      } else {
        const float z = rn::add(warp_lane_sum<kPer>(ts.s, lane, p.E), rn::kRenormEps);
        float ap_i[kPer];
#pragma unroll
        for (int i = 0; i < kPer; ++i) ap_i[i] = rn::mul(a[i], rn::div(ts.s[i], z));
        const float ap = warp_lane_sum<kPer>(ap_i, lane, p.E);
#pragma unroll
        for (int i = 0; i < kPer; ++i) ds[i] = rn::add(ds[i], rn::div(rn::sub(a[i], ap), z));
      }
    }
    float dl[kPer];
    if (p.softmax_score) {
      float v[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) v[i] = rn::mul(ds[i], ts.s[i]);
      const float d2 = warp_lane_sum<kPer>(v, lane, p.E);
#pragma unroll
      for (int i = 0; i < kPer; ++i) dl[i] = rn::mul(ts.s[i], rn::sub(ds[i], d2));
    } else {
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        dl[i] = rn::mul(ds[i], rn::mul(ts.s[i], rn::sub(1.0f, ts.s[i])));
    }
    if (p.z) {
      const float f = rn::mul(p.z_scale, ts.lse());
#pragma unroll
      for (int i = 0; i < kPer; ++i) dl[i] = rn::add(dl[i], rn::mul(f, ts.p[i]));
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i < p.E) p.d_logits[t * p.E + lane + 32 * i] = dl[i];
  }
}

}  // namespace

void moe_router_backward(Context& ctx, const RouterConfig& cfg, const RouterBackwardArgs& a) {
  const int64_t T = a.logits.dim(0), E = cfg.experts;
  if (T == 0) return;
  RouterBwdParams p{};
  p.logits = a.logits.ptr<float>();
  p.ids = a.expert_ids.ptr<int32_t>();
  p.counts = cfg.aux_loss_coeff != 0 ? a.counts.ptr<int32_t>() : nullptr;
  p.d_weights = a.d_weights.ptr<float>();
  p.d_logits = a.d_logits.ptr<float>();
  p.status = ctx.status();
  p.T = T;
  p.E = int(E);
  p.k = int(cfg.topk);
  p.softmax_score = cfg.score == RouterScore::softmax;
  p.renorm = cfg.renormalize;
  p.z = cfg.z_loss_coeff != 0;
  p.scale = cfg.scaling_factor;
  // The same host expressions as the CPU reference's, so the constants are the same floats.
  const double Td = double(T);
  p.aux_scale = float(double(cfg.aux_loss_coeff) * double(E) / (double(cfg.topk) * Td * Td));
  p.z_scale = float(2.0 * double(cfg.z_loss_coeff) / Td);
  const unsigned blocks = grid_size(qnum::ceil_div(T, Cfg::kWarps));
  dispatch_per_lane(E, [&](auto per) {
    router_bwd_kernel<decltype(per)::value><<<blocks, Cfg::kThreads, 0, ctx.stream()>>>(p);
  });
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
