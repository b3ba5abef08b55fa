// CPU reference of group_offsets: a plain running sum.
#include <climits>

#include "core/offsets_impl.hpp"

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
  const bool is64 = a.splits.dtype == DType::int64;
  StatusBlock* st = ctx.status();
  int64_t run = 0, padded = 0;
  for (int64_t g = 0; g < G; ++g) {
    int64_t m = is64 ? a.splits.ptr<int64_t>()[g] : a.splits.ptr<int32_t>()[g];
    if (m < 0) {
      report_fault_host(st, kFaultNegativeSplit, OpId::group_offsets, static_cast<int32_t>(g), m);
      m = 0;
    }
    store(a.start, g, run, st, g);
    store(a.scale_row_start, g, padded, st, g);
    if (a.element_start.present())
      for (int64_t s = 0; s < a.element_start.dim(0); ++s)
        a.element_start.ptr<int64_t>()[s * G + g] =
            wrap_mul(run, a.row_strides[static_cast<size_t>(s)]);
    run = wrap_add(run, m);
    padded = wrap_add(padded, wrap_mul(wrap_add(m, a.pad_rows - 1) / a.pad_rows, a.pad_rows));
    store(a.end, g, run, st, g);
  }
  store(a.total, 0, run, st, G - 1);
  if (a.expected_total >= 0 && run != a.expected_total)
    report_fault_host(st, kFaultSplitsTotalMismatch, OpId::group_offsets, -1, run);
}

}  // namespace groupmm::cpu
