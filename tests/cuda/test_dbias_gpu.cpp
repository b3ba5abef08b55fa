// group_dbias on the GPU: equals the CPU reference (fp32 sum-order differences only) over split
// patterns, dtypes, the vectorized and scalar paths and accumulation; deterministic; graph replay
// with new splits equals eager bit for bit; faults set the status.
#include "common/tolerance.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/dbias.hpp"

namespace groupmm::test {
namespace {

// Host tensor of dtype t filled with N(0, 1) values.
std::vector<uint8_t> random_host(DType t, int64_t n) {
  std::vector<uint8_t> b(static_cast<size_t>(dtype_storage_bytes(t, n)));
  TensorView v(b.data(), t, Device::CPU, {n});
  const auto r = randn(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) cpu::store_f(v, i, r[static_cast<size_t>(i)]);
  return b;
}

struct Case {
  Pattern pattern;
  int64_t G, M, N;
  DType dy, db;
  bool splits64;
};

std::string case_name(const Case& c) {
  return detail::cat(pattern_name(c.pattern), "_G", c.G, "_N", c.N, "_", dtype_name(c.dy), "_to_",
                     dtype_name(c.db), c.splits64 ? "_i64" : "_i32");
}
void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

class DbiasGpu : public ::testing::TestWithParam<Case> {};

TEST_P(DbiasGpu, MatchesCpuReference) {
  GROUPMM_REQUIRE_GPU();
  const Case c = GetParam();
  Context cctx(Device::CPU), gctx(Device::CUDA);
  const auto s = make_splits(c.pattern, c.G, c.M);
  std::vector<int64_t> s64 = s;
  std::vector<int32_t> s32 = to_i32(s);
  const TensorView hs =
      c.splits64 ? host_view(s64, DType::int64, {c.G}) : host_view(s32, DType::int32, {c.G});
  auto hdy = random_host(c.dy, c.M * c.N);
  const TensorView hdyv(hdy.data(), c.dy, Device::CPU, {c.M, c.N});
  std::vector<uint8_t> hdb(static_cast<size_t>(dtype_storage_bytes(c.db, c.G * c.N)));
  const TensorView hdbv(hdb.data(), c.db, Device::CPU, {c.G, c.N});
  Tensor ddy = clone_to(hdyv, Device::CUDA), ds = clone_to(hs, Device::CUDA);
  Tensor ddb = Tensor::empty({c.G, c.N}, c.db, Device::CUDA);
  for (bool accumulate : {false, true}) {
    if (accumulate && c.db != DType::fp32) continue;
    // accumulate starts from the same random fp32 values on both sides; else poison
    if (accumulate) {
      auto init = random_host(DType::fp32, c.G * c.N);
      std::copy(init.begin(), init.end(), hdb.begin());
      copy(ddb, hdbv);
    } else {
      fill_bytes(hdbv, 0xFF);
      fill_bytes(ddb, 0xFF);
    }
    group_dbias(cctx, hdyv, hs, hdbv, accumulate);
    group_dbias(gctx, ddy, ds, ddb, accumulate);
    EXPECT_NO_THROW(gctx.check());
    EXPECT_NO_THROW(cctx.check());
    std::vector<uint8_t> got = bytes_of(ddb);
    const auto g = cpu::to_floats(TensorView(got.data(), c.db, Device::CPU, {c.G * c.N}));
    const auto r = cpu::to_floats(hdbv);
    const int64_t rows = s.empty() ? 0 : *std::max_element(s.begin(), s.end());
    const Tolerance tol =
        tolerance(TolOp::dbias, c.dy, c.db, rows + accumulate).between_implementations();
    EXPECT_TRUE(close_to(g, r, tol, detail::cat("accumulate=", accumulate)));
    for (int64_t e = 0; e < c.G; ++e)
      if (s[static_cast<size_t>(e)] == 0)
        for (int64_t n = 0; n < c.N; ++n)
          ASSERT_EQ(g[static_cast<size_t>(e * c.N + n)], r[static_cast<size_t>(e * c.N + n)])
              << "zero-row expert " << e;
    // deterministic: a second run gives the same bits
    if (!accumulate) {
      group_dbias(gctx, ddy, ds, ddb);
      EXPECT_EQ(bytes_of(ddb), got);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Patterns, DbiasGpu,
    ::testing::Values(Case{Pattern::balanced, 8, 4096, 256, DType::bf16, DType::fp32, false},
                      Case{Pattern::zipf, 128, 32768, 2048, DType::bf16, DType::fp32, true},
                      Case{Pattern::zipf, 128, 8192, 1536, DType::bf16, DType::bf16, false},
                      Case{Pattern::zero_first, 16, 1001, 512, DType::fp16, DType::fp16, false},
                      Case{Pattern::zero_last, 7, 777, 100, DType::bf16, DType::fp32,
                           true},  // scalar
                      Case{Pattern::quarter_empty, 64, 5000, 33, DType::fp32, DType::fp32, false},
                      Case{Pattern::random_odd, 256, 20000, 768, DType::fp32, DType::fp32, true},
                      Case{Pattern::zero_all, 5, 0, 64, DType::bf16, DType::fp32, false},
                      Case{Pattern::balanced, 1, 129, 8, DType::fp16, DType::fp32, false}),
    [](const auto& info) { return case_name(info.param); });

TEST(DbiasGpuGraph, ReplayWithNewSplitsEqualsEager) {
  GROUPMM_REQUIRE_GPU();
  const int64_t G = 32, M = 6000, N = 1024;
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    ctx.reserve_workspace(group_dbias_workspace_size(ctx, M, N, G));
    auto hdy = random_host(DType::bf16, M * N);
    Tensor dy =
        clone_to(TensorView(hdy.data(), DType::bf16, Device::CPU, {M, N}), Device::CUDA, stream);
    Tensor ds = Tensor::empty({G}, DType::int32, Device::CUDA, stream);
    Tensor db_graph = Tensor::empty({G, N}, DType::fp32, Device::CUDA, stream);
    Tensor db_eager = Tensor::empty({G, N}, DType::fp32, Device::CUDA, stream);
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    group_dbias(ctx, dy, ds, db_graph);
    GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (Pattern p : {Pattern::zipf, Pattern::quarter_empty, Pattern::balanced}) {
      std::vector<int32_t> s = to_i32(make_splits(p, G, M));
      copy(ds, host_view(s, DType::int32, {G}), stream);
      fill_bytes(db_graph, 0xFF, stream);
      fill_bytes(db_eager, 0xFF, stream);
      GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
      group_dbias(ctx, dy, ds, db_eager);
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      EXPECT_EQ(bytes_of(db_graph), bytes_of(db_eager)) << pattern_name(p);
    }
    EXPECT_NO_THROW(ctx.check());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

TEST(DbiasGpuFaults, OverflowAndMismatchSetStatusWithoutOutOfBoundsWrites) {
  GROUPMM_REQUIRE_GPU();
  Context ctx(Device::CUDA);
  std::vector<float> hdy(6 * 2, 1.0f);
  std::vector<int32_t> s = {4, 5, 3};  // sums to 12 > 6 rows
  Tensor dy = clone_to(host_view(hdy, DType::fp32, {6, 2}), Device::CUDA);
  Tensor ds = clone_to(host_view(s, DType::int32, {3}), Device::CUDA);
  Tensor db = Tensor::empty({3, 2}, DType::fp32, Device::CUDA);
  group_dbias(ctx, dy, ds, db);
  std::vector<float> out(6);
  copy(host_view(out, DType::fp32, {3, 2}), db);
  EXPECT_EQ(out, (std::vector<float>{4, 4, 2, 2, 0, 0}));
  const StatusBlock st = ctx.take_status();
  EXPECT_EQ(st.bits, kFaultSplitsOverflow | kFaultSplitsTotalMismatch);
  std::vector<int32_t> neg = {3, -1, 3};
  copy(ds, host_view(neg, DType::int32, {3}));
  group_dbias(ctx, dy, ds, db);
  EXPECT_THROW_MSG(ctx.check(), "negative split (treated as 0)");
}

}  // namespace
}  // namespace groupmm::test
