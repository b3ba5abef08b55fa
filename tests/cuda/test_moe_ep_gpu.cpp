// nn::MoE with expert parallelism on the CUDA backend: R = 2 and 4 ranks as threads sharing one
// GPU (the device in-process group), throughput and capacity mode, bf16 with fp32 main grads,
// against the one-rank block on the same GPU over the global tokens. The dispatch, the combine and
// their backwards are bit-exact (EpGpu); the grouped GEMMs may pick another kernel configuration
// for another row count and expert count, so the comparison is within a tolerance (relative error
// <= 1e-2 for y, dx and every grad; the replicated grads summed over the ranks).
#include "common/moe_ep_harness.hpp"

namespace groupmm::test {
namespace {

using namespace moe_ep;

void expect_rel(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_LE(rel_error(got, want), 1e-2) << what;
}

TEST(MoeEpGpu, MatchesOneRankBlock) {
  GROUPMM_REQUIRE_GPU();
  for (int R : {2, 4})
    for (ep::EpMode mode : {ep::EpMode::throughput, ep::EpMode::capacity}) {
      MoEConfig cfg{.hidden = 256,
                    .ffn_hidden = 128,
                    .experts = 8,
                    .topk = 2,
                    .max_tokens = 1,
                    .renormalize = true,
                    .shared_ffn_hidden = 128,
                    .bias = true,
                    .dtype = DType::bf16,
                    .delay_wgrad = true,
                    .accumulate_into_main_grad = true,
                    .seed = 5};
      Case c{cfg, R, mode, ep::EpCapacity{64, 0}, {}};
      for (int r = 0; r < R; ++r) c.tokens.push_back(24 + 8 * r);
      SCOPED_TRACE("R=" + std::to_string(R) + " " + ep::ep_mode_name(mode));
      const Result res = run_case(c, Device::CUDA, seed_for("moe_ep_gpu") + uint64_t(R));
      const int64_t H = cfg.hidden, F = cfg.ffn_hidden, El = cfg.experts / R;
      int64_t first = 0;
      for (int r = 0; r < R; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        const StepOut& o = res.rank[size_t(r)];
        const int64_t T = c.tokens[size_t(r)];
        EXPECT_EQ(o.status, 0u);
        expect_rel(o.y, rows_of(res.one.y, first, T, H), "y");
        expect_rel(o.dx, rows_of(res.one.dx, first, T, H), "dx");
        expect_rel(o.gu_w, rows_of(res.one.gu_w, r * El, El, 2 * F * H), "gate_up dW");
        expect_rel(o.gu_b, rows_of(res.one.gu_b, r * El, El, 2 * F), "gate_up db");
        expect_rel(o.down_w, rows_of(res.one.down_w, r * El, El, H * F), "down dW");
        expect_rel(o.down_b, rows_of(res.one.down_b, r * El, El, H), "down db");
        first += T;
      }
      expect_rel(rank_sum(res.rank, &StepOut::wr_grad), res.one.wr_grad, "router dW");
      expect_rel(rank_sum(res.rank, &StepOut::sgu_w), res.one.sgu_w, "shared gate_up dW");
      expect_rel(rank_sum(res.rank, &StepOut::sdown_w), res.one.sdown_w, "shared down dW");
    }
}

}  // namespace
}  // namespace groupmm::test
