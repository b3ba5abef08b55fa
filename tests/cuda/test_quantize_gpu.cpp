// group_quantize / bgrad / dequantize / swizzle_scales on the GPU: every output byte equals the
// independent oracle of common/quant_oracle.hpp and the round trip stays within half a step of
// each block (the format rules, not only agreement with a CPU path that shares the numerics
// headers); every output byte equals the CPU reference (outputs poisoned 0xFF on both sides first),
// for every recipe, both directions, plain and swizzled scales, split patterns with zero-row and
// unaligned experts, weights; CUDA graph replay with changed splits equals eager bit for bit;
// device faults set the status.
#include "common/oracle_check.hpp"

namespace groupmm::test {
namespace {

// Rounds every split down to even and hands the (even) remainder to the largest one.
void make_even(std::vector<int64_t>& s, int64_t M) {
  int64_t total = 0;
  for (auto& v : s) total += (v -= v % 2);
  *std::max_element(s.begin(), s.end()) += M - total;
}

// Wide random values plus, optionally, the special values every encoder must agree on.
std::vector<float> input_values(int64_t n, bool specials) {
  std::vector<float> v = rand_wide(static_cast<size_t>(n));
  if (specials && n > 4000) {
    v[17] = INFINITY;
    v[1000] = -INFINITY;
    v[2001] = NAN;
    v[2002] = -NAN;
    v[3003] = -0.0f;
    v[3004] = 1e-41f;  // fp32 subnormal
    v[n - 1] = 448.0f;
  }
  return v;
}

void expect_same_outputs(const Quantized& gpu, const Quantized& cpu, const std::string& what) {
  const std::pair<const char*, std::pair<const Tensor*, const Tensor*>> outs[] = {
      {"data", {&gpu.buf.data, &cpu.buf.data}},
      {"scale_inv", {&gpu.buf.scale_inv, &cpu.buf.scale_inv}},
      {"columnwise_data", {&gpu.buf.columnwise_data, &cpu.buf.columnwise_data}},
      {"columnwise_scale_inv", {&gpu.buf.columnwise_scale_inv, &cpu.buf.columnwise_scale_inv}},
      {"amax", {&gpu.buf.amax, &cpu.buf.amax}},
      {"global_scale", {&gpu.buf.global_scale, &cpu.buf.global_scale}}};
  for (const auto& [name, t] : outs) {
    if (!t.second->view().present()) continue;
    const auto a = quant_bytes(*t.first), b = quant_bytes(*t.second);
    ASSERT_EQ(a.size(), b.size()) << what << " " << name;
    size_t bad = 0, first = a.size();
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i]) {
        if (first == a.size()) first = i;
        ++bad;
      }
    EXPECT_EQ(bad, 0u) << what << " " << name << ": " << bad << " bytes differ, first at byte "
                       << first << " (gpu " << int(a[first < a.size() ? first : 0]) << ", cpu "
                       << int(b[first < b.size() ? first : 0]) << ")";
  }
}

// A fresh random bf16 input [M, K] and its splits, on the CPU (hx, hs: a view of s) and the GPU.
struct SplitInput {
  std::vector<int64_t> s;
  Tensor hx, dx, ds;
  TensorView hs;
};
SplitInput split_input(std::vector<int64_t> s, int64_t M, int64_t K, bool specials) {
  SplitInput in;
  in.s = std::move(s);
  in.hx = make_input(input_values(M * K, specials), DType::bf16, {M, K}, Device::CPU);
  in.dx = clone_to(in.hx, Device::CUDA);
  in.hs = host_view(in.s, DType::int64, {static_cast<int64_t>(in.s.size())});
  in.ds = clone_to(in.hs, Device::CUDA);
  return in;
}

// Quantizes one bf16 input (wide values with specials) split as `s` with every config on the CPU
// and the GPU, and expects the same bytes.
void expect_split_input_matches_cpu(std::vector<int64_t> s, int64_t K,
                                    const std::vector<QuantizeConfig>& cfgs,
                                    const std::string& what) {
  const int64_t M = std::accumulate(s.begin(), s.end(), int64_t(0));
  const SplitInput in = split_input(std::move(s), M, K, true);
  Context cctx(Device::CPU), gctx(Device::CUDA);
  for (const auto& cfg : cfgs) {
    Quantized qc = run_quantize(cctx, in.hx, in.hs, cfg);
    Quantized qg = run_quantize(gctx, in.dx, in.ds, cfg);
    EXPECT_NO_THROW(gctx.check());
    expect_same_outputs(qg, qc, what + " " + cfg_name(cfg));
  }
}

struct Case {
  QuantizeConfig cfg;
  Pattern pattern;
  int64_t G, M, K;
  DType in;
  bool specials;
};

std::string case_name(const Case& c) {
  return cfg_name(c.cfg) + "_" + pattern_name(c.pattern) + "_G" + std::to_string(c.G) + "_M" +
         std::to_string(c.M) + "_K" + std::to_string(c.K) + "_" + dtype_name(c.in) +
         (c.specials ? "_specials" : "");
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

class QuantizeGpu : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizeGpu, MatchesCpuReferenceBitForBit) {
  GROUPMM_REQUIRE_GPU();
  Case c = GetParam();
  // NVFP4 packs two tokens per byte in the columnwise copy: every split must be even (an odd one
  // is a documented fault, tested in QuantizeGpuFaults), so the total must be even too.
  if (c.cfg.recipe == QuantRecipe::nvfp4) c.M -= c.M % 2;
  auto s = make_splits(c.pattern, c.G, c.M);
  if (c.cfg.recipe == QuantRecipe::nvfp4 && c.pattern != Pattern::zero_all) make_even(s, c.M);
  std::vector<int64_t> s64 = s;
  const std::vector<float> v = input_values(c.M * c.K, c.specials);
  Context cctx(Device::CPU), gctx(Device::CUDA);
  Tensor hx = make_input(v, c.in, {c.M, c.K}, Device::CPU);
  Tensor dx = clone_to(hx, Device::CUDA);
  TensorView hs = host_view(s64, DType::int64, {c.G});
  Tensor ds = clone_to(hs, Device::CUDA);
  Quantized qc = run_quantize(cctx, hx, hs, c.cfg);
  Quantized qg = run_quantize(gctx, dx, ds, c.cfg);
  EXPECT_NO_THROW(gctx.check());
  EXPECT_NO_THROW(cctx.check());
  expect_same_outputs(qg, qc, case_name(c));
  // dequantize both directions on both backends
  for (bool col : {false, true}) {
    if (col ? !has_columnwise(c.cfg.direction) : !has_rowwise(c.cfg.direction)) continue;
    Tensor oc = Tensor::empty({c.M, c.K}, DType::fp32, Device::CPU);
    Tensor og = Tensor::empty({c.M, c.K}, DType::bf16, Device::CUDA);
    Tensor oc16 = Tensor::empty({c.M, c.K}, DType::bf16, Device::CPU);
    fill_bytes(oc16, 0xFF);
    fill_bytes(og, 0xFF);
    GroupDequantizeArgs d;
    d.config = c.cfg;
    d.from_columnwise = col;
    d.in = qc.gt;
    d.out = oc16;
    group_dequantize(cctx, d);
    d.in = qg.gt;
    d.out = og;
    group_dequantize(gctx, d);
    EXPECT_NO_THROW(gctx.check());
    EXPECT_EQ(quant_bytes(og), quant_bytes(oc16)) << "dequantize col=" << col;
  }
}

// group_dequantize with fp32 / fp16 / bf16 outputs equals the CPU reference bit for bit, both
// copies, uneven splits with an empty expert; the columnwise copy (which has no alignment rule) is
// also read from an odd address.
TEST(DequantizeGpu, EveryOutputDtypeAndAnOddColumnwiseAddressMatchCpu) {
  GROUPMM_REQUIRE_GPU();
  const int64_t G = 5, M = 390, K = 96;
  std::vector<int64_t> s = {100, 0, 150, 60, 80};
  for (QuantRecipe r :
       {QuantRecipe::fp8_current, QuantRecipe::fp8_block, QuantRecipe::mxfp8, QuantRecipe::nvfp4}) {
    const QuantizeConfig cfg = qcfg(r, QuantDirection::both);
    const int64_t Kr = r == QuantRecipe::fp8_block ? 128 : K;
    const std::vector<float> v = input_values(M * Kr, false);
    Context cctx(Device::CPU), gctx(Device::CUDA);
    Tensor hx = make_input(v, DType::bf16, {M, Kr}, Device::CPU);
    Tensor dx = clone_to(hx, Device::CUDA);
    TensorView hs = host_view(s, DType::int64, {G});
    Tensor ds = clone_to(hs, Device::CUDA);
    Quantized qc = run_quantize(cctx, hx, hs, cfg);
    Quantized qg = run_quantize(gctx, dx, ds, cfg);
    // The GPU columnwise copy moved to an odd byte address.
    const int64_t nb = dtype_storage_bytes(qg.gt.data.dtype, qg.gt.data.numel());
    const DType byte = DType::fp8e4m3;  // raw bytes
    Tensor shifted_col = Tensor::empty({nb + 16}, byte, Device::CUDA);
    GroupedTensor moved = qg.gt;
    moved.columnwise_data.data = static_cast<uint8_t*>(shifted_col.data()) + 1;
    copy(TensorView(moved.columnwise_data.data, byte, Device::CUDA, {nb}),
         TensorView(qg.gt.columnwise_data.data, byte, Device::CUDA, {nb}));
    for (bool col : {false, true})
      for (DType out : {DType::fp32, DType::fp16, DType::bf16}) {
        Tensor oc = Tensor::empty({M, Kr}, out, Device::CPU);
        Tensor og = Tensor::empty({M, Kr}, out, Device::CUDA);
        fill_bytes(oc, 0xFF);
        fill_bytes(og, 0xFF);
        const TensorView og_view = og;
        GroupDequantizeArgs d;
        d.config = cfg;
        d.from_columnwise = col;
        d.in = qc.gt;
        d.out = oc;
        group_dequantize(cctx, d);
        d.in = out == DType::bf16 ? moved : qg.gt;
        d.out = og_view;
        group_dequantize(gctx, d);
        EXPECT_NO_THROW(gctx.check());
        Tensor back = Tensor::empty({M, Kr}, out, Device::CPU);
        copy(back, og_view);
        EXPECT_EQ(quant_bytes(back), quant_bytes(oc))
            << recipe_name(r) << " col=" << col << " out=" << dtype_name(out);
      }
  }
}

std::vector<Case> cases() {
  std::vector<Case> v;
  const auto B = QuantDirection::both, Rw = QuantDirection::rowwise,
             Cw = QuantDirection::columnwise;
  const auto P = ScaleLayout::plain, S = ScaleLayout::swizzled;
  const std::vector<QuantizeConfig> cfgs = {
      qcfg(QuantRecipe::fp8_current, B),
      qcfg(QuantRecipe::fp8_current, Rw, P, DType::fp8e5m2, true), qcfg(QuantRecipe::fp8_block, B),
      qcfg(QuantRecipe::fp8_block, Cw, P, DType::fp8e4m3, true),
      qcfg(QuantRecipe::fp8_block, B, ScaleLayout::mn_major),
      qcfg(QuantRecipe::fp8_block, Rw, ScaleLayout::mn_major, DType::fp8e5m2, true),
      qcfg(QuantRecipe::mxfp8, B), qcfg(QuantRecipe::mxfp8, B, S),
      qcfg(QuantRecipe::mxfp8, Rw, S, DType::fp8e5m2), qcfg(QuantRecipe::nvfp4, B),
      qcfg(QuantRecipe::nvfp4, B, S), qcfg(QuantRecipe::nvfp4, Cw, S),
      // every amax schedule (automatic picks one per recipe): separate pass, fused with lag 1
      // (experts of tens of MB), a few, and more than G
      with_amax(qcfg(QuantRecipe::fp8_current, B), AmaxSchedule::separate),
      with_amax(qcfg(QuantRecipe::fp8_current, B), AmaxSchedule::fused, 1),
      with_amax(qcfg(QuantRecipe::fp8_current, Rw, P, DType::fp8e4m3, true), AmaxSchedule::fused,
                3),
      with_amax(qcfg(QuantRecipe::nvfp4, B, S), AmaxSchedule::fused, 1),
      with_amax(qcfg(QuantRecipe::nvfp4, B), AmaxSchedule::fused, 40),
      with_amax(qcfg(QuantRecipe::nvfp4, B, S), AmaxSchedule::separate)};
  const std::vector<std::tuple<Pattern, int64_t, int64_t>> pats = {
      {Pattern::balanced, 8, 2048},      {Pattern::zipf, 32, 3001},
      {Pattern::zero_first, 5, 999},     {Pattern::zero_last, 7, 1300},
      {Pattern::zero_all, 4, 0},         {Pattern::random_odd, 16, 2333},
      {Pattern::quarter_empty, 9, 1111}, {Pattern::balanced, 1, 300}};
  for (const auto& cfg : cfgs) {
    const int64_t K = cfg.recipe == QuantRecipe::fp8_block ? 384 : 320;  // 320: a partial tile
    for (const auto& [pat, G, M] : pats) v.push_back({cfg, pat, G, M, K, DType::bf16, false});
    v.push_back({cfg, Pattern::random_odd, 6, 1500, K, DType::fp32, true});
    v.push_back({cfg, Pattern::zipf, 6, 1500, K, DType::fp16, false});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, QuantizeGpu, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

class QuantizeGpuOracle : public ::testing::TestWithParam<OracleCase> {};

TEST_P(QuantizeGpuOracle, OutputBytesAndRoundTripMatchTheOracle) {
  GROUPMM_REQUIRE_GPU();
  const OracleCase c = GetParam();
  Context ctx(Device::CUDA);
  OracleInput in = case_input(c);
  const Tensor dx = clone_to(in.x, Device::CUDA);
  const Tensor ds = clone_to(in.splits_view(), Device::CUDA);
  const Quantized q = run_quantize(ctx, dx, c.weights ? TensorView() : ds.view(), c.cfg);
  EXPECT_NO_THROW(ctx.check());
  expect_oracle_case(ctx, in, q, c.cfg, oracle_case_name(c));  // dequantized on the GPU
  EXPECT_NO_THROW(ctx.check());
}

INSTANTIATE_TEST_SUITE_P(Recipes, QuantizeGpuOracle, ::testing::ValuesIn(oracle_cases()),
                         [](const auto& info) { return oracle_case_name(info.param); });

TEST(QuantizeGpuWeights, UniformGroupsAllRecipesMatchCpu) {
  GROUPMM_REQUIRE_GPU();
  const int64_t G = 3, N = 200, K = 256;  // N not a multiple of 128: partial 2D blocks
  const std::vector<float> v = input_values(G * N * K, true);
  Context cctx(Device::CPU), gctx(Device::CUDA);
  Tensor hw = make_input(v, DType::bf16, {G, N, K}, Device::CPU);
  Tensor dw = clone_to(hw, Device::CUDA);
  const auto B = QuantDirection::both;
  for (const auto& cfg :
       {qcfg(QuantRecipe::fp8_block, B, ScaleLayout::plain, DType::fp8e4m3, false, true),
        qcfg(QuantRecipe::fp8_block, B, ScaleLayout::plain, DType::fp8e4m3, true, false),
        qcfg(QuantRecipe::fp8_block, B, ScaleLayout::mn_major, DType::fp8e4m3, false, true),
        qcfg(QuantRecipe::fp8_block, B, ScaleLayout::mn_major, DType::fp8e4m3, true, false),
        qcfg(QuantRecipe::nvfp4, B, ScaleLayout::swizzled, DType::fp8e4m3, false, true),
        qcfg(QuantRecipe::nvfp4, B, ScaleLayout::plain, DType::fp8e4m3, false, false),
        qcfg(QuantRecipe::mxfp8, B, ScaleLayout::swizzled), qcfg(QuantRecipe::fp8_current, B),
        with_amax(qcfg(QuantRecipe::fp8_current, B), AmaxSchedule::separate),
        with_amax(qcfg(QuantRecipe::nvfp4, B, ScaleLayout::swizzled, DType::fp8e4m3, false, true),
                  AmaxSchedule::fused, 2)}) {
    Quantized qc = run_quantize(cctx, hw, TensorView(), cfg);
    Quantized qg = run_quantize(gctx, dw, TensorView(), cfg);
    EXPECT_NO_THROW(gctx.check());
    expect_same_outputs(qg, qc, "weights " + cfg_name(cfg));
  }
}

// The columnwise copy is stored straight from registers: each column's run of an expert's
// [K, m_g] block starts at col * m_g, so for m_g not a multiple of 16 (8 for fp4) the runs are
// realigned across the column's lanes for vector stores, with byte stores at the head and the
// last chunk; when every run of a warp is aligned the direct path stores. Splits chosen to hit
// each: m_g % 16 == 0, even, odd (every misalignment within one expert, as col * m_g runs through
// the residues), runs shorter than the head (1, 3, 6), partial last row tiles and empty experts,
// with fp8_block's 128-row column blocks split across partial tiles. NVFP4 needs even splits.
TEST(QuantizeGpuColumnwise, StoreAlignmentsMatchCpu) {
  GROUPMM_REQUIRE_GPU();
  const auto B = QuantDirection::both, Cw = QuantDirection::columnwise;
  const std::vector<QuantizeConfig> fp8 = {
      qcfg(QuantRecipe::fp8_current, B), qcfg(QuantRecipe::fp8_block, B),
      qcfg(QuantRecipe::mxfp8, Cw, ScaleLayout::plain, DType::fp8e5m2),
      qcfg(QuantRecipe::mxfp8, B, ScaleLayout::swizzled)};
  const std::vector<QuantizeConfig> fp4 = {qcfg(QuantRecipe::nvfp4, B),
                                           qcfg(QuantRecipe::nvfp4, Cw, ScaleLayout::swizzled)};
  std::vector<QuantizeConfig> all = fp8;
  all.insert(all.end(), fp4.begin(), fp4.end());
  expect_split_input_matches_cpu({132, 4, 260, 16, 0, 100, 2, 48, 6}, 384, all,
                                 "columnwise stores even");
  expect_split_input_matches_cpu({1, 131, 3, 257, 0, 17, 143, 6, 255, 9}, 384, fp8,
                                 "columnwise stores odd");
  expect_split_input_matches_cpu({2, 130, 10, 258, 0, 18, 142, 6, 254, 12}, 256, fp4,
                                 "columnwise stores fp4 runs");
}

// The fused amax schedule reduces an expert's amax ahead of its quantize items when the average
// expert has at most 128 items (one warp's slot loads), with the blocking reduction for any
// larger expert; above that average only the blocking one runs. Both shapes here: [1200, 2048]
// in one expert (160 items: blocking only) and 8 experts of [4000, 2048] with one of 1600 rows
// (208 items: blocking) among smaller ones (early), at lags 1 and 3, nvfp4 too.
TEST(QuantizeGpuFusedAmax, EarlyAndBlockingReductionsMatchCpu) {
  GROUPMM_REQUIRE_GPU();
  const std::vector<QuantizeConfig> cfgs = {
      with_amax(qcfg(QuantRecipe::fp8_current, QuantDirection::both), AmaxSchedule::fused, 1),
      with_amax(qcfg(QuantRecipe::fp8_current, QuantDirection::rowwise), AmaxSchedule::fused, 3),
      with_amax(qcfg(QuantRecipe::nvfp4, QuantDirection::both, ScaleLayout::swizzled),
                AmaxSchedule::fused, 1)};
  for (const std::vector<int64_t>& s :
       {std::vector<int64_t>{1200}, std::vector<int64_t>{1600, 100, 0, 700, 300, 500, 256, 544}})
    expect_split_input_matches_cpu(s, 2048, cfgs, "fused amax G=" + std::to_string(s.size()));
}

TEST(QuantizeGpuBgrad, DbiasAndDataMatchCpuBitForBit) {
  GROUPMM_REQUIRE_GPU();
  for (DType dbt : {DType::fp32, DType::bf16}) {
    const int64_t G = 12, M = 3000, K = 448;
    auto s = make_splits(Pattern::quarter_empty, G, M);
    make_even(s, M);
    const SplitInput in = split_input(std::move(s), M, K, false);
    Context cctx(Device::CPU), gctx(Device::CUDA);
    Tensor dbc = Tensor::empty({G, K}, dbt, Device::CPU),
           dbg = Tensor::empty({G, K}, dbt, Device::CUDA);
    fill_bytes(dbc, 0xFF);
    fill_bytes(dbg, 0xFF);
    const auto cfg = qcfg(QuantRecipe::mxfp8, QuantDirection::both, ScaleLayout::swizzled);
    Quantized qc = run_quantize(cctx, in.hx, in.hs, cfg, dbc);
    Quantized qg = run_quantize(gctx, in.dx, in.ds, cfg, dbg);
    EXPECT_NO_THROW(gctx.check());
    expect_same_outputs(qg, qc, "bgrad");
    EXPECT_EQ(quant_bytes(dbg), quant_bytes(dbc)) << "dbias " << dtype_name(dbt);
  }
}

TEST(QuantizeGpuSwizzle, SwizzleAndUnswizzleMatchCpu) {
  GROUPMM_REQUIRE_GPU();
  const int64_t G = 10, M = 2500;
  auto s = make_splits(Pattern::zipf, G, M);
  s[3] = 0;
  s[0] += M - std::accumulate(s.begin(), s.end(), int64_t(0));
  TensorView hs = host_view(s, DType::int64, {G});
  Context cctx(Device::CPU), gctx(Device::CUDA);
  Tensor ds = clone_to(hs, Device::CUDA);
  for (bool col : {false, true}) {
    const int64_t cols = col ? 300 : 13;
    const int block = 16;
    const int64_t pn = plain_scales_numel(M, cols, G, col, block);
    const int64_t sn = swizzled_scales_numel(M, cols, G, col, block);
    std::vector<uint8_t> pv(static_cast<size_t>(pn));
    for (auto& b : pv) b = static_cast<uint8_t>(rng()() % 255 + 1);  // never 0: padding shows
    Tensor hp = clone_to(TensorView(pv.data(), DType::e8m0, Device::CPU, {pn}), Device::CPU);
    Tensor dp = clone_to(hp, Device::CUDA);
    Tensor hsw = Tensor::empty({sn}, DType::e8m0, Device::CPU),
           dsw = Tensor::empty({sn}, DType::e8m0, Device::CUDA);
    fill_bytes(hsw, 0xFF);
    fill_bytes(dsw, 0xFF);
    SwizzleScalesArgs a;
    a.rows_total = M;
    a.cols = cols;
    a.columnwise = col;
    a.block = block;
    a.splits = hs;
    a.plain = hp;
    a.swizzled = hsw;
    swizzle_scales(cctx, a);
    a.splits = ds;
    a.plain = dp;
    a.swizzled = dsw;
    swizzle_scales(gctx, a);
    EXPECT_EQ(quant_bytes(dsw), quant_bytes(hsw)) << "swizzle col=" << col;
    Tensor back = Tensor::empty({pn}, DType::e8m0, Device::CUDA);
    fill_bytes(back, 0xFF);
    a.unswizzle = true;
    a.plain = back;
    swizzle_scales(gctx, a);
    EXPECT_NO_THROW(gctx.check());
    // plain entries past the last expert's rows are not part of any expert; compare the used part
    const auto got = quant_bytes(back);
    const int64_t used = col ? [&] {
      int64_t n = 0;
      for (auto m : s) n += (m + block - 1) / block;
      return n * cols;
    }() : M * cols;
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + used, pv.begin())) << "unswizzle col=" << col;
  }
}

// Captures the whole op (plan + amax + quantize + dbias reduce) and replays it with new splits.
TEST(QuantizeGpuGraph, ReplayWithNewSplitsEqualsEager) {
  GROUPMM_REQUIRE_GPU();
  const int64_t G = 16, M = 4096, K = 512;
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    Tensor dx = make_input(input_values(M * K, false), DType::bf16, {M, K}, Device::CUDA);
    Tensor ds = Tensor::empty({G}, DType::int32, Device::CUDA, stream);
    for (const auto& cfg :
         {qcfg(QuantRecipe::mxfp8, QuantDirection::both, ScaleLayout::swizzled),
          qcfg(QuantRecipe::fp8_block, QuantDirection::both, ScaleLayout::mn_major),
          qcfg(QuantRecipe::nvfp4, QuantDirection::both, ScaleLayout::swizzled),
          qcfg(QuantRecipe::fp8_current, QuantDirection::both),
          qcfg(QuantRecipe::fp8_block, QuantDirection::both),
          with_amax(qcfg(QuantRecipe::fp8_current, QuantDirection::both), AmaxSchedule::separate),
          with_amax(qcfg(QuantRecipe::nvfp4, QuantDirection::both), AmaxSchedule::fused, 2)}) {
      std::vector<int32_t> s0 = to_i32(make_splits(Pattern::balanced, G, M));
      copy(ds, host_view(s0, DType::int32, {G}), stream);
      Tensor db_graph = Tensor::empty({G, K}, DType::fp32, Device::CUDA, stream);
      GroupQuantizeArgs a;
      a.input = dx;
      a.splits = ds;
      a.config = cfg;
      QuantizedBuffers gb =
          allocate_quantized(group_quantize_shapes(M, K, G, cfg), Device::CUDA, stream);
      a.out = gb.view(G, ds, cfg);
      ctx.reserve_workspace(group_quantize_workspace_size(ctx, a, true));
      bgrad_group_quantize(ctx, a, db_graph);  // eager warm-up: sets kernel attributes once
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      bgrad_group_quantize(ctx, a, db_graph);
      GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
      GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      for (Pattern p :
           {Pattern::zipf, Pattern::quarter_empty, Pattern::zero_first, Pattern::random_odd}) {
        auto s64 = make_splits(p, G, M);
        make_even(s64, M);  // NVFP4 columnwise
        std::vector<int32_t> s = to_i32(s64);
        copy(ds, host_view(s, DType::int32, {G}), stream);
        Quantized graph_out{std::move(gb), GroupedTensor()};
        for (const Tensor* t : {&graph_out.buf.data, &graph_out.buf.scale_inv,
                                &graph_out.buf.columnwise_data, &graph_out.buf.columnwise_scale_inv,
                                &graph_out.buf.amax, &graph_out.buf.global_scale, &db_graph})
          if (t->view().present()) fill_bytes(*t, 0xFF, stream);
        GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
        Tensor db_eager = Tensor::empty({G, K}, DType::fp32, Device::CUDA, stream);
        fill_bytes(db_eager, 0xFF, stream);
        Quantized eager = run_quantize(ctx, dx, ds, cfg, db_eager);
        GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
        expect_same_outputs(graph_out, eager,
                            std::string("graph ") + cfg_name(cfg) + " " + pattern_name(p));
        EXPECT_EQ(quant_bytes(db_graph), quant_bytes(db_eager)) << "dbias " << pattern_name(p);
        gb = std::move(graph_out.buf);
      }
      ctx.check();
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
  }
  cudaStreamDestroy(stream);
}

// row_map: the rows gathered on the GPU quantize to the CPU reference's bytes and to the GPU's own
// quantization of the gathered copy, bias gradients included: fp8_block, fp8_current (e4m3 and
// e5m2; the early amax reduction for small experts, the blocking one for large), -1 rows, repeated
// sources, zero-row experts, G = 1 and G = 128; an entry outside [-1, T) sets kFaultBadIndex on
// both backends and reads as a zero row.
TEST(QuantizeGpuGathered, MatchesCpuAndTheGatheredCopy) {
  GROUPMM_REQUIRE_GPU();
  struct C {
    int64_t G, M;
    Pattern p;
    bool fault;
  };
  const C cases[] = {{1, 1000, Pattern::balanced, false},
                     {8, 4096, Pattern::quarter_empty, false},
                     {128, 8192, Pattern::zipf, false},
                     {6, 2048, Pattern::zero_first, true}};
  const int64_t K = 512;
  for (const C& c : cases) {
    const int64_t T = c.M / 4 + 3;
    const std::vector<float> v = input_values(T * K, true);
    Context cctx(Device::CPU), gctx(Device::CUDA);
    Tensor hx = make_input(v, DType::bf16, {T, K}, Device::CPU);
    Tensor dx = clone_to(hx, Device::CUDA);
    std::vector<int64_t> s = make_splits(c.p, c.G, c.M);
    TensorView hs = host_view(s, DType::int64, {c.G});
    Tensor ds = clone_to(hs, Device::CUDA);
    std::vector<int32_t> map = random_row_map(c.M, T, uint64_t(c.G));
    if (c.fault) {
      map[size_t(c.M / 2)] = static_cast<int32_t>(T);
      map[size_t(c.M - 1)] = -2;
    }
    TensorView hmap = host_view(map, DType::int32, {c.M});
    Tensor dmap = clone_to(hmap, Device::CUDA);
    Tensor dxg = clone_to(gather_rows_host(hx, map), Device::CUDA);
    const std::string what = "G" + std::to_string(c.G) + "_" + pattern_name(c.p);
    for (const QuantizeConfig& cfg :
         {qcfg(QuantRecipe::fp8_block, QuantDirection::both),
          qcfg(QuantRecipe::fp8_block, QuantDirection::rowwise, ScaleLayout::mn_major),
          qcfg(QuantRecipe::fp8_current, QuantDirection::both),
          qcfg(QuantRecipe::fp8_current, QuantDirection::both, ScaleLayout::plain, DType::fp8e5m2),
          with_amax(qcfg(QuantRecipe::fp8_current, QuantDirection::rowwise), AmaxSchedule::fused,
                    3)}) {
      Tensor dbc = Tensor::empty({c.G, K}, DType::fp32, Device::CPU);
      Tensor dbg = Tensor::empty({c.G, K}, DType::fp32, Device::CUDA);
      Tensor dbg2 = Tensor::empty({c.G, K}, DType::fp32, Device::CUDA);
      for (Tensor* t : {&dbc, &dbg, &dbg2}) fill_bytes(*t, 0xFF);
      Quantized qc = run_quantize_gathered(cctx, hx, hmap, hs, cfg, dbc);
      Quantized qg = run_quantize_gathered(gctx, dx, dmap, ds, cfg, dbg);
      const StatusBlock sg = gctx.take_status(), sc = cctx.take_status();
      EXPECT_EQ(sg.bits, c.fault ? kFaultBadIndex : 0u) << what << " " << cfg_name(cfg);
      EXPECT_EQ(sc.bits, sg.bits) << what;
      Quantized qcopy = run_quantize(gctx, dxg, ds, cfg, dbg2);
      EXPECT_NO_THROW(gctx.check());
      expect_same_outputs(qg, qc, what + " vs cpu " + cfg_name(cfg));
      expect_same_outputs(qg, qcopy, what + " vs the gathered copy " + cfg_name(cfg));
      EXPECT_EQ(quant_bytes(dbg), quant_bytes(dbc)) << what << " dbias vs cpu " << cfg_name(cfg);
      EXPECT_EQ(quant_bytes(dbg), quant_bytes(dbg2)) << what << " dbias vs copy " << cfg_name(cfg);
    }
  }
}

// A captured gathered quantization replays with new row maps and splits as eager computes them.
TEST(QuantizeGpuGraph, GatheredReplayWithNewRowMapsEqualsEager) {
  GROUPMM_REQUIRE_GPU();
  const int64_t G = 16, M = 4096, T = 1100, K = 384;
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    Tensor dx = make_input(input_values(T * K, false), DType::bf16, {T, K}, Device::CUDA);
    Tensor ds = Tensor::empty({G}, DType::int32, Device::CUDA, stream);
    Tensor dmap = Tensor::empty({M}, DType::int32, Device::CUDA, stream);
    for (const auto& cfg : {qcfg(QuantRecipe::fp8_block, QuantDirection::both),
                            qcfg(QuantRecipe::fp8_current, QuantDirection::both)}) {
      std::vector<int32_t> s0 = to_i32(make_splits(Pattern::balanced, G, M));
      std::vector<int32_t> m0 = random_row_map(M, T, 1);
      copy(ds, host_view(s0, DType::int32, {G}), stream);
      copy(dmap, host_view(m0, DType::int32, {M}), stream);
      GroupQuantizeArgs a;
      a.input = dx;
      a.row_map = dmap;
      a.splits = ds;
      a.config = cfg;
      QuantizedBuffers gb =
          allocate_quantized(group_quantize_shapes(M, K, G, cfg), Device::CUDA, stream);
      a.out = gb.view(G, ds, cfg);
      ctx.reserve_workspace(group_quantize_workspace_size(ctx, a));
      group_quantize(ctx, a);  // eager warm-up: sets kernel attributes once
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      group_quantize(ctx, a);
      GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
      GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      uint64_t seed = 2;
      for (Pattern p : {Pattern::zipf, Pattern::quarter_empty, Pattern::random_odd}) {
        std::vector<int32_t> s = to_i32(make_splits(p, G, M));
        std::vector<int32_t> m = random_row_map(M, T, seed++, 5);
        copy(ds, host_view(s, DType::int32, {G}), stream);
        copy(dmap, host_view(m, DType::int32, {M}), stream);
        Quantized graph_out{std::move(gb), GroupedTensor()};
        for (const Tensor* t :
             {&graph_out.buf.data, &graph_out.buf.scale_inv, &graph_out.buf.columnwise_data,
              &graph_out.buf.columnwise_scale_inv, &graph_out.buf.amax})
          if (t->view().present()) fill_bytes(*t, 0xFF, stream);
        GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
        Quantized eager = run_quantize_gathered(ctx, dx, dmap, ds, cfg);
        GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
        expect_same_outputs(graph_out, eager,
                            std::string("gathered graph ") + cfg_name(cfg) + " " + pattern_name(p));
        gb = std::move(graph_out.buf);
      }
      ctx.check();
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
  }
  cudaStreamDestroy(stream);
}

TEST(QuantizeGpuFaults, BadSplitsSetStatusAndMatchCpu) {
  GROUPMM_REQUIRE_GPU();
  const int64_t M = 512, K = 64;
  struct F {
    std::vector<int64_t> s;
    QuantRecipe r;
    uint32_t bits;
  };
  const F faults[] = {
      {{100, -7, 300, 112}, QuantRecipe::mxfp8, kFaultNegativeSplit},
      {{300, 300, 0, 0}, QuantRecipe::mxfp8, kFaultSplitsOverflow | kFaultSplitsTotalMismatch},
      {{101, 99, 200, 112}, QuantRecipe::nvfp4, kFaultSplitAlignment}};
  for (const F& f : faults) {
    Context cctx(Device::CPU), gctx(Device::CUDA);
    const SplitInput in = split_input(f.s, M, K, false);
    const auto cfg = qcfg(f.r, QuantDirection::both, ScaleLayout::swizzled);
    Quantized qc = run_quantize(cctx, in.hx, in.hs, cfg);
    Quantized qg = run_quantize(gctx, in.dx, in.ds, cfg);
    EXPECT_EQ(gctx.take_status().bits, f.bits);
    EXPECT_EQ(cctx.take_status().bits, f.bits);
    expect_same_outputs(qg, qc, "fault case");
  }
}

TEST(QuantizeGpuFaults, CheckThrowsReadableMessage) {
  GROUPMM_REQUIRE_GPU();
  Context ctx(Device::CUDA);
  std::vector<int32_t> s = {64, -3};
  Tensor ds = clone_to(host_view(s, DType::int32, {2}), Device::CUDA);
  Tensor dx = make_input(input_values(64 * 32, false), DType::bf16, {64, 32}, Device::CUDA);
  run_quantize(ctx, dx, ds, qcfg(QuantRecipe::mxfp8));
  EXPECT_THROW_MSG(ctx.check(), "device fault in group_quantize (status 0x1): negative split");
}

}  // namespace
}  // namespace groupmm::test
