// GroupedGemmArgs::zero_tail on the device: the output rows past sum(splits) are written with
// zeros. Every CTA sums the splits itself (G loads, negative splits as 0, the sum capped at M), so
// one launch sized from host-known M suffices and nothing is read on the host (graph safe).
#include <cub/block/block_reduce.cuh>

#include "gemm/backends.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/common/splits_scan.cuh"

namespace groupmm::cuda {
namespace {

using ZeroTailConfig = BlockConfig<256>;

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    zero_tail_kernel(const void* splits, bool splits64, int64_t G, int64_t M, int64_t row_words,
                     uint4* out) {
  using Reduce = cub::BlockReduce<int64_t, Cfg::kThreads>;
  __shared__ typename Reduce::TempStorage scratch;
  __shared__ int64_t first_row;
  int64_t s = 0;
  for (int64_t g = threadIdx.x; g < G; g += Cfg::kThreads) {
    const int64_t m = load_split(splits, splits64, g);
    s += m < 0 ? 0 : (m > M ? M : m);  // capped per expert: the sum cannot overflow
  }
  s = Reduce(scratch).Sum(s);
  if (threadIdx.x == 0) first_row = s < M ? s : M;
  __syncthreads();
  const int64_t end = M * row_words;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * Cfg::kThreads;
  for (int64_t i = first_row * row_words + blockIdx.x * Cfg::kThreads + threadIdx.x; i < end;
       i += stride)
    out[i] = make_uint4(0u, 0u, 0u, 0u);
}

}  // namespace

void zero_rows_past_splits(Context& ctx, const TensorView& splits, const TensorView& out) {
  const int64_t M = out.dim(0);
  if (M == 0) return;
  const int64_t row_bytes = out.numel() / M * static_cast<int64_t>(dtype_bits(out.dtype) / 8);
  GROUPMM_CHECK(row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(out.data) % 16 == 0,
                "grouped_gemm: zero_tail needs 16-byte aligned output rows (row of ", row_bytes,
                " bytes)");
  const int64_t row_words = row_bytes / 16;
  // Enough CTAs to stream a large tail at full bandwidth; a short tail leaves most of them idle.
  const int64_t want = (M * row_words + ZeroTailConfig::kThreads - 1) / ZeroTailConfig::kThreads;
  const int blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(want, static_cast<int64_t>(ctx.sm_count()) * 4)));
  zero_tail_kernel<ZeroTailConfig><<<blocks, ZeroTailConfig::kThreads, 0, ctx.stream()>>>(
      splits.data, splits.dtype == DType::int64, splits.dim(0), M, row_words,
      static_cast<uint4*>(out.data));
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
