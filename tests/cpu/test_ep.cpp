// Expert-parallel dispatch / combine on the CPU backend over the in-process transport: R simulated
// ranks as threads, checked against a one-rank reference over all tokens (the global token order is
// rank 0's tokens, then rank 1's, ...): the dispatched expert-grouped rows, the bytes each rank
// sends (a row crosses to a rank once), a whole layer bit for bit, and the validation messages.
#include <cstring>
#include <exception>
#include <thread>

#include "common/test_util.hpp"
#include "groupmm/convert.hpp"
#include "groupmm/ep.hpp"

namespace groupmm::test {
namespace {

using ep::EpConfig;

// Bit-for-bit equality of two float vectors (memcmp is not called on the empty ones: their data()
// may be null).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Runs fn(rank, transport) on R threads; rethrows the first rank's exception, if any.
template <class Fn>
void run_ranks(int R, Fn fn) {
  auto group = ep::make_in_process_group(R);
  std::vector<std::exception_ptr> errs(static_cast<size_t>(R));
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r, *group[size_t(r)]);
      } catch (...) {
        errs[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

// One rank's inputs: tokens [T, H] fp32 (also as bf16 bits), routing [T, k].
struct RankData {
  int64_t T = 0;
  std::vector<float> x;
  std::vector<uint16_t> x_bf16;
  std::vector<int32_t> ids;
  std::vector<float> w;
};

// Random routing with the corner cases: tokens whose k experts all live on one rank, the last
// expert never chosen (zero rows), and (R >= 2) the last rank's experts never chosen (it receives
// nothing). Token counts differ per rank (rank 0 may have none).
std::vector<RankData> make_case(const EpConfig& cfg, std::mt19937_64& g) {
  const int64_t R = cfg.ranks, E = cfg.experts, k = cfg.topk, H = cfg.hidden, El = E / R;
  const int64_t usable = R >= 2 ? E - El : E - 1;  // experts [0, usable) may be chosen
  std::vector<RankData> d(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    RankData& rd = d[size_t(r)];
    rd.T = r == 0 && R > 1 ? 0 : int64_t(g() % 9) + 1 + 3 * r;
    rd.x = randn(size_t(rd.T * H), 1.0f, g);
    for (float v : rd.x) rd.x_bf16.push_back(float_to_bf16_bits(v));
    rd.w = randn(size_t(rd.T * k), 1.0f, g);
    for (int64_t t = 0; t < rd.T; ++t) {
      const bool one_rank = t % 3 == 0 && El >= k;  // all k experts on one rank
      const int64_t base = (int64_t(g() % uint64_t(std::max<int64_t>(usable / El, 1)))) * El;
      for (int64_t j = 0; j < k; ++j) {
        int64_t e = one_rank ? base + (j + int64_t(g() % 2)) % El : int64_t(g() % uint64_t(usable));
        rd.ids.push_back(int32_t(std::min(e, usable - 1)));
      }
    }
  }
  return d;
}

// The one-rank reference permutation: for each expert, its (token, slot) entries in global
// (token, slot) order; entry = (rank, token).
std::vector<std::vector<std::pair<int64_t, int64_t>>> reference_groups(
    const EpConfig& cfg, const std::vector<RankData>& d) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> groups(static_cast<size_t>(cfg.experts));
  for (int64_t r = 0; r < cfg.ranks; ++r)
    for (int64_t t = 0; t < d[size_t(r)].T; ++t)
      for (int64_t j = 0; j < cfg.topk; ++j)
        groups[size_t(d[size_t(r)].ids[size_t(t * cfg.topk + j)])].push_back({r, t});
  return groups;
}

float expert_scale(int64_t e) {
  return 0.5f + 0.25f * float(e);
}

struct Result {
  std::vector<std::vector<float>> x_grouped, out;
  std::vector<std::vector<int64_t>> splits, sent_bytes;
};

// dispatch -> y = x * s_e on the expert rank (rounded to the row dtype) -> combine.
Result run_layer(const EpConfig& cfg, const std::vector<RankData>& d, DType dt) {
  const int R = int(cfg.ranks);
  const int64_t H = cfg.hidden, El = cfg.experts / cfg.ranks;
  Result res;
  res.x_grouped.resize(size_t(R));
  res.out.resize(size_t(R));
  res.splits.resize(size_t(R));
  res.sent_bytes.resize(size_t(R));
  run_ranks(R, [&](int r, ep::InProcessTransport& tr) {
    Context ctx(Device::CPU);
    RankData rd = d[size_t(r)];
    const TensorView ids = host_view(rd.ids, DType::int32, {rd.T, cfg.topk});
    const TensorView x =
        dt == DType::fp32 ? host_view(rd.x, dt, {rd.T, H}) : host_view(rd.x_bf16, dt, {rd.T, H});
    ep::EpPlan plan = ep::ep_dispatch_plan(ctx, tr, cfg, ids);
    Tensor xg = Tensor::empty({plan.rows, H}, dt, Device::CPU);
    ep::ep_dispatch(ctx, tr, plan, x, xg);
    res.sent_bytes[size_t(r)] = tr.last_sent_bytes();
    res.x_grouped[size_t(r)] = floats_of(xg);
    res.splits[size_t(r)] = plan.splits_host;
    Tensor yg = Tensor::empty({plan.rows, H}, dt, Device::CPU);
    for (int64_t le = 0, row = 0; le < El; ++le)
      for (int64_t i = 0; i < plan.splits_host[size_t(le)]; ++i, ++row)
        for (int64_t h = 0; h < H; ++h) {
          const float v = cpu::load_f(xg, row * H + h) * expert_scale(r * El + le);
          cpu::store_f(yg, row * H + h, v);
        }
    Tensor out = Tensor::empty({rd.T, H}, dt, Device::CPU);
    ep::ep_combine(ctx, tr, plan, yg, host_view(rd.w, DType::fp32, {rd.T, cfg.topk}), out);
    res.out[size_t(r)] = floats_of(out);
  });
  return res;
}

// Rounds to dt and back (the reference's storage rounding).
float round_to(DType dt, float v) {
  return dt == DType::fp32 ? v : bf16_bits_to_float(float_to_bf16_bits(v));
}

void check_case(const EpConfig& cfg, uint64_t seed, DType dt) {
  SCOPED_TRACE(cfg.to_string() + " seed " + std::to_string(seed) + " " + dtype_name(dt));
  std::mt19937_64 g(seed);
  const std::vector<RankData> d = make_case(cfg, g);
  const Result res = run_layer(cfg, d, dt);
  const int64_t R = cfg.ranks, H = cfg.hidden, k = cfg.topk, El = cfg.experts / R;
  const auto groups = reference_groups(cfg, d);
  const auto row = [&](int64_t r, int64_t t) {
    std::vector<float> v(static_cast<size_t>(H));
    for (int64_t h = 0; h < H; ++h) v[size_t(h)] = round_to(dt, d[size_t(r)].x[size_t(t * H + h)]);
    return v;
  };
  for (int64_t q = 0; q < R; ++q) {
    // (b) the dispatched rows and splits are the reference permutation's slice for q's experts.
    std::vector<float> want;
    std::vector<int64_t> want_splits;
    for (int64_t e = q * El; e < (q + 1) * El; ++e) {
      want_splits.push_back(int64_t(groups[size_t(e)].size()));
      for (auto [r, t] : groups[size_t(e)]) {
        const auto v = row(r, t);
        want.insert(want.end(), v.begin(), v.end());
      }
    }
    EXPECT_EQ(res.splits[size_t(q)], want_splits) << "rank " << q;
    EXPECT_EQ(res.x_grouped[size_t(q)], want) << "rank " << q;
    // (a) rank r sends q each token with an expert on q exactly once.
    for (int64_t r = 0; r < R; ++r) {
      int64_t rows = 0;
      for (int64_t t = 0; t < d[size_t(r)].T; ++t) {
        bool needed = false;
        for (int64_t j = 0; j < k; ++j) needed |= d[size_t(r)].ids[size_t(t * k + j)] / El == q;
        rows += needed;
      }
      EXPECT_EQ(res.sent_bytes[size_t(r)][size_t(q)], rows * dtype_storage_bytes(dt, H))
          << "rank " << r << " -> " << q;
    }
  }
  // (c) the layer: out[t] = sum_j w[t, j] * round(x[t] * s_e) in fp32, slot order, rounded once.
  for (int64_t r = 0; r < R; ++r) {
    const RankData& rd = d[size_t(r)];
    std::vector<float> want(size_t(rd.T * H));
    for (int64_t t = 0; t < rd.T; ++t) {
      const auto xv = row(r, t);
      for (int64_t h = 0; h < H; ++h) {
        float acc = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          const float y = round_to(dt, xv[size_t(h)] * expert_scale(rd.ids[size_t(t * k + j)]));
          const float v = rd.w[size_t(t * k + j)] * y;
          acc += v;
        }
        want[size_t(t * H + h)] = round_to(dt, acc);
      }
    }
    // Bit-exact: compare the bit patterns (NaN-free data, but -0.0 vs 0.0 would count too).
    ASSERT_EQ(res.out[size_t(r)].size(), want.size());
    EXPECT_TRUE(same_bits(res.out[size_t(r)], want)) << "rank " << r;
  }
}

TEST(EpCpu, DispatchCombineMatchesOneRankReference) {
  for (int R : {1, 2, 4})
    for (int64_t k : {1, 2, 4})
      for (uint64_t seed : {1u, 2u, 3u}) {
        const EpConfig cfg{8, R, 24, k};
        check_case(cfg, seed_for("ep") + seed * 131 + uint64_t(R * 7 + k), DType::fp32);
      }
}

TEST(EpCpu, Bf16RowsMovedAsBytes) {
  for (int R : {1, 2, 4}) check_case(EpConfig{16, R, 40, 3}, seed_for("ep_bf16") + R, DType::bf16);
}

TEST(EpCpu, IdenticalForAnyRankCount) {
  // The same global tokens split over 1 or 4 ranks give the same output bits (the combine's fixed
  // order does not depend on R).
  std::mt19937_64 g(seed_for("ep_any_r"));
  const EpConfig c4{8, 4, 16, 2};
  const std::vector<RankData> d4 = make_case(c4, g);
  RankData all;
  for (const RankData& rd : d4) {
    all.T += rd.T;
    all.x.insert(all.x.end(), rd.x.begin(), rd.x.end());
    all.x_bf16.insert(all.x_bf16.end(), rd.x_bf16.begin(), rd.x_bf16.end());
    all.ids.insert(all.ids.end(), rd.ids.begin(), rd.ids.end());
    all.w.insert(all.w.end(), rd.w.begin(), rd.w.end());
  }
  const Result r4 = run_layer(c4, d4, DType::fp32);
  const Result r1 = run_layer(EpConfig{8, 1, 16, 2}, {all}, DType::fp32);
  std::vector<float> cat;
  for (const auto& o : r4.out) cat.insert(cat.end(), o.begin(), o.end());
  EXPECT_TRUE(same_bits(cat, r1.out[0]));
}

void expect_error(int R, const EpConfig& cfg, std::vector<int32_t> ids, int64_t T, int64_t x_rows,
                  const std::string& what) {
  try {
    run_ranks(R, [&](int, ep::InProcessTransport& tr) {
      Context ctx(Device::CPU);
      std::vector<int32_t> my_ids = ids;
      ep::EpPlan plan =
          ep::ep_dispatch_plan(ctx, tr, cfg, host_view(my_ids, DType::int32, {T, cfg.topk}));
      std::vector<float> x(size_t(x_rows * cfg.hidden)), xg(size_t(plan.rows * cfg.hidden) + 1);
      ep::ep_dispatch(ctx, tr, plan, host_view(x, DType::fp32, {x_rows, cfg.hidden}),
                      host_view(xg, DType::fp32, {plan.rows, cfg.hidden}));
    });
    ADD_FAILURE() << "no error; expected " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(EpCpu, ValidationMessages) {
  // Every rank sees the same bad argument, so every rank fails before the first exchange.
  expect_error(1, EpConfig{4, 1, 8, 2}, {0, 4}, 1, 1, "expert_ids[0, 1]=4 must be in [0, 4)");
  expect_error(1, EpConfig{4, 1, 8, 2}, {0, -1}, 1, 1, "expert_ids[0, 1]=-1");
  expect_error(2, EpConfig{5, 2, 8, 1}, {0}, 1, 1, "cfg.experts=5 must be >= 1 and divisible");
  expect_error(2, EpConfig{4, 3, 8, 1}, {0}, 1, 1, "cfg.ranks=3 must equal the transport's size 2");
  expect_error(1, EpConfig{4, 1, 8, 2}, {0, 1}, 1, 2, "ep_dispatch: x.shape[0]=2 must equal 1");
  expect_error(1, EpConfig{4, 1, 8, 5}, {0, 1, 2, 3, 0}, 1, 1, "cfg.topk=5 must be in 1..min");
}

}  // namespace
}  // namespace groupmm::test
