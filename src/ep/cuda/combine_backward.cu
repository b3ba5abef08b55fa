// Expert side of ep_combine_backward on CUDA (the CPU reference: src/ep/cpu/combine_backward.cpp):
//   scale: d_yg[g] = w_recv[e] * dy_recv[e / k] for the entry e of every grouped row (0 for the
//     tail, or the tail left alone), one fp32 product rounded once (unweighted: a copy);
//   dot: one warp per entry sent back, d_weight = dot(dy_recv[e / k], yg[g]) in the fixed order
//     of ep_dot_order: lane l sums h = l, l + 32, ... (ep/backends.hpp's dot_lane_partial), then
//     a butterfly of __fadd_rn over __shfl_xor_sync, exactly the CPU's emulation.
// Graph safe: device indices only.
#include "ep/cuda/ep_common.cuh"

namespace groupmm::ep::cuda {
namespace {

struct ScaleParams {
  void* d_yg;
  RecvRows dy_recv;
  const float* w_recv;
  const int32_t* grouped_entry;
  int64_t k;
  bool zero_tail;
  RowGeometry geo;  // plan.rows rows of vectors
};

template <class E, int N>
__global__ void __launch_bounds__(MoverConfig::kThreads) scale_rows_kernel(ScaleParams p) {
  using P = ElementVec<E, N>;
  P* __restrict__ out = static_cast<P*>(p.d_yg);
  const int64_t nv = p.geo.vecs;
  p.geo.for_each_row([&](int64_t g, int lane) {
    const int64_t e = p.grouped_entry[g];
    const P* dy = reinterpret_cast<const P*>(e >= 0 ? p.dy_recv.row(e / p.k) : nullptr);
    if (dy == nullptr && !p.zero_tail) return;                   // a tail row left as it was
    const bool weighted = dy != nullptr && p.w_recv != nullptr;  // else a copy (through fp32)
    const float w = weighted ? p.w_recv[e] : 1.0f;
    for (int64_t v = lane; v < nv; v += p.geo.threads_per_row) {
      P o{};
      if (dy != nullptr) {
        const P d = dy[v];
#pragma unroll
        for (int n = 0; n < N; ++n) {
          const float x = E::to_float(d.v[n]);
          o.v[n] = E::from_float(weighted ? __fmul_rn(w, x) : x);
        }
      }
      out[g * nv + v] = o;
    }
  });
}

struct DotParams {
  RecvRows dy_recv;
  const void* yg;
  const int32_t* grouped_entry;
  const int32_t* back_grouped;
  float* dw_send;
  int64_t n, k, H;
};

constexpr int kDotWarps = MoverConfig::kThreads / 32;

template <class E>
__global__ void __launch_bounds__(MoverConfig::kThreads) dot_kernel(DotParams p) {
  using S = typename E::Storage;
  const int lane = int(threadIdx.x) % 32;
  const S* __restrict__ yg = static_cast<const S*>(p.yg);
  const int64_t stride = int64_t(gridDim.x) * kDotWarps;
  for (int64_t i = int64_t(blockIdx.x) * kDotWarps + threadIdx.x / 32; i < p.n; i += stride) {
    const int64_t g = p.back_grouped[i];
    const int64_t e = g >= 0 ? p.grouped_entry[g] : -1;
    const S* a = reinterpret_cast<const S*>(e >= 0 ? p.dy_recv.row(e / p.k) : nullptr);
    if (a == nullptr) continue;  // warp-uniform
    const S* b = yg + g * p.H;
    float acc = ::groupmm::ep::detail::dot_lane_partial(
        lane, p.H, [a](int64_t h) { return E::to_float(a[h]); },
        [b](int64_t h) { return E::to_float(b[h]); });
#pragma unroll
    for (int m = ::groupmm::ep::detail::kDotLanes / 2; m >= 1; m /= 2)
      acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, m));
    if (lane == 0) p.dw_send[i] = acc;
  }
}

}  // namespace

void ep_combine_backward_expert(Context& ctx, const EpPlan& plan, const RecvRows& dy_recv,
                                const float* w_recv, const TensorView& y_grouped,
                                const TensorView& d_y_grouped, float* dw_send, bool zero_tail) {
  const int64_t H = plan.cfg.hidden, k = plan.cfg.topk;
  const int32_t* grouped_entry = plan.grouped_entry.ptr<int32_t>();
  dispatch_element(d_y_grouped.dtype, "ep_combine_backward dtype", [&](auto el) {
    using E = decltype(el);
    constexpr int kVec = kVec16<E>;
    const bool vec =
        H % kVec == 0 && recv_rows_aligned(dy_recv, 16) && aligned_to(d_y_grouped.data, 16);
    ScaleParams s{d_y_grouped.data,
                  dy_recv,
                  w_recv,
                  grouped_entry,
                  k,
                  zero_tail,
                  RowGeometry(ctx, plan.rows, vec ? H / kVec : H)};
    if (s.geo.grid > 0) {
      if (vec) {
        s.geo.fit(ctx, scale_rows_kernel<E, kVec>);
        scale_rows_kernel<E, kVec><<<s.geo.grid, MoverConfig::kThreads, 0, ctx.stream()>>>(s);
      } else {
        s.geo.fit(ctx, scale_rows_kernel<E, 1>);
        scale_rows_kernel<E, 1><<<s.geo.grid, MoverConfig::kThreads, 0, ctx.stream()>>>(s);
      }
      GROUPMM_CHECK_LAUNCH();
    }
    if (dw_send == nullptr) return;  // unweighted: no d_weights
    const DotParams d{dy_recv,
                      y_grouped.data,
                      grouped_entry,
                      plan.back_grouped.ptr<int32_t>(),
                      dw_send,
                      plan.back_send_total,
                      k,
                      H};
    if (d.n == 0) return;
    const int64_t cap = int64_t(std::max(ctx.sm_count(), 1)) * MoverConfig::kCtasPerSm;
    const unsigned grid = unsigned(std::min(qnum::ceil_div(d.n, int64_t(kDotWarps)), cap));
    dot_kernel<E><<<grid, MoverConfig::kThreads, 0, ctx.stream()>>>(d);
    GROUPMM_CHECK_LAUNCH();
  });
}

}  // namespace groupmm::ep::cuda
