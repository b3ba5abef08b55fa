// group_quantize on the CPU reference held to the independent oracle (common/quant_oracle.hpp):
// every data byte, scale and per-expert value for every recipe, layout, fp8 dtype, scale option
// and 2D weight blocks, on inputs with zero-row, all-zero, Inf, NaN and near-underflow experts;
// dequantize(quantize(x)) within half a step of each element's block; the bias gradient of
// bgrad_group_quantize in its documented summation order, bit for bit.
#include "common/oracle_check.hpp"

namespace groupmm::test {
namespace {

class QuantOracle : public ::testing::TestWithParam<OracleCase> {};

// One input with every special (NaN and Inf experts included): the round trip checks every finite
// element of a block with a finite scale.
TEST_P(QuantOracle, OutputBytesAndRoundTripMatchTheOracle) {
  const OracleCase c = GetParam();
  Context ctx(Device::CPU);
  OracleInput in = case_input(c);
  const Quantized q = run_quantize(ctx, in.x, c.weights ? TensorView() : in.splits_view(), c.cfg);
  EXPECT_NO_THROW(ctx.check());
  expect_oracle_case(ctx, in, q, c.cfg, oracle_case_name(c));
  EXPECT_NO_THROW(ctx.check());
}

INSTANTIATE_TEST_SUITE_P(Recipes, QuantOracle, ::testing::ValuesIn(oracle_cases()),
                         [](const auto& info) { return oracle_case_name(info.param); });

// The bias gradient of bgrad_group_quantize is the documented order (quantize.hpp), bit for bit:
// 16-row segments summed from +0, 8 segments per 128-row tile, tiles in order.
TEST(QuantOracleBgrad, DbiasIsTheDocumentedOrderBitForBit) {
  Context ctx(Device::CPU);
  OracleInput in = oracle_input({300, 0, 129, 17, 256}, 64, DType::fp32, false);
  const int64_t G = static_cast<int64_t>(in.splits.size());
  std::vector<float> db(static_cast<size_t>(G * in.p.K), NAN);
  run_quantize(ctx, in.x, in.splits_view(), qcfg(QuantRecipe::mxfp8),
               host_view(db, DType::fp32, {G, in.p.K}));
  EXPECT_NO_THROW(ctx.check());
  const std::vector<float> want = oracle::bgrad_dbias(in.p);
  size_t bad = 0;
  for (size_t i = 0; i < db.size(); ++i)
    if (float_bits(db[i]) != float_bits(want[i]) && ++bad <= 4)
      ADD_FAILURE() << "db[" << i / size_t(in.p.K) << ", " << i % size_t(in.p.K)
                    << "] = " << std::hexfloat << db[i] << ", documented order gives " << want[i];
  EXPECT_EQ(bad, 0u);
}

}  // namespace
}  // namespace groupmm::test
