// CUDA router-weighted SwiGLU (plain, or with a SwigluForm: gpt-oss's clamp, alpha, up offset and
// interleaved gate/up pairs): one warp per row (grid-stride over rows), 16-byte vectors of the
// gate and up halves (interleaved: two consecutive vectors of pairs, de-interleaved in registers).
// With fewer rows than the GPU has warps, the forward splits each row over `chunks` warps
// (vector-interleaved): at decode batches one warp's serial walk of a row was the kernel's time.
// The backward's dprob is the row's sum of dout * swiglu in a fixed order: each lane adds its
// vectors (lane-strided) element by element, then a butterfly, so it is deterministic run to run
// and independent of the grid. Element math: swiglu_backends.hpp's weighted_swiglu_* and
// swiglu_form_* with the fast sigmoid (the sigmoid's division without the IEEE slow path: this
// kernel is bound by instruction issue, not bandwidth; see there).
// With splits (the at-most mode, moe.hpp) each block first sums the splits on the device
// (scan_splits) and runs only the rows [0, min(sum, M)); block 0 reports the splits rule's faults.
#include <algorithm>

#include "moe/backends.hpp"
#include "moe/swiglu_backends.hpp"
#include "kernels/common/occupancy.cuh"
#include "kernels/common/splits_scan.cuh"
#include "moe/cuda/moe_common.cuh"

namespace groupmm::cuda {
namespace {

using namespace moe;

struct WeightedSwigluConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlocksPerSm = 8;  // grid: min(rows / kWarps, SMs * this, resident)
  static_assert(kThreads <= 1024, "block size");
};

struct WeightedSwigluParams {
  const void* gate_up;  // [M, 2I]
  const float* prob;    // [M]
  const void* dout;     // [M, I] (backward)
  void* out;            // [M, I] (forward) or dgate_up [M, 2I] (backward)
  float* dprob;         // [M] (backward)
  int64_t M, I;
  const void* splits = nullptr;  // [G] int32 / int64 (the at-most mode), or null: every row
  bool splits64 = false;
  int64_t G = 0;
  StatusBlock* status = nullptr;
  int64_t chunks = 1;  // warps per row (forward; the backward's dprob sums a row in one warp)
};

// The rows this call computes: M, or min(sum of the splits, M) with splits (the splits rule of
// offsets.hpp at most M rows, scan_splits; block 0 reports its faults). Every thread of the block
// must call it.
__device__ __forceinline__ int64_t rows_to_compute(const WeightedSwigluParams& p) {
  if (p.splits == nullptr) return p.M;
  SplitsScanArgs sa;
  sa.splits = p.splits;
  sa.splits64 = p.splits64;
  sa.G = p.G;
  sa.row_bound = p.M;
  sa.expected_total = p.M;
  sa.total_at_most = true;
  sa.status = blockIdx.x == 0 ? p.status : nullptr;
  sa.op = OpId::weighted_swiglu;
  const auto totals = scan_splits<WeightedSwigluConfig::kThreads, 0>(
      sa, [](int64_t) { return Counts<0>{}; }, [](const ExpertSpan<0>&) {});
  return min(totals.rows, p.M);
}

// The element math of a kernel: swiglu's (kForm false: the plain op, unchanged) or a SwigluForm's.
template <bool kForm>
struct ElemMath {
  SwigluFormElem f;
  __device__ __forceinline__ float fwd(float g, float u) const {
    if constexpr (kForm)
      return swiglu_form_fwd(g, u, f, SwigluSigmoidFast{});
    else
      return weighted_swiglu_fwd_elem(g, u);
  }
  __device__ __forceinline__ void bwd(float d, float g, float u, float& dg, float& du) const {
    if constexpr (kForm)
      swiglu_form_bwd(d, g, u, f, SwigluSigmoidFast{}, dg, du);
    else
      weighted_swiglu_bwd_elem(d, g, u, dg, du);
  }
};

// Element n of the 2N values held by the vectors (a, b) and its setter: interleaved pairs (gate,
// up) = elements (2n, 2n + 1) of vectors 2v and 2v + 1 of the row.
template <class P, int N>
__device__ __forceinline__ auto& pair_elem(P& a, P& b, int j) {
  return j < N ? a.v[j] : b.v[j - N];
}

// kForm: a SwigluForm (else the plain SwiGLU); kInterleaved: gate_up's layout (kForm only).
template <class E, int N, bool kBackward, bool kForm, bool kInterleaved>
__global__ void __launch_bounds__(WeightedSwigluConfig::kThreads)
    weighted_swiglu_kernel(WeightedSwigluParams p, ElemMath<kForm> math) {
  static_assert(kForm || !kInterleaved, "the interleaved layout is a SwigluForm");
  using S = typename E::Storage;
  using P = ElementVec<E, N>;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * WeightedSwigluConfig::kWarps;
  const int64_t V = p.I / N;
  const int64_t M = rows_to_compute(p);
  const int64_t chunks = kBackward ? 1 : p.chunks;
  for (int64_t q = int64_t(blockIdx.x) * WeightedSwigluConfig::kWarps + threadIdx.x / 32;
       q < M * chunks; q += warps) {
    const int64_t m = q / chunks, chunk = q % chunks;
    const P* __restrict__ row =
        reinterpret_cast<const P*>(static_cast<const S*>(p.gate_up) + m * 2 * p.I);
    const P* __restrict__ dout =
        kBackward ? reinterpret_cast<const P*>(static_cast<const S*>(p.dout) + m * p.I) : nullptr;
    P* dgu = reinterpret_cast<P*>(static_cast<S*>(p.out) + m * 2 * p.I);  // backward
    const float w = p.prob[m];
    float dp = 0.0f;
    auto one = [&](int64_t v, P g, P u, const P& d) {
      if constexpr (kInterleaved) {  // (g, u) hold vectors 2v, 2v + 1: de-interleave them
        P a = g, b = u;
#pragma unroll
        for (int n = 0; n < N; ++n) {
          g.v[n] = pair_elem<P, N>(a, b, 2 * n);
          u.v[n] = pair_elem<P, N>(a, b, 2 * n + 1);
        }
      }
      if constexpr (!kBackward) {
        P o;
#pragma unroll
        for (int n = 0; n < N; ++n)
          o.v[n] = E::from_float(math.fwd(E::to_float(g.v[n]), E::to_float(u.v[n])) * w);
        reinterpret_cast<P*>(static_cast<S*>(p.out) + m * p.I)[v] = o;
      } else {
        P dg, du;
#pragma unroll
        for (int n = 0; n < N; ++n) {
          const float gf = E::to_float(g.v[n]), uf = E::to_float(u.v[n]), df = E::to_float(d.v[n]);
          float a, b;
          math.bwd(df * w, gf, uf, a, b);
          dg.v[n] = E::from_float(a);
          du.v[n] = E::from_float(b);
          dp += df * math.fwd(gf, uf);
        }
        if constexpr (kInterleaved) {
          P a, b;
#pragma unroll
          for (int n = 0; n < N; ++n) {
            pair_elem<P, N>(a, b, 2 * n) = dg.v[n];
            pair_elem<P, N>(a, b, 2 * n + 1) = du.v[n];
          }
          dgu[2 * v] = a;
          dgu[2 * v + 1] = b;
        } else {
          dgu[v] = dg;
          dgu[V + v] = du;
        }
      }
    };
#pragma unroll 2
    for (int64_t v = chunk * 32 + lane; v < V; v += 32 * chunks) {
      P d{};
      if constexpr (kBackward) d = dout[v];
      if constexpr (kInterleaved)
        one(v, row[2 * v], row[2 * v + 1], d);
      else
        one(v, row[v], row[V + v], d);
    }
    if constexpr (kBackward) {
#pragma unroll
      for (int step = 16; step >= 1; step /= 2) dp += __shfl_xor_sync(kFullMask, dp, step);
      if (lane == 0) p.dprob[m] = dp;
    }
  }
}

template <bool kBackward, bool kForm, bool kInterleaved>
void launch(Context& ctx, DType t, const WeightedSwigluParams& p, const SwigluFormElem& f) {
  dispatch_element(t, "weighted_swiglu dtype", [&](auto e) {
    using E = decltype(e);
    constexpr int kVec = kVec16<E>;
    const bool vec = p.I % kVec == 0 && aligned16(p.gate_up) && aligned16(p.out) &&
                     (p.dout == nullptr || aligned16(p.dout));
    // The forward's warps per row: enough for every warp the grid can hold, at most one pass.
    constexpr int kT = WeightedSwigluConfig::kThreads;
    WeightedSwigluParams q = p;
    if (!kBackward && p.M > 0) {
      const int64_t warps = int64_t(ctx.sm_count()) * WeightedSwigluConfig::kBlocksPerSm *
                            WeightedSwigluConfig::kWarps;
      const int64_t passes = qnum::ceil_div(p.I / (vec ? kVec : 1), int64_t(32));
      q.chunks = std::clamp<int64_t>(warps / p.M, 1, std::max<int64_t>(passes, 1));
    }
    // At least one block with splits: it reports the faults of a sum above M = 0.
    const int64_t want = std::max<int64_t>(
        qnum::ceil_div(p.M * q.chunks, WeightedSwigluConfig::kWarps), p.splits != nullptr ? 1 : 0);
    auto kernel = vec ? weighted_swiglu_kernel<E, kVec, kBackward, kForm, kInterleaved>
                      : weighted_swiglu_kernel<E, 1, kBackward, kForm, kInterleaved>;
    const unsigned grid = resident_grid(ctx, kernel, kT, want, WeightedSwigluConfig::kBlocksPerSm);
    kernel<<<grid, kT, 0, ctx.stream()>>>(q, ElemMath<kForm>{f});
    GROUPMM_CHECK_LAUNCH();
  });
}

template <bool kBackward>
void launch(Context& ctx, DType t, const WeightedSwigluParams& p, const SwigluForm& form) {
  if (p.M == 0 && p.splits == nullptr) return;
  const SwigluFormElem f{form.alpha, form.limit, form.up_offset};
  if (form.plain())
    launch<kBackward, false, false>(ctx, t, p, f);
  else if (form.layout == SwigluLayout::halves)
    launch<kBackward, true, false>(ctx, t, p, f);
  else
    launch<kBackward, true, true>(ctx, t, p, f);
}

void with_splits(Context& ctx, WeightedSwigluParams& p, const TensorView& splits) {
  if (!splits.present()) return;
  p.splits = splits.data;
  p.splits64 = splits.dtype == DType::int64;
  p.G = splits.dim(0);
  p.status = ctx.status();
}

}  // namespace

void weighted_swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& prob,
                             const TensorView& out, const SwigluForm& form,
                             const TensorView& splits) {
  WeightedSwigluParams p{gate_up.data, prob.ptr<float>(), nullptr,   out.data,
                         nullptr,      out.dim(0),        out.dim(1)};
  with_splits(ctx, p, splits);
  launch<false>(ctx, gate_up.dtype, p, form);
}

void weighted_swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                              const TensorView& prob, const TensorView& dgate_up,
                              const TensorView& dprob, const SwigluForm& form,
                              const TensorView& splits) {
  WeightedSwigluParams p{gate_up.data,       prob.ptr<float>(), dout.data,  dgate_up.data,
                         dprob.ptr<float>(), dout.dim(0),       dout.dim(1)};
  with_splits(ctx, p, splits);
  launch<true>(ctx, gate_up.dtype, p, form);
}

}  // namespace groupmm::cuda
