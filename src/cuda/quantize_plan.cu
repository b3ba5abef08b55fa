// The quantize plan kernel: one block scans the splits in tiles (CUB BlockScan), carrying the
// running sums between tiles, so any G works in one launch.
#include <cub/block/block_scan.cuh>

#include "core/quantize_impl.hpp"
#include "cuda/quantize_plan.cuh"
#include "cuda/status.cuh"

namespace groupmm::cuda {
namespace {

struct PlanConfig {
  static constexpr int kThreads = 256;
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block size");
};

struct Quad {
  int64_t a, b, c, d;
};
struct QuadSum {
  __device__ Quad operator()(const Quad& x, const Quad& y) const {
    return {x.a + y.a, x.b + y.b, x.c + y.c, x.d + y.d};
  }
};

struct PlanParams {
  QuantPlan plan;
  const void* splits;  // null: uniform
  bool splits64;
  int64_t rows_total;
  int64_t uniform_rows;
  int64_t cb;
  int cb_shift;  // log2(cb) when cb is a power of two, else -1
  uint32_t* amax_bits;
  uint32_t* slots;  // the fused amax slots: n_slots set to kSlotEmpty
  int64_t col_tiles;
  int64_t n_slots;  // the host's bound on the items: tile_bound(rows_total, G) * col_tiles
  StatusBlock* status;
  OpId op;
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) quant_plan_kernel(PlanParams p) {
  // The kernels after the plan are launched with programmatic dependent launch and wait for the
  // whole plan (pdl_wait) before reading it: let them start launching now. The plan itself is
  // launched the same way (its launch overlaps the previous kernel's tail) and waits for that
  // kernel before it reads the splits or writes the plan (which that kernel may still read).
  pdl_launch_dependents();
  pdl_wait();
  // The fused amax slots first: the host's bound on the item count (no dependence on the scan;
  // the stores overlap the splits' loads).
  if (p.slots != nullptr)
    for (int64_t i = threadIdx.x; i < p.n_slots; i += Cfg::kThreads) p.slots[i] = kSlotEmpty;
  using Scan = cub::BlockScan<Quad, Cfg::kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ Quad carry;  // a: unclamped rows, b: tiles, c: column blocks, d: padded blocks
  if (threadIdx.x == 0) carry = {0, 0, 0, 0};
  __syncthreads();
  const int64_t G = p.plan.G;
  for (int64_t base = 0; base < G; base += Cfg::kThreads) {
    const int64_t g = base + threadIdx.x;
    int64_t m = 0;
    if (g < G) {
      if (p.splits == nullptr) {
        m = p.uniform_rows;
      } else {
        m = load_split(p.splits, p.splits64, g);
        if (m < 0) {
          report_fault(p.status, kFaultNegativeSplit, p.op, static_cast<int32_t>(g), m);
          m = 0;
        }
      }
      if (p.amax_bits) p.amax_bits[g] = 0;
    }
    auto col_blocks = [&](int64_t r) {
      return p.cb_shift >= 0 ? (r + p.cb - 1) >> p.cb_shift : qnum::ceil_div(r, p.cb);
    };
    const Quad c0 = carry;
    // Expert g's entries from its clamped start / rows and the exclusive prefixes of the other
    // three sums, then the carry past this chunk (a: unclamped rows).
    auto finish_chunk = [&](int64_t start, int64_t rows, const Quad& ex, int64_t total_a,
                            const Quad& total) {
      if (g < G) {
        p.plan.start[g] = start;
        p.plan.rows[g] = rows;
        p.plan.tile_start[g] = c0.b + ex.b;
        p.plan.cb_start[g] = c0.c + ex.c;
        p.plan.cs4_start[g] = c0.d + ex.d;
      }
      __syncthreads();  // everyone has read carry and tmp
      if (threadIdx.x == 0)
        carry = {c0.a + total_a, c0.b + total.b, c0.c + total.c, c0.d + total.d};
      __syncthreads();
    };
    // Every prefix in one scan of the unclamped rows: exact while this chunk's running sum stays
    // within rows_total (one scan instead of two: H200, mxfp8 both [32768, 2048] 73.7 -> 73.9%
    // of copy). Past it (a fault), the two clamped scans below.
    const int64_t nbu = col_blocks(m);
    Quad unc{m, qnum::ceil_div(m, qnum::kTileRows), nbu, qnum::round_up(nbu, 4)}, unc_excl;
    Quad unc_total;
    Scan(tmp).ExclusiveScan(unc, unc_excl, Quad{0, 0, 0, 0}, QuadSum{}, unc_total);
    if (c0.a + unc_total.a <= p.rows_total) {  // CTA-uniform
      finish_chunk(c0.a + unc_excl.a, m, unc_excl, unc_total.a, unc_total);
      continue;
    }
    __syncthreads();  // tmp is reused
    // First scan: unclamped starts, then clamp against the buffer like cpu::expert_rows.
    Quad item{m, 0, 0, 0}, excl;
    Quad tile_total;
    Scan(tmp).ExclusiveScan(item, excl, Quad{0, 0, 0, 0}, QuadSum{}, tile_total);
    const int64_t run = c0.a + excl.a;
    const int64_t start = run < p.rows_total ? run : p.rows_total;
    int64_t rows = m;
    if (g < G && start + rows > p.rows_total) {
      report_fault(p.status, kFaultSplitsOverflow, p.op, static_cast<int32_t>(g), m);
      rows = p.rows_total - start;
    }
    if (g >= G) rows = 0;
    __syncthreads();
    const int64_t nb = col_blocks(rows);
    Quad item2{0, qnum::ceil_div(rows, qnum::kTileRows), nb, qnum::round_up(nb, 4)}, excl2;
    Quad total2;
    Scan(tmp).ExclusiveScan(item2, excl2, Quad{0, 0, 0, 0}, QuadSum{}, total2);
    finish_chunk(start, rows, excl2, tile_total.a, total2);
  }
  if (threadIdx.x == 0) {
    const Quad c = carry;
    p.plan.start[G] = c.a < p.rows_total ? c.a : p.rows_total;
    p.plan.rows[G] = 0;
    p.plan.tile_start[G] = c.b;
    p.plan.cb_start[G] = c.c;
    p.plan.cs4_start[G] = c.d;
    *p.plan.ticket = 0;
    if (p.splits != nullptr && c.a != p.rows_total)
      report_fault(p.status, kFaultSplitsTotalMismatch, p.op, -1, c.a);
  }
}

}  // namespace

QuantPlan plan_view(void* ws, int64_t G) {
  int64_t* b = static_cast<int64_t*>(ws);
  const int64_t n = G + 1;
  return {b, b + n, b + 2 * n, b + 3 * n, b + 4 * n, reinterpret_cast<uint32_t*>(b + 5 * n), G};
}

void launch_quant_plan(Context& ctx, const QuantPlan& plan, const TensorView& splits,
                       int64_t rows_total, int col_block, uint32_t* amax_bits, OpId op,
                       uint32_t* slots, int64_t col_tiles) {
  PlanParams p{};
  p.plan = plan;
  p.splits = splits.present() ? splits.data : nullptr;
  p.splits64 = splits.present() && splits.dtype == DType::int64;
  p.rows_total = rows_total;
  p.uniform_rows = rows_total / plan.G;
  p.cb = col_block;
  p.cb_shift = log2_exact(col_block);
  p.amax_bits = amax_bits;
  p.slots = slots;
  p.col_tiles = col_tiles;
  p.n_slots = slots != nullptr ? tile_bound(rows_total, plan.G) * col_tiles : 0;
  p.status = ctx.status();
  p.op = op;
  launch_pdl(quant_plan_kernel<PlanConfig>, dim3(1), dim3(PlanConfig::kThreads), 0, ctx.stream(),
             p);
}

}  // namespace groupmm::cuda
