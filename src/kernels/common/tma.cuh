// Tensor memory access (TMA) for the hand-written kernels: 2-D tensor maps made on the host, the
// bulk tensor copy into shared memory, and the shared-memory barriers (mbarrier) whose
// transaction count tracks the copied bytes. Each device wrapper is one PTX instruction (a wait
// is a loop of one); what it guarantees is the PTX ISA's. The CUTLASS kernels make their own
// maps; this is for kernels CUTLASS has no schedule for.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace groupmm::cuda {

// ---- host: tensor maps --------------------------------------------------------------------------
// A row-major 2-D tensor [rows, cols] of elem_bytes-byte elements (1 or 2) at `base`, rows
// `row_bytes` apart, read in boxes of box_cols x box_rows elements, no swizzle; reads past either
// dimension fill zeros. Requirements (the hardware's, checked, GROUPMM_CHECK naming `op`): base
// 16-byte aligned, row_bytes a multiple of 16, box_cols * elem_bytes a multiple of 16, boxes of at
// most 256 per dimension. swizzle128: the box lands with the 128-byte swizzle (16-byte chunk c of
// box row r at chunk c ^ (r % 8); box rows of exactly 128 bytes, destination 1024-byte aligned),
// the layout wgmma reads as GMMA::Layout_K_SW128_Atom. The driver's encoder is found once per
// process (no libcuda link).
CUtensorMap make_tensor_map_2d(const char* op, const void* base, int elem_bytes, int64_t cols,
                               int64_t rows, int64_t row_bytes, int box_cols, int box_rows,
                               bool swizzle128 = false);

// A row-major 3-D tensor [d2, d1, d0] (d0 contiguous; d1 rows `stride1_bytes` apart, d2 planes
// `stride2_bytes` apart), read in boxes of box0 x box1 x 1 elements; reads past any dimension fill
// zeros, so a box never reads a neighbouring plane. Same requirements as the 2-D map (strides
// multiples of 16, box0 * elem_bytes a multiple of 16, 128 with swizzle128).
CUtensorMap make_tensor_map_3d(const char* op, const void* base, int elem_bytes, int64_t d0,
                               int64_t d1, int64_t d2, int64_t stride1_bytes, int64_t stride2_bytes,
                               int box0, int box1, bool swizzle128 = false);

// ---- device: barriers -------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// A barrier that completes a phase after `count` arrivals and the bytes announced with them.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
// Makes the initialized barriers visible to the async proxy (the TMA unit) before first use.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival that also announces `bytes` more to come from copies completing on this barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
      "r"(bytes)
      : "memory");
}
// Waits until the phase of parity `parity` has completed (acquire: the copied bytes are visible).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// ---- device: bulk tensor copies ---------------------------------------------------------------
// The box at element coordinates (col, row) of `map` into shared memory at dst (128-byte
// aligned), its bytes counted on `bar`. `map` must live in kernel parameter space
// (__grid_constant__) or global memory.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int col, int row,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_addr(bar))
      : "memory");
}
// The 3-D box at (c0, c1, c2) of `map` into dst, as tma_load_2d.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}
// Fetches a tensor map into the descriptor cache ahead of its first copy.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace groupmm::cuda
