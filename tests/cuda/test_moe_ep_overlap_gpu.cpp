// nn::MoE's chunked expert-parallel step (ep.chunks) on the CUDA backend over the in-process
// device group: R = 2 ranks as threads sharing one GPU (the group orders every copy on one stream,
// so the chunks run in order there: concurrent_streams() is false), throughput and capacity mode,
// bf16 with fp32 main grads and delayed wgrad, and the mxfp8 recipe. Bit for bit against the same
// ranks with chunks = 1: each expert's rows and their order are the unchunked ones, so every
// kernel (the grouped GEMMs of each chunk's experts included) must give the same bits. The
// two-stream path (NCCL) is test_moe_ep_overlap_nccl_gpu.cpp's.
#include "common/moe_ep_harness.hpp"

namespace groupmm::test {
namespace {

using namespace moe_ep;

MoEConfig gpu_block() {
  return MoEConfig{.hidden = 256,
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
                   .seed = 7};
}

void check_against_unchunked(const MoEConfig& cfg, uint64_t seed) {
  const int R = 2;
  for (ep::EpMode mode : {ep::EpMode::throughput, ep::EpMode::capacity}) {
    Case c{cfg, R, mode, ep::EpCapacity{64, 0}, {}};
    for (int r = 0; r < R; ++r) c.tokens.push_back(24 + 8 * r);
    const Result base = run_case(c, Device::CUDA, seed);
    for (int64_t n : {2, 3}) {
      SCOPED_TRACE(std::string(ep::ep_mode_name(mode)) + " chunks=" + std::to_string(n));
      Case cc = c;
      cc.chunks = n;
      const Result res = run_case(cc, Device::CUDA, seed);
      for (int r = 0; r < R; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        EXPECT_EQ(res.rank[size_t(r)].status, 0u);
        expect_same_step(res.rank[size_t(r)], base.rank[size_t(r)]);
      }
    }
  }
}

TEST(MoeEpOverlapGpu, InProcessChunksMatchUnchunkedBf16) {
  GROUPMM_REQUIRE_GPU();
  check_against_unchunked(gpu_block(), seed_for("moe_ep_overlap_gpu"));
}

TEST(MoeEpOverlapGpu, InProcessChunksMatchUnchunkedMxfp8) {
  GROUPMM_REQUIRE_GPU();
  MoEConfig cfg = gpu_block();
  cfg.bias = false;
  cfg.recipe = nn::quantized_recipe(QuantRecipe::mxfp8);
  check_against_unchunked(cfg, seed_for("moe_ep_overlap_gpu_mxfp8"));
}

}  // namespace
}  // namespace groupmm::test
