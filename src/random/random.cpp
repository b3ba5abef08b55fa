// fill_uniform: validation and backend dispatch.
#include "random/backends.hpp"

namespace groupmm {

void fill_uniform(Context& ctx, const TensorView& v, float lo, float hi, uint64_t seed) {
  GROUPMM_CHECK(v.dtype == DType::bf16 || v.dtype == DType::fp16 || v.dtype == DType::fp32,
                "fill_uniform: v.dtype=", dtype_name(v.dtype), " must be bf16, fp16 or fp32");
  GROUPMM_CHECK(v.device == ctx.device(), "fill_uniform: v is on ", device_name(v.device),
                " but the context is ", device_name(ctx.device()));
  GROUPMM_CHECK(v.data != nullptr || v.numel() == 0, "fill_uniform: v.data is null");
  GROUPMM_CHECK(reinterpret_cast<uintptr_t>(v.data) % uintptr_t(dtype_bits(v.dtype) / 8) == 0,
                "fill_uniform: v.data must be aligned to its elements");
  if (v.device == Device::CUDA)
    cuda::fill_uniform(ctx, v, lo, hi, seed);
  else
    cpu::fill_uniform(ctx, v, lo, hi, seed);
}

}  // namespace groupmm
