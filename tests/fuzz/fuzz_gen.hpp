// Random inputs for the public-API fuzzer (fuzz_api.cpp): sizes, dtypes, splits, exact-size host
// buffers, and the mutations that turn a well-formed view into a malformed one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <random>
#include <vector>

#include "groupmm/core.hpp"

namespace groupmm::fuzz {

class Arena;

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  uint64_t rng() { return rng_(); }
  int64_t pick(int64_t lo, int64_t hi) {  // uniform in [lo, hi] (any lo <= hi)
    const uint64_t span = uint64_t(hi) - uint64_t(lo);
    return int64_t(uint64_t(lo) + (span == UINT64_MAX ? rng_() : rng_() % (span + 1)));
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  int64_t huge() {
    const int64_t h[] = {int64_t(1) << 31, int64_t(1) << 40, int64_t(1) << 62,
                         std::numeric_limits<int64_t>::max()};
    return h[pick(0, 3)];
  }
  // A dimension for the TensorView constructor: mostly small, sometimes negative or huge.
  int64_t dim() { return chance(0.8) ? pick(0, 64) : chance(0.5) ? -pick(1, 3) : huge(); }
  int64_t groups() { return chance(0.9) ? pick(1, 8) : pick(9, 40); }
  // Mostly the valid dtypes; rarely a value past the enum's last one.
  DType dtype() { return static_cast<DType>(chance(0.98) ? pick(0, 8) : pick(9, 255)); }

  // Turns v into one of the malformed views an op must reject (or cope with).
  void mutate(TensorView& v, Arena& a);
  // Mostly nothing; else one (rarely two) of the present views is mutated.
  void mutate_one_of(std::initializer_list<TensorView*> views, Arena& a) {
    std::vector<TensorView*> present;
    for (TensorView* v : views)
      if (v->present()) present.push_back(v);
    if (present.empty()) return;
    for (int i = 0; i < 2 && chance(i == 0 ? 0.4 : 0.15); ++i)
      mutate(*present[size_t(pick(0, int64_t(present.size()) - 1))], a);
  }

 private:
  std::mt19937_64 rng_;
};

// Exact-size host buffers with random contents, freed with the case.
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    for (void* p : blocks_) std::free(p);
  }
  // 16-byte aligned (ops check alignment), exactly `n` bytes long (AddressSanitizer sees overruns),
  // random bytes (NaN and Inf included for the float types).
  void* bytes(size_t n) {
    void* p = nullptr;
    if (posix_memalign(&p, 16, n ? n : 1) != 0) std::abort();
    blocks_.push_back(p);
    auto* b = static_cast<uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) {  // xorshift64: cheap enough for every byte
      fill_ ^= fill_ << 13, fill_ ^= fill_ >> 7, fill_ ^= fill_ << 17;
      b[i] = uint8_t(fill_ >> 24);
    }
    return p;
  }
  TensorView view(DType t, std::initializer_list<int64_t> dims) {
    TensorView v(nullptr, t, Device::CPU, dims);
    v.data = bytes(size_t(v.nbytes()));
    return v;
  }
  // [G] row counts for M rows: a partition of M, or one of the faults the ops must survive.
  TensorView splits(Gen& g, int64_t G, int64_t M) {
    const DType t = g.chance(0.97) ? (g.chance(0.5) ? DType::int32 : DType::int64) : g.dtype();
    std::vector<int64_t> s(size_t(G), 0);
    for (int64_t m = 0; m < M; ++m) ++s[size_t(g.pick(0, G - 1))];  // valid partition
    if (g.chance(0.35)) {
      const size_t i = size_t(g.pick(0, G - 1));
      switch (g.pick(0, 5)) {
        case 0:
          s[i] = -g.pick(1, 1000);
          break;  // negative
        case 1:
          s[i] += g.pick(1, 50);
          break;  // sum past M
        case 2:
          s[i] = std::max<int64_t>(0, s[i] - g.pick(1, 50));
          break;  // sum below M
        case 3:
          s[i] = std::numeric_limits<int32_t>::max();
          break;
        case 4:
          s[i] = std::numeric_limits<int64_t>::max();
          break;  // running sum overflows
        default:
          s[i] = std::numeric_limits<int64_t>::min();
          break;
      }
    }
    TensorView v(nullptr, t, Device::CPU, {G});
    v.data = bytes(size_t(std::max<int64_t>(v.nbytes(), 0)));
    for (int64_t i = 0; i < G; ++i) {
      if (t == DType::int32) static_cast<int32_t*>(v.data)[i] = int32_t(s[size_t(i)]);
      if (t == DType::int64) static_cast<int64_t*>(v.data)[i] = s[size_t(i)];
    }
    return v;
  }

 private:
  std::vector<void*> blocks_;
  uint64_t fill_ = 0x9E3779B97F4A7C15ull;
};

inline void Gen::mutate(TensorView& v, Arena& a) {
  if (v.rank < 1 || v.rank > 3) return;  // already absent or malformed
  switch (pick(0, 10)) {
    case 0:  // another dtype (the buffer may now be too small: only with null data)
      v.dtype = dtype();
      if (v.nbytes() > 0) v.data = nullptr;
      break;
    case 1: {  // another rank, same elements ([1, n] or [n] or [1, 1, n])
      const int64_t n = v.numel();
      const int r = int(pick(1, 3));
      v.rank = r;
      v.shape = {r == 1 ? n : 1, r == 2 ? n : 1, r == 3 ? n : 0};
      break;
    }
    case 2:  // a smaller first dim (the buffer still covers it)
      if (v.shape[0] > 0) v.shape[0] = pick(0, v.shape[0] - 1);
      break;
    case 3:  // a negative dim, written to the field (the constructor would refuse it)
      v.shape[size_t(pick(0, v.rank - 1))] = -pick(1, 5);
      break;
    case 4:  // a huge dim on null data
      v.shape[size_t(pick(0, v.rank - 1))] = huge();
      v.data = nullptr;
      break;
    case 5:  // a view of host memory that claims to be on the GPU
      v.device = Device::CUDA;
      break;
    case 6:  // null data
      v.data = nullptr;
      break;
    case 7:  // misaligned data (1 or 2 bytes past an aligned buffer of the same size)
      if (v.data != nullptr) {  // a buffer exists, so the claim is small
        const int64_t n = std::max<int64_t>(v.nbytes(), 0);
        v.data = static_cast<char*>(a.bytes(size_t(n) + 2)) + pick(1, 2);
      }
      break;
    case 8:  // absent
      v = TensorView();
      break;
    case 9:  // a rank out of range, written to the field
      v.rank = chance(0.5) ? 0 : int(pick(4, 7));
      break;
    default:  // a larger last dim on null data
      if (v.shape[size_t(v.rank - 1)] < (int64_t(1) << 60))
        v.shape[size_t(v.rank - 1)] += pick(1, 100);
      v.data = nullptr;
      break;
  }
}

}  // namespace groupmm::fuzz
