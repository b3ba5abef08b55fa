// The device workspace of the quantize family, laid out here and nowhere else. Every size is
// host-known (M, K, G), so a caller can reserve it before a graph capture. Parts, in order, each
// 256-byte aligned:
//   plan          QuantPlan: 5 arrays of G + 1 int64, then the tile kernel's work ticket (8 bytes)
//   amax slots    fp8_current / nvfp4: one uint32 per 128x128 tile of tile_bound(M, G) row tiles
//                 (the fused amax schedule: each amax item's maximum)
//   dbias partial bgrad (and group_dbias): [tile_bound(M, G), K] fp32, one column-sum row per tile
// Ops that need only the plan (dequantize, swizzle) use the first part.
#pragma once

#include <cstddef>
#include <cstdint>

#include "numerics/quantize_layout.hpp"

namespace groupmm::cuda {

struct QuantWorkspace {
  static constexpr size_t kAlign = 256;
  size_t plan_bytes = 0, slot_bytes = 0, partial_bytes = 0;

  static size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  static size_t plan_size(int64_t G) { return aligned(static_cast<size_t>(5 * (G + 1) + 1) * 8); }
  // Amax slots (= the tile kernel's items of one pass) for M rows of K columns in G experts.
  static int64_t slot_count(int64_t M, int64_t K, int64_t G) {
    return qnum::tile_bound(M, G) * qnum::ceil_div(K, 128);
  }

  // The layout for M x K in G experts: with amax slots (fp8_current, nvfp4) and / or dbias
  // partial sums.
  static QuantWorkspace of(int64_t M, int64_t K, int64_t G, bool amax_slots, bool dbias) {
    QuantWorkspace w;
    w.plan_bytes = plan_size(G);
    if (amax_slots) w.slot_bytes = aligned(static_cast<size_t>(slot_count(M, K, G)) * 4);
    if (dbias) w.partial_bytes = static_cast<size_t>(qnum::tile_bound(M, G) * K) * 4;
    return w;
  }
  size_t total() const { return plan_bytes + slot_bytes + partial_bytes; }

  // The parts inside a workspace `ws` of at least total() bytes (null where absent).
  static void* plan(void* ws) { return ws; }
  uint32_t* amax_slots(void* ws) const {
    return slot_bytes ? reinterpret_cast<uint32_t*>(static_cast<char*>(ws) + plan_bytes) : nullptr;
  }
  float* dbias_partial(void* ws) const {
    return partial_bytes
               ? reinterpret_cast<float*>(static_cast<char*>(ws) + plan_bytes + slot_bytes)
               : nullptr;
  }
};

}  // namespace groupmm::cuda
