// CUDA group_dbias, deterministic and graph safe, in three launches:
//   1. group_offsets: start/end of each expert and its first 128-row chunk (the "padded rows"
//      scan with pad 128, divided by 128), all int64, into the workspace;
//   2. dbias_chunk_kernel: one block per (chunk, 256-column strip); 8 row lanes x 32 column
//      threads, 16-byte loads, a fixed shared-memory sum -> fp32 partial[chunk][n];
//   3. dbias_expert_kernel: one block per (expert, 256 columns) adds its chunks in order.
// Chunks never straddle two experts and there are at most ceil(M/128) + G of them (host-known), so
// a skewed routing spreads over the whole GPU without atomics.
#include "core/dbias_impl.hpp"
#include "core/offsets_impl.hpp"
#include "cuda/status.cuh"
#include "groupmm/convert.hpp"

namespace groupmm::cuda {
namespace {

struct DbiasConfig {
  static constexpr int kChunkRows = 128;
  static constexpr int kColThreads = 32;
  static constexpr int kRowLanes = 8;
  static constexpr int kThreads = kColThreads * kRowLanes;
  static constexpr int kReduceThreads = 256;
  static_assert(kChunkRows % kRowLanes == 0, "row lanes split a chunk evenly");
  static_assert(kThreads <= 1024 && kReduceThreads <= 1024, "block size");
};

struct DbiasParams {
  const void* dy;
  int64_t M, N, G;
  const int64_t* start;  // [G] unclamped (negative splits counted as 0)
  const int64_t* end;    // [G]
  const int64_t* prow;   // [G] sum_{j<g} roundup(m_j, 128): expert g's first chunk * 128
  float* partial;        // [max_chunks, N]
  void* db;
  bool db_fp32, accumulate;
  DType dtype;
  StatusBlock* status;
};

// Element loads as fp32 by storage type.
struct Bf16 {
  using S = uint16_t;
  static __device__ __forceinline__ float f(S v) { return bf16_bits_to_float(v); }
};
struct Fp16 {
  using S = uint16_t;
  static __device__ __forceinline__ float f(S v) { return fp16_bits_to_float(v); }
};
struct Fp32 {
  using S = float;
  static __device__ __forceinline__ float f(S v) { return v; }
};

template <class S, int VEC>
struct alignas(sizeof(S) * VEC) Vec {
  S v[VEC];
};

template <class E, int VEC>
__global__ void __launch_bounds__(DbiasConfig::kThreads) dbias_chunk_kernel(DbiasParams p) {
  using Cfg = DbiasConfig;
  using S = typename E::S;
  constexpr int kCols = Cfg::kColThreads * VEC;  // columns of this block's strip
  __shared__ float sm[Cfg::kRowLanes][kCols];
  const int64_t c = blockIdx.x;
  // The expert owning chunk c: the largest g with prow[g] <= c * 128 (zero-chunk experts share
  // their successor's prow, so the last of equal values is the one with chunks).
  const int64_t crow = c * Cfg::kChunkRows;
  int64_t lo = 0, hi = p.G - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (p.prow[mid] <= crow)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t g = lo;
  const int64_t e = min(p.end[g], p.M);
  const int64_t r0 = min(p.start[g], p.M) + (crow - p.prow[g]);
  const int64_t r1 = min(r0 + Cfg::kChunkRows, e);
  if (r0 >= r1) return;  // past the expert's valid rows: the expert kernel never reads it

  const int ct = threadIdx.x % Cfg::kColThreads, lane = threadIdx.x / Cfg::kColThreads;
  const int64_t col0 = int64_t(blockIdx.y) * kCols + int64_t(ct) * VEC;
  float acc[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
  if (col0 < p.N) {  // VEC > 1 only when N % VEC == 0, so the whole vector is in range
    const S* dy = static_cast<const S*>(p.dy);
    for (int64_t r = r0 + lane; r < r1; r += Cfg::kRowLanes) {
      const Vec<S, VEC> x = *reinterpret_cast<const Vec<S, VEC>*>(dy + r * p.N + col0);
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] += E::f(x.v[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) sm[lane][ct * VEC + i] = acc[i];
  __syncthreads();
  for (int j = threadIdx.x; j < kCols; j += Cfg::kThreads) {
    const int64_t col = int64_t(blockIdx.y) * kCols + j;
    if (col >= p.N) continue;
    float s = 0.0f;
#pragma unroll
    for (int l = 0; l < Cfg::kRowLanes; ++l) s += sm[l][j];
    p.partial[c * p.N + col] = s;
  }
}

__global__ void __launch_bounds__(DbiasConfig::kReduceThreads) dbias_expert_kernel(DbiasParams p) {
  using Cfg = DbiasConfig;
  const int64_t g = blockIdx.x;
  const int64_t col = int64_t(blockIdx.y) * Cfg::kReduceThreads + threadIdx.x;
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    const int64_t m = p.end[g] - p.start[g];
    if (p.end[g] > p.M && m > 0)
      report_fault(p.status, kFaultSplitsOverflow, OpId::group_dbias, static_cast<int32_t>(g), m);
    if (g == p.G - 1 && p.end[g] != p.M)
      report_fault(p.status, kFaultSplitsTotalMismatch, OpId::group_dbias, -1, p.end[g]);
  }
  if (col >= p.N) return;
  const int64_t rows = min(p.end[g], p.M) - min(p.start[g], p.M);
  if (rows == 0 && p.accumulate) return;  // zero-row expert: unchanged
  const int64_t chunks = (rows + Cfg::kChunkRows - 1) / Cfg::kChunkRows;
  const float* part = p.partial + (p.prow[g] / Cfg::kChunkRows) * p.N + col;
  float s = 0.0f;
  for (int64_t i = 0; i < chunks; ++i) s += part[i * p.N];
  const int64_t o = g * p.N + col;
  if (p.db_fp32) {
    float* db = static_cast<float*>(p.db);
    db[o] = p.accumulate ? s + db[o] : s;
  } else {
    static_cast<uint16_t*>(p.db)[o] =
        p.dtype == DType::bf16 ? float_to_bf16_bits(s) : float_to_fp16_bits(s);
  }
}

int64_t max_chunks(int64_t M, int64_t G) {
  return (M + DbiasConfig::kChunkRows - 1) / DbiasConfig::kChunkRows + G;
}
size_t index_bytes(int64_t G) {
  return (size_t(3 * G) * 8 + 255) / 256 * 256;
}

template <class E, int VEC>
void launch_chunks(const DbiasParams& p, int64_t chunks, cudaStream_t s) {
  constexpr int64_t kCols = DbiasConfig::kColThreads * VEC;
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>((p.N + kCols - 1) / kCols));
  dbias_chunk_kernel<E, VEC><<<grid, DbiasConfig::kThreads, 0, s>>>(p);
}

template <class E>
void launch_chunks_for(const DbiasParams& p, int64_t chunks, cudaStream_t s) {
  constexpr int kVec = 16 / int(sizeof(typename E::S));
  const bool vec = p.N % kVec == 0 && reinterpret_cast<uintptr_t>(p.dy) % 16 == 0;
  if (vec)
    launch_chunks<E, kVec>(p, chunks, s);
  else
    launch_chunks<E, 1>(p, chunks, s);
}

}  // namespace

size_t group_dbias_workspace_size(int64_t M, int64_t N, int64_t G) {
  return index_bytes(G) + size_t(max_chunks(M, G)) * size_t(N) * sizeof(float);
}

void group_dbias(Context& ctx, const TensorView& dy, const TensorView& splits, const TensorView& db,
                 bool accumulate, void* workspace, size_t) {
  const int64_t M = dy.dim(0), N = dy.dim(1), G = db.dim(0);
  auto* idx = static_cast<int64_t*>(workspace);
  OffsetsArgs oa;
  oa.splits = splits;
  oa.start = TensorView(idx, DType::int64, Device::CUDA, {G});
  oa.end = TensorView(idx + G, DType::int64, Device::CUDA, {G});
  oa.scale_row_start = TensorView(idx + 2 * G, DType::int64, Device::CUDA, {G});
  oa.pad_rows = DbiasConfig::kChunkRows;
  cuda::group_offsets(ctx, oa);

  DbiasParams p{};
  p.dy = dy.data;
  p.M = M;
  p.N = N;
  p.G = G;
  p.start = idx;
  p.end = idx + G;
  p.prow = idx + 2 * G;
  p.partial = reinterpret_cast<float*>(static_cast<char*>(workspace) + index_bytes(G));
  p.db = db.data;
  p.db_fp32 = db.dtype == DType::fp32;
  p.accumulate = accumulate;
  p.dtype = dy.dtype;
  p.status = ctx.status();
  cudaStream_t s = ctx.stream();
  if (N > 0) {
    switch (dy.dtype) {
      case DType::bf16:
        launch_chunks_for<Bf16>(p, max_chunks(M, G), s);
        break;
      case DType::fp16:
        launch_chunks_for<Fp16>(p, max_chunks(M, G), s);
        break;
      default:
        launch_chunks_for<Fp32>(p, max_chunks(M, G), s);
        break;
    }
    GROUPMM_CHECK_LAUNCH();
  }
  const int64_t col_blocks = (N + DbiasConfig::kReduceThreads - 1) / DbiasConfig::kReduceThreads;
  const dim3 grid(static_cast<unsigned>(G), static_cast<unsigned>(col_blocks > 0 ? col_blocks : 1));
  dbias_expert_kernel<<<grid, DbiasConfig::kReduceThreads, 0, s>>>(p);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
