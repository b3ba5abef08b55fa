// `groupmm info`: version, build configuration, visible GPUs.
#include <cstdio>

#include "cli.hpp"
#include "groupmm/core.hpp"
#include "groupmm/version.hpp"

namespace groupmm::tool {
namespace {

struct InfoOptions {};  // no options

int run_info(const InfoOptions&) {
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  std::printf("groupmm %s\n", GROUPMM_VERSION);
  if (GROUPMM_WITH_CUDA_KERNELS)
    std::printf("  build: C++20, CUDA runtime %d.%d, kernels for %s, CUTLASS %s\n", rt / 1000,
                (rt % 1000) / 10, GROUPMM_CUDA_ARCHS, GROUPMM_CUTLASS_VERSION);
  else
    std::printf(
        "  build: C++20, CUDA runtime %d.%d, no CUDA kernels (a CPU-only library: "
        "GROUPMM_CUDA_KERNELS=OFF)\n",
        rt / 1000, (rt % 1000) / 10);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    std::printf("  GPUs: none visible (driver %s)\n", drv ? "present" : "absent");
    std::printf("  backend: CPU reference (Device::CPU) is active\n");
    return 0;
  }
  std::printf("  driver: CUDA %d.%d\n", drv / 1000, (drv % 1000) / 10);
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    std::printf(
        "  GPU %d: %s, sm_%d%d, %d SMs, L2 %.1f MiB, memory %.1f GiB, smem/block %zu KiB%s\n", d,
        p.name, p.major, p.minor, p.multiProcessorCount, p.l2CacheSize / 1048576.0,
        p.totalGlobalMem / 1073741824.0, p.sharedMemPerBlockOptin / 1024,
        p.major == 9 ? "" : " (not sm_90: groupmm's CUDA kernels will not run here)");
  }
  std::printf("  backend: %s\n", groupmm::cuda_available()   ? "CUDA (sm_90a kernels)"
                                 : GROUPMM_WITH_CUDA_KERNELS ? "CPU reference (no sm_90 GPU)"
                                                             : "CPU reference (a CPU-only build)");
  return 0;
}

void add_info_options(CLI::App&, InfoOptions&) {}

Register reg_info(command<InfoOptions>("", "info", "version, build configuration and visible GPUs",
                                       add_info_options, run_info));

}  // namespace
}  // namespace groupmm::tool
