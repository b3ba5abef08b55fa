// The occupancy cache of resident_grid (occupancy.cuh).
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/common/occupancy.cuh"

namespace groupmm::cuda {

int resident_ctas_per_sm(const void* kernel, int threads, size_t smem) {
  int device = 0;
  GROUPMM_CHECK_CUDA(cudaGetDevice(&device));
  // Not a stream operation (graph safe); cached because it costs about a microsecond of host time
  // and the launches that ask are the ~10 us ops of issue 20's host budget.
  static std::mutex mu;
  static auto* cache = new std::map<std::tuple<const void*, int, int, size_t>, int>;
  const auto key = std::make_tuple(kernel, device, threads, smem);
  {
    const std::lock_guard<std::mutex> lock(mu);
    const auto it = cache->find(key);
    if (it != cache->end()) return it->second;
  }
  int n = 0;
  GROUPMM_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  const std::lock_guard<std::mutex> lock(mu);
  (*cache)[key] = n;
  return n;
}

}  // namespace groupmm::cuda
