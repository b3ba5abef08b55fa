// group_dbias on the CPU backend: hand-computed sums, a float64 reference over split patterns and
// dtypes, accumulation, zero-row experts, device faults, validation messages.
#include "common/tolerance.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/dbias.hpp"

namespace groupmm::test {
namespace {

// dy values (exactly representable in dtype) stored in dtype.
std::vector<uint8_t> store_as(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> out(
      static_cast<size_t>(dtype_storage_bytes(t, static_cast<int64_t>(v.size()))));
  TensorView tv(out.data(), t, Device::CPU, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) cpu::store_f(tv, static_cast<int64_t>(i), v[i]);
  return out;
}

// float64 column sums of each expert's rows (values read back from dtype storage).
std::vector<double> ref_dbias(const TensorView& dy, const std::vector<int64_t>& splits) {
  const int64_t N = dy.dim(1), G = static_cast<int64_t>(splits.size());
  std::vector<double> out(static_cast<size_t>(G * N), 0.0);
  int64_t row = 0;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < splits[static_cast<size_t>(g)]; ++r, ++row)
      for (int64_t n = 0; n < N; ++n)
        out[static_cast<size_t>(g * N + n)] += cpu::load_f(dy, row * N + n);
  return out;
}

TEST(DbiasCpu, HandComputed) {
  Context ctx(Device::CPU);
  std::vector<float> dy = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // [5, 2]
  std::vector<int32_t> splits = {2, 0, 3};
  std::vector<float> db(6, -1.0f);
  group_dbias(ctx, host_view(dy, DType::fp32, {5, 2}), host_view(splits, DType::int32, {3}),
              host_view(db, DType::fp32, {3, 2}));
  EXPECT_EQ(db, (std::vector<float>{4, 6, 0, 0, 21, 24}));
  // accumulate: += sums, the zero-row expert is left unchanged
  db = {1, 1, 7, 7, 1, 1};
  group_dbias(ctx, host_view(dy, DType::fp32, {5, 2}), host_view(splits, DType::int32, {3}),
              host_view(db, DType::fp32, {3, 2}), /*accumulate=*/true);
  EXPECT_EQ(db, (std::vector<float>{5, 7, 7, 7, 22, 25}));
  EXPECT_NO_THROW(ctx.check());
}

struct Case {
  Pattern pattern;
  int64_t G, M, N;
  DType dy, db;
};

std::string case_name(const Case& c) {
  return std::string(pattern_name(c.pattern)) + "_G" + std::to_string(c.G) + "_" +
         dtype_name(c.dy) + "_to_" + dtype_name(c.db);
}
void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

class DbiasCpuRef : public ::testing::TestWithParam<Case> {};

TEST_P(DbiasCpuRef, MatchesFloat64Sums) {
  const Case c = GetParam();
  Context ctx(Device::CPU);
  const auto s = make_splits(c.pattern, c.G, c.M);
  std::vector<int64_t> splits = s;
  auto dy = store_as(randn(static_cast<size_t>(c.M * c.N)), c.dy);
  std::vector<uint8_t> db(static_cast<size_t>(dtype_storage_bytes(c.db, c.G * c.N)), 0xFF);
  TensorView dyv(dy.data(), c.dy, Device::CPU, {c.M, c.N});
  TensorView dbv(db.data(), c.db, Device::CPU, {c.G, c.N});
  group_dbias(ctx, dyv, host_view(splits, DType::int64, {c.G}), dbv);
  EXPECT_NO_THROW(ctx.check());
  const auto ref = ref_dbias(dyv, s);
  const std::vector<float> got = cpu::to_floats(dbv);
  const int64_t rows = s.empty() ? 0 : *std::max_element(s.begin(), s.end());
  EXPECT_TRUE(close_to(got, ref, tolerance(TolOp::dbias, c.dy, c.db, rows), "db"));
  for (int64_t g = 0; g < c.G; ++g)
    if (s[static_cast<size_t>(g)] == 0)
      for (int64_t n = 0; n < c.N; ++n) ASSERT_EQ(got[static_cast<size_t>(g * c.N + n)], 0.0f) << g;
}

INSTANTIATE_TEST_SUITE_P(
    Patterns, DbiasCpuRef,
    ::testing::Values(Case{Pattern::balanced, 8, 512, 64, DType::bf16, DType::fp32},
                      Case{Pattern::zipf, 16, 777, 40, DType::fp16, DType::fp32},
                      Case{Pattern::zero_first, 4, 100, 33, DType::fp32, DType::fp32},
                      Case{Pattern::zero_last, 5, 300, 16, DType::bf16, DType::bf16},
                      Case{Pattern::quarter_empty, 12, 257, 24, DType::fp16, DType::fp16},
                      Case{Pattern::zero_all, 3, 0, 8, DType::bf16, DType::fp32},
                      Case{Pattern::balanced, 1, 129, 7, DType::fp32, DType::fp32}),
    [](const auto& info) { return case_name(info.param); });

TEST(DbiasCpu, FaultsClampAndReport) {
  Context ctx(Device::CPU);
  std::vector<float> dy(6 * 2, 1.0f);
  std::vector<int32_t> splits = {4, 5, 3};  // sums to 12 > 6 rows
  std::vector<float> db(6, -1.0f);
  group_dbias(ctx, host_view(dy, DType::fp32, {6, 2}), host_view(splits, DType::int32, {3}),
              host_view(db, DType::fp32, {3, 2}));
  EXPECT_EQ(db, (std::vector<float>{4, 4, 2, 2, 0, 0}));  // expert 1 clamped to 2 rows
  const StatusBlock st = ctx.take_status();
  EXPECT_EQ(st.bits, kFaultSplitsOverflow | kFaultSplitsTotalMismatch);
  EXPECT_EQ(static_cast<OpId>(st.op), OpId::group_dbias);
  EXPECT_EQ(st.group, 1);
}

TEST(DbiasCpu, ValidationNamesOpArgumentAndValue) {
  Context ctx(Device::CPU);
  std::vector<float> dy(8 * 4), db(3 * 4);
  std::vector<uint16_t> db16(3 * 4);
  std::vector<int32_t> splits = {2, 3, 3};
  std::vector<int32_t> splits2 = {2, 6};
  std::vector<int32_t> i32(32);
  const TensorView dyv = host_view(dy, DType::fp32, {8, 4});
  const TensorView sv = host_view(splits, DType::int32, {3});
  EXPECT_THROW_MSG(group_dbias(ctx, host_view(i32, DType::int32, {8, 4}), sv,
                               host_view(db, DType::fp32, {3, 4})),
                   "group_dbias: dy.dtype=int32 must be bf16, fp16 or fp32");
  EXPECT_THROW_MSG(group_dbias(ctx, dyv, sv, host_view(db, DType::fp32, {3, 3})),
                   "group_dbias: db.shape[1]=3 must equal 4");
  EXPECT_THROW_MSG(group_dbias(ctx, dyv, host_view(splits2, DType::int32, {2}),
                               host_view(db, DType::fp32, {3, 4})),
                   "group_dbias: splits.shape[0]=2 must equal the number of groups 3");
  EXPECT_THROW_MSG(group_dbias(ctx, dyv, sv, host_view(db16, DType::bf16, {3, 4})),
                   "group_dbias: db.dtype=bf16 must be fp32 or dy's dtype fp32");
  EXPECT_THROW_MSG(group_dbias(ctx, host_view(i32, DType::bf16, {8, 4}), sv,
                               host_view(db16, DType::bf16, {3, 4}), true),
                   "group_dbias: accumulate=true needs an fp32 db, got bf16");
  EXPECT_THROW_MSG(group_dbias(ctx, dyv, sv, TensorView()), "group_dbias: db is required");
  EXPECT_EQ(group_dbias_workspace_size(ctx, 100, 64, 4), 0u);
}

}  // namespace
}  // namespace groupmm::test
