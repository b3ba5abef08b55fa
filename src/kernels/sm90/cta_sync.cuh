// The kernel layer's barrier, fence, cluster and copy helpers (PTX the common ones in
// kernels/common/tma.cuh and ptx.cuh do not cover): cp.async and plain mbarrier arrivals, the
// producer warpgroup's named barrier, the generic-to-async proxy fence, cluster addressing and
// arrivals, the multicast TMA copy.
#pragma once

#include <cstdint>

#include "kernels/common/tma.cuh"

namespace groupmm::cuda::sm90::detail {

__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar))
               : "memory");
}
// The producer warpgroup's own barrier (named barrier 1; the consumers never use it).
__device__ __forceinline__ void producer_sync() {
  asm volatile("bar.sync 1, 128;" ::: "memory");
}
// Orders shared-memory writes of the generic proxy (cp.async) before the async proxy's reads
// (wgmma operands) of this thread.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The shared::cluster address of the same shared-memory location in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t peer_smem_addr(const void* p, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr(p)), "r"(rank));
  return r;
}
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr)
               : "memory");
}
// Every thread of every CTA of the cluster (release / acquire: barrier inits and the last
// remote arrivals are visible across it).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// The B box at (col, row) into dst of every CTA in `mask`, counted on each one's barrier at bar's
// offset.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, int col,
                                                      int row, uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_addr(bar)), "h"(mask)
      : "memory");
}

}  // namespace groupmm::cuda::sm90::detail
