// Shared helpers for the GoogleTest suites: GPU gating, random data, split patterns, tolerances.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/cpu_util.hpp"
#include "groupmm/convert.hpp"
#include "groupmm/core.hpp"

namespace groupmm {
inline void PrintTo(DType t, std::ostream* os) {
  *os << dtype_name(t);
}
}  // namespace groupmm

namespace groupmm::test {

// Strict GPU mode: with GROUPMM_REQUIRE_GPU set (to anything but "" or "0"), a GPU test that
// finds no usable sm_90 device fails instead of skipping. The device scripts set it, so a run on
// the GPU machine cannot pass by skipping everything.
inline bool gpu_required() {
  const char* e = std::getenv("GROUPMM_REQUIRE_GPU");
  return e != nullptr && *e != '\0' && std::string(e) != "0";
}

// Skips the current test cleanly where no sm_90 GPU exists (CI machines); fails in strict mode.
#define GROUPMM_REQUIRE_GPU()                                                             \
  do {                                                                                    \
    if (!::groupmm::cuda_available()) {                                                   \
      if (::groupmm::test::gpu_required())                                                \
        FAIL() << "GROUPMM_REQUIRE_GPU is set but no usable sm_90 GPU is visible";        \
      GTEST_SKIP() << "no sm_90 GPU visible (set GROUPMM_REQUIRE_GPU=1 to fail instead)"; \
    }                                                                                     \
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

// ---- seeds -------------------------------------------------------------------------------------
// Every test draws its random data from rng(), which is reseeded when each test starts from the
// base seed and the test's full name: a test's data does not depend on which tests ran before it
// (ctest runs each one alone). The base seed is GROUPMM_TEST_SEED (decimal or 0x-hex; "random"
// draws a fresh one), default kDefaultTestSeed. A failing test prints the line that reproduces it.
constexpr uint64_t kDefaultTestSeed = 20241124;

inline uint64_t base_seed() {
  static const uint64_t seed = [] {
    const char* e = std::getenv("GROUPMM_TEST_SEED");
    if (e == nullptr || *e == '\0') return kDefaultTestSeed;
    if (std::string(e) == "random")
      return (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
    char* end = nullptr;
    const uint64_t v = std::strtoull(e, &end, 0);
    if (*end != '\0') {
      std::fprintf(stderr, "GROUPMM_TEST_SEED=%s: expected a number or \"random\"\n", e);
      std::exit(2);
    }
    return v;
  }();
  return seed;
}

// splitmix64 of the base seed and an FNV-1a hash of the name.
inline uint64_t seed_for(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  uint64_t z = base_seed() ^ h;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 g(seed_for(""));
  return g;
}

inline std::string full_test_name(const ::testing::TestInfo& t) {
  return std::string(t.test_suite_name()) + "." + t.name();
}

class SeedListener : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo& t) override {
    rng().seed(seed_for(full_test_name(t)));
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (!t.result()->Failed()) return;
    std::printf(
        "[   SEED   ] %s: data from GROUPMM_TEST_SEED=%llu (per-test seed 0x%016llx); "
        "rerun: GROUPMM_TEST_SEED=%llu <binary> --gtest_filter='%s'\n",
        full_test_name(t).c_str(), static_cast<unsigned long long>(base_seed()),
        static_cast<unsigned long long>(seed_for(full_test_name(t))),
        static_cast<unsigned long long>(base_seed()), full_test_name(t).c_str());
    std::fflush(stdout);
  }
};
inline const bool kSeedListenerInstalled = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedListener);
  return true;
}();

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
// Readable, build-independent parameter values in test listings (ctest names include them).
inline void PrintTo(Pattern p, std::ostream* os) {
  *os << pattern_name(p);
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

// Every byte of a view (any device, any dtype) on the host.
inline std::vector<uint8_t> bytes_of(const TensorView& v) {
  std::vector<uint8_t> h(static_cast<size_t>(v.nbytes()));
  if (!h.empty())
    copy(TensorView(h.data(), DType::e8m0, Device::CPU, {v.nbytes()}),
         TensorView(v.data, DType::e8m0, v.device, {v.nbytes()}));
  return h;
}

// A float view (any device) as fp32 values.
inline std::vector<float> floats_of(const TensorView& v) {
  std::vector<uint8_t> h = bytes_of(v);
  return cpu::to_floats(TensorView(h.data(), v.dtype, Device::CPU, {v.numel()}));
}

// Splits moved to multiples of `multiple` (the remainders go to the first expert), for ops whose
// alignment rule needs them (FP8 wgrad: 16). The total must already be a multiple.
inline std::vector<int64_t> align_splits(std::vector<int64_t> s, int64_t multiple) {
  int64_t rest = 0;
  for (auto& v : s) {
    rest += v % multiple;
    v -= v % multiple;
  }
  s[0] += rest;
  return s;
}

// DeepGEMM's accuracy measure, 1 - 2<x,y> / (|x|^2 + |y|^2) in fp64 (0 for equal inputs).
inline double calc_diff(const std::vector<float>& x, const std::vector<float>& y) {
  double xy = 0, xx = 0, yy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    xy += double(x[i]) * y[i];
    xx += double(x[i]) * x[i];
    yy += double(y[i]) * y[i];
  }
  return xx + yy == 0 ? 0 : 1 - 2 * xy / (xx + yy);
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

}  // namespace groupmm::test
