// fill_uniform on the device: a grid-stride loop over the counter-based hash.
#include "random/backends.hpp"

namespace groupmm::cuda {
namespace {

template <class Store>
__global__ void fill_kernel(int64_t n, float lo, float hi, uint64_t seed, Store store) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    store(i, lo + (hi - lo) * uniform01(seed, static_cast<uint64_t>(i)));
}

struct StoreBf16 {
  uint16_t* p;
  __device__ void operator()(int64_t i, float x) const { p[i] = float_to_bf16_bits(x); }
};
struct StoreFp16 {
  uint16_t* p;
  __device__ void operator()(int64_t i, float x) const { p[i] = float_to_fp16_bits(x); }
};
struct StoreFp32 {
  float* p;
  __device__ void operator()(int64_t i, float x) const { p[i] = x; }
};

}  // namespace

void fill_uniform(Context& ctx, const TensorView& v, float lo, float hi, uint64_t seed) {
  const int64_t n = v.numel();
  if (n == 0) return;
  const int blocks =
      static_cast<int>(std::min<int64_t>((n + 255) / 256, int64_t(ctx.sm_count()) * 16));
  if (v.dtype == DType::bf16) {
    fill_kernel<<<blocks, 256, 0, ctx.stream()>>>(n, lo, hi, seed, StoreBf16{v.ptr<uint16_t>()});
  } else if (v.dtype == DType::fp16) {
    fill_kernel<<<blocks, 256, 0, ctx.stream()>>>(n, lo, hi, seed, StoreFp16{v.ptr<uint16_t>()});
  } else {
    fill_kernel<<<blocks, 256, 0, ctx.stream()>>>(n, lo, hi, seed, StoreFp32{v.ptr<float>()});
  }
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
