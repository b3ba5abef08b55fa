// The per-expert plan of the quantize family on the device: each expert's clamped row range (the
// splits rule of offsets.hpp) and its tile / column-block / swizzle offsets (quantize.hpp
// "Layouts"), built by one small kernel so that no host reads splits (graph safe). Arrays of
// G + 1 int64; entry G holds the totals. Also read by group_dbias.
#pragma once

#include "numerics/quantize_layout.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/common/splits_scan.cuh"

namespace groupmm::cuda {

// A fused amax slot holds a tile maximum or this (above every canonical amax: NaN is
// 0x7FC00000); the plan kernel empties the slots.
constexpr uint32_t kSlotEmpty = 0xFFFFFFFFu;

struct QuantPlan {
  int64_t* start;       // clamped start row
  int64_t* rows;        // clamped rows
  int64_t* tile_start;  // prefix of ceil(rows / 128)
  int64_t* cb_start;    // prefix of ceil(rows / cb)
  int64_t* cs4_start;   // prefix of roundup(ceil(rows / cb), 4)
  uint32_t* ticket;     // the tile kernel's next work ticket (zeroed by the plan)
  int64_t G;

  __device__ __forceinline__ qnum::Geom geom(int64_t g) const {
    return {start[g], rows[g], tile_start[g], cb_start[g], cs4_start[g]};
  }
};

// The plan's arrays inside the workspace's plan part (QuantWorkspace::plan_size(G) bytes).
QuantPlan plan_view(void* plan_part, int64_t G);

struct QuantPlanArgs {
  TensorView splits;           // [G] device int32 / int64; absent: G experts of rows_total / G rows
  int64_t rows_total = 0;      // M: the row bound of the splits rule
  bool total_at_most = false;  // SplitsTotal::at_most: a sum short of rows_total is no fault
  int col_block = 128;         // cb: 16, 32 or 128 rows
  uint32_t* amax_bits = nullptr;   // [G] zeroed when given (the amax pass merges into it)
  uint32_t* amax_slots = nullptr;  // set to kSlotEmpty when given (the fused amax schedule)
  int64_t slot_count = 0;          // how many (QuantWorkspace::slot_count)
  OpId op = OpId::none;            // faults are reported against it
};

// Builds the plan and zeroes its ticket. The plan kernel triggers programmatic dependent launch
// at its start: a kernel launched after it with launch_pdl must execute pdl_wait() before it
// reads anything the plan wrote. A plain launch after it needs nothing.
void launch_quant_plan(Context& ctx, const QuantPlan& plan, const QuantPlanArgs& args);

}  // namespace groupmm::cuda
