// The at-most splits mode on the CPU backend (tests/common/at_most_case.hpp): weighted SwiGLU,
// group_dbias, the quantizers and the quantized GEMMs of fp8_current, fp8_block and mxfp8, and
// GroupedLinear with SplitsTotal::at_most, each against exact splits over the experts' rows, with
// the rows past the sum poisoned; sums past the rows reported. The capacity-mode plan's
// splits_at_most. nn::MoE's capacity mode, which runs on them, is test_moe_ep.cpp's.
#include "common/at_most_case.hpp"
#include "groupmm/nn/grouped_linear.hpp"

namespace groupmm::test {
namespace {

using namespace at_most;

TEST(AtMostCpu, WeightedSwigluComputesTheExpertsRowsOnly) {
  for (DType t : {DType::fp32, DType::bf16})
    for (DType st : {DType::int32, DType::int64})
      for (const Shape& sh : shapes()) check_weighted_swiglu(Device::CPU, t, st, sh);
}

TEST(AtMostCpu, WeightedSwigluReportsBadSplits) {
  check_weighted_swiglu_faults(Device::CPU);
}

TEST(AtMostCpu, DbiasSumsTheExpertsRowsOnly) {
  for (const Shape& sh : shapes()) check_dbias(Device::CPU, sh);
}

TEST(AtMostCpu, QuantizeWritesTheExpertsRowsOnly) {
  for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block, QuantRecipe::mxfp8})
    for (const Shape& sh : shapes())
      for (bool dbias : {false, true}) check_quantize(Device::CPU, r, sh, dbias);
}

TEST(AtMostCpu, QuantizeReportsASumPastTheRows) {
  check_quantize_fault(Device::CPU);
}

TEST(AtMostCpu, QuantizeRejectsAtMostWithoutSplits) {
  Context ctx(Device::CPU);
  const QuantizeConfig c = act_config(QuantRecipe::fp8_block);
  std::vector<float> w(2 * 128 * 128);
  Quantized q = quant_buffers(c, 256, 128, 2, Device::CPU);
  GroupQuantizeArgs a;
  a.input = host_view(w, DType::fp32, {2, 128, 128});
  a.splits_total = SplitsTotal::at_most;
  a.config = c;
  a.out = q.buf.view(2, TensorView(), c);
  EXPECT_THROW_MSG(group_quantize(ctx, a),
                   "group_quantize: splits_total=at_most needs splits (weights have none)");
}

TEST(AtMostCpu, QuantizedGemmPassesReadTheExpertsRowsOnly) {
  for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block, QuantRecipe::mxfp8})
    for (const Shape& sh : gemm_shapes()) check_quantized_gemm(Device::CPU, r, sh, 0.0);
}

// GroupedLinear with splits_total = at_most (and expected_rows) against an exact layer with the
// same weights over the experts' rows: y and dx rows, dW and db bit for bit; y and dx rows past
// the sum untouched.
void check_linear(const std::shared_ptr<const nn::LinearRecipe>& recipe, const Shape& sh) {
  const int64_t S = sum_of(sh.splits), M = S + sh.tail, G = int64_t(sh.splits.size());
  const int64_t K = 128, N = 256;
  Context ctx(Device::CPU);
  nn::GroupedLinearConfig c{.experts = G,
                            .in_features = K,
                            .out_features = N,
                            .bias = true,
                            .dtype = DType::bf16,
                            .max_tokens = M,
                            .seed = 3,
                            .recipe = recipe};
  nn::GroupedLinear exact(ctx, c);
  c.splits_total = SplitsTotal::at_most;
  c.expected_rows = S + 1;  // the GEMMs' kernel choice only (capped at M where the tail is empty)
  nn::GroupedLinear short_sum(ctx, c);
  const std::string what = short_sum.to_string() + " S=" + std::to_string(S);
  Tensor x = rows_with_nan_tail(randn(size_t(S * K)), S, M, K, DType::bf16, Device::CPU);
  Tensor dy = rows_with_nan_tail(randn(size_t(S * N)), S, M, N, DType::bf16, Device::CPU);
  Tensor splits = splits_on(sh.splits, DType::int64, Device::CPU);
  // Poison the layer's own y and dx buffers (a first step), so that untouched rows are visible.
  fill_bytes(TensorView(short_sum.forward(ctx, x, splits).data, DType::bf16, Device::CPU, {M, N}),
             kPoison);
  fill_bytes(TensorView(short_sum.backward(ctx, dy).data, DType::bf16, Device::CPU, {M, K}),
             kPoison);
  EXPECT_EQ(ctx.take_status().bits, 0u) << what;
  const TensorView y = short_sum.forward(ctx, x, splits);
  const std::vector<uint8_t> y_bytes = bytes_of(y);
  const std::vector<uint8_t> dx_bytes = bytes_of(short_sum.backward(ctx, dy));
  EXPECT_EQ(ctx.take_status().bits, 0u) << what;
  EXPECT_TRUE(all_poison(y_bytes, S * N * 2, M * N * 2)) << what << ": a y row past the sum";
  EXPECT_TRUE(all_poison(dx_bytes, S * K * 2, M * K * 2)) << what << ": a dx row past the sum";
  const TensorView ye =
      exact.forward(ctx, TensorView(x.data(), DType::bf16, Device::CPU, {S, K}), splits);
  const TensorView dxe =
      exact.backward(ctx, TensorView(dy.data(), DType::bf16, Device::CPU, {S, N}));
  EXPECT_EQ(ctx.take_status().bits, 0u) << what;
  EXPECT_TRUE(byte_range(y_bytes, 0, S * N * 2) == bytes_of(ye)) << what << ": y";
  EXPECT_TRUE(byte_range(dx_bytes, 0, S * K * 2) == bytes_of(dxe)) << what << ": dx";
  EXPECT_TRUE(bytes_of(short_sum.weight_grad()) == bytes_of(exact.weight_grad())) << what;
  EXPECT_TRUE(bytes_of(short_sum.bias_grad()) == bytes_of(exact.bias_grad())) << what;
}

TEST(AtMostCpu, GroupedLinearRunsTheExpertsRowsOnly) {
  for (const Shape& sh : gemm_shapes()) {
    if (sum_of(sh.splits) == 0) continue;  // the exact layer cannot take 0 rows of a sum
    check_linear(nn::high_precision_recipe(), sh);
    for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block, QuantRecipe::mxfp8})
      check_linear(nn::quantized_recipe(r), sh);
  }
}

TEST(AtMostCpu, CapacityPlanSplitsLeaveTheTailOut) {
  check_capacity_plan_splits(Device::CPU);
}

}  // namespace
}  // namespace groupmm::test
