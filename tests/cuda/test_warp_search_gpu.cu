// find_expert_warp (the warp-parallel expert lookup of the 4-bit decode kernel) against the
// one-thread find_expert, for every t of random prefix arrays with empty experts, at G around
// the powers of 32 where its rounds change.
#include "common/test_util.hpp"
#include "kernels/common/splits_scan.cuh"
#include "kernels/common/warp_search.cuh"

namespace groupmm::test {
namespace {

// One warp per t; lane 0 writes the warp's answer and the one-thread answer.
__global__ void search_all(const int64_t* prefix, int64_t G, int64_t total, int64_t* warp_g,
                           int64_t* ref_g) {
  const int64_t t = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= total) return;  // warp-uniform
  const int64_t g = cuda::find_expert_warp(prefix, G, t, lane);
  if (lane == 0) {
    warp_g[t] = g;
    ref_g[t] = cuda::find_expert(prefix, G, t);
  }
}

TEST(WarpSearchGpu, FindExpertWarpEqualsFindExpert) {
  GROUPMM_REQUIRE_GPU();
  std::mt19937_64& gen = rng();
  for (int64_t G : {1, 2, 31, 32, 33, 128, 1023, 1024, 1025, 5000}) {
    for (int round = 0; round < 3; ++round) {
      // Per-expert counts 0..3 (a third empty; round 2: only the last expert has any).
      std::vector<int64_t> prefix(size_t(G + 1), 0);
      std::uniform_int_distribution<int64_t> count(0, 3);
      for (int64_t g = 0; g < G; ++g) {
        const int64_t c = round == 2 ? (g == G - 1 ? 5 : 0) : count(gen) % 3 == 0 ? 0 : count(gen);
        prefix[size_t(g + 1)] = prefix[size_t(g)] + c;
      }
      const int64_t total = prefix[size_t(G)];
      if (total == 0) continue;
      Tensor p =
          clone_to(TensorView(prefix.data(), DType::int64, Device::CPU, {G + 1}), Device::CUDA);
      Tensor a = Tensor::empty({total}, DType::int64, Device::CUDA);
      Tensor b = Tensor::empty({total}, DType::int64, Device::CUDA);
      const int64_t threads = total * 32;
      search_all<<<unsigned((threads + 255) / 256), 256>>>(static_cast<const int64_t*>(p.data()), G,
                                                           total, static_cast<int64_t*>(a.data()),
                                                           static_cast<int64_t*>(b.data()));
      GROUPMM_CHECK_CUDA(cudaGetLastError());
      std::vector<int64_t> ha(static_cast<size_t>(total)), hb(static_cast<size_t>(total));
      copy(TensorView(ha.data(), DType::int64, Device::CPU, {total}), a);
      copy(TensorView(hb.data(), DType::int64, Device::CPU, {total}), b);
      for (int64_t t = 0; t < total; ++t) {
        ASSERT_EQ(ha[size_t(t)], hb[size_t(t)]) << "G=" << G << " round " << round << " t=" << t;
        const int64_t g = ha[size_t(t)];
        ASSERT_TRUE(prefix[size_t(g)] <= t && t < prefix[size_t(g + 1)]) << "G=" << G << " t=" << t;
      }
    }
  }
}

}  // namespace
}  // namespace groupmm::test
