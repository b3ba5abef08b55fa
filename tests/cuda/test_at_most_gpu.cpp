// The at-most splits mode on the GPU (tests/common/at_most_case.hpp, the cases of
// tests/cpu/test_at_most.cpp): weighted SwiGLU, group_dbias, the quantizers and the quantized GEMMs
// of fp8_current, fp8_block and mxfp8 with the rows past the sum poisoned (NaN inputs, 0xFF
// outputs), against exact splits over the experts' rows on the same device: bit for bit, except
// the GEMMs (their kernel configuration may depend on M: relative error <= 1e-2); sums past the
// rows reported; the capacity plan's splits_at_most. nn::MoE's capacity mode, which runs on them,
// is test_moe_ep_gpu.cpp's.
#include "common/at_most_case.hpp"

namespace groupmm::test {
namespace {

using namespace at_most;

TEST(AtMostGpu, WeightedSwigluComputesTheExpertsRowsOnly) {
  GROUPMM_REQUIRE_GPU();
  for (DType t : {DType::bf16, DType::fp16, DType::fp32})
    for (DType st : {DType::int32, DType::int64})
      for (const Shape& sh : shapes()) check_weighted_swiglu(Device::CUDA, t, st, sh);
}

TEST(AtMostGpu, WeightedSwigluReportsBadSplits) {
  GROUPMM_REQUIRE_GPU();
  check_weighted_swiglu_faults(Device::CUDA);
}

TEST(AtMostGpu, DbiasSumsTheExpertsRowsOnly) {
  GROUPMM_REQUIRE_GPU();
  for (const Shape& sh : shapes()) check_dbias(Device::CUDA, sh);
}

TEST(AtMostGpu, QuantizeWritesTheExpertsRowsOnly) {
  GROUPMM_REQUIRE_GPU();
  for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block, QuantRecipe::mxfp8})
    for (const Shape& sh : shapes())
      for (bool dbias : {false, true}) check_quantize(Device::CUDA, r, sh, dbias);
}

TEST(AtMostGpu, QuantizeReportsASumPastTheRows) {
  GROUPMM_REQUIRE_GPU();
  check_quantize_fault(Device::CUDA);
}

TEST(AtMostGpu, QuantizedGemmPassesReadTheExpertsRowsOnly) {
  GROUPMM_REQUIRE_GPU();
  for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block, QuantRecipe::mxfp8})
    for (const Shape& sh : gemm_shapes()) check_quantized_gemm(Device::CUDA, r, sh, 1e-2);
}

TEST(AtMostGpu, CapacityPlanSplitsLeaveTheTailOut) {
  GROUPMM_REQUIRE_GPU();
  check_capacity_plan_splits(Device::CUDA);
}

}  // namespace
}  // namespace groupmm::test
