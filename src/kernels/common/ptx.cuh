// Thin wrappers over the PTX instructions the kernels use that CUDA C++ does not spell: async
// copies into shared memory, L2 prefetch, relaxed (flag-and-data) global accesses, streaming
// loads, warp-level mma, byte permutes and packed 16-bit maxima. Each wrapper is one instruction;
// what it guarantees is the PTX ISA's.
#pragma once

#include <cstdint>

namespace groupmm::cuda {

// ---- cp.async: global -> shared, 16 bytes, bypassing L1 ----------------------------------------
// Copies src_bytes (0 or 16) bytes from src to the shared address dst and zero-fills the rest of
// the 16 bytes, so a tile past the end of its data loads as zeros (src must still be a valid
// address when src_bytes is 0). No L2 eviction-priority hint: the .L2::cache_hint form with a
// createpolicy descriptor raised an illegal-instruction fault in the fused quantize kernel on
// CUDA 13.0.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
// Closes the group of cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- shared memory -----------------------------------------------------------------------------
// 16 bytes at the shared address `addr` (16-byte aligned) by ld.shared: the generic loads the
// compiler makes of a pointer it cannot prove shared take longer. Volatile: ordered after the
// (volatile) barrier waits that publish the data.
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

// A contiguous run of global memory into L2 (a hint: nothing waits for it). bytes: a multiple of
// 16, src 16-byte aligned, the range inside one allocation.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// ---- relaxed global accesses at GPU scope ------------------------------------------------------
// For a word that is its own flag (a value and "not yet written" in one): morally strong, so a
// reader sees either the old or the new word, and no fence is needed when nothing else is
// published with it.
__device__ __forceinline__ uint32_t ld_relaxed_gpu(const uint32_t* a) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_gpu(uint32_t* a, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}

// ---- streaming loads ---------------------------------------------------------------------------
// 16 bytes from global memory that is read once (weights): not kept in L1. Zeros when !pred (no
// access then: src may be out of range).
__device__ __forceinline__ uint4 ldg_stream16(const void* src, bool pred) {
  uint4 v;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(src), "r"(static_cast<int>(pred)));
  return v;
}

// ---- warp-level tensor core multiply-accumulate ------------------------------------------------
// d += a b for a 16x16 bf16 tile a (row-major), a 16x8 bf16 tile b (column-major), fp32 d (the
// PTX ISA's fragment layout for mma.m16n8k16: lane (g, t) = (lane / 4, lane % 4) holds a0 = (row g,
// columns 2t, 2t + 1), a1 = (row g + 8, same), a2 = (row g, columns 2t + 8, 2t + 9), a3 = (row
// g + 8, same), b0 = (rows 2t, 2t + 1, column g), b1 = (rows 2t + 8, 2t + 9, column g), d0 d1 =
// (row g, columns 2t, 2t + 1), d2 d3 = (row g + 8, same); the lower-numbered element in the low
// half of a register).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- integer bit manipulation ------------------------------------------------------------------
// Byte permute of the 8 bytes b:a (a = bytes 0-3): result byte i is selected by nibble i of sel;
// a selector nibble >= 8 replicates the sign bit of the selected byte (0x00 or 0xFF).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// Unsigned maximum of the two 16-bit halves separately.
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

}  // namespace groupmm::cuda
