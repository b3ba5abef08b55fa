// Messages of Context::check() for split faults: a whole-tensor fault names the sum of the splits,
// not a group (issue 21: "first at group -1").
#include <vector>

#include "common/test_util.hpp"
#include "groupmm/gemm.hpp"

namespace groupmm::test {
namespace {

TEST(FaultMessages, SplitSumBelowTheRowsNamesTheSum) {
  Context ctx(Device::CPU);
  std::vector<uint16_t> x(8 * 16, 0), w(2 * 8 * 16, 0), y(8 * 8, 0);
  std::vector<int32_t> splits = {2, 3};  // 5 of the 8 rows
  gemm_forward(ctx, TensorView(x.data(), DType::bf16, Device::CPU, {8, 16}),
               TensorView(w.data(), DType::bf16, Device::CPU, {2, 8, 16}),
               TensorView(splits.data(), DType::int32, Device::CPU, {2}),
               TensorView(y.data(), DType::bf16, Device::CPU, {8, 8}));
  try {
    ctx.check();
    FAIL() << "a split sum below the rows was not reported";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sum of splits != expected rows; the splits sum to 5"), std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("group -1"), std::string::npos) << msg;
  }
}

TEST(FaultMessages, NegativeSplitNamesItsGroup) {
  Context ctx(Device::CPU);
  std::vector<uint16_t> x(8 * 16, 0), w(2 * 8 * 16, 0), y(8 * 8, 0);
  std::vector<int32_t> splits = {8, -3};
  gemm_forward(ctx, TensorView(x.data(), DType::bf16, Device::CPU, {8, 16}),
               TensorView(w.data(), DType::bf16, Device::CPU, {2, 8, 16}),
               TensorView(splits.data(), DType::int32, Device::CPU, {2}),
               TensorView(y.data(), DType::bf16, Device::CPU, {8, 8}));
  EXPECT_THROW_MSG(ctx.check(), "first at group 1, value -3");
}

}  // namespace
}  // namespace groupmm::test
