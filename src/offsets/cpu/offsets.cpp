// CPU reference of group_offsets: the splits rule (cpu::expert_rows) without a row bound, then
// the running sums.
#include <climits>

#include "offsets/backends.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::cpu {

static void store(const TensorView& v, int64_t i, int64_t value, StatusBlock* st, int64_t g) {
  if (!v.present()) return;
  if (v.dtype == DType::int64) {
    v.ptr<int64_t>()[i] = value;
    return;
  }
  if (value > INT32_MAX) {
    report_fault_host(st, kFaultSplitsOverflow, OpId::group_offsets, static_cast<int32_t>(g),
                      value);
    value = INT32_MAX;
  }
  v.ptr<int32_t>()[i] = static_cast<int32_t>(value);
}

// Sums and products of absurd splits (near INT64_MAX) wrap modulo 2^64, as the device's int64
// arithmetic does (signed overflow would be undefined here); the results are then only reported.
static int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
static int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

void group_offsets(Context& ctx, const OffsetsArgs& a) {
  const int64_t G = a.splits.dim(0);
  StatusBlock* st = ctx.status();
  const std::vector<RowRange> ranges =
      expert_rows(ctx, a.splits, INT64_MAX, OpId::group_offsets, a.expected_total);
  int64_t end = 0, padded = 0;
  for (int64_t g = 0; g < G; ++g) {
    const RowRange r = ranges[static_cast<size_t>(g)];
    store(a.start, g, r.start, st, g);
    store(a.scale_row_start, g, padded, st, g);
    if (a.element_start.present())
      for (int64_t s = 0; s < a.element_start.dim(0); ++s)
        a.element_start.ptr<int64_t>()[s * G + g] =
            wrap_mul(r.start, a.row_strides[static_cast<size_t>(s)]);
    end = r.start + r.rows;  // <= INT64_MAX: expert_rows clamps the ranges to the bound
    padded = wrap_add(padded, wrap_mul(wrap_add(r.rows, a.pad_rows - 1) / a.pad_rows, a.pad_rows));
    store(a.end, g, end, st, g);
  }
  store(a.total, 0, end, st, G - 1);
}

}  // namespace groupmm::cpu
