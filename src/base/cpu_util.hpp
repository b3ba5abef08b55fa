// Helpers shared by the CPU reference ops: element load/store by dtype, expert row ranges (the
// splits rule), the grouped column sums of the bias gradients.
#pragma once

#include <algorithm>
#include <vector>

#include "numerics/quantize.hpp"
#include "groupmm/convert.hpp"
#include "groupmm/core.hpp"

namespace groupmm::cpu {

// Reads element i of a float-typed view (bf16, fp16, fp32, fp8, e8m0) as fp32.
inline float load_f(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::bf16:
      return bf16_bits_to_float(v.ptr<uint16_t>()[i]);
    case DType::fp16:
      return fp16_bits_to_float(v.ptr<uint16_t>()[i]);
    case DType::fp32:
      return v.ptr<float>()[i];
    case DType::fp8e4m3:
      return e4m3_to_float(v.ptr<uint8_t>()[i]);
    case DType::fp8e5m2:
      return e5m2_to_float(v.ptr<uint8_t>()[i]);
    case DType::e8m0:
      return e8m0_to_float(v.ptr<uint8_t>()[i]);
    default:
      break;
  }
  GROUPMM_CHECK(false, "load_f: dtype ", dtype_name(v.dtype), " is not a float type");
  return 0;
}

// Writes fp32 x into element i of a bf16/fp16/fp32 view with the format's rounding.
inline void store_f(const TensorView& v, int64_t i, float x) {
  switch (v.dtype) {
    case DType::bf16:
      v.ptr<uint16_t>()[i] = float_to_bf16_bits(x);
      return;
    case DType::fp16:
      v.ptr<uint16_t>()[i] = float_to_fp16_bits(x);
      return;
    case DType::fp32:
      v.ptr<float>()[i] = x;
      return;
    default:
      break;
  }
  GROUPMM_CHECK(false, "store_f: dtype ", dtype_name(v.dtype), " is not bf16/fp16/fp32");
}

// Whole view as fp32 (tests and references).
inline std::vector<float> to_floats(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load_f(v, static_cast<int64_t>(i));
  return out;
}

struct RowRange {
  int64_t start = 0, rows = 0;
};

// Expert row ranges from host splits by the splits rule of offsets.hpp (the CUDA kernels' scan is
// src/kernels/common/splits_scan.cuh): negative -> 0 (kFaultNegativeSplit), a range past row_bound
// cut short (kFaultSplitsOverflow), a sum other than expected_total (kFaultSplitsTotalMismatch;
// -1: not checked; total_at_most: only a sum above it). Faults are reported against `op`, in the
// scan's order: the negative splits first, then the ranges' faults, then the sum. The status block
// keeps the first fault's group and value, so a negative split names its own group even when an
// earlier group runs past the rows ({10, -2} for 8 rows: group 1, value -2), as on the device,
// whose scan reports a chunk's negative splits before its ranges (a chunk: a group per thread of
// the scanning block, 256 in the grouped GEMM's setup kernel).
inline std::vector<RowRange> expert_rows(Context& ctx, const TensorView& splits, int64_t row_bound,
                                         OpId op, int64_t expected_total,
                                         bool total_at_most = false) {
  const int64_t G = splits.dim(0);
  std::vector<int64_t> m(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    int64_t& mg = m[static_cast<size_t>(g)];
    mg = splits.dtype == DType::int64 ? splits.ptr<int64_t>()[g] : splits.ptr<int32_t>()[g];
    if (mg < 0) {
      report_fault_host(ctx.status(), kFaultNegativeSplit, op, static_cast<int32_t>(g), mg);
      mg = 0;
    }
  }
  std::vector<RowRange> r(static_cast<size_t>(G));
  int64_t run = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t mg = m[static_cast<size_t>(g)];
    const int64_t start = std::min(run, row_bound);
    int64_t rows = mg;
    if (rows > row_bound - start) {  // not start + rows: a split near INT64_MAX would overflow
      report_fault_host(ctx.status(), kFaultSplitsOverflow, op, static_cast<int32_t>(g), mg);
      rows = row_bound - start;
    }
    r[static_cast<size_t>(g)] = {start, rows};
    run = mg > INT64_MAX - run ? INT64_MAX : run + mg;  // the sum is only reported: saturate
  }
  const bool bad_total = total_at_most ? run > expected_total : run != expected_total;
  if (expected_total >= 0 && bad_total)
    report_fault_host(ctx.status(), kFaultSplitsTotalMismatch, op, -1, run);
  return r;
}
// The ops with a row buffer: ranges clamped to its rows_total rows, which the splits must sum to.
inline std::vector<RowRange> expert_rows(Context& ctx, const TensorView& splits, int64_t rows_total,
                                         OpId op) {
  return expert_rows(ctx, splits, rows_total, op, rows_total);
}

// Column sums of one expert's rows in the bias-gradient order of dbias.hpp, which both backends
// follow bit for bit: fp32; per 128-row tile of the expert, per 16-row segment a sequential sum
// from +0; the tile sums its 8 segments in order from +0; the expert sums its tiles in order from
// +0; a NaN result is canonical. out[n] for n < N; value(r, n): element n of the expert's row r.
template <class Value>
void expert_column_sums(int64_t rows, int64_t N, Value&& value, float* out) {
  constexpr int64_t kTileRows = 128, kSegmentRows = 16;
  std::vector<float> tile(static_cast<size_t>(N)), segment(static_cast<size_t>(N));
  std::fill(out, out + N, 0.0f);
  for (int64_t t0 = 0; t0 < rows; t0 += kTileRows) {
    std::fill(tile.begin(), tile.end(), 0.0f);
    for (int64_t s0 = t0; s0 < std::min(t0 + kTileRows, rows); s0 += kSegmentRows) {
      std::fill(segment.begin(), segment.end(), 0.0f);
      for (int64_t r = s0; r < std::min(s0 + kSegmentRows, rows); ++r)
        for (int64_t n = 0; n < N; ++n) segment[static_cast<size_t>(n)] += value(r, n);
      for (int64_t n = 0; n < N; ++n)
        tile[static_cast<size_t>(n)] += segment[static_cast<size_t>(n)];
    }
    for (int64_t n = 0; n < N; ++n) out[n] += tile[static_cast<size_t>(n)];
  }
  for (int64_t n = 0; n < N; ++n) out[n] = qnum::canon_nan(out[n]);
}

}  // namespace groupmm::cpu
