// nn::MoE with expert parallelism on the CPU backend: R = 2 and 4 simulated ranks (threads over
// the in-process transport), throughput and capacity mode, against the one-rank block on the
// global tokens. Bit for bit: y, dx and every local expert weight and bias grad (the experts see
// their rows in the one-rank order). Within a tight tolerance: the replicated parameters' grads
// (router weight, shared expert), summed over the ranks (relative error <= 1e-5 in fp32; each
// rank sums only its tokens, so the fp32 order differs). fp32 and bf16 (fp32 main grads, delayed
// wgrad) blocks; capacity overflow reported; the configuration checks.
#include <algorithm>
#include <cmath>

#include "common/moe_ep_harness.hpp"

namespace groupmm::test {
namespace {

using namespace moe_ep;

MoEConfig block(DType t) {
  return MoEConfig{.hidden = 16,
                   .ffn_hidden = 8,
                   .experts = 8,
                   .topk = 3,
                   .max_tokens = 1,
                   .renormalize = true,
                   .scaling_factor = 1.25f,
                   .shared_ffn_hidden = 6,
                   .bias = true,
                   .dtype = t,
                   .seed = 11};
}

void expect_rel(const std::vector<float>& got, const std::vector<float>& want, double tol,
                const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_LE(rel_error(got, want), tol) << what;
}

void check(const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.cfg.to_string() + " R=" + std::to_string(c.ranks) + " " +
               ep::ep_mode_name(c.mode));
  const Result res = run_case(c, Device::CPU, seed);
  const int64_t H = c.cfg.hidden, F = c.cfg.ffn_hidden, El = c.cfg.experts / c.ranks;
  int64_t first_token = 0;
  for (int r = 0; r < c.ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const StepOut& o = res.rank[size_t(r)];
    const int64_t T = c.tokens[size_t(r)];
    EXPECT_EQ(o.status, 0u);
    EXPECT_TRUE(ep_harness::same_bits(o.y, rows_of(res.one.y, first_token, T, H))) << "y";
    EXPECT_TRUE(ep_harness::same_bits(o.dx, rows_of(res.one.dx, first_token, T, H))) << "dx";
    EXPECT_TRUE(
        ep_harness::same_bits(o.weights, rows_of(res.one.weights, first_token, T, c.cfg.topk)));
    const int64_t e0 = r * El;
    EXPECT_TRUE(ep_harness::same_bits(o.gu_w, rows_of(res.one.gu_w, e0, El, 2 * F * H)))
        << "gate_up dW";
    EXPECT_TRUE(ep_harness::same_bits(o.gu_b, rows_of(res.one.gu_b, e0, El, 2 * F)))
        << "gate_up db";
    EXPECT_TRUE(ep_harness::same_bits(o.down_w, rows_of(res.one.down_w, e0, El, H * F)))
        << "down dW";
    EXPECT_TRUE(ep_harness::same_bits(o.down_b, rows_of(res.one.down_b, e0, El, H))) << "down db";
    first_token += T;
  }
  const double tol = 1e-5;
  expect_rel(rank_sum(res.rank, &StepOut::wr_grad), res.one.wr_grad, tol, "router dW");
  expect_rel(rank_sum(res.rank, &StepOut::sgu_w), res.one.sgu_w, tol, "shared gate_up dW");
  expect_rel(rank_sum(res.rank, &StepOut::sgu_b), res.one.sgu_b, tol, "shared gate_up db");
  expect_rel(rank_sum(res.rank, &StepOut::sdown_w), res.one.sdown_w, tol, "shared down dW");
  expect_rel(rank_sum(res.rank, &StepOut::sdown_b), res.one.sdown_b, tol, "shared down db");
}

TEST(MoeEpCpu, Fp32BlockMatchesOneRank) {
  for (int R : {2, 4})
    for (ep::EpMode mode : {ep::EpMode::throughput, ep::EpMode::capacity}) {
      Case c{block(DType::fp32), R, mode, ep::EpCapacity{}, {}};
      for (int r = 0; r < R; ++r) c.tokens.push_back(r == 1 ? 0 : 5 + 3 * r);  // one empty rank
      int64_t tmax = 0;
      for (int64_t t : c.tokens) tmax = std::max(tmax, t);
      c.cap = ep::EpCapacity{tmax, 0};  // never overflows
      check(c, seed_for("moe_ep") + uint64_t(R * 3 + int(mode)));
    }
}

TEST(MoeEpCpu, Bf16MainGradDelayedWgradMatchesOneRank) {
  for (int R : {2, 4})
    for (ep::EpMode mode : {ep::EpMode::throughput, ep::EpMode::capacity}) {
      MoEConfig cfg = block(DType::bf16);
      cfg.delay_wgrad = true;
      cfg.accumulate_into_main_grad = true;
      cfg.score = RouterScore::sigmoid;
      Case c{cfg, R, mode, ep::EpCapacity{12, 0}, {}};
      for (int r = 0; r < R; ++r) c.tokens.push_back(4 + 2 * r);
      check(c, seed_for("moe_ep_bf16") + uint64_t(R * 3 + int(mode)));
    }
}

// The 4-bit weight recipes (serving: forward only) over ranks: y bit for bit the one-rank block's
// in both modes; in capacity mode the expert layers run at-most splits over the budget (a sum
// short of the buffer's rows is no fault).
TEST(MoeEpCpu, W4RecipesForwardMatchesOneRank) {
  for (auto recipe : {nn::nvfp4_weight_recipe(), nn::mxfp4_weight_recipe()})
    for (ep::EpMode mode : {ep::EpMode::throughput, ep::EpMode::capacity}) {
      MoEConfig cfg = block(DType::bf16);
      cfg.hidden = 64;
      cfg.ffn_hidden = 32;
      cfg.shared_ffn_hidden = 32;
      cfg.recipe = recipe;
      const int R = 2;
      Case c{cfg, R, mode, ep::EpCapacity{12, 0}, {5, 8}};
      c.forward_only = true;
      SCOPED_TRACE(recipe->name() + " " + ep::ep_mode_name(mode));
      const Result res = run_case(c, Device::CPU, seed_for("moe_ep_w4") + uint64_t(int(mode)));
      EXPECT_EQ(res.one.status, 0u);
      int64_t first_token = 0;
      for (int r = 0; r < R; ++r) {
        const StepOut& o = res.rank[size_t(r)];
        const int64_t T = c.tokens[size_t(r)];
        EXPECT_EQ(o.status, 0u) << "rank " << r;
        EXPECT_TRUE(ep_harness::same_bits(o.y, rows_of(res.one.y, first_token, T, cfg.hidden)))
            << "rank " << r << " y";
        first_token += T;
      }
    }
}

TEST(MoeEpCpu, CapacityOverflowIsReportedAndFinite) {
  // One row a peer: every rank with tokens overflows; the step still completes (dropped slots
  // contribute nothing) and reports kFaultEpCapacity.
  for (int R : {2, 4}) {
    Case c{block(DType::fp32), R, ep::EpMode::capacity, ep::EpCapacity{1, 0}, {}};
    for (int r = 0; r < R; ++r) c.tokens.push_back(6);
    const Result res = run_case(c, Device::CPU, seed_for("moe_ep_over") + uint64_t(R));
    for (int r = 0; r < R; ++r) {
      SCOPED_TRACE("R=" + std::to_string(R) + " rank " + std::to_string(r));
      EXPECT_EQ(res.rank[size_t(r)].status, uint32_t(kFaultEpCapacity));
      for (const auto* v : {&res.rank[size_t(r)].y, &res.rank[size_t(r)].dx})
        EXPECT_TRUE(std::all_of(v->begin(), v->end(), [](float f) { return std::isfinite(f); }));
    }
  }
}

TEST(MoeEpCpu, ConfigurationChecks) {
  run_ranks(2, [&](int, ep::InProcessTransport& tr) {
    Context ctx(Device::CPU);
    MoEConfig c = block(DType::fp32);
    c.max_tokens = 4;
    c.ep.transport = &tr;
    MoEConfig bad = c;
    bad.experts = 7;
    bad.topk = 2;
    EXPECT_THROW_MSG(MoE(ctx, bad),
                     "MoE: experts=7 must be divisible by the expert-parallel world size 2");
    bad = c;
    bad.capacity_factor = 1.5;
    EXPECT_THROW_MSG(MoE(ctx, bad), "MoE: capacity_factor=1.5 must be 0 with expert parallelism");
    bad = c;
    bad.pad_align = 16;
    EXPECT_THROW_MSG(MoE(ctx, bad), "MoE: pad_align=16 must be 1 with expert parallelism");
    bad = c;
    bad.ep.mode = ep::EpMode::capacity;
    EXPECT_THROW_MSG(MoE(ctx, bad), "needs rows_per_peer >= 1");
    MoE m(ctx, c);
    EXPECT_EQ(m.ranks(), 2);
    EXPECT_EQ(m.local_experts(), 4);
    EXPECT_EQ(m.gate_up().weight().dim(0), 4);
    EXPECT_EQ(m.first_expert(), 4 * tr.rank());
  });
}

}  // namespace
}  // namespace groupmm::test
