// group_quantize / dequantize / swizzle_scales / bgrad on the CPU backend: layout cross-checks
// (columnwise = transposed rowwise where scales coincide, swizzled = swizzle_scales(plain)), bias
// gradients, faults, validation messages. Exact outputs and round trips against an independent
// oracle: test_quantize_oracle.cpp.
#include "common/quant_test_util.hpp"

namespace groupmm::test {
namespace {

struct Problem {
  int64_t M, K, G;
  std::vector<int32_t> splits;
  Tensor x;
  TensorView sv;
};

Problem make_problem(Pattern pat, int64_t G, int64_t M, int64_t K, DType t = DType::bf16) {
  Problem p{M, K, G, to_i32(make_splits(pat, G, M)), Tensor(), TensorView()};
  p.x = make_input(rand_wide(static_cast<size_t>(M * K)), t, {M, K}, Device::CPU);
  p.sv = host_view(p.splits, DType::int32, {G});
  return p;
}

// Rounds every split down to even and hands the (even) remainder to the largest one.
void make_even(std::vector<int32_t>& s, int64_t M) {
  int64_t total = 0;
  for (auto& v : s) total += (v -= v % 2);
  *std::max_element(s.begin(), s.end()) += static_cast<int32_t>(M - total);
}

TEST(QuantCpu, SwizzledScalesEqualSwizzleOfPlainAndUnswizzleInverts) {
  for (QuantRecipe r : {QuantRecipe::mxfp8, QuantRecipe::nvfp4, QuantRecipe::mxfp4}) {
    Context ctx(Device::CPU);
    Problem p = make_problem(Pattern::quarter_empty, 6, 520, 160);
    make_even(p.splits, p.M);
    const auto cp = qcfg(r, QuantDirection::both);
    const auto cs = qcfg(r, QuantDirection::both, ScaleLayout::swizzled);
    Quantized qp = run_quantize(ctx, p.x, p.sv, cp), qs = run_quantize(ctx, p.x, p.sv, cs);
    EXPECT_EQ(quant_bytes(qp.buf.data), quant_bytes(qs.buf.data));
    EXPECT_EQ(quant_bytes(qp.buf.columnwise_data), quant_bytes(qs.buf.columnwise_data));
    for (bool col : {false, true}) {
      const TensorView plain = col ? qp.buf.columnwise_scale_inv.view() : qp.buf.scale_inv.view();
      const TensorView swz_ref = col ? qs.buf.columnwise_scale_inv.view() : qs.buf.scale_inv.view();
      Tensor swz = Tensor::empty_like(swz_ref, Device::CPU);
      fill_bytes(swz, 0xFF);
      SwizzleScalesArgs a;
      a.splits = p.sv;
      a.rows_total = p.M;
      a.cols = col ? p.K : p.K / cp.row_block();
      a.columnwise = col;
      a.block = cp.col_block();
      a.plain = plain;
      a.swizzled = swz;
      swizzle_scales(ctx, a);
      EXPECT_EQ(quant_bytes(swz), quant_bytes(swz_ref)) << recipe_name(r) << " col=" << col;
      Tensor back = Tensor::empty_like(plain, Device::CPU);
      fill_bytes(back, 0xFF);
      a.unswizzle = true;
      a.plain = back;
      swizzle_scales(ctx, a);
      EXPECT_EQ(quant_bytes(back), quant_bytes(plain)) << recipe_name(r) << " col=" << col;
    }
    EXPECT_NO_THROW(ctx.check());
  }
}

// fp8_block's mn_major scales hold the plain scales transposed: rowwise [K/128, Mp] vs [M, K/128]
// (128x128: block rows), columnwise per expert [nb_g, K] vs [K, nb_g]; the data is unchanged.
// The transposes are written out here, independently of the library's index functions.
TEST(QuantCpu, MnMajorScalesAreThePlainScalesTransposed) {
  Context ctx(Device::CPU);
  auto floats = [](const Tensor& t) {
    const auto b = quant_bytes(t);
    std::vector<float> f(b.size() / 4);
    std::memcpy(f.data(), b.data(), b.size());
    return f;
  };
  for (const bool pow2 : {false, true}) {
    Problem p = make_problem(Pattern::zero_middle, 5, 601, 384);
    const auto cp = qcfg(QuantRecipe::fp8_block, QuantDirection::both, ScaleLayout::plain,
                         DType::fp8e4m3, pow2);
    auto cm = cp;
    cm.scale_layout = ScaleLayout::mn_major;
    Quantized qp = run_quantize(ctx, p.x, p.sv, cp), qm = run_quantize(ctx, p.x, p.sv, cm);
    EXPECT_EQ(quant_bytes(qp.buf.data), quant_bytes(qm.buf.data));
    EXPECT_EQ(quant_bytes(qp.buf.columnwise_data), quant_bytes(qm.buf.columnwise_data));
    const int64_t KB = p.K / 128, Mp = (p.M + 3) / 4 * 4;
    ASSERT_EQ(qm.buf.scale_inv.view().dim(0), KB);
    ASSERT_EQ(qm.buf.scale_inv.view().dim(1), Mp);
    const auto rp = floats(qp.buf.scale_inv), rm = floats(qm.buf.scale_inv);
    for (int64_t m = 0; m < p.M; ++m)
      for (int64_t c = 0; c < KB; ++c)
        ASSERT_EQ(float_bits(rm[static_cast<size_t>(c * Mp + m)]),
                  float_bits(rp[static_cast<size_t>(m * KB + c)]))
            << "rowwise m" << m << " c" << c;
    const auto cpl = floats(qp.buf.columnwise_scale_inv), cmn = floats(qm.buf.columnwise_scale_inv);
    int64_t cb_start = 0;
    for (int64_t g = 0; g < p.G; ++g) {
      const int64_t nb = (p.splits[static_cast<size_t>(g)] + 127) / 128;
      for (int64_t k = 0; k < p.K; ++k)
        for (int64_t j = 0; j < nb; ++j)
          ASSERT_EQ(float_bits(cmn[static_cast<size_t>(p.K * (cb_start + j) + k)]),
                    float_bits(cpl[static_cast<size_t>(p.K * cb_start + k * nb + j)]))
              << "columnwise g" << g << " k" << k << " j" << j;
      cb_start += nb;
    }
  }
  // 128x128 weight blocks: rowwise [K/128, roundup(G*N/128 + G, 4)], columnwise per expert
  // [nb_g, K/128].
  const int64_t G = 3, N = 200, K = 256, KB = K / 128, nb = (N + 127) / 128;
  Tensor w =
      make_input(rand_wide(static_cast<size_t>(G * N * K)), DType::bf16, {G, N, K}, Device::CPU);
  const auto cp = qcfg(QuantRecipe::fp8_block, QuantDirection::both, ScaleLayout::plain,
                       DType::fp8e4m3, false, true);
  auto cm = cp;
  cm.scale_layout = ScaleLayout::mn_major;
  Quantized qp = run_quantize(ctx, w, TensorView(), cp),
            qm = run_quantize(ctx, w, TensorView(), cm);
  const int64_t ld = (G * N / 128 + G + 3) / 4 * 4;
  ASSERT_EQ(qm.buf.scale_inv.view().dim(1), ld);
  const auto rp = floats(qp.buf.scale_inv), rm = floats(qm.buf.scale_inv);
  const auto cpl = floats(qp.buf.columnwise_scale_inv), cmn = floats(qm.buf.columnwise_scale_inv);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = 0; t < nb; ++t)
      for (int64_t c = 0; c < KB; ++c) {
        const int64_t tr = g * nb + t;  // tile_start_g = g * nb
        ASSERT_EQ(float_bits(rm[static_cast<size_t>(c * ld + tr)]),
                  float_bits(rp[static_cast<size_t>(tr * KB + c)]));
        ASSERT_EQ(float_bits(cmn[static_cast<size_t>(KB * (g * nb + t) + c)]),
                  float_bits(cpl[static_cast<size_t>(KB * g * nb + c * nb + t)]));
      }
  EXPECT_NO_THROW(ctx.check());
}

TEST(QuantCpu, ColumnwiseIsTransposedRowwiseWhenScalesCoincide) {
  // Per-expert scales (fp8_current) and 2D blocks (weights) give both copies the same scale for
  // every element, so the columnwise block of expert g must be the transpose of its rows.
  Context ctx(Device::CPU);
  Problem p = make_problem(Pattern::zero_first, 4, 200, 64);
  Quantized q = run_quantize(ctx, p.x, p.sv, qcfg(QuantRecipe::fp8_current));
  auto rw = quant_bytes(q.buf.data), cw = quant_bytes(q.buf.columnwise_data);
  int64_t start = 0;
  for (int64_t g = 0; g < p.G; ++g) {
    const int64_t m = p.splits[static_cast<size_t>(g)];
    for (int64_t r = 0; r < m; ++r)
      for (int64_t k = 0; k < p.K; ++k)
        ASSERT_EQ(cw[static_cast<size_t>(p.K * start + k * m + r)],
                  rw[static_cast<size_t>((start + r) * p.K + k)]);
    start += m;
  }
  for (QuantRecipe r : {QuantRecipe::fp8_block, QuantRecipe::nvfp4}) {
    const int64_t G = 3, N = 144, K = 256;
    Tensor w =
        make_input(rand_wide(static_cast<size_t>(G * N * K)), DType::bf16, {G, N, K}, Device::CPU);
    const auto cfg = qcfg(r, QuantDirection::both, ScaleLayout::plain, DType::fp8e4m3, false, true);
    Quantized wq = run_quantize(ctx, w, TensorView(), cfg);
    const auto a = quant_bytes(wq.buf.data), b = quant_bytes(wq.buf.columnwise_data);
    const bool fp4 = r == QuantRecipe::nvfp4;
    auto code = [&](const std::vector<uint8_t>& v, int64_t e) -> int {
      return fp4 ? (v[static_cast<size_t>(e / 2)] >> (4 * (e % 2))) & 0xF
                 : v[static_cast<size_t>(e)];
    };
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          ASSERT_EQ(code(b, K * g * N + k * N + n), code(a, (g * N + n) * K + k))
              << recipe_name(r) << " g" << g << " n" << n << " k" << k;
    GroupDequantizeArgs d;
    d.in = wq.gt;
    d.config = cfg;
    Tensor o = Tensor::empty({G, N, K}, DType::fp32, Device::CPU);
    d.out = o;
    group_dequantize(ctx, d);
    EXPECT_LE(rel_error(cpu_floats(o), cpu_floats(w)), fp4 ? 0.2 : 0.05);
  }
  EXPECT_NO_THROW(ctx.check());
}

TEST(QuantCpu, BgradSumsRowsPerExpertZeroRowGetsZero) {
  Context ctx(Device::CPU);
  Problem p = make_problem(Pattern::zero_middle, 5, 333, 48, DType::fp32);
  std::vector<float> db(static_cast<size_t>(p.G * p.K), -1.0f);
  Quantized q = run_quantize(ctx, p.x, p.sv, qcfg(QuantRecipe::fp8_current),
                             host_view(db, DType::fp32, {p.G, p.K}));
  const std::vector<float> x = cpu_floats(p.x);
  int64_t start = 0;
  for (int64_t g = 0; g < p.G; ++g) {
    const int64_t m = p.splits[static_cast<size_t>(g)];
    for (int64_t k = 0; k < p.K; ++k) {
      double ref = 0, mag = 0;
      for (int64_t r = start; r < start + m; ++r) {
        ref += x[static_cast<size_t>(r * p.K + k)];
        mag += std::fabs(x[static_cast<size_t>(r * p.K + k)]);
      }
      const float got = db[static_cast<size_t>(g * p.K + k)];
      if (m == 0) {
        EXPECT_EQ(got, 0.0f);
      } else {
        EXPECT_NEAR(got, ref, 1e-5 * mag + 1e-30) << "g" << g << " k" << k;
      }
    }
    start += m;
  }
}

TEST(QuantCpu, FaultsAreReportedAndOddNvfp4ColumnwiseSkipped) {
  Context ctx(Device::CPU);
  Problem p = make_problem(Pattern::balanced, 3, 96, 32);
  p.splits = {40, -5, 56};
  Quantized q = run_quantize(ctx, p.x, p.sv, qcfg(QuantRecipe::mxfp8));
  EXPECT_THROW_MSG(ctx.check(), "device fault in group_quantize (status 0x1): negative split");
  p.splits = {31, 33, 32};
  q = run_quantize(ctx, p.x, p.sv, qcfg(QuantRecipe::nvfp4));
  const StatusBlock st = ctx.take_status();
  EXPECT_EQ(st.bits, kFaultSplitAlignment);
  EXPECT_EQ(st.group, 0);
  p.splits = {64, 64, 64};  // runs past M = 96: clamped, no write out of bounds
  q = run_quantize(ctx, p.x, p.sv, qcfg(QuantRecipe::mxfp8));
  EXPECT_TRUE(ctx.take_status().bits & kFaultSplitsOverflow);
}

void expect_same_buffers(const QuantizedBuffers& a, const QuantizedBuffers& b,
                         const std::string& what) {
  const std::pair<const char*, std::pair<const Tensor*, const Tensor*>> outs[] = {
      {"data", {&a.data, &b.data}},
      {"scale_inv", {&a.scale_inv, &b.scale_inv}},
      {"columnwise_data", {&a.columnwise_data, &b.columnwise_data}},
      {"columnwise_scale_inv", {&a.columnwise_scale_inv, &b.columnwise_scale_inv}},
      {"amax", {&a.amax, &b.amax}}};
  for (const auto& [name, t] : outs) {
    ASSERT_EQ(t.first->view().present(), t.second->view().present()) << what << " " << name;
    if (t.first->view().present())
      EXPECT_EQ(quant_bytes(*t.first), quant_bytes(*t.second)) << what << " " << name;
  }
}

// row_map: every output byte and the bias gradient are those of the gathered copy quantized (-1
// rows zero rows, repeated sources, zero-row experts); an entry outside [-1, T) is a fault and a
// zero row.
TEST(QuantCpu, GatheredRowsEqualTheQuantizedGatheredCopy) {
  Context ctx(Device::CPU);
  const int64_t T = 200, K = 256, G = 5, M = 704;
  Tensor x = make_input(rand_wide(static_cast<size_t>(T * K)), DType::bf16, {T, K}, Device::CPU);
  std::vector<int32_t> s = to_i32(make_splits(Pattern::quarter_empty, G, M));
  const TensorView sv = host_view(s, DType::int32, {G});
  for (bool fault : {false, true}) {
    std::vector<int32_t> map = random_row_map(M, T, fault ? 9 : 3);
    if (fault) {
      map[1] = static_cast<int32_t>(T);
      map[M - 2] = -9;
    }
    const Tensor xg = gather_rows_host(x, map);
    for (const QuantizeConfig& cfg :
         {qcfg(QuantRecipe::fp8_block, QuantDirection::both),
          qcfg(QuantRecipe::fp8_block, QuantDirection::columnwise, ScaleLayout::mn_major),
          qcfg(QuantRecipe::fp8_current, QuantDirection::both),
          qcfg(QuantRecipe::fp8_current, QuantDirection::rowwise, ScaleLayout::plain,
               DType::fp8e5m2),
          with_amax(qcfg(QuantRecipe::fp8_current, QuantDirection::both), AmaxSchedule::fused,
                    2)}) {
      std::vector<float> db_g(static_cast<size_t>(G * K), -1.0f), db_c(db_g.size(), -2.0f);
      const Quantized g = run_quantize_gathered(ctx, x, host_view(map, DType::int32, {M}), sv, cfg,
                                                host_view(db_g, DType::fp32, {G, K}));
      const StatusBlock st = ctx.take_status();
      EXPECT_EQ(st.bits, fault ? kFaultBadIndex : 0u) << cfg_name(cfg);
      if (fault) EXPECT_EQ(st.value, T) << cfg_name(cfg);  // the first bad entry
      const Quantized c = run_quantize(ctx, xg, sv, cfg, host_view(db_c, DType::fp32, {G, K}));
      ctx.check();
      expect_same_buffers(g.buf, c.buf, cfg_name(cfg));
      EXPECT_EQ(db_g, db_c) << cfg_name(cfg);
    }
  }
}

TEST(QuantCpu, GatheredRowsValidation) {
  Context ctx(Device::CPU);
  const int64_t T = 40, K = 128, G = 2, M = 64;
  Tensor x = make_input(rand_wide(static_cast<size_t>(T * K)), DType::bf16, {T, K}, Device::CPU);
  std::vector<int32_t> s = {32, 32}, map = random_row_map(M, T, 1);
  std::vector<int64_t> map64(map.begin(), map.end());
  const TensorView sv = host_view(s, DType::int32, {G});
  auto cfg = qcfg(QuantRecipe::fp8_block);
  QuantizedBuffers b = allocate_quantized(group_quantize_shapes(M, K, G, cfg), Device::CPU);
  GroupQuantizeArgs a;
  a.input = x;
  a.row_map = host_view(map, DType::int32, {M});
  a.splits = sv;
  a.config = cfg;
  a.out = b.view(G, sv, cfg);
  EXPECT_NO_THROW(group_quantize(ctx, a));
  a.row_map = host_view(map64, DType::int64, {M});
  EXPECT_THROW_MSG(group_quantize(ctx, a),
                   "group_quantize: row_map must be int32 [M], not int64 [64]");
  a.row_map = host_view(map, DType::int32, {M});
  a.config = with_amax(qcfg(QuantRecipe::fp8_current), AmaxSchedule::separate);
  EXPECT_THROW_MSG(group_quantize(ctx, a),
                   "group_quantize: row_map needs the fused amax schedule, not "
                   "amax_schedule=separate");
  a.config = qcfg(QuantRecipe::mxfp8);
  EXPECT_THROW_MSG(group_quantize(ctx, a),
                   "group_quantize: row_map needs fp8_current or fp8_block, not mxfp8");
  a.config = cfg;
  Tensor x32 = make_input(rand_wide(static_cast<size_t>(T * K)), DType::fp32, {T, K}, Device::CPU);
  a.input = x32;
  EXPECT_THROW_MSG(group_quantize(ctx, a), "group_quantize: row_map needs a bf16 input, not fp32");
  a.input = x;
  a.out.data = TensorView(b.data.data(), DType::fp8e4m3, Device::CPU, {T, K});  // sized for T
  EXPECT_THROW_MSG(group_quantize(ctx, a), "group_quantize: out.data.numel=5120");
}

TEST(QuantCpu, ValidationNamesOpArgumentAndValue) {
  Context ctx(Device::CPU);
  Problem p = make_problem(Pattern::balanced, 2, 64, 96);
  auto cfg = qcfg(QuantRecipe::mxfp8);
  QuantizedBuffers b = allocate_quantized(group_quantize_shapes(64, 96, 2, cfg), Device::CPU);
  GroupQuantizeArgs a;
  a.input = p.x;
  a.splits = p.sv;
  a.config = cfg;
  a.out = b.view(2, p.sv, cfg);
  EXPECT_NO_THROW(group_quantize(ctx, a));
  a.config.recipe = QuantRecipe::fp8_block;
  EXPECT_THROW_MSG(
      group_quantize(ctx, a),
      "group_quantize: input.shape[-1]=K=96 must be a multiple of 128 (fp8_block block)");
  a.config = cfg;
  a.config.scale_layout = ScaleLayout::swizzled;
  EXPECT_THROW_MSG(group_quantize(ctx, a), "group_quantize: out.scale_inv.numel=192");
  a.config = cfg;
  a.config.fp8_dtype = DType::bf16;
  EXPECT_THROW_MSG(group_quantize(ctx, a),
                   "group_quantize: config.fp8_dtype=bf16 must be fp8e4m3 or fp8e5m2");
  a.config = cfg;
  a.config.fp8_dtype = DType::fp8e5m2;
  EXPECT_THROW_MSG(group_quantize(ctx, a),
                   "group_quantize: out.data.dtype=fp8e4m3 must be fp8e5m2");
  a.config = cfg;
  TensorView xi = a.input;
  xi.dtype = DType::int32;
  a.input = xi;
  EXPECT_THROW_MSG(group_quantize(ctx, a),
                   "group_quantize: input.dtype=int32 must be bf16, fp16 or fp32");
  a.input = p.x;
  a.out.columnwise_scale_inv = TensorView();
  EXPECT_THROW_MSG(group_quantize(ctx, a),
                   "group_quantize: out.columnwise_scale_inv is required (e8m0[4, 96])");
  a.out = b.view(2, p.sv, cfg);
  a.config.scale_layout = ScaleLayout::swizzled;
  a.config.recipe = QuantRecipe::fp8_block;
  EXPECT_THROW_MSG(group_quantize_shapes(64, 128, 2, a.config),
                   "group_quantize_shapes: config.scale_layout=swizzled needs mxfp8, nvfp4 or "
                   "mxfp4, not fp8_block");
  a.config = qcfg(QuantRecipe::mxfp8, QuantDirection::both, ScaleLayout::mn_major);
  EXPECT_THROW_MSG(
      group_quantize_shapes(64, 128, 2, a.config),
      "group_quantize_shapes: config.scale_layout=mn_major needs fp8_block, not mxfp8");
  a.config = qcfg(QuantRecipe::fp8_current);
  a.config.amax_lag = -1;
  EXPECT_THROW_MSG(group_quantize_shapes(64, 128, 2, a.config),
                   "group_quantize_shapes: config.amax_lag=-1 must be >= 0");
  a.config = qcfg(QuantRecipe::nvfp4);
  a.config.block_2d = true;
  EXPECT_THROW_MSG(group_quantize(ctx, a),
                   "group_quantize: config.block_2d is for weights ([G, N, K], no splits)");
  std::vector<float> db(10);
  a.config = cfg;
  EXPECT_THROW_MSG(bgrad_group_quantize(ctx, a, host_view(db, DType::fp32, {2, 5})),
                   "bgrad_group_quantize: dbias.shape=[2, 5] must be [2, 96]");
  GroupDequantizeArgs d;
  d.in = b.view(2, p.sv, cfg);
  d.config = cfg;
  d.out = p.x;
  d.in.recipe = QuantRecipe::nvfp4;
  EXPECT_THROW_MSG(group_dequantize(ctx, d),
                   "group_dequantize: in.recipe=nvfp4 must equal config.recipe=mxfp8");
  d.in.recipe = QuantRecipe::mxfp8;
  d.in.scale_layout = ScaleLayout::swizzled;  // scales read in the wrong layout: refused
  EXPECT_THROW_MSG(
      group_dequantize(ctx, d),
      "group_dequantize: in.scale_layout=swizzled must equal config.scale_layout=plain");
  d.in.scale_layout = cfg.scale_layout;
  d.in.data = TensorView();
  EXPECT_THROW_MSG(group_dequantize(ctx, d), "group_dequantize: in.data is required");
}

}  // namespace
}  // namespace groupmm::test
