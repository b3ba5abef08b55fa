// The expert-parallel row movers on CUDA (the CPU reference: src/ep/cpu/rows.cpp):
//   gather: dst row i = src row idx[i] / div (a receive row: staged, or the rank's own block read
//     in place), as bytes in the widest vector the row length, the strides and the pointers allow
//     (every pack and unpack of ep_dispatch / ep_combine / the backwards);
//   scatter: each receive row read once and written to the grouped rows its slots name (the
//     unpacks of ep_dispatch and of the combine backward's dy); the inverse of an index map;
//   weighted sum: the home rank's out[t] = sum_j w[t, j] * rows[slot_entry[t, j]] (+ add[t]) in
//     fp32, slot order, rounded once (__fmul_rn / __fadd_rn: never an fma, like the CPU's two
//     roundings).
// Both are graph safe: device indices only, no sync, no allocation.
#include "ep/cuda/ep_common.cuh"

namespace groupmm::ep::cuda {
namespace {

struct GatherParams {
  void* dst;
  RecvRows src;
  const int32_t* idx;
  int64_t div;
  bool zero_missing;
  int64_t dst_stride;  // in vectors (launch_mover sets it)
  RowGeometry geo;
};

template <class V>
__global__ void __launch_bounds__(MoverConfig::kThreads) gather_rows_kernel(GatherParams p) {
  V* __restrict__ dst = static_cast<V*>(p.dst);
  const int64_t nv = p.geo.vecs, step = p.geo.threads_per_row;
  p.geo.for_each_row([&](int64_t i, int lane) {
    const int64_t s = p.idx[i];
    const V* row = reinterpret_cast<const V*>(s >= 0 ? p.src.row(s / p.div) : nullptr);
    if (row != nullptr) {
      for (int64_t v = lane; v < nv; v += step) dst[i * p.dst_stride + v] = row[v];
    } else if (p.zero_missing) {
      for (int64_t v = lane; v < nv; v += step) dst[i * p.dst_stride + v] = V{};
    }
  });
}

// Sets a byte mover's geometry (n rows of row_bytes in vectors V) and destination stride, and
// launches it (nothing for 0 rows).
template <class V, class Params>
void launch_mover(Context& ctx, void (*kernel)(Params), Params p, int64_t n, int64_t row_bytes,
                  int64_t dst_stride) {
  p.geo = RowGeometry(ctx, n, row_bytes / int64_t(sizeof(V)));
  p.dst_stride = dst_stride / int64_t(sizeof(V));
  if (p.geo.grid == 0) return;
  p.geo.fit(ctx, kernel);
  kernel<<<p.geo.grid, MoverConfig::kThreads, 0, ctx.stream()>>>(p);
  GROUPMM_CHECK_LAUNCH();
}

struct ScatterParams {
  void* dst;
  RecvRows src;
  const int32_t* map;  // [n, k]: the grouped row of each receive row's slot, -1: none
  int64_t k;
  int64_t dst_stride;  // in vectors (launch_mover sets it)
  RowGeometry geo;     // the n receive rows
};

// One read of each receive row, written to each grouped row its slots name (a row's vectors and k
// are far below 2^31: 32-bit counters).
template <class V>
__global__ void __launch_bounds__(MoverConfig::kThreads) scatter_rows_kernel(ScatterParams p) {
  V* __restrict__ dst = static_cast<V*>(p.dst);
  const int nv = int(p.geo.vecs), step = p.geo.threads_per_row, k = int(p.k);
  p.geo.for_each_row([&](int64_t r, int lane) {
    const V* row = reinterpret_cast<const V*>(p.src.row(r));
    if (row == nullptr) return;
    const int32_t* m = p.map + r * k;
    for (int v = lane; v < nv; v += step) {
      const V x = row[v];
      for (int j = 0; j < k; ++j) {
        const int32_t g = m[j];
        if (g >= 0) dst[int64_t(g) * p.dst_stride + v] = x;
      }
    }
  });
}

__global__ void __launch_bounds__(PlanLaunch::kThreads)
    invert_index_kernel(int32_t* out, const int32_t* idx, int64_t n_in) {
  for (int64_t j = grid_stride_start(); j < n_in; j += grid_stride()) {
    const int32_t g = idx[j];
    if (g >= 0) out[g] = int32_t(j);
  }
}

struct SumParams {
  void* out;
  RecvRows rows;
  const int32_t* slot_entry;  // [T, k]
  const float* w;             // [T, k] or null (unweighted)
  const void* add;            // [T, H] of out's dtype, or null
  int64_t k;
  RowGeometry geo;  // T rows of vectors
};

template <class E, int N>
__global__ void __launch_bounds__(MoverConfig::kThreads) weighted_sum_kernel(SumParams p) {
  using P = ElementVec<E, N>;
  P* __restrict__ out = static_cast<P*>(p.out);
  const int64_t nv = p.geo.vecs;
  p.geo.for_each_row([&](int64_t t, int lane) {
    const int32_t* se = p.slot_entry + t * p.k;
    for (int64_t v = lane; v < nv; v += p.geo.threads_per_row) {
      float acc[N];
#pragma unroll
      for (int n = 0; n < N; ++n) acc[n] = 0.0f;
      for (int64_t j = 0; j < p.k; ++j) {
        const int64_t r = se[j];
        const P* row = reinterpret_cast<const P*>(r >= 0 ? p.rows.row(r) : nullptr);
        if (row == nullptr) continue;
        const P y = row[v];
        const float wj = p.w != nullptr ? p.w[t * p.k + j] : 1.0f;
#pragma unroll
        for (int n = 0; n < N; ++n) {
          const float yn = E::to_float(y.v[n]);
          acc[n] = __fadd_rn(acc[n], p.w != nullptr ? __fmul_rn(wj, yn) : yn);
        }
      }
      P o;
      if (p.add != nullptr) {  // the addend last, like moe_unpermute's
        const P a = static_cast<const P*>(p.add)[t * nv + v];
#pragma unroll
        for (int n = 0; n < N; ++n) acc[n] = __fadd_rn(acc[n], E::to_float(a.v[n]));
      }
#pragma unroll
      for (int n = 0; n < N; ++n) o.v[n] = E::from_float(acc[n]);
      out[t * nv + v] = o;
    }
  });
}

}  // namespace

// Calls launch(V{}) with the widest vector type V (16, 4 or 1 bytes) that the row length, the
// destination's stride and pointer, and the receive rows allow.
template <class Launch>
void with_row_vector(int64_t row_bytes, int64_t dst_stride, const void* dst, const RecvRows& src,
                     const Launch& launch) {
  const auto fits = [&](size_t v) {
    return row_bytes % int64_t(v) == 0 && dst_stride % int64_t(v) == 0 && aligned_to(dst, v) &&
           recv_rows_aligned(src, v);
  };
  if (fits(16))
    launch(uint4{});
  else if (fits(4))
    launch(uint32_t{});
  else
    launch(uint8_t{});
}

void ep_gather_rows_strided(Context& ctx, void* dst, int64_t dst_stride, const RecvRows& src,
                            const int32_t* idx, int64_t n, int64_t div, int64_t row_bytes,
                            bool zero_missing) {
  const GatherParams p{dst, src, idx, div, zero_missing, 0, RowGeometry(ctx, 0, 0)};
  with_row_vector(row_bytes, dst_stride, dst, src, [&](auto v) {
    using V = decltype(v);
    launch_mover<V>(ctx, gather_rows_kernel<V>, p, n, row_bytes, dst_stride);
  });
}

void ep_scatter_rows(Context& ctx, void* dst, int64_t dst_stride, const RecvRows& src,
                     const int32_t* map, int64_t n, int64_t k, int64_t row_bytes) {
  const ScatterParams p{dst, src, map, k, 0, RowGeometry(ctx, 0, 0)};
  with_row_vector(row_bytes, dst_stride, dst, src, [&](auto v) {
    using V = decltype(v);
    launch_mover<V>(ctx, scatter_rows_kernel<V>, p, n, row_bytes, dst_stride);
  });
}

void ep_invert_index(Context& ctx, int32_t* out, int64_t n_out, const int32_t* idx, int64_t n_in) {
  if (n_out > 0)
    GROUPMM_CHECK_CUDA(cudaMemsetAsync(out, 0xFF, size_t(n_out) * sizeof(int32_t), ctx.stream()));
  if (n_in == 0) return;
  invert_index_kernel<<<PlanLaunch::grid(ctx, n_in), PlanLaunch::kThreads, 0, ctx.stream()>>>(
      out, idx, n_in);
  GROUPMM_CHECK_LAUNCH();
}

void ep_gather_rows(Context& ctx, void* dst, const void* src, const int32_t* idx, int64_t n,
                    int64_t div, int64_t row_bytes, bool zero_missing) {
  ep_gather_rows_strided(ctx, dst, row_bytes, RecvRows::plain(src, row_bytes), idx, n, div,
                         row_bytes, zero_missing);
}

void ep_weighted_sum(Context& ctx, const TensorView& out, const RecvRows& rows,
                     const int32_t* slot_entry, const float* w, int64_t k, const void* add) {
  const int64_t T = out.dim(0), H = out.dim(1);
  dispatch_element(out.dtype, "ep_combine dtype", [&](auto e) {
    using E = decltype(e);
    constexpr int kVec = kVec16<E>;
    const bool vec = H % kVec == 0 && aligned_to(out.data, 16) && recv_rows_aligned(rows, 16) &&
                     aligned_to(add, 16);
    SumParams p{out.data, rows, slot_entry, w, add, k, RowGeometry(ctx, T, vec ? H / kVec : H)};
    if (p.geo.grid == 0) return;
    if (vec) {
      p.geo.fit(ctx, weighted_sum_kernel<E, kVec>);
      weighted_sum_kernel<E, kVec><<<p.geo.grid, MoverConfig::kThreads, 0, ctx.stream()>>>(p);
    } else {
      p.geo.fit(ctx, weighted_sum_kernel<E, 1>);
      weighted_sum_kernel<E, 1><<<p.geo.grid, MoverConfig::kThreads, 0, ctx.stream()>>>(p);
    }
    GROUPMM_CHECK_LAUNCH();
  });
}

}  // namespace groupmm::ep::cuda
