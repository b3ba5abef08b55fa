// group_offsets on the CPU backend: values, faults, validation messages.
#include "common/test_util.hpp"
#include "groupmm/offsets.hpp"

namespace groupmm::test {
namespace {

TEST(OffsetsCpu, AllOutputsHandComputed) {
  Context ctx(Device::CPU);
  std::vector<int32_t> splits = {3, 0, 130, 1};
  std::vector<int64_t> start(4), end(4), elem(8), srow(4), total(1);
  OffsetsArgs a;
  a.splits = host_view(splits, DType::int32, {4});
  a.start = host_view(start, DType::int64, {4});
  a.end = host_view(end, DType::int64, {4});
  a.element_start = host_view(elem, DType::int64, {2, 4});
  a.row_strides = {10, 7, 0, 0};
  a.scale_row_start = host_view(srow, DType::int64, {4});
  a.total = host_view(total, DType::int64, {1});
  a.expected_total = 134;
  group_offsets(ctx, a);
  EXPECT_EQ(start, (std::vector<int64_t>{0, 3, 3, 133}));
  EXPECT_EQ(end, (std::vector<int64_t>{3, 3, 133, 134}));
  EXPECT_EQ(elem, (std::vector<int64_t>{0, 30, 30, 1330, 0, 21, 21, 931}));
  EXPECT_EQ(srow, (std::vector<int64_t>{0, 128, 128, 384}));
  EXPECT_EQ(total[0], 134);
  EXPECT_NO_THROW(ctx.check());
}

TEST(OffsetsCpu, NegativeSplitSetsStatusAndCountsZero) {
  Context ctx(Device::CPU);
  std::vector<int64_t> splits = {4, -2, 5};
  std::vector<int32_t> end(3);
  OffsetsArgs a;
  a.splits = host_view(splits, DType::int64, {3});
  a.end = host_view(end, DType::int32, {3});
  group_offsets(ctx, a);
  EXPECT_EQ(end, (std::vector<int32_t>{4, 4, 9}));
  EXPECT_THROW_MSG(ctx.check(), "device fault in group_offsets");
  EXPECT_NO_THROW(ctx.check());  // check() resets the status
  group_offsets(ctx, a);
  EXPECT_THROW_MSG(ctx.check(), "negative split (treated as 0); first at group 1, value -2");
}

TEST(OffsetsCpu, TotalMismatchAndInt32Overflow) {
  Context ctx(Device::CPU);
  std::vector<int64_t> splits = {int64_t(1) << 31, 5};
  std::vector<int32_t> end(2);
  OffsetsArgs a;
  a.splits = host_view(splits, DType::int64, {2});
  a.end = host_view(end, DType::int32, {2});
  a.expected_total = 7;
  group_offsets(ctx, a);
  EXPECT_EQ(end[1], INT32_MAX);
  const StatusBlock s = ctx.take_status();
  EXPECT_TRUE(s.bits & kFaultSplitsOverflow);
  EXPECT_TRUE(s.bits & kFaultSplitsTotalMismatch);
}

TEST(OffsetsCpu, ValidationNamesOpArgumentAndValue) {
  Context ctx(Device::CPU);
  std::vector<int32_t> splits = {1, 2, 3};
  std::vector<float> bad(3);
  std::vector<int64_t> short_out(2), elem(6);
  OffsetsArgs a;
  a.splits = host_view(bad, DType::fp32, {3});
  EXPECT_THROW_MSG(group_offsets(ctx, a),
                   "group_offsets: splits.dtype=fp32 must be int32 or int64");
  a.splits = host_view(splits, DType::int32, {3});
  a.start = host_view(short_out, DType::int64, {2});
  EXPECT_THROW_MSG(group_offsets(ctx, a), "group_offsets: start.shape=[2] must be [3]");
  a.start = TensorView();
  a.element_start = host_view(elem, DType::int64, {6});
  EXPECT_THROW_MSG(group_offsets(ctx, a), "group_offsets: element_start.shape=[6] must be [S, 3]");
  a.element_start = TensorView();
  a.pad_rows = 0;
  EXPECT_THROW_MSG(group_offsets(ctx, a), "group_offsets: pad_rows=0 must be >= 1");
  a.pad_rows = 128;
  a.splits.device = Device::CUDA;
  EXPECT_THROW_MSG(group_offsets(ctx, a),
                   "group_offsets: splits is on cuda but the context is cpu");
}

TEST(OffsetsCpu, LargeGMatchesRunningSum) {
  Context ctx(Device::CPU);
  const int64_t G = 4096;
  auto s64 = make_splits(Pattern::zipf, G, 1 << 20);
  std::vector<int32_t> splits = to_i32(s64);
  std::vector<int32_t> start(G);
  OffsetsArgs a;
  a.splits = host_view(splits, DType::int32, {G});
  a.start = host_view(start, DType::int32, {G});
  a.expected_total = 1 << 20;
  group_offsets(ctx, a);
  int64_t run = 0;
  for (int64_t g = 0; g < G; ++g) {
    ASSERT_EQ(start[static_cast<size_t>(g)], run);
    run += splits[static_cast<size_t>(g)];
  }
  EXPECT_NO_THROW(ctx.check());
}

}  // namespace
}  // namespace groupmm::test
