// FP8 dispatch (ep_dispatch_fp8) on the CPU backend over the in-process transport, R = 1, 2, 4:
// the rows and scales every rank receives, concatenated over the ranks, are bit for bit those of a
// one-rank reference (moe_permute of all tokens, then group_quantize of the permuted rows by
// expert); the probs are moe_permute's; the FP8 block GEMM on the dispatched rows equals the one on
// the one-rank rows; a row crosses to a rank once, at the wire size; capacity mode without overflow
// equals throughput mode, and with overflow drops as ep_dispatch does; validation messages.
#include <algorithm>

#include "common/ep_fp8_harness.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

using namespace ep_harness;

// The one-rank reference over all tokens (rank 0's, then rank 1's, ...).
struct Fp8Reference {
  std::vector<uint8_t> data;
  std::vector<float> scales, probs, gemm;
  std::vector<int32_t> splits;
};

Fp8Reference reference(const EpConfig& cfg, const std::vector<RankData>& d, const Fp8Weights& wts) {
  RankData all;
  for (const RankData& rd : d) {
    all.T += rd.T;
    all.x.insert(all.x.end(), rd.x.begin(), rd.x.end());
    all.w.insert(all.w.end(), rd.w.begin(), rd.w.end());
    all.ids.insert(all.ids.end(), rd.ids.begin(), rd.ids.end());
  }
  const int64_t T = all.T, k = cfg.topk, E = cfg.experts, H = cfg.hidden;
  Context ctx(Device::CPU);
  PermuteMap m;
  m.tokens = T;
  m.topk = k;
  m.experts = E;
  m.rows = moe_permuted_rows(T, k, E);
  std::vector<int32_t> dest(size_t(T * k)), meta(size_t(3 * E));
  m.dest_row = host_view(dest, DType::int32, {T, k});
  m.row_start = TensorView(meta.data(), DType::int32, Device::CPU, {E});
  m.kept = TensorView(meta.data() + E, DType::int32, Device::CPU, {E});
  m.splits = TensorView(meta.data() + 2 * E, DType::int32, Device::CPU, {E});
  moe_permute_plan(ctx, host_view(all.ids, DType::int32, {T, k}), m);
  Tensor x = upload(all.x, DType::bf16, {T, H}, Device::CPU, nullptr);
  Tensor w = upload(all.w, DType::fp32, {T, k}, Device::CPU, nullptr);
  Tensor xp = Tensor::empty({m.rows, H}, DType::bf16, Device::CPU);
  Tensor probs = Tensor::empty({m.rows}, DType::fp32, Device::CPU);
  moe_permute(ctx, x, m, xp, w, probs);
  const QuantizeConfig qc = ep::ep_fp8_dispatch_config();
  QuantizedBuffers q = allocate_quantized(group_quantize_shapes(m.rows, H, E, qc), Device::CPU);
  GroupQuantizeArgs a;
  a.input = xp;
  a.splits = m.splits;
  a.config = qc;
  a.out = q.view(E, m.splits, qc);
  const GroupedTensor xq = group_quantize(ctx, a);
  Fp8Reference ref;
  ref.data = bytes_of(q.data);
  ref.scales = floats_of(q.scale_inv);
  ref.probs = floats_of(probs);
  ref.splits.assign(meta.begin() + 2 * E, meta.end());
  if (wts.N > 0) {
    Tensor keep;
    QuantizedBuffers wq = quantize_weights(ctx, wts.w, E, wts.N, H, keep);
    ref.gemm =
        fp8_gemm(ctx, xq, wq.view(E, TensorView(), fp8_weight_config()), m.splits, m.rows, wts.N);
  }
  return ref;
}

template <class T>
std::vector<T> cat(const std::vector<Fp8RankOut>& outs, std::vector<T> Fp8RankOut::*field,
                   const std::vector<int64_t>& keep_rows = {}, int64_t row_len = 1) {
  std::vector<T> v;
  for (size_t r = 0; r < outs.size(); ++r) {
    const std::vector<T>& f = outs[r].*field;
    const size_t n = keep_rows.empty() ? f.size() : size_t(keep_rows[r] * row_len);
    v.insert(v.end(), f.begin(), f.begin() + long(n));
  }
  return v;
}

Fp8Weights make_weights(int64_t E, int64_t N, int64_t H, std::mt19937_64& g) {
  Fp8Weights w{N, randn(size_t(E * N * H), 0.05f, g)};
  for (float& v : w.w) v = round_to(DType::bf16, v);
  return w;
}

// Checks a run against the reference. Capacity mode: each rank's first sum(real entries) rows.
void check_fp8(const EpConfig& cfg, const RunOpts& o, uint64_t seed, int64_t N) {
  SCOPED_TRACE(cfg.to_string() + " " + ep::ep_mode_name(o.mode) + " " + o.cap.to_string());
  std::mt19937_64 g(seed);
  const std::vector<RankData> d = make_case(cfg, DType::bf16, Routing::mixed, g);
  const Fp8Weights wts = make_weights(cfg.experts, N, cfg.hidden, g);
  const std::vector<Fp8RankOut> got = run_fp8(cfg, d, o, wts);
  const Fp8Reference ref = reference(cfg, d, wts);
  const int64_t R = cfg.ranks, H = cfg.hidden, El = cfg.experts / R, k = cfg.topk;
  std::vector<int64_t> used(size_t(R), 0);
  std::vector<int32_t> splits;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<int32_t> want(ref.splits.begin() + r * El, ref.splits.begin() + (r + 1) * El);
    for (int32_t v : want) used[size_t(r)] += v;
    if (o.mode == EpMode::capacity) want.back() += int32_t(got[size_t(r)].rows - used[size_t(r)]);
    EXPECT_EQ(got[size_t(r)].splits, want) << "rank " << r;
    EXPECT_EQ(got[size_t(r)].status, 0u) << "rank " << r;
    const Fp8RankOut& gr = got[size_t(r)];
    // Capacity mode's tail: zero data and scales, or left as poisoned (0xFF) without zero_tail.
    const bool zero = o.cap.zero_tail;
    for (int64_t i = used[size_t(r)] * H; i < gr.rows * H; ++i)
      ASSERT_EQ(gr.data[size_t(i)], zero ? 0 : 0xFF) << "rank " << r << " tail byte " << i;
    for (int64_t i = used[size_t(r)] * (H / 128); i < gr.rows * (H / 128); ++i)
      ASSERT_TRUE(zero ? gr.scales[size_t(i)] == 0.0f : std::isnan(gr.scales[size_t(i)]))
          << "rank " << r << " tail scale " << i;
    if (o.mode != EpMode::throughput) continue;
    for (int64_t q = 0; q < R; ++q) {  // one wire row per (token, other expert rank)
      int64_t rows = 0;
      for (int64_t t = 0; t < d[size_t(r)].T; ++t) {
        bool needed = false;
        for (int64_t j = 0; j < k; ++j) needed |= d[size_t(r)].ids[size_t(t * k + j)] / El == q;
        rows += needed;
      }
      EXPECT_EQ(gr.sent_bytes[size_t(q)], q == r ? 0 : rows * ep::ep_fp8_wire_row_bytes(H))
          << "rank " << r << " -> " << q;
    }
  }
  EXPECT_EQ(cat(got, &Fp8RankOut::data, used, H), ref.data) << "data";
  EXPECT_TRUE(same_bits(cat(got, &Fp8RankOut::scales, used, H / 128), ref.scales)) << "scales";
  EXPECT_TRUE(same_bits(cat(got, &Fp8RankOut::probs, used), ref.probs)) << "probs";
  if (N > 0) EXPECT_TRUE(same_bits(cat(got, &Fp8RankOut::gemm, used, N), ref.gemm)) << "gemm";
}

TEST(EpFp8Cpu, MatchesOneRankQuantizedPermute) {
  for (int R : {1, 2, 4})
    for (int64_t k : {1, 3}) {
      const EpConfig cfg{8, R, 256, k};
      check_fp8(cfg, RunOpts{}, seed_for("ep_fp8") + uint64_t(R * 7 + k), 0);
    }
}

TEST(EpFp8Cpu, GemmOnDispatchedRowsEqualsOneRankGemm) {
  for (int R : {1, 2, 4}) {
    const EpConfig cfg{8, R, 256, 2};
    check_fp8(cfg, RunOpts{}, seed_for("ep_fp8_gemm") + uint64_t(R), 128);
  }
}

TEST(EpFp8Cpu, CapacityWithoutOverflowEqualsReference) {
  for (int R : {1, 2, 4}) {
    const EpConfig cfg{8, R, 128, 3};
    check_fp8(cfg, RunOpts{DType::bf16, EpMode::capacity, EpCapacity{9 + 3 * R, 0}},
              seed_for("ep_fp8_cap") + uint64_t(R), 128);
  }
}

TEST(EpFp8Cpu, CapacityTailLeftAloneWithoutZeroTail) {
  for (int R : {1, 2, 4}) {
    const EpConfig cfg{8, R, 128, 3};
    check_fp8(cfg, RunOpts{DType::bf16, EpMode::capacity, EpCapacity{9 + 3 * R, 0, false}},
              seed_for("ep_fp8_cap") + uint64_t(R), 128);
  }
}

TEST(EpFp8Cpu, WireRowIsAboutHalfABf16Row) {
  EXPECT_EQ(ep::ep_fp8_wire_row_bytes(128), 144);    // 128 + 4, padded to 16
  EXPECT_EQ(ep::ep_fp8_wire_row_bytes(7168), 7392);  // 7168 + 56 * 4
  EXPECT_EQ(ep::ep_fp8_wire_row_bytes(2048), 2112);
  EXPECT_LT(double(ep::ep_fp8_wire_row_bytes(7168)) / (2 * 7168), 0.52);
}

TEST(EpFp8Cpu, CapacityOverflowDropsLikeEpDispatch) {
  // The same routing through ep_dispatch (bf16) and ep_dispatch_fp8: same splits, same status,
  // and every kept row's data is the quantization of the bf16 row ep_dispatch delivered.
  for (int R : {1, 2, 4}) {
    SCOPED_TRACE("R=" + std::to_string(R));
    const EpConfig cfg{8, R, 128, 3};
    const RunOpts o{DType::bf16, EpMode::capacity, EpCapacity{2, 0}, true};
    std::mt19937_64 g(seed_for("ep_fp8_over") + uint64_t(R));
    const std::vector<RankData> d = make_case(cfg, DType::bf16, Routing::mixed, g, 12);
    const auto fp8 = run_fp8(cfg, d, o, Fp8Weights{});
    const auto bf = run_layer(cfg, d, o);
    for (int r = 0; r < R; ++r) {
      EXPECT_EQ(fp8[size_t(r)].splits, bf[size_t(r)].splits) << "rank " << r;
      EXPECT_EQ(fp8[size_t(r)].status, bf[size_t(r)].status) << "rank " << r;
      // Quantize ep_dispatch's grouped rows here: the same bytes and scales.
      const int64_t rows = bf[size_t(r)].rows, H = cfg.hidden;
      Context ctx(Device::CPU);
      Tensor xg = upload(bf[size_t(r)].x_grouped, DType::bf16, {rows, H}, Device::CPU, nullptr);
      QuantizedBuffers q = quantize_tokens(ctx, xg, rows, H);
      EXPECT_EQ(bytes_of(q.data), fp8[size_t(r)].data) << "rank " << r;
      // Scales of the kept rows (a zero tail row quantizes to scale 1 here, 0 in the dispatch).
      const std::vector<float> sc = floats_of(q.scale_inv);
      const std::vector<float>& xr = bf[size_t(r)].x_grouped;
      for (int64_t i = 0; i < rows; ++i) {
        if (std::all_of(xr.begin() + i * H, xr.begin() + (i + 1) * H,
                        [](float v) { return v == 0; }))
          continue;
        for (int64_t c = 0; c < H / 128; ++c)
          EXPECT_EQ(sc[size_t(i * (H / 128) + c)], fp8[size_t(r)].scales[size_t(i * (H / 128) + c)])
              << "rank " << r << " row " << i;
      }
    }
  }
}

TEST(EpFp8Cpu, ValidationMessages) {
  const EpConfig cfg{4, 1, 128, 2};
  const auto expect = [&](const std::string& what, auto&& fn) {
    try {
      run_ranks(1, [&](int, ep::InProcessTransport& tr) {
        Context ctx(Device::CPU);
        std::vector<int32_t> ids = {0, 1};
        ep::EpPlan p = ep::ep_dispatch_plan(ctx, tr, cfg, host_view(ids, DType::int32, {1, 2}));
        fn(ctx, tr, p);
      });
      ADD_FAILURE() << "no error; expected " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const QuantizeConfig qc = ep::ep_fp8_dispatch_config();
  const auto bufs = [&](int64_t rows) {
    return allocate_quantized(group_quantize_shapes(rows, 128, 1, qc), Device::CPU);
  };
  expect("ep_dispatch_fp8: x_q.recipe=none must be fp8_block",
         [&](Context& ctx, ep::InProcessTransport& tr, ep::EpPlan& p) {
           QuantizedBuffers a = bufs(1), b = bufs(2);
           GroupedTensor xq = a.view(1, TensorView(), qc);
           xq.recipe = QuantRecipe::none;
           ep::ep_dispatch_fp8(ctx, tr, p, xq, b.view(1, TensorView(), qc));
         });
  expect("ep_dispatch_fp8: x_grouped.data.shape[0]=1 must equal 2",
         [&](Context& ctx, ep::InProcessTransport& tr, ep::EpPlan& p) {
           QuantizedBuffers a = bufs(1), b = bufs(1);
           GroupedTensor xq = a.view(1, TensorView(), qc);
           xq.recipe = QuantRecipe::fp8_block;
           GroupedTensor xg = b.view(1, TensorView(), qc);
           xg.recipe = QuantRecipe::fp8_block;
           ep::ep_dispatch_fp8(ctx, tr, p, xq, xg);
         });
  expect("ep_dispatch_fp8: x_q.scale_layout=mn_major must be plain",
         [&](Context& ctx, ep::InProcessTransport& tr, ep::EpPlan& p) {
           QuantizedBuffers a = bufs(1), b = bufs(2);
           GroupedTensor xq = a.view(1, TensorView(), qc);
           xq.recipe = QuantRecipe::fp8_block;
           xq.scale_layout = ScaleLayout::mn_major;
           ep::ep_dispatch_fp8(ctx, tr, p, xq, b.view(1, TensorView(), qc));
         });
  expect("ep_dispatch_fp8: cfg.hidden=64 must be a multiple of 128",
         [&](Context& ctx, ep::InProcessTransport& tr, ep::EpPlan&) {
           std::vector<int32_t> ids = {0, 1};
           ep::EpPlan p = ep::ep_dispatch_plan(ctx, tr, EpConfig{4, 1, 64, 2},
                                               host_view(ids, DType::int32, {1, 2}));
           ep::ep_dispatch_fp8(ctx, tr, p, GroupedTensor{}, GroupedTensor{});
         });
}

}  // namespace
}  // namespace groupmm::test
