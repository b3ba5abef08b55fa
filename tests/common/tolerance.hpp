// The tolerances of every float comparison against a reference, in one table keyed by
// (op, input dtype, output dtype), and the check that applies them: a norm ratio and a max-abs
// error side by side, so that neither a spread of small errors nor one wrong element passes.
#pragma once

#include <algorithm>
#include <sstream>

#include "common/test_util.hpp"

namespace groupmm::test {

enum class TolOp { gemm, swiglu, dbias };

inline const char* tol_op_name(TolOp op) {
  switch (op) {
    case TolOp::gemm:
      return "gemm";
    case TolOp::swiglu:
      return "swiglu";
    case TolOp::dbias:
      return "dbias";
  }
  return "?";
}

// Bounds on the error of a correct implementation against an exact (fp64) reference computed
// from the same stored inputs:
//   rel      ||got - ref||_2 / ||ref||_2
//   max_abs  max_i |got_i - ref_i| / max_i |ref_i|
// Two implementations compared with each other (GPU against the CPU reference) may each be off
// by the bound in opposite directions: between_implementations() doubles it.
struct Tolerance {
  double rel = 0, max_abs = 0;
  Tolerance between_implementations() const { return {2 * rel, 2 * max_abs}; }
};

// The table. Measured: the largest ratios of a correct implementation (the CPU reference against
// fp64) over GROUPMM_TEST_SEED=1..20 on the CPU suites' shapes (GROUPMM_TEST_PRINT_ERRORS=1
// prints every comparison), quoted per entry.
//  - 16-bit outputs: the error is the final round-to-nearest, at most half an ulp: 2^-9 of the
//    value's binade, so max_abs <= 2^-8 (bf16) / 2^-11 (fp16) of the largest value, a hard
//    bound (measured max_abs sits within a few % of it). The norm ratio is statistical: ~1.1e-3
//    (bf16) on large outputs, up to 2e-3 on experts of a few hundred values; its tolerance is
//    1.5x the largest seen. One extra bf16 rounding per term of a sum (a 16-bit accumulator)
//    costs ~2^-9 * sqrt(terms) relative: 1e-2 at 40 terms. fp32 accumulation error (below
//    2^-24 * sqrt(terms)) is negligible here for any length the tests use.
//  - fp32 outputs: fp32 accumulation against fp64 grows like u * sqrt(terms), u = 2^-24, from
//    one rounding of the output up: rel <= u * (1 + sqrt(terms)), max_abs <= u * (1 + 2 *
//    sqrt(terms)). Measured rel / (u * sqrt(terms)) and max_abs / (u * sqrt(terms)): dbias (129
//    rows) 0.52 and 0.69; gemm wgrad (2001-3000 rows, accumulating into main_grad) 0.29 and 0.6;
//    gemm forward/dgrad into fp32 (sums of 512-2048 terms, fp32 bias added after the sum) 0.33
//    and 1.0 (half the max_abs bound). `terms`: the length of each output's sum (K forward, N
//    dgrad, rows wgrad and dbias).
inline Tolerance tolerance(TolOp op, DType in, DType out, int64_t terms = 1) {
  using D = DType;
  const Tolerance bf16_out{3e-3, 4e-3}, fp16_out{3.5e-4, 5e-4};
  const double u = 0x1p-24, root = std::sqrt(double(std::max<int64_t>(terms, 1)));
  const Tolerance fp32_sum{u * (1 + root), u * (1 + 2 * root)};
  switch (op) {
    case TolOp::gemm:
      // bf16: rel 2.0e-3, max_abs 3.75e-3; fp16: rel 2.5e-4, max_abs 4.7e-4
      if (out == D::bf16 && in == D::bf16) return bf16_out;
      if (out == D::fp16 && in == D::fp16) return fp16_out;
      if (out == D::fp32 && (in == D::bf16 || in == D::fp16)) return fp32_sum;
      break;
    case TolOp::swiglu:  // fp32 math (exp, one division) then the output rounding
      // fp32: rel 7.1e-8, max_abs 2.8e-7 (backward: (1 - s) loses bits when the gate is large);
      // bf16: rel 1.8e-3, max_abs 3.3e-3; fp16: rel 2.2e-4, max_abs 4.0e-4
      if (in == D::fp32 && out == D::fp32) return {2e-7, 6e-7};
      if (in == D::bf16 && out == D::bf16) return bf16_out;
      if (in == D::fp16 && out == D::fp16) return fp16_out;
      break;
    case TolOp::dbias:
      // bf16: rel 2.0e-3, max_abs 3.7e-3; fp16: rel 2.3e-4, max_abs 4.5e-4
      if (out == D::fp32) return fp32_sum;
      if (out == D::bf16 && in == D::bf16) return bf16_out;
      if (out == D::fp16 && in == D::fp16) return fp16_out;
      break;
  }
  ADD_FAILURE() << "no tolerance for (" << tol_op_name(op) << ", " << dtype_name(in) << ", "
                << dtype_name(out) << ")";
  return {0, 0};
}

// A GPU GEMM (tensor cores) against the CPU reference. 16-bit outputs: both sides within the
// table's half-ulp bound. fp32 outputs (any pass: no output rounding, only the accumulation's
// error): tensor cores add with truncation and a different order
// (not the round-to-nearest sequential sums the u * sqrt(terms) model measured on the CPU), so
// the bound keeps the 1e-5 floor the GPU suite has passed with until it is measured on the device
// (GROUPMM_TEST_PRINT_ERRORS=1 on the GPU machine prints the ratios).
inline Tolerance gpu_gemm_tolerance(DType in, DType out, int64_t terms) {
  Tolerance t = tolerance(TolOp::gemm, in, out, terms).between_implementations();
  if (out == DType::fp32) t = {std::max(t.rel, 1e-5), std::max(t.max_abs, 2e-5)};
  return t;
}

struct ErrorStats {
  double rel = 0, max_abs = 0;  // as in Tolerance
  size_t worst = 0;             // index of the largest |got - ref|
  double got_worst = 0, ref_worst = 0;
  bool nonfinite = false;  // a NaN or Inf in got or ref (index in worst)
  std::string to_string() const {
    std::ostringstream os;
    os.precision(3);
    if (nonfinite) {
      os << "non-finite value at element " << worst << ": got " << got_worst << ", ref "
         << ref_worst;
      return os.str();
    }
    os << "rel " << rel << ", max_abs " << max_abs << " (element " << worst << ": got " << got_worst
       << ", ref " << ref_worst << ")";
    return os.str();
  }
};

template <class R>
ErrorStats error_stats(const std::vector<float>& got, const std::vector<R>& ref) {
  ErrorStats s;
  double num = 0, den = 0, maxd = 0, maxr = 0;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    const double g = got[i], r = static_cast<double>(ref[i]);
    if (!std::isfinite(g) || !std::isfinite(r)) {
      s.nonfinite = true;
      s.worst = i;
      s.got_worst = g;
      s.ref_worst = r;
      return s;
    }
    const double d = std::fabs(g - r);
    num += d * d;
    den += r * r;
    maxr = std::max(maxr, std::fabs(r));
    if (d > maxd || i == 0) {
      maxd = d;
      s.worst = i;
      s.got_worst = g;
      s.ref_worst = r;
    }
  }
  s.rel = den == 0 ? std::sqrt(num) : std::sqrt(num / den);
  s.max_abs = maxr == 0 ? maxd : maxd / maxr;
  return s;
}

inline bool print_errors() {
  static const bool on = std::getenv("GROUPMM_TEST_PRINT_ERRORS") != nullptr;
  return on;
}

// EXPECT_TRUE(close_to(got, ref, tol, "what")): both measures within tol, sizes equal, all
// finite. GROUPMM_TEST_PRINT_ERRORS=1 prints the measured ratios of every call.
template <class R>
::testing::AssertionResult close_to(const std::vector<float>& got, const std::vector<R>& ref,
                                    Tolerance tol, const std::string& what) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " values, reference has " << ref.size();
  const ErrorStats s = error_stats(got, ref);
  if (print_errors())
    std::printf("[  ERRORS  ] %s: rel %.3g (%.2f of tol), max_abs %.3g (%.2f of tol)\n",
                what.c_str(), s.rel, tol.rel > 0 ? s.rel / tol.rel : 0.0, s.max_abs,
                tol.max_abs > 0 ? s.max_abs / tol.max_abs : 0.0);
  if (!s.nonfinite && s.rel <= tol.rel && s.max_abs <= tol.max_abs)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << s.to_string() << "; tolerance rel "
                                       << tol.rel << ", max_abs " << tol.max_abs;
}

}  // namespace groupmm::test
