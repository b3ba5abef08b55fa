// group_offsets on the GPU: equals the CPU reference, graph replay with changed splits equals
// eager, faults set the status bit and check() throws.
#include "common/test_util.hpp"
#include "groupmm/offsets.hpp"

namespace groupmm::test {
namespace {

struct Outs {
  Tensor start, end, elem, srow, total;
  Outs(int64_t G, Device d, DType it) {
    start = Tensor::empty({G}, it, d);
    end = Tensor::empty({G}, DType::int64, d);
    elem = Tensor::empty({2, G}, DType::int64, d);
    srow = Tensor::empty({G}, it, d);
    total = Tensor::empty({1}, DType::int64, d);
    for (const Tensor* t : {&start, &end, &elem, &srow, &total}) fill_bytes(*t, 0xA5);
  }
  OffsetsArgs args(const TensorView& splits, int64_t expected) const {
    OffsetsArgs a;
    a.splits = splits;
    a.expected_total = expected;
    a.start = start;
    a.end = end;
    a.element_start = elem;
    a.row_strides = {7168, 56, 0, 0};
    a.scale_row_start = srow;
    a.total = total;
    return a;
  }
};

void expect_same(const Outs& gpu, const Outs& cpu) {
  EXPECT_EQ(bytes_of(gpu.start), bytes_of(cpu.start)) << "start";
  EXPECT_EQ(bytes_of(gpu.end), bytes_of(cpu.end)) << "end";
  EXPECT_EQ(bytes_of(gpu.elem), bytes_of(cpu.elem)) << "element_start";
  EXPECT_EQ(bytes_of(gpu.srow), bytes_of(cpu.srow)) << "scale_row_start";
  EXPECT_EQ(bytes_of(gpu.total), bytes_of(cpu.total)) << "total";
}

struct Case {
  Pattern pattern;
  int64_t G;
  int64_t total;
  bool splits64;
};

std::string case_name(const Case& c) {
  return std::string(pattern_name(c.pattern)) + "_G" + std::to_string(c.G) +
         (c.splits64 ? "_i64" : "_i32");
}
void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

class OffsetsGpu : public ::testing::TestWithParam<Case> {};

TEST_P(OffsetsGpu, MatchesCpuReference) {
  GROUPMM_REQUIRE_GPU();
  const Case c = GetParam();
  const auto s = make_splits(c.pattern, c.G, c.total);
  std::vector<int64_t> s64 = s;
  std::vector<int32_t> s32 = to_i32(s);
  TensorView hs =
      c.splits64 ? host_view(s64, DType::int64, {c.G}) : host_view(s32, DType::int32, {c.G});
  for (DType it : {DType::int32, DType::int64}) {
    Context cctx(Device::CPU), gctx(Device::CUDA);
    Outs ho(c.G, Device::CPU, it), go(c.G, Device::CUDA, it);
    Tensor ds = clone_to(hs, Device::CUDA);
    group_offsets(cctx, ho.args(hs, c.total));
    group_offsets(gctx, go.args(ds, c.total));
    EXPECT_NO_THROW(gctx.check());
    EXPECT_NO_THROW(cctx.check());
    expect_same(go, ho);
  }
}

INSTANTIATE_TEST_SUITE_P(Patterns, OffsetsGpu,
                         ::testing::Values(Case{Pattern::balanced, 32, 32768, false},
                                           Case{Pattern::zipf, 128, 65536, true},
                                           Case{Pattern::zero_first, 8, 1001, false},
                                           Case{Pattern::zero_middle, 9, 77, true},
                                           Case{Pattern::zero_last, 16, 4097, false},
                                           Case{Pattern::zero_all, 5, 0, false},
                                           Case{Pattern::balanced, 1, 123, false},
                                           Case{Pattern::zipf, 4096, 1 << 20, false},
                                           Case{Pattern::random_odd, 4096, 999999, true},
                                           Case{Pattern::quarter_empty, 5000, 70001, false}),
                         [](const auto& info) { return case_name(info.param); });

TEST(OffsetsGpuGraph, ReplayWithNewSplitsEqualsEager) {
  GROUPMM_REQUIRE_GPU();
  const int64_t G = 64;
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    Tensor ds = Tensor::empty({G}, DType::int32, Device::CUDA, stream);
    Outs graph_out(G, Device::CUDA, DType::int32);
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    group_offsets(ctx, graph_out.args(ds, -1));
    GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (Pattern p : {Pattern::zipf, Pattern::quarter_empty, Pattern::balanced}) {
      std::vector<int32_t> s = to_i32(make_splits(p, G, 12345));
      copy(ds, host_view(s, DType::int32, {G}), stream);
      GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
      Outs eager(G, Device::CUDA, DType::int32);
      group_offsets(ctx, eager.args(ds, -1));
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      expect_same(graph_out, eager);
    }
    ctx.check();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

TEST(OffsetsGpuFaults, NegativeAndMismatchSetStatus) {
  GROUPMM_REQUIRE_GPU();
  Context ctx(Device::CUDA);
  std::vector<int32_t> s = {5, -3, 7, 2};
  Tensor ds = clone_to(host_view(s, DType::int32, {4}), Device::CUDA);
  Outs o(4, Device::CUDA, DType::int32);
  group_offsets(ctx, o.args(ds, 14));
  EXPECT_THROW_MSG(ctx.check(), "device fault in group_offsets (status 0x1): negative split");
  std::vector<int64_t> end(4);
  copy(host_view(end, DType::int64, {4}), o.end);
  EXPECT_EQ(end, (std::vector<int64_t>{5, 5, 12, 14}));
  group_offsets(ctx, o.args(ds, 15));
  const StatusBlock st = ctx.take_status();
  EXPECT_EQ(st.bits, kFaultNegativeSplit | kFaultSplitsTotalMismatch);
  EXPECT_NO_THROW(ctx.check());
}

}  // namespace
}  // namespace groupmm::test
