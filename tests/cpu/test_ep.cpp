// Expert-parallel dispatch / combine and their backwards on the CPU backend over the in-process
// transport: R simulated ranks as threads, checked against a one-rank reference over all tokens
// (the global token order is rank 0's tokens, then rank 1's, ...), both a plain loop reference
// that knows capacity drops and the one-rank moe ops (moe_permute, moe_permute_backward); the
// bytes each rank sends (a row crosses to a rank once) and a capacity plan's staging (the other
// ranks' blocks only); capacity mode against throughput mode and with overflow; the validation
// messages.
#include "common/ep_harness.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

using namespace ep_harness;

// Which (rank, token, slot) entries survive capacity mode's drop rule (all of them in throughput
// mode): per (home r, peer q), tokens needing q in token order while both running totals fit.
std::vector<std::vector<bool>> kept_slots(const EpConfig& cfg, const std::vector<RankData>& d,
                                          const RunOpts& o) {
  const int64_t R = cfg.ranks, k = cfg.topk, El = cfg.experts / R;
  const int64_t C = o.cap.rows_per_peer;
  const int64_t Ce = o.cap.entries_per_peer > 0 ? o.cap.entries_per_peer : C * k;
  std::vector<std::vector<bool>> kept(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const RankData& rd = d[size_t(r)];
    kept[size_t(r)].assign(size_t(rd.T * k), true);
    if (o.mode == EpMode::throughput) continue;
    std::vector<int64_t> rows(size_t(R), 0), entries(size_t(R), 0);
    for (int64_t t = 0; t < rd.T; ++t)
      for (int64_t q = 0; q < R; ++q) {
        int64_t n = 0;
        for (int64_t j = 0; j < k; ++j) n += rd.ids[size_t(t * k + j)] / El == q;
        if (n == 0) continue;
        rows[size_t(q)] += 1;
        entries[size_t(q)] += n;
        if (rows[size_t(q)] <= C && entries[size_t(q)] <= Ce) continue;
        for (int64_t j = 0; j < k; ++j)
          if (rd.ids[size_t(t * k + j)] / El == q) kept[size_t(r)][size_t(t * k + j)] = false;
      }
  }
  return kept;
}

// The plain-loop reference of a whole step (see run_layer), per rank.
std::vector<RankOut> reference(const EpConfig& cfg, const std::vector<RankData>& d,
                               const RunOpts& o) {
  const int64_t R = cfg.ranks, H = cfg.hidden, k = cfg.topk, El = cfg.experts / R;
  const DType dt = o.dt;
  const auto kept = kept_slots(cfg, d, o);
  std::vector<RankOut> ref(static_cast<size_t>(R));
  const auto y_of = [&](int64_t r, int64_t t, int64_t j, int64_t h) {
    const RankData& rd = d[size_t(r)];
    return round_to(dt, rd.x[size_t(t * H + h)] * expert_scale(rd.ids[size_t(t * k + j)]));
  };
  const auto dyg_of = [&](int64_t r, int64_t t, int64_t j, int64_t h) {
    const RankData& rd = d[size_t(r)];
    return round_to(dt, rd.w[size_t(t * k + j)] * rd.dy[size_t(t * H + h)]);
  };
  for (int64_t q = 0; q < R; ++q)
    for (int64_t e = q * El; e < (q + 1) * El; ++e) {
      int32_t n = 0;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t t = 0; t < d[size_t(r)].T; ++t)
          for (int64_t j = 0; j < k; ++j) {
            if (d[size_t(r)].ids[size_t(t * k + j)] != e || !kept[size_t(r)][size_t(t * k + j)])
              continue;
            ++n;
            for (int64_t h = 0; h < H; ++h) {
              ref[size_t(q)].x_grouped.push_back(d[size_t(r)].x[size_t(t * H + h)]);
              ref[size_t(q)].d_y_grouped.push_back(dyg_of(r, t, j, h));
            }
          }
      ref[size_t(q)].splits.push_back(n);
    }
  for (int64_t r = 0; r < R; ++r) {
    const RankData& rd = d[size_t(r)];
    RankOut& o_r = ref[size_t(r)];
    o_r.out.assign(size_t(rd.T * H), 0.0f);
    o_r.dx.assign(size_t(rd.T * H), 0.0f);
    o_r.d_weights.assign(size_t(rd.T * k), 0.0f);
    for (int64_t t = 0; t < rd.T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        float acc = 0.0f, dacc = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          if (!kept[size_t(r)][size_t(t * k + j)]) continue;
          const float v = rd.w[size_t(t * k + j)] * y_of(r, t, j, h);
          acc += v;
          dacc += round_to(dt, dyg_of(r, t, j, h) * expert_scale(rd.ids[size_t(t * k + j)]));
        }
        o_r.out[size_t(t * H + h)] = round_to(dt, acc);
        o_r.dx[size_t(t * H + h)] = round_to(dt, dacc);
      }
      for (int64_t j = 0; j < k; ++j) {
        if (!kept[size_t(r)][size_t(t * k + j)]) continue;
        std::vector<float> y(static_cast<size_t>(H));
        for (int64_t h = 0; h < H; ++h) y[size_t(h)] = y_of(r, t, j, h);
        o_r.d_weights[size_t(t * k + j)] = ep::ep_dot_order(rd.dy.data() + t * H, y.data(), H);
      }
    }
  }
  return ref;
}

// Compares a run with the reference. Capacity mode: the grouped buffers have R * C_e rows whose
// tail (past the kept entries) is zero and counted in the last split.
void expect_matches(const EpConfig& cfg, const std::vector<RankOut>& got,
                    const std::vector<RankOut>& want, const RunOpts& o) {
  const int64_t R = cfg.ranks, H = cfg.hidden;
  for (int64_t q = 0; q < R; ++q) {
    SCOPED_TRACE("rank " + std::to_string(q));
    const RankOut &g = got[size_t(q)], &w = want[size_t(q)];
    std::vector<int32_t> splits = w.splits;
    std::vector<float> xg = w.x_grouped, dyg = w.d_y_grouped;
    if (o.mode == EpMode::capacity) {  // the zero tail
      const int64_t used = int64_t(xg.size()) / H;
      splits.back() += int32_t(g.rows - used);
      xg.resize(size_t(g.rows * H), 0.0f);
      dyg.resize(size_t(g.rows * H), 0.0f);
    }
    EXPECT_EQ(g.splits, splits);
    EXPECT_TRUE(same_bits(g.x_grouped, xg)) << "x_grouped";
    EXPECT_TRUE(same_bits(g.d_y_grouped, dyg)) << "d_y_grouped";
    EXPECT_TRUE(same_bits(g.out, w.out)) << "out";
    EXPECT_TRUE(same_bits(g.d_weights, w.d_weights)) << "d_weights";
    EXPECT_TRUE(same_bits(g.dx, w.dx)) << "dx";
  }
}

void check_case(const EpConfig& cfg, uint64_t seed, const RunOpts& o, Routing routing) {
  SCOPED_TRACE(cfg.to_string() + " seed " + std::to_string(seed) + " " + dtype_name(o.dt) + " " +
               ep::ep_mode_name(o.mode) + " " + o.cap.to_string());
  std::mt19937_64 g(seed);
  const std::vector<RankData> d = make_case(cfg, o.dt, routing, g);
  const std::vector<RankOut> got = run_layer(cfg, d, o);
  expect_matches(cfg, got, reference(cfg, d, o), o);
  const int64_t R = cfg.ranks, k = cfg.topk, El = cfg.experts / R;
  for (int64_t r = 0; r < R; ++r) {
    EXPECT_EQ(got[size_t(r)].status, 0u) << "rank " << r;
    if (o.mode == EpMode::capacity) {
      // The row staging holds every peer's block but the rank's own (the movers read that one in
      // place): none at R = 1 (one int32 granule, so that the buffer exists).
      const int64_t C = o.cap.rows_per_peer;
      const int64_t Ce = o.cap.entries_per_peer > 0 ? o.cap.entries_per_peer : C * k;
      EXPECT_EQ(
          got[size_t(r)].stage_bytes,
          std::max<int64_t>((R - 1) * std::max(C, Ce) * dtype_storage_bytes(o.dt, cfg.hidden), 4))
          << "rank " << r;
    }
    if (o.mode != EpMode::throughput) continue;
    // A row crosses to a rank once: rank r sends q each token with an expert on q exactly once;
    // its own rows do not go through the transport (packed in place: 0 bytes to itself).
    for (int64_t q = 0; q < R; ++q) {
      int64_t rows = 0;
      for (int64_t t = 0; t < d[size_t(r)].T; ++t) {
        bool needed = false;
        for (int64_t j = 0; j < k; ++j) needed |= d[size_t(r)].ids[size_t(t * k + j)] / El == q;
        rows += needed;
      }
      EXPECT_EQ(got[size_t(r)].sent_bytes[size_t(q)],
                q == r ? 0 : rows * dtype_storage_bytes(o.dt, cfg.hidden))
          << "rank " << r << " -> " << q;
    }
  }
}

TEST(EpCpu, ForwardBackwardMatchOneRankReference) {
  for (int R : {1, 2, 4, 8})
    for (int64_t k : {1, 2, 4})
      for (uint64_t seed : {1u, 2u}) {
        const EpConfig cfg{16, R, 24, k};
        check_case(cfg, seed_for("ep") + seed * 131 + uint64_t(R * 7 + k), RunOpts{},
                   Routing::mixed);
      }
}

TEST(EpCpu, Bf16AndFp16RowsMovedAsBytes) {
  for (DType dt : {DType::bf16, DType::fp16})
    for (int R : {1, 2, 4})
      check_case(EpConfig{16, R, 40, 3}, seed_for("ep_16bit") + R,
                 RunOpts{dt, EpMode::throughput, {}}, Routing::mixed);
}

TEST(EpCpu, AllTokensOnOneExpert) {
  for (int R : {1, 2, 4})
    for (int64_t k : {1, 3})
      check_case(EpConfig{8, R, 16, k}, seed_for("ep_one") + R + k, RunOpts{}, Routing::one_expert);
}

// The global tokens of all ranks (rank 0's, then rank 1's, ...) and their one-rank permute map.
struct OneRank {
  RankData all;
  std::vector<int32_t> dest, meta;  // meta = row_start | kept | splits
  PermuteMap m;
  OneRank(const EpConfig& cfg, const std::vector<RankData>& d) {
    for (const RankData& rd : d) {
      all.T += rd.T;
      for (auto [dst, src] :
           {std::pair{&all.x, &rd.x}, std::pair{&all.dy, &rd.dy}, std::pair{&all.w, &rd.w}})
        dst->insert(dst->end(), src->begin(), src->end());
      all.ids.insert(all.ids.end(), rd.ids.begin(), rd.ids.end());
    }
    const int64_t T = all.T, k = cfg.topk, E = cfg.experts;
    m.tokens = T;
    m.topk = k;
    m.experts = E;
    m.rows = moe_permuted_rows(T, k, E);
    dest.assign(size_t(T * k), 0);
    meta.assign(size_t(3 * E), 0);
    m.dest_row = host_view(dest, DType::int32, {T, k});
    m.row_start = TensorView(meta.data(), DType::int32, Device::CPU, {E});
    m.kept = TensorView(meta.data() + E, DType::int32, Device::CPU, {E});
    m.splits = TensorView(meta.data() + 2 * E, DType::int32, Device::CPU, {E});
    Context ctx(Device::CPU);
    moe_permute_plan(ctx, host_view(all.ids, DType::int32, {T, k}), m);
  }
  std::vector<int32_t> splits() const { return {meta.begin() + 2 * m.experts, meta.end()}; }
};

// One field of every rank, concatenated in rank order.
template <class T>
std::vector<T> cat(const std::vector<RankOut>& outs, std::vector<T> RankOut::*field) {
  std::vector<T> v;
  for (const RankOut& o : outs) v.insert(v.end(), (o.*field).begin(), (o.*field).end());
  return v;
}

// The global tokens through the one-rank moe ops: the ranks' grouped buffers, concatenated, are
// moe_permute's output, and dx is moe_permute_backward's of the concatenated gradients, bit for
// bit.
TEST(EpCpu, MatchesOneRankMoePermute) {
  for (int R : {1, 2, 4, 8}) {
    SCOPED_TRACE("R=" + std::to_string(R));
    const EpConfig cfg{16, R, 20, 4};
    std::mt19937_64 g(seed_for("ep_moe") + uint64_t(R));
    const std::vector<RankData> d = make_case(cfg, DType::bf16, Routing::mixed, g);
    const std::vector<RankOut> got =
        run_layer(cfg, d, RunOpts{DType::bf16, EpMode::throughput, {}});
    OneRank one(cfg, d);
    const int64_t T = one.all.T, E = cfg.experts, H = cfg.hidden;
    Context ctx(Device::CPU);
    Tensor x = upload(one.all.x, DType::bf16, {T, H}, Device::CPU, nullptr);
    Tensor xp = Tensor::empty({one.m.rows, H}, DType::bf16, Device::CPU);
    moe_permute(ctx, x, one.m, xp);
    std::vector<float> cat_dxg;
    for (int64_t q = 0; q < R; ++q) {
      const RankOut& o = got[size_t(q)];
      const auto dxg = apply_experts(o.d_y_grouped, o.splits, q * (E / R), H, DType::bf16);
      cat_dxg.insert(cat_dxg.end(), dxg.begin(), dxg.end());
    }
    EXPECT_EQ(cat(got, &RankOut::splits), one.splits());
    EXPECT_TRUE(same_bits(cat(got, &RankOut::x_grouped), floats_of(xp)));
    Tensor dxp = upload(cat_dxg, DType::bf16, {one.m.rows, H}, Device::CPU, nullptr);
    Tensor dx = Tensor::empty({T, H}, DType::bf16, Device::CPU);
    moe_permute_backward(ctx, dxp, one.m, dx);
    EXPECT_TRUE(same_bits(cat(got, &RankOut::dx), floats_of(dx)));
  }
}

// The one-rank block's convention (router weights into the expert through probs, unweighted
// combine): every output is the one-rank ops' (moe_permute with probs, moe_unpermute and their
// backwards), bit for bit.
TEST(EpCpu, ProbsFlowMatchesOneRankMoeOps) {
  for (int R : {1, 2, 4, 8}) {
    SCOPED_TRACE("R=" + std::to_string(R));
    const EpConfig cfg{16, R, 24, 3};
    const DType bf = DType::bf16;
    std::mt19937_64 g(seed_for("ep_probs") + uint64_t(R));
    const std::vector<RankData> d = make_case(cfg, bf, Routing::mixed, g);
    const std::vector<RankOut> got =
        run_layer(cfg, d, RunOpts{bf, EpMode::throughput, {}, false, true});
    OneRank one(cfg, d);
    const int64_t T = one.all.T, k = cfg.topk, H = cfg.hidden, rows = one.m.rows;
    Context ctx(Device::CPU);
    Tensor x = upload(one.all.x, bf, {T, H}, Device::CPU, nullptr);
    Tensor w = upload(one.all.w, DType::fp32, {T, k}, Device::CPU, nullptr);
    Tensor xp = Tensor::empty({rows, H}, bf, Device::CPU);
    Tensor probs = Tensor::empty({rows}, DType::fp32, Device::CPU);
    moe_permute(ctx, x, one.m, xp, w, probs);
    const std::vector<float> xp_f = floats_of(xp), probs_f = floats_of(probs);
    EXPECT_TRUE(same_bits(cat(got, &RankOut::x_grouped), xp_f));
    EXPECT_TRUE(same_bits(cat(got, &RankOut::probs), probs_f));
    const std::vector<int32_t> splits = one.splits();
    Tensor yp = upload(apply_experts(xp_f, splits, 0, H, bf, &probs_f), bf, {rows, H}, Device::CPU,
                       nullptr);
    Tensor y = Tensor::empty({T, H}, bf, Device::CPU);
    moe_unpermute(ctx, yp, one.m, y);
    EXPECT_TRUE(same_bits(cat(got, &RankOut::out), floats_of(y))) << "out";
    Tensor dy = upload(one.all.dy, bf, {T, H}, Device::CPU, nullptr);
    Tensor dyp = Tensor::empty({rows, H}, bf, Device::CPU);
    moe_unpermute_backward(ctx, dy, one.m, dyp);
    const std::vector<float> dyp_f = floats_of(dyp);
    EXPECT_TRUE(same_bits(cat(got, &RankOut::d_y_grouped), dyp_f)) << "d_y_grouped";
    Tensor dxp = upload(apply_experts(dyp_f, splits, 0, H, bf, &probs_f), bf, {rows, H},
                        Device::CPU, nullptr);
    std::vector<float> dprobs = expert_d_probs(dyp_f, xp_f, splits, 0, H);
    std::vector<float> dweights(size_t(T * k));
    Tensor dx = Tensor::empty({T, H}, bf, Device::CPU);
    moe_permute_backward(ctx, dxp, one.m, dx, host_view(dprobs, DType::fp32, {rows}),
                         host_view(dweights, DType::fp32, {T, k}));
    EXPECT_TRUE(same_bits(cat(got, &RankOut::dx), floats_of(dx))) << "dx";
    EXPECT_TRUE(same_bits(cat(got, &RankOut::d_weights), dweights)) << "d_weights";
  }
}

TEST(EpCpu, IdenticalForAnyRankCount) {
  // The same global tokens split over 1 or 4 ranks give the same output bits (the fixed orders do
  // not depend on R).
  std::mt19937_64 g(seed_for("ep_any_r"));
  const EpConfig c4{8, 4, 16, 2};
  const std::vector<RankData> d4 = make_case(c4, DType::fp32, Routing::mixed, g);
  const OneRank one(c4, d4);
  const auto r4 = run_layer(c4, d4, RunOpts{});
  const auto r1 = run_layer(EpConfig{8, 1, 16, 2}, {one.all}, RunOpts{});
  for (auto field : {&RankOut::out, &RankOut::d_weights, &RankOut::dx})
    EXPECT_TRUE(same_bits(cat(r4, field), r1[0].*field));
}

TEST(EpCpu, CapacityWithoutOverflowEqualsThroughput) {
  for (int R : {1, 2, 4, 8})
    for (int64_t k : {1, 2, 4}) {
      // Large enough for every case make_case draws (at most 9 + 3 R tokens a rank).
      const RunOpts o{DType::fp32, EpMode::capacity, EpCapacity{9 + 3 * R, 0}};
      check_case(EpConfig{16, R, 24, k}, seed_for("ep_cap") + uint64_t(R * 7 + k), o,
                 Routing::mixed);
    }
  // A tighter entry budget that still fits (the test data has at most 2 entries a row when k = 2),
  // bf16 rows, all tokens on one expert.
  check_case(EpConfig{8, 4, 16, 2}, seed_for("ep_cap_e"),
             RunOpts{DType::bf16, EpMode::capacity, EpCapacity{21, 42}}, Routing::mixed);
  check_case(EpConfig{8, 2, 16, 3}, seed_for("ep_cap_one"),
             RunOpts{DType::fp32, EpMode::capacity, EpCapacity{20, 0}}, Routing::one_expert);
}

TEST(EpCpu, CapacityProbsFlowEqualsThroughput) {
  for (int R : {1, 2, 4}) {
    const EpConfig cfg{16, R, 24, 4};
    std::mt19937_64 g(seed_for("ep_cap_probs") + uint64_t(R));
    const std::vector<RankData> d = make_case(cfg, DType::bf16, Routing::mixed, g);
    const auto tp = run_layer(cfg, d, RunOpts{DType::bf16, EpMode::throughput, {}, false, true});
    const auto cp = run_layer(
        cfg, d, RunOpts{DType::bf16, EpMode::capacity, EpCapacity{9 + 3 * R, 0}, false, true});
    for (int r = 0; r < R; ++r) {
      SCOPED_TRACE("R=" + std::to_string(R) + " rank " + std::to_string(r));
      const RankOut &a = tp[size_t(r)], &b = cp[size_t(r)];
      const size_t n = a.probs.size();
      ASSERT_GE(b.probs.size(), n);
      EXPECT_TRUE(
          same_bits(std::vector<float>(b.probs.begin(), b.probs.begin() + long(n)), a.probs));
      EXPECT_EQ(std::vector<float>(b.probs.begin() + long(n), b.probs.end()),
                std::vector<float>(b.probs.size() - n, 0.0f))
          << "tail probs";
      EXPECT_TRUE(same_bits(b.out, a.out));
      EXPECT_TRUE(same_bits(b.dx, a.dx));
      EXPECT_TRUE(same_bits(b.d_weights, a.d_weights));
      EXPECT_EQ(b.status, 0u);
    }
  }
}

// EpCapacity::zero_tail = false: the grouped buffers' tail (poisoned by run_rank) is left as it
// was (x_grouped, probs, d_y_grouped), the rows holding entries and every result home are the
// zeroing run's bit for bit.
TEST(EpCpu, CapacityTailLeftAloneWithoutZeroTail) {
  for (int R : {1, 2, 4})
    for (bool probs : {false, true}) {
      const EpConfig cfg{16, R, 24, 3};
      SCOPED_TRACE("R=" + std::to_string(R) + (probs ? " probs" : " weights"));
      std::mt19937_64 g(seed_for("ep_cap_tail") + uint64_t(R));
      const std::vector<RankData> d = make_case(cfg, DType::bf16, Routing::mixed, g);
      const EpCapacity zero{9 + 3 * R, 0}, keep{9 + 3 * R, 0, false};
      const auto a = run_layer(cfg, d, RunOpts{DType::bf16, EpMode::capacity, zero, false, probs});
      const auto b = run_layer(cfg, d, RunOpts{DType::bf16, EpMode::capacity, keep, false, probs});
      for (int r = 0; r < R; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        const RankOut &z = a[size_t(r)], &k = b[size_t(r)];
        ASSERT_EQ(z.entries, k.entries);
        ASSERT_LT(z.entries, z.rows) << "the case needs a tail";
        EXPECT_TRUE(same_bits(k.out, z.out));
        EXPECT_TRUE(same_bits(k.dx, z.dx));
        EXPECT_TRUE(same_bits(k.d_weights, z.d_weights));
        const int64_t H = cfg.hidden, n = z.entries * H;
        for (auto f : {&RankOut::x_grouped, &RankOut::d_y_grouped}) {
          const std::vector<float>&zv = z.*f, &kv = k.*f;
          EXPECT_TRUE(same_bits({zv.begin(), zv.begin() + n}, {kv.begin(), kv.begin() + n}));
          for (int64_t i = n; i < z.rows * H; ++i) {
            ASSERT_EQ(zv[size_t(i)], 0.0f) << "zeroed tail, value " << i;
            ASSERT_TRUE(std::isnan(kv[size_t(i)])) << "kept (poisoned) tail, value " << i;
          }
        }
        if (!probs) continue;
        for (int64_t i = z.entries; i < z.rows; ++i) {
          ASSERT_EQ(z.probs[size_t(i)], 0.0f) << "zeroed tail prob " << i;
          ASSERT_TRUE(std::isnan(k.probs[size_t(i)])) << "kept tail prob " << i;
        }
      }
    }
}

TEST(EpCpu, CapacityOverflowDropsDeterministicallyAndReports) {
  for (int R : {1, 2, 4})
    for (EpCapacity cap : {EpCapacity{2, 0}, EpCapacity{6, 5}, EpCapacity{1, 1}}) {
      const EpConfig cfg{8, R, 16, 3};
      const RunOpts o{DType::fp32, EpMode::capacity, cap};
      SCOPED_TRACE("R=" + std::to_string(R) + " " + cap.to_string());
      std::mt19937_64 g(seed_for("ep_over") + uint64_t(R));
      const std::vector<RankData> d = make_case(cfg, o.dt, Routing::mixed, g, 12);
      const std::vector<RankOut> got = run_layer(cfg, d, o);
      expect_matches(cfg, got, reference(cfg, d, o), o);
      // A rank whose tokens overflowed some peer reports it; ranks that dropped nothing do not.
      const auto kept = kept_slots(cfg, d, o);
      for (int64_t r = 0; r < R; ++r) {
        const bool dropped = std::find(kept[size_t(r)].begin(), kept[size_t(r)].end(), false) !=
                             kept[size_t(r)].end();
        EXPECT_EQ(got[size_t(r)].status, dropped ? uint32_t(kFaultEpCapacity) : 0u) << "rank " << r;
      }
    }
}

TEST(EpCpu, CapacityOverflowMessageNamesPeer) {
  // One rank, three tokens on expert 0, room for two rows: peer 0 needed 3.
  Context ctx(Device::CPU);
  auto group = ep::make_in_process_group(1);
  std::vector<int32_t> ids = {0, 0, 0};
  ep::EpPlan plan = ep::ep_capacity_plan_create(ctx, *group[0], EpConfig{2, 1, 4, 1},
                                                EpCapacity{2, 0}, 3, DType::fp32);
  ep::ep_capacity_plan(ctx, *group[0], host_view(ids, DType::int32, {3, 1}), plan);
  EXPECT_THROW_MSG(ctx.check(),
                   "device fault in ep_dispatch (status 0x20): expert-parallel capacity exceeded "
                   "(rows dropped); first at peer rank 0, needed 3");
  // Out-of-bounds writes would show in guard rows past the view.
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<float> xg(size_t((plan.rows + 2) * 4), -7.0f);
  ep::ep_dispatch(ctx, *group[0], plan, host_view(x, DType::fp32, {3, 4}),
                  host_view(xg, DType::fp32, {plan.rows, 4}));
  EXPECT_EQ(plan.rows, 2);
  EXPECT_EQ(std::vector<float>(xg.begin(), xg.begin() + 8),
            std::vector<float>(x.begin(), x.begin() + 8));
  EXPECT_EQ(std::vector<float>(xg.begin() + 8, xg.end()), std::vector<float>(8, -7.0f));
}

TEST(EpCpu, DotOrderIsTheLaneButterfly) {
  std::mt19937_64 g(seed_for("ep_dot"));
  for (int64_t n : {0, 1, 31, 32, 33, 100, 1000}) {
    const auto a = randn(size_t(n), 1.0f, g), b = randn(size_t(n), 1.0f, g);
    float lanes[32] = {};
    for (int64_t h = 0; h < n; ++h) lanes[h % 32] += a[size_t(h)] * b[size_t(h)];
    for (int m = 16; m >= 1; m /= 2)
      for (int l = 0; l < m; ++l) lanes[l] = lanes[l] + lanes[l + m];
    const float got = ep::ep_dot_order(a.data(), b.data(), n);
    EXPECT_EQ(got, lanes[0]) << "n=" << n;
    double exact = 0;
    for (int64_t h = 0; h < n; ++h) exact += double(a[size_t(h)]) * b[size_t(h)];
    EXPECT_NEAR(got, exact, 1e-5 * (1 + std::abs(exact)) + 1e-6 * double(n));
  }
}

template <class Fn>
void expect_error(int R, const std::string& what, Fn fn) {
  try {
    run_ranks(R, fn);
    ADD_FAILURE() << "no error; expected " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

void expect_dispatch_error(int R, const EpConfig& cfg, std::vector<int32_t> ids, int64_t T,
                           int64_t x_rows, const std::string& what) {
  expect_error(R, what, [&](int, ep::InProcessTransport& tr) {
    Context ctx(Device::CPU);
    std::vector<int32_t> my_ids = ids;
    ep::EpPlan plan =
        ep::ep_dispatch_plan(ctx, tr, cfg, host_view(my_ids, DType::int32, {T, cfg.topk}));
    std::vector<float> x(size_t(x_rows * cfg.hidden)), xg(size_t(plan.rows * cfg.hidden) + 1);
    ep::ep_dispatch(ctx, tr, plan, host_view(x, DType::fp32, {x_rows, cfg.hidden}),
                    host_view(xg, DType::fp32, {plan.rows, cfg.hidden}));
  });
}

// A transport that forwards to its rank's end of an in-process group and throws at its
// `fail_at`-th collective (counting both kinds from 0; -1: never), as a rank that runs out of
// memory or hits a bad argument there would.
class FailingTransport final : public ep::Transport {
 public:
  FailingTransport(ep::Transport& inner, int fail_at) : inner_(inner), fail_at_(fail_at) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Device device() const override { return inner_.device(); }
  void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) override {
    step();
    inner_.all_to_all_counts(send, recv, n);
  }
  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                    void* recv, const int64_t* recv_counts, const int64_t* recv_offsets,
                    cudaStream_t stream) override {
    step();
    inner_.all_to_all_v(send, send_counts, send_offsets, recv, recv_counts, recv_offsets, stream);
  }
  int calls() const { return calls_; }

 private:
  void step() {
    GROUPMM_CHECK(calls_ != fail_at_, "injected failure before collective ", calls_);
    ++calls_;
  }
  ep::Transport& inner_;
  int fail_at_;
  int calls_ = 0;
};

// Every step of an EP layer (plan, dispatch, combine and their backwards, both modes): one rank
// fails before its n-th collective; the group returns (no rank is left waiting), and the error
// names the failed rank and its cause, not a released peer.
TEST(EpCpu, FailingRankReleasesTheOthersAtEveryStep) {
  const int R = 4;
  const EpConfig cfg{8, R, 16, 2};
  std::mt19937_64 g(seed_for("ep_fail"));
  const auto data = make_case(cfg, DType::fp32, Routing::mixed, g);
  for (EpMode mode : {EpMode::throughput, EpMode::capacity}) {
    RunOpts o;
    o.mode = mode;
    o.cap = EpCapacity{64, 64};
    std::vector<int> collectives(static_cast<size_t>(R), 0);
    run_ranks(R, [&](int r, ep::InProcessTransport& tr) {
      Context ctx(Device::CPU);
      FailingTransport counting(tr, -1);
      run_rank(ctx, counting, cfg, data[size_t(r)], o);
      collectives[size_t(r)] = counting.calls();
    });
    ASSERT_GT(collectives[0], 2);
    for (int failing : {0, R - 1})
      for (int n = 0; n < collectives[size_t(failing)]; ++n) {
        SCOPED_TRACE(::testing::Message() << "mode " << int(mode) << ", rank " << failing
                                          << " fails before collective " << n);
        try {
          run_ranks(R, [&](int r, ep::InProcessTransport& tr) {
            Context ctx(Device::CPU);
            FailingTransport t(tr, r == failing ? n : -1);
            run_rank(ctx, t, cfg, data[size_t(r)], o);
          });
          ADD_FAILURE() << "no error";
        } catch (const Error& e) {
          const std::string msg = e.what();
          EXPECT_NE(msg.find("run_ranks: rank " + std::to_string(failing) +
                             " failed: injected failure before collective " + std::to_string(n)),
                    std::string::npos)
              << msg;
        }
      }
  }
}

// A rank that returns while its peers wait in a collective (the ranks disagree on the sequence of
// collectives) fails the group instead of leaving them waiting.
TEST(EpCpu, RankThatLeavesEarlyReleasesTheOthers) {
  EXPECT_THROW_MSG(run_ranks(3,
                             [&](int r, ep::InProcessTransport& tr) {
                               if (r == 1) return;
                               std::vector<int64_t> send(3), recv(3);
                               tr.all_to_all_counts(send.data(), recv.data(), 1);
                             }),
                   "run_ranks: rank 1 failed: it returned while other ranks waited for it");
}

// A rank that throws something that is not a std::exception is still reported.
TEST(EpCpu, NonStandardExceptionIsReported) {
  EXPECT_THROW_MSG(run_ranks(2,
                             [&](int r, ep::InProcessTransport& tr) {
                               if (r == 0) throw 42;
                               std::vector<int64_t> send(2), recv(2);
                               tr.all_to_all_counts(send.data(), recv.data(), 1);
                             }),
                   "rank 0 failed: an exception that is not a std::exception");
}

TEST(EpCpu, ValidationMessages) {
  // Every rank sees the same bad argument, so every rank fails before the first exchange.
  expect_dispatch_error(1, EpConfig{4, 1, 8, 2}, {0, 4}, 1, 1,
                        "expert_ids[0, 1]=4 must be in [0, 4)");
  // -1 names no expert (not an error); -2 is out of range
  expect_dispatch_error(1, EpConfig{4, 1, 8, 2}, {0, -2}, 1, 1, "expert_ids[0, 1]=-2");
  expect_dispatch_error(2, EpConfig{5, 2, 8, 1}, {0}, 1, 1,
                        "cfg.experts=5 must be >= 1 and divisible");
  expect_dispatch_error(2, EpConfig{4, 3, 8, 1}, {0}, 1, 1,
                        "cfg.ranks=3 must equal the transport's size 2");
  expect_dispatch_error(1, EpConfig{4, 1, 8, 2}, {0, 1}, 1, 2,
                        "ep_dispatch: x.shape[0]=2 must equal 1");
  expect_dispatch_error(1, EpConfig{4, 1, 8, 5}, {0, 1, 2, 3, 0}, 1, 1,
                        "cfg.topk=5 must be in 1..min");
  const EpConfig cfg{4, 1, 8, 2};
  std::vector<int32_t> ids = {0, 1};
  std::vector<float> f(64), w(2);
  std::vector<uint16_t> b(64);
  // Capacity plans: bounds, mode, staging dtype.
  expect_error(1, "ep_capacity_plan_create: cap.rows_per_peer=0 must be >= 1",
               [&](int, ep::InProcessTransport& tr) {
                 Context ctx(Device::CPU);
                 ep::ep_capacity_plan_create(ctx, tr, cfg, EpCapacity{0, 0}, 1, DType::bf16);
               });
  expect_error(
      1, "ep_capacity_plan: plan.mode=throughput must be capacity",
      [&](int, ep::InProcessTransport& tr) {
        Context ctx(Device::CPU);
        ep::EpPlan p = ep::ep_dispatch_plan(ctx, tr, cfg, host_view(ids, DType::int32, {1, 2}));
        ep::ep_capacity_plan(ctx, tr, host_view(ids, DType::int32, {1, 2}), p);
      });
  expect_error(
      1,
      "ep_dispatch: x.dtype=fp32 needs 32 bytes a row but the capacity plan was made "
      "for 16",
      [&](int, ep::InProcessTransport& tr) {
        Context ctx(Device::CPU);
        ep::EpPlan p = ep::ep_capacity_plan_create(ctx, tr, cfg, EpCapacity{1, 0}, 1, DType::bf16);
        ep::ep_capacity_plan(ctx, tr, host_view(ids, DType::int32, {1, 2}), p);
        ep::ep_dispatch(ctx, tr, p, host_view(f, DType::fp32, {1, 8}),
                        host_view(f, DType::fp32, {p.rows, 8}));
      });
  // Backward shapes, dtypes and aliasing.
  expect_error(
      1, "ep_combine_backward: d_weights.shape[1]=1 must equal 2",
      [&](int, ep::InProcessTransport& tr) {
        Context ctx(Device::CPU);
        ep::EpPlan p = ep::ep_dispatch_plan(ctx, tr, cfg, host_view(ids, DType::int32, {1, 2}));
        std::vector<float> yg(16), dyg(16);
        ep::ep_combine_backward(
            ctx, tr, p, host_view(f, DType::fp32, {1, 8}), host_view(w, DType::fp32, {1, 2}),
            host_view(yg, DType::fp32, {2, 8}), host_view(dyg, DType::fp32, {2, 8}),
            host_view(w, DType::fp32, {1, 1}));
      });
  expect_error(
      1, "ep_dispatch_backward: dx.dtype=fp32 must be bf16", [&](int, ep::InProcessTransport& tr) {
        Context ctx(Device::CPU);
        ep::EpPlan p = ep::ep_dispatch_plan(ctx, tr, cfg, host_view(ids, DType::int32, {1, 2}));
        ep::ep_dispatch_backward(ctx, tr, p, host_view(b, DType::bf16, {2, 8}),
                                 host_view(f, DType::fp32, {1, 8}));
      });
  expect_error(
      1,
      "ep_dispatch: weights and probs must be given together (weights given, probs "
      "absent)",
      [&](int, ep::InProcessTransport& tr) {
        Context ctx(Device::CPU);
        ep::EpPlan p = ep::ep_dispatch_plan(ctx, tr, cfg, host_view(ids, DType::int32, {1, 2}));
        ep::ep_dispatch(ctx, tr, p, host_view(f, DType::fp32, {1, 8}),
                        host_view(f, DType::fp32, {2, 8}), host_view(w, DType::fp32, {1, 2}));
      });
  expect_error(
      1, "ep_dispatch_backward: d_probs.shape[0]=1 must equal 2",
      [&](int, ep::InProcessTransport& tr) {
        Context ctx(Device::CPU);
        ep::EpPlan p = ep::ep_dispatch_plan(ctx, tr, cfg, host_view(ids, DType::int32, {1, 2}));
        std::vector<float> dxg(16), dx(8), dp(1), dw(2);
        ep::ep_dispatch_backward(
            ctx, tr, p, host_view(dxg, DType::fp32, {2, 8}), host_view(dx, DType::fp32, {1, 8}),
            host_view(dp, DType::fp32, {1}), host_view(dw, DType::fp32, {1, 2}));
      });
  expect_error(1, "ep_combine: out may not alias y_grouped", [&](int, ep::InProcessTransport& tr) {
    Context ctx(Device::CPU);
    ep::EpPlan p = ep::ep_dispatch_plan(ctx, tr, cfg, host_view(ids, DType::int32, {1, 2}));
    ep::ep_combine(ctx, tr, p, host_view(f, DType::fp32, {2, 8}), host_view(w, DType::fp32, {1, 2}),
                   host_view(f, DType::fp32, {1, 8}));
  });
}

}  // namespace
}  // namespace groupmm::test
