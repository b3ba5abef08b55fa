// Messages of Context::check() for split faults: a whole-tensor fault names the sum of the splits,
// not a group (issue 21: "first at group -1"); a negative split names its own group even when a
// fault of an earlier group was found first (splits {10, -2} for 8 rows named group 0).
#include <vector>

#include "common/test_util.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/offsets.hpp"

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

// Group 0 (10 rows of 8) runs past the rows before group 1's negative count is read; the message
// names group 1, the negative split, and still lists every fault.
TEST(FaultMessages, NegativeSplitAfterAnOverflowNamesTheNegativeGroup) {
  Context ctx(Device::CPU);
  std::vector<uint16_t> x(8 * 16, 0), w(2 * 8 * 16, 0), y(8 * 8, 0);
  std::vector<int32_t> splits = {10, -2};
  gemm_forward(ctx, TensorView(x.data(), DType::bf16, Device::CPU, {8, 16}),
               TensorView(w.data(), DType::bf16, Device::CPU, {2, 8, 16}),
               TensorView(splits.data(), DType::int32, Device::CPU, {2}),
               TensorView(y.data(), DType::bf16, Device::CPU, {8, 8}));
  const StatusBlock s = ctx.take_status();
  EXPECT_EQ(s.bits, kFaultNegativeSplit | kFaultSplitsTotalMismatch | kFaultSplitsOverflow);
  EXPECT_EQ(static_cast<OpId>(s.op), OpId::grouped_gemm);
  EXPECT_EQ(s.group, 1);
  EXPECT_EQ(s.value, -2);
  EXPECT_EQ(describe_status(s),
            "device fault in grouped_gemm (status 0x7): negative split (treated as 0); sum of "
            "splits != expected rows; splits run past the buffer (rows clamped); first at group "
            "1, value -2");
}

// Several negative splits (int64, through the offsets op): the first one is named.
TEST(FaultMessages, OffsetsNameTheFirstNegativeGroup) {
  Context ctx(Device::CPU);
  std::vector<int64_t> splits = {5, 4, -7, 3, -1}, start(5);
  OffsetsArgs a;
  a.splits = TensorView(splits.data(), DType::int64, Device::CPU, {5});
  a.start = TensorView(start.data(), DType::int64, Device::CPU, {5});
  a.expected_total = 8;
  group_offsets(ctx, a);
  EXPECT_EQ(start, (std::vector<int64_t>{0, 5, 9, 9, 12}));
  const StatusBlock s = ctx.take_status();
  EXPECT_EQ(s.bits, kFaultNegativeSplit | kFaultSplitsTotalMismatch);
  EXPECT_EQ(s.group, 2);
  EXPECT_EQ(s.value, -7);
}

}  // namespace
}  // namespace groupmm::test
