// The throughput plan built by kernels (ep_dispatch_plan on a CUDA Context) against the host code
// (ep::detail::ep_dispatch_plan_host, the CPU backend's plan) on the same routing and the same
// device group (R ranks as threads sharing one GPU): every count and every index array bit for
// bit, over the harness's corner cases (a rank with no tokens, a rank that receives nothing, a
// token naming one expert twice, every token on one expert, T = 0 everywhere), int32 and int64
// ids, many tokens (several chunks of the ranking), and the largest local expert count the
// rankings hold (and each plan's entry_grouped, grouped_entry inverted); then whole EP steps on
// either plan, bit for bit; and the bad-id message.
#include "common/ep_harness.hpp"

namespace groupmm::test {
namespace {

using namespace ep_harness;

// A plan's contents on the host: its counts and each index array cut to the length it uses (an
// empty array is allocated with one element, which holds nothing).
struct PlanDump {
  int64_t rows = 0, tokens = 0, local_experts = 0;
  int64_t send_total = 0, recv_total = 0, back_send_total = 0, back_recv_total = 0;
  std::vector<int64_t> splits_host, send_rows, send_offsets, recv_rows, recv_offsets;
  std::vector<int64_t> back_send, back_send_offsets, back_recv, back_recv_offsets;
  std::vector<int32_t> splits, send_token, grouped_entry, back_grouped, slot_entry;
  std::vector<int32_t> entry_grouped;  // [recv_total * k]
  uint32_t status = 0;
};

std::vector<int32_t> used(const Tensor& t, int64_t n) {
  std::vector<int32_t> v = ints_of(t.view());
  EXPECT_GE(int64_t(v.size()), n);
  v.resize(size_t(n));
  return v;
}

PlanDump dump(const ep::EpPlan& p) {
  PlanDump d;
  d.rows = p.rows;
  d.tokens = p.tokens;
  d.local_experts = p.local_experts;
  d.send_total = p.send_total;
  d.recv_total = p.recv_total;
  d.back_send_total = p.back_send_total;
  d.back_recv_total = p.back_recv_total;
  d.splits_host = p.splits_host;
  d.send_rows = p.send_rows;
  d.send_offsets = p.send_offsets;
  d.recv_rows = p.recv_rows;
  d.recv_offsets = p.recv_offsets;
  d.back_send = p.back_send;
  d.back_send_offsets = p.back_send_offsets;
  d.back_recv = p.back_recv;
  d.back_recv_offsets = p.back_recv_offsets;
  d.splits = used(p.splits, p.local_experts);
  d.send_token = used(p.send_token, p.send_total);
  d.grouped_entry = used(p.grouped_entry, p.rows);
  d.back_grouped = used(p.back_grouped, p.back_send_total);
  d.slot_entry = used(p.slot_entry, p.tokens * p.cfg.topk);
  d.entry_grouped = used(p.entry_grouped, p.recv_total * p.cfg.topk);
  // entry_grouped is grouped_entry inverted (the device kernel's result, checked on the host):
  // each grouped row's entry maps back to it, and every other slot is -1.
  std::vector<int32_t> inverse(d.entry_grouped.size(), -1);
  for (int64_t g = 0; g < p.rows; ++g)
    if (d.grouped_entry[size_t(g)] >= 0) inverse[size_t(d.grouped_entry[size_t(g)])] = int32_t(g);
  EXPECT_EQ(d.entry_grouped, inverse) << "entry_grouped is not grouped_entry inverted";
  return d;
}

void expect_same_plans(const PlanDump& got, const PlanDump& want) {
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.local_experts, want.local_experts);
  EXPECT_EQ(got.send_total, want.send_total);
  EXPECT_EQ(got.recv_total, want.recv_total);
  EXPECT_EQ(got.back_send_total, want.back_send_total);
  EXPECT_EQ(got.back_recv_total, want.back_recv_total);
  EXPECT_EQ(got.splits_host, want.splits_host);
  EXPECT_EQ(got.send_rows, want.send_rows);
  EXPECT_EQ(got.send_offsets, want.send_offsets);
  EXPECT_EQ(got.recv_rows, want.recv_rows);
  EXPECT_EQ(got.recv_offsets, want.recv_offsets);
  EXPECT_EQ(got.back_send, want.back_send);
  EXPECT_EQ(got.back_send_offsets, want.back_send_offsets);
  EXPECT_EQ(got.back_recv, want.back_recv);
  EXPECT_EQ(got.back_recv_offsets, want.back_recv_offsets);
  EXPECT_EQ(got.splits, want.splits);
  EXPECT_EQ(got.send_token, want.send_token);
  EXPECT_EQ(got.grouped_entry, want.grouped_entry);
  EXPECT_EQ(got.back_grouped, want.back_grouped);
  EXPECT_EQ(got.slot_entry, want.slot_entry);
  EXPECT_EQ(got.entry_grouped, want.entry_grouped);
  EXPECT_EQ(got.status, 0u);
  EXPECT_EQ(want.status, 0u);
}

// expert_ids [T, k] of id_dtype (int32 or int64) on the device.
Tensor device_ids(const std::vector<int32_t>& ids, int64_t T, int64_t k, DType id_dtype,
                  cudaStream_t s) {
  if (id_dtype == DType::int32) return upload_ids(ids, {T, k}, Device::CUDA, s);
  std::vector<int64_t> wide(ids.begin(), ids.end());
  Tensor t = Tensor::empty({T, k}, DType::int64, Device::CUDA, s);
  if (!wide.empty()) copy(t, TensorView(wide.data(), DType::int64, Device::CPU, {T, k}), s);
  GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
  return t;
}

// Both plans of every rank, built one after the other on the same device group (the device plan
// first).
std::vector<std::pair<PlanDump, PlanDump>> both_plans(const EpConfig& cfg,
                                                      const std::vector<RankData>& d,
                                                      DType id_dtype) {
  const int R = int(cfg.ranks);
  std::vector<std::pair<PlanDump, PlanDump>> res(static_cast<size_t>(R));
  const GroupStream gs(Device::CUDA);
  run_ranks(
      R,
      [&](int r, ep::InProcessTransport& tr) {
        Context ctx(Device::CUDA, gs.s);
        const RankData& rd = d[size_t(r)];
        const Tensor ids = device_ids(rd.ids, rd.T, cfg.topk, id_dtype, gs.s);
        const ep::EpPlan plan = ep::ep_dispatch_plan(ctx, tr, cfg, ids);
        // The host time outside the wait is measured (a plan always launches and enqueues).
        EXPECT_GT(plan.host_us, 0.0);
        PlanDump dev = dump(plan);
        dev.status = ctx.take_status().bits;
        PlanDump host = dump(ep::detail::ep_dispatch_plan_host(ctx, tr, cfg, ids));
        host.status = ctx.take_status().bits;
        res[size_t(r)] = {std::move(dev), std::move(host)};
      },
      Device::CUDA, gs.s);
  return res;
}

struct PlanCase {
  EpConfig cfg;
  Routing routing = Routing::mixed;
  int64_t max_tokens = 9;
  DType id_dtype = DType::int32;
};

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> cases;
  for (int R : {1, 2, 4}) {
    cases.push_back({EpConfig{8, R, 16, 2}});
    cases.push_back({EpConfig{8, R, 16, 1}});
    cases.push_back({EpConfig{8, R, 16, 3}, Routing::mixed, 9, DType::int64});
    cases.push_back({EpConfig{16, R, 16, 4}});
    cases.push_back({EpConfig{16, R, 16, 8}, Routing::mixed, 40});
    cases.push_back({EpConfig{8, R, 16, 2}, Routing::one_expert});
    cases.push_back({EpConfig{16, R, 16, 4}, Routing::one_expert, 70, DType::int64});
  }
  // Many tokens: several 64-token chunks and several CTAs of every ranking, and Qwen3's E and k.
  cases.push_back({EpConfig{64, 4, 16, 8}, Routing::mixed, 600});
  cases.push_back({EpConfig{128, 1, 16, 8}, Routing::mixed, 3000});
  cases.push_back({EpConfig{128, 2, 16, 8}, Routing::mixed, 3000});
  cases.push_back({EpConfig{128, 8, 16, 8}, Routing::mixed, 400});
  // The most local experts the device rankings hold (E / R + 3 = 1024 groups), and one past it
  // (the host code builds that plan on CUDA too).
  cases.push_back({EpConfig{1021, 1, 16, 3}, Routing::mixed, 200});
  cases.push_back({EpConfig{2048, 2, 16, 2}, Routing::mixed, 50});
  return cases;
}

TEST(EpPlanGpu, DevicePlanEqualsHostPlan) {
  GROUPMM_REQUIRE_GPU();
  for (const PlanCase& c : plan_cases()) {
    SCOPED_TRACE(c.cfg.to_string() + (c.routing == Routing::one_expert ? " one_expert" : " mixed") +
                 " T<=" + std::to_string(c.max_tokens + 3 * c.cfg.ranks) + " ids " +
                 dtype_name(c.id_dtype));
    std::mt19937_64 g(seed_for("ep_plan_gpu") + uint64_t(c.cfg.ranks * 131 + c.cfg.experts) +
                      uint64_t(c.cfg.topk * 7 + c.max_tokens));
    const std::vector<RankData> d = make_case(c.cfg, DType::fp32, c.routing, g, c.max_tokens);
    const auto plans = both_plans(c.cfg, d, c.id_dtype);
    for (size_t r = 0; r < plans.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      expect_same_plans(plans[r].first, plans[r].second);
    }
  }
}

TEST(EpPlanGpu, NoTokensAnywhere) {
  GROUPMM_REQUIRE_GPU();
  for (int R : {1, 2, 4}) {
    SCOPED_TRACE("R=" + std::to_string(R));
    const EpConfig cfg{8, R, 16, 2};
    const std::vector<RankData> d(static_cast<size_t>(R));  // T = 0 on every rank
    const auto plans = both_plans(cfg, d, DType::int32);
    for (size_t r = 0; r < plans.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      expect_same_plans(plans[r].first, plans[r].second);
      EXPECT_EQ(plans[r].first.rows, 0);
      EXPECT_EQ(plans[r].first.splits, std::vector<int32_t>(size_t(cfg.experts / R), 0));
    }
    // ... and a whole step on it (every output is empty).
    RunOpts o{DType::bf16, EpMode::throughput, {}};
    RunOpts oh = o;
    oh.host_plan = true;
    expect_same_steps(run_layer(cfg, d, o, Device::CUDA), run_layer(cfg, d, oh, Device::CUDA),
                      true);
  }
}

// Whole steps (dispatch, combine, both backwards; weighted or with probs) on the device plan
// against the host plan on the same GPU, bit for bit, sent bytes included.
TEST(EpPlanGpu, StepOnDevicePlanEqualsStepOnHostPlan) {
  GROUPMM_REQUIRE_GPU();
  struct StepCase {
    EpConfig cfg;
    RunOpts o;
    Routing routing = Routing::mixed;
    int64_t max_tokens = 9;
  };
  const EpMode tp = EpMode::throughput;
  std::vector<StepCase> cases;
  for (int R : {1, 2, 4}) {
    cases.push_back({EpConfig{8, R, 24, 2}, RunOpts{DType::fp32, tp, {}}});
    cases.push_back({EpConfig{16, R, 64, 4}, RunOpts{DType::bf16, tp, {}}});
    cases.push_back({EpConfig{8, R, 13, 3}, RunOpts{DType::fp16, tp, {}}});
    cases.push_back({EpConfig{8, R, 32, 2}, RunOpts{DType::bf16, tp, {}}, Routing::one_expert});
    cases.push_back({EpConfig{16, R, 64, 4}, RunOpts{DType::bf16, tp, {}, false, true}});
  }
  cases.push_back({EpConfig{64, 4, 128, 8}, RunOpts{DType::bf16, tp, {}}, Routing::mixed, 600});
  for (const StepCase& c : cases) {
    SCOPED_TRACE(c.cfg.to_string() + " " + dtype_name(c.o.dt) + (c.o.probs ? " probs" : "") +
                 (c.routing == Routing::one_expert ? " one_expert" : ""));
    std::mt19937_64 g(seed_for("ep_plan_gpu_step") + uint64_t(c.cfg.ranks * 131 + c.cfg.hidden));
    const std::vector<RankData> d = make_case(c.cfg, c.o.dt, c.routing, g, c.max_tokens);
    RunOpts host = c.o;
    host.host_plan = true;
    expect_same_steps(run_layer(c.cfg, d, c.o, Device::CUDA),
                      run_layer(c.cfg, d, host, Device::CUDA), true);
  }
}

// An id outside [0, E) is reported as the host plan reports it (the first one in (t, j) order,
// int32 or int64), after the count exchange; every rank sees it here, so every rank fails.
TEST(EpPlanGpu, BadIdMessage) {
  GROUPMM_REQUIRE_GPU();
  struct BadCase {
    int R;
    std::vector<int32_t> ids;  // per rank, T = ids / k
    DType id_dtype;
    std::string msg;
  };
  const int64_t k = 2;
  const std::vector<BadCase> cases = {
      {1, {0, 4}, DType::int32, "ep_dispatch_plan: expert_ids[0, 1]=4 must be in [0, 4)"},
      {1, {0, 1, 2, 9, -3, 1}, DType::int64, "ep_dispatch_plan: expert_ids[1, 1]=9 must be in"},
      {2, {1, 2, -2, 0}, DType::int32, "ep_dispatch_plan: expert_ids[1, 0]=-2 must be in"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.msg);
    const EpConfig cfg{4, c.R, 8, k};
    const GroupStream gs(Device::CUDA);
    EXPECT_THROW_MSG(run_ranks(
                         c.R,
                         [&](int, ep::InProcessTransport& tr) {
                           Context ctx(Device::CUDA, gs.s);
                           const int64_t T = int64_t(c.ids.size()) / k;
                           const Tensor ids = device_ids(c.ids, T, k, c.id_dtype, gs.s);
                           ep::ep_dispatch_plan(ctx, tr, cfg, ids);
                         },
                         Device::CUDA, gs.s),
                     c.msg);
  }
  // An int64 id past int32's range is named as it is.
  const EpConfig cfg{4, 1, 8, 1};
  const GroupStream gs(Device::CUDA);
  EXPECT_THROW_MSG(run_ranks(
                       1,
                       [&](int, ep::InProcessTransport& tr) {
                         Context ctx(Device::CUDA, gs.s);
                         std::vector<int64_t> v = {1, int64_t(5) << 32};
                         Tensor ids = Tensor::empty({2, 1}, DType::int64, Device::CUDA, gs.s);
                         copy(ids, TensorView(v.data(), DType::int64, Device::CPU, {2, 1}), gs.s);
                         ep::ep_dispatch_plan(ctx, tr, cfg, ids);
                       },
                       Device::CUDA, gs.s),
                   "expert_ids[1, 0]=21474836480 must be in [0, 4)");
}

}  // namespace
}  // namespace groupmm::test
