// Shared helpers for the GoogleTest suites: GPU gating, random data, split patterns, tolerances.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "groupmm/convert.hpp"
#include "groupmm/core.hpp"

namespace groupmm::test {

// Skips the current test cleanly where no sm_90 GPU exists (CI machines).
#define GROUPMM_REQUIRE_GPU()                                                 \
  do {                                                                        \
    if (!::groupmm::cuda_available()) GTEST_SKIP() << "no sm_90 GPU visible"; \
  } while (0)

// Asserts that `stmt` throws groupmm::Error whose message contains `needle`.
#define EXPECT_THROW_MSG(stmt, needle)                                         \
  do {                                                                         \
    bool groupmm_thrown_ = false;                                              \
    try {                                                                      \
      stmt;                                                                    \
    } catch (const ::groupmm::Error& e) {                                      \
      groupmm_thrown_ = true;                                                  \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)         \
          << "message: " << e.what() << "\nexpected to contain: " << (needle); \
    }                                                                          \
    EXPECT_TRUE(groupmm_thrown_) << #stmt " did not throw groupmm::Error";     \
  } while (0)

inline std::mt19937_64& rng() {
  static std::mt19937_64 g(std::random_device{}());
  return g;
}

// ---- split patterns (docs/testing.md) -----------------------------------------------------------
enum class Pattern {
  balanced,
  zipf,
  zero_first,
  zero_middle,
  zero_last,
  zero_all,
  quarter_empty,
  random_odd
};

inline const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::balanced:
      return "balanced";
    case Pattern::zipf:
      return "zipf";
    case Pattern::zero_first:
      return "zero_first";
    case Pattern::zero_middle:
      return "zero_middle";
    case Pattern::zero_last:
      return "zero_last";
    case Pattern::zero_all:
      return "zero_all";
    case Pattern::quarter_empty:
      return "quarter_empty";
    case Pattern::random_odd:
      return "random_odd";
  }
  return "?";
}

// Splits of G groups summing to exactly `total` (0 for zero_all), following the pattern.
inline std::vector<int64_t> make_splits(Pattern p, int64_t G, int64_t total,
                                        std::mt19937_64& g = rng()) {
  std::vector<double> w(static_cast<size_t>(G), 1.0);
  std::vector<int64_t> out(static_cast<size_t>(G), 0);
  if (p == Pattern::zero_all || total == 0) return out;
  switch (p) {
    case Pattern::zipf: {
      for (int64_t i = 0; i < G; ++i)
        w[static_cast<size_t>(i)] = 1.0 / std::pow(double(i + 1), 1.1);
      std::shuffle(w.begin(), w.end(), g);
      break;
    }
    case Pattern::zero_first:
      w[0] = 0;
      break;
    case Pattern::zero_middle:
      w[static_cast<size_t>(G / 2)] = 0;
      break;
    case Pattern::zero_last:
      w[static_cast<size_t>(G - 1)] = 0;
      break;
    case Pattern::quarter_empty:
      for (int64_t i = 0; i < G; ++i)
        if (i % 4 == 1) w[static_cast<size_t>(i)] = 0;
      break;
    case Pattern::random_odd: {
      std::uniform_real_distribution<double> u(0.2, 1.8);
      for (auto& x : w) x = u(g);
      break;
    }
    default:
      break;
  }
  if (G > 1 && std::all_of(w.begin(), w.end(), [](double x) { return x == 0; })) w[0] = 1;
  if (G == 1) w[0] = 1;
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  int64_t assigned = 0;
  for (int64_t i = 0; i < G; ++i) {
    out[static_cast<size_t>(i)] =
        static_cast<int64_t>(std::floor(w[static_cast<size_t>(i)] / sum * double(total)));
    assigned += out[static_cast<size_t>(i)];
  }
  // Hand the remainder to non-zero-weight groups so the total is exact.
  for (int64_t i = 0; assigned < total; i = (i + 1) % G)
    if (w[static_cast<size_t>(i)] > 0) {
      ++out[static_cast<size_t>(i)];
      ++assigned;
    }
  return out;
}

inline std::vector<int32_t> to_i32(const std::vector<int64_t>& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

// ---- random data -------------------------------------------------------------------------------
inline std::vector<float> randn(size_t n, float scale = 1.0f, std::mt19937_64& g = rng()) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Values spread over many binades (quantization tests).
inline std::vector<float> rand_wide(size_t n, std::mt19937_64& g = rng()) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_real_distribution<float> e(-12.0f, 12.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g) * std::exp2(e(g));
  return v;
}

// Host views over std::vector storage.
template <class T>
TensorView host_view(std::vector<T>& v, DType t, std::initializer_list<int64_t> dims) {
  return TensorView(v.data(), t, Device::CPU, dims);
}

// ||a - b|| / ||b|| in fp64; NaN anywhere gives +inf.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Tolerance table keyed by format (docs/testing.md).
struct Tol {
  static constexpr double gemm_bf16 = 1e-2;
  static constexpr double gemm_fp16 = 5e-3;
  static constexpr double exact = 0.0;
};

}  // namespace groupmm::test
