// The two row movers of permute / unpermute, each one memory-bound pass of 16-byte vectors:
//   scatter (moe_permute, moe_unpermute_backward): a CTA reads a chunk of token rows once and
//   writes
//     each to its k destination rows; extra CTAs zero the padding and tail rows. Every buffer row
//     is written exactly once (the plan gives each kept entry its own row), so no atomics.
//   gather (moe_unpermute, moe_permute_backward): a CTA sums each token's k source rows in choice
//     order in fp32 (then the routed bias's k products, fused, and the addend last) and rounds
//     once: the CPU reference's order, bit for bit.
// Rows shorter than a CTA share it (rows_per_cta rows of threads_per_row threads). With few tokens
// the gather also splits each row's vectors over col_chunks CTAs (decode batches: one token's row
// would otherwise be one CTA's serial loop); each vector is still one thread's sum in choice order.
#include <algorithm>
#include <type_traits>

#include "moe/backends.hpp"
#include "moe/cuda/moe_common.cuh"

namespace groupmm::cuda {
namespace {

using namespace moe;

struct MoverConfig {
  static constexpr int kThreads = 128;
  static constexpr int kBatch = 8;     // gather: source rows whose loads are issued together
  static constexpr int kScatterU = 4;  // scatter: vectors of a row per thread, loaded together
  static constexpr int kZeroCtasPerSm = 2;
  static constexpr int kGatherCtasPerSm = 2;  // gather: below this, rows split over CTAs
  static_assert(kThreads % 32 == 0, "whole warps");
};

struct MoverParams {
  const void* src;
  void* dst;
  const void* add;           // gather: [T, H] or null
  const int32_t* dest_row;   // [T, k]
  const int32_t* row_start;  // [E] (scatter: padding rows)
  const int32_t* kept;       // [E]
  const float* weights;      // scatter: [T, k] or null
  float* probs;              // scatter: [R] or null
  const float* d_probs;      // gather: [R] or null
  float* d_weights;          // gather: [T, k] or null
  const void* bias;          // gather: the routed bias [E, H] or null (then ids, rw too)
  const int32_t* ids;        // gather: [T, k]
  const float* rw;           // gather: [T, k] router weights
  StatusBlock* status;
  int64_t T, k, E, align, rows;
  int vecs;  // vectors per row
  int rows_per_cta, threads_per_row;
  int64_t token_ctas;  // CTAs [0, token_ctas) move tokens; the rest zero rows (scatter)
  int col_chunks = 1;  // gather: CTAs a token block's rows are split over (vector-interleaved)
};

template <class E, int N>
__global__ void __launch_bounds__(MoverConfig::kThreads) scatter_kernel(MoverParams p) {
  using P = ElementVec<E, N>;
  const int r = threadIdx.x / p.threads_per_row, lv = threadIdx.x % p.threads_per_row;
  if (r >= p.rows_per_cta) return;
  const P* __restrict__ src = static_cast<const P*>(p.src);
  P* __restrict__ dst = static_cast<P*>(p.dst);
  const int64_t V = p.vecs;
  if (blockIdx.x < p.token_ctas) {
    const int64_t t = int64_t(blockIdx.x) * p.rows_per_cta + r;
    if (t >= p.T) return;
    const int32_t* dest = p.dest_row + t * p.k;
    // kScatterU vectors of the row per thread, their loads issued before the stores.
    constexpr int U = MoverConfig::kScatterU;
    const int64_t step = p.threads_per_row;
    for (int64_t v0 = lv; v0 < V; v0 += step * U) {
      P val[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (v0 + u * step < V) val[u] = src[t * V + v0 + u * step];
      for (int64_t j = 0; j < p.k; ++j) {
        const int64_t d = dest[j];
        if (d < 0) continue;
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (v0 + u * step < V) dst[d * V + v0 + u * step] = val[u];
      }
    }
    if (p.probs != nullptr && lv == 0)
      for (int64_t j = 0; j < p.k; ++j)
        if (dest[j] >= 0) p.probs[dest[j]] = p.weights[t * p.k + j];
    return;
  }
  // Zero rows: slot q < E * (align - 1) is padding row q % (align - 1) of expert q / (align - 1)
  // (when that expert has that many); the slots after them are the tail rows.
  const int64_t pad_slots = p.E * (p.align - 1);
  const int64_t kl = p.kept[p.E - 1];
  const int64_t tail_start = p.row_start[p.E - 1] + qnum::round_up(kl, p.align);
  const int64_t n = pad_slots + (p.rows > tail_start ? p.rows - tail_start : 0);
  const int64_t stride = (int64_t(gridDim.x) - p.token_ctas) * p.rows_per_cta;
  for (int64_t q = (int64_t(blockIdx.x) - p.token_ctas) * p.rows_per_cta + r; q < n; q += stride) {
    int64_t row;
    if (q < pad_slots) {
      const int64_t e = q / (p.align - 1), i = q % (p.align - 1), ke = p.kept[e];
      if (i >= qnum::round_up(ke, p.align) - ke) continue;
      row = p.row_start[e] + ke + i;
    } else {
      row = tail_start + (q - pad_slots);
    }
    const P zero{};
    for (int64_t v = lv; v < V; v += p.threads_per_row) dst[row * V + v] = zero;
    if (p.probs != nullptr && lv == 0) p.probs[row] = 0.0f;
  }
}

// kU vectors of a row per thread and kBatch / kU choices per batch: kBatch loads in flight per
// thread whatever k is (with one vector per thread, top-2 kept only two 16-byte loads in flight;
// see docs/decisions.md, "MoE movers: several vectors per thread in the gather"). Each element
// still sums its choices in order. kBias: with the routed bias (p.bias), an instantiation of its
// own, so that the bias's batch of loads does not take registers from the plain gather.
template <class E, int N, int kU, bool kBias>
__global__ void __launch_bounds__(MoverConfig::kThreads) gather_kernel(MoverParams p) {
  using P = ElementVec<E, N>;
  constexpr int B = MoverConfig::kBatch / kU;  // choices per batch
  static_assert(MoverConfig::kBatch % kU == 0, "whole batches");
  const int r = threadIdx.x / p.threads_per_row, lv = threadIdx.x % p.threads_per_row;
  const int64_t chunk = blockIdx.x % p.col_chunks;
  const int64_t t = int64_t(blockIdx.x / p.col_chunks) * p.rows_per_cta + r;
  if (r >= p.rows_per_cta || t >= p.T) return;
  const P* __restrict__ src = static_cast<const P*>(p.src);
  const P* __restrict__ add = static_cast<const P*>(p.add);
  P* __restrict__ dst = static_cast<P*>(p.dst);
  const int64_t V = p.vecs, step = p.threads_per_row;
  const int32_t* dest = p.dest_row + t * p.k;
  // d_weights (chunk 0's): lane j loads choice j's d_prob before the row's loads and stores it
  // after them, so the k gathers overlap the row (one lane gathering them after the row kept every
  // CTA alive k load latencies longer). With more choices than lanes per row, the extra ones are
  // done last.
  const bool dw = p.d_weights != nullptr && lv < p.k && chunk == 0;
  const float dw0 = dw && dest[lv] >= 0 ? p.d_probs[dest[lv]] : 0.0f;
  const int64_t first = lv + chunk * step * kU;  // the thread's first vector
  for (int64_t v0 = first; v0 < V; v0 += step * kU * p.col_chunks) {
    float acc[kU][N];
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int n = 0; n < N; ++n) acc[u][n] = 0.0f;
    for (int64_t j0 = 0; j0 < p.k; j0 += B) {
      P buf[B][kU];
      bool ok[B][kU];
#pragma unroll
      for (int b = 0; b < B; ++b) {  // issue the batch's loads before summing
        const int64_t d = j0 + b < p.k ? dest[j0 + b] : -1;
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int64_t v = v0 + u * step;
          ok[b][u] = d >= 0 && v < V;
          if (ok[b][u]) buf[b][u] = src[d * V + v];
        }
      }
#pragma unroll
      for (int b = 0; b < B; ++b)
#pragma unroll
        for (int u = 0; u < kU; ++u)
          if (ok[b][u]) {
#pragma unroll
            for (int n = 0; n < N; ++n) acc[u][n] += E::to_float(buf[b][u].v[n]);
          }
    }
    if constexpr (kBias) {  // the routed bias after the k rows, j order (the CPU's order)
      const P* __restrict__ bias = static_cast<const P*>(p.bias);
      for (int64_t j0 = 0; j0 < p.k; j0 += B) {
        P buf[B][kU];
        bool ok[B][kU];
        float w[B];
#pragma unroll
        for (int b = 0; b < B; ++b) {  // the batch's bias rows load together, as the rows above
          const int64_t j = j0 + b, i = t * p.k + j;
          int64_t e = j < p.k && dest[j] >= 0 ? p.ids[i] : -1;
          if (j < p.k && dest[j] >= 0 && (e < 0 || e >= p.E)) {
            if (v0 == first)
              report_fault(p.status, kFaultBadIndex, OpId::moe_unpermute, int32_t(t), e);
            e = -1;
          }
          w[b] = e >= 0 ? p.rw[i] : 0.0f;
#pragma unroll
          for (int u = 0; u < kU; ++u) {
            const int64_t v = v0 + u * step;
            ok[b][u] = e >= 0 && v < V;
            if (ok[b][u]) buf[b][u] = bias[e * V + v];
          }
        }
#pragma unroll
        for (int b = 0; b < B; ++b)
#pragma unroll
          for (int u = 0; u < kU; ++u)
            if (ok[b][u]) {
#pragma unroll
              for (int n = 0; n < N; ++n)
                acc[u][n] = fmaf(w[b], E::to_float(buf[b][u].v[n]), acc[u][n]);
            }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t v = v0 + u * step;
      if (v >= V) break;
      if (add != nullptr) {
        const P a = add[t * V + v];
#pragma unroll
        for (int n = 0; n < N; ++n) acc[u][n] += E::to_float(a.v[n]);
      }
      P out;
#pragma unroll
      for (int n = 0; n < N; ++n) out.v[n] = E::from_float(acc[u][n]);
      dst[t * V + v] = out;
    }
  }
  if (dw) {
    p.d_weights[t * p.k + lv] = dw0;
    for (int64_t j = lv + step; j < p.k; j += step)
      p.d_weights[t * p.k + j] = dest[j] >= 0 ? p.d_probs[dest[j]] : 0.0f;
  }
}

// Vectors per thread of a gather: enough to keep kBatch loads in flight for top-k (k >= 8: one).
// Fewer token CTAs than kGatherCtasPerSm an SM split each row over more CTAs, up to one pass of
// the row's vectors each.
template <class E, int N>
void launch_gather(Context& ctx, MoverParams p) {
  constexpr int kThreads = MoverConfig::kThreads;
  const int kU = N == 1 || p.k >= 8 ? 1 : (p.k >= 4 ? 2 : (p.k >= 2 ? 4 : 8));
  const int64_t passes = qnum::ceil_div(int64_t(p.vecs), int64_t(p.threads_per_row) * kU);
  const int64_t want = int64_t(ctx.sm_count()) * MoverConfig::kGatherCtasPerSm;
  p.col_chunks = int(std::clamp<int64_t>(want / std::max<int64_t>(p.token_ctas, 1), 1,
                                         std::max<int64_t>(passes, 1)));
  const unsigned grid = grid_size(p.token_ctas * p.col_chunks);
  cudaStream_t s = ctx.stream();
  auto launch = [&](auto u) {
    constexpr int kUs = decltype(u)::value;
    if (p.bias != nullptr)
      gather_kernel<E, N, kUs, true><<<grid, kThreads, 0, s>>>(p);
    else
      gather_kernel<E, N, kUs, false><<<grid, kThreads, 0, s>>>(p);
  };
  if constexpr (N == 1) {  // the unaligned fallback, not tuned
    launch(std::integral_constant<int, 1>{});
  } else if (kU == 1) {
    launch(std::integral_constant<int, 1>{});
  } else if (kU == 2) {
    launch(std::integral_constant<int, 2>{});
  } else if (kU == 4) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 8>{});
  }
}

MoverParams base_params(const PermuteMap& m, const TensorView& src, const TensorView& dst) {
  MoverParams p{};
  p.src = src.data;
  p.dst = dst.data;
  p.dest_row = m.dest_row.ptr<int32_t>();
  p.row_start = m.row_start.ptr<int32_t>();
  p.kept = m.kept.ptr<int32_t>();
  p.T = m.tokens;
  p.k = m.topk;
  p.E = m.experts;
  p.align = m.align;
  p.rows = m.rows;
  return p;
}

// Row geometry for N-element vectors, then the launch. kScatter adds the zero-row CTAs.
template <bool kScatter>
void launch(Context& ctx, DType t, int64_t H, MoverParams p) {
  dispatch_element(t, "permute dtype", [&](auto e) {
    using E = decltype(e);
    constexpr int kVec = kVec16<E>;
    const bool vec = H % kVec == 0 && aligned16(p.src) && aligned16(p.dst) &&
                     (p.add == nullptr || aligned16(p.add)) &&
                     (p.bias == nullptr || aligned16(p.bias));
    const int64_t V = vec ? H / kVec : H;
    p.vecs = int(V);
    p.rows_per_cta = int(std::max<int64_t>(1, MoverConfig::kThreads / std::max<int64_t>(V, 1)));
    p.threads_per_row = MoverConfig::kThreads / p.rows_per_cta;
    p.token_ctas = qnum::ceil_div(p.T, p.rows_per_cta);
    const int64_t zero_ctas = kScatter ? int64_t(ctx.sm_count()) * MoverConfig::kZeroCtasPerSm : 0;
    const int64_t ctas = p.token_ctas + zero_ctas;
    if (ctas == 0) return;
    if constexpr (kScatter) {
      const unsigned grid = grid_size(ctas);
      if (vec)
        scatter_kernel<E, kVec><<<grid, MoverConfig::kThreads, 0, ctx.stream()>>>(p);
      else
        scatter_kernel<E, 1><<<grid, MoverConfig::kThreads, 0, ctx.stream()>>>(p);
    } else {
      if (vec)
        launch_gather<E, kVec>(ctx, p);
      else
        launch_gather<E, 1>(ctx, p);
    }
    GROUPMM_CHECK_LAUNCH();
  });
}

}  // namespace

void moe_scatter_rows(Context& ctx, const TensorView& src, const PermuteMap& m,
                      const TensorView& dst, const TensorView& weights, const TensorView& probs) {
  MoverParams p = base_params(m, src, dst);
  p.weights = weights.present() ? weights.ptr<float>() : nullptr;
  p.probs = probs.present() ? probs.ptr<float>() : nullptr;
  launch<true>(ctx, src.dtype, src.dim(1), p);
}

void moe_gather_rows(Context& ctx, const TensorView& src, const PermuteMap& m,
                     const TensorView& dst, const TensorView& add, const TensorView& d_probs,
                     const TensorView& d_weights, const RoutedBias& routed) {
  MoverParams p = base_params(m, src, dst);
  p.add = add.present() ? add.data : nullptr;
  if (routed.present()) {
    p.bias = routed.bias.data;
    p.ids = routed.expert_ids.ptr<int32_t>();
    p.rw = routed.weights.ptr<float>();
    p.status = ctx.status();
  }
  p.d_probs = d_probs.present() ? d_probs.ptr<float>() : nullptr;
  p.d_weights = d_weights.present() ? d_weights.ptr<float>() : nullptr;
  launch<false>(ctx, src.dtype, src.dim(1), p);
}

}  // namespace groupmm::cuda
