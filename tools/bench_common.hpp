// Shared pieces of the `groupmm bench` suites: split patterns, event timing, L2 rotation count.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "groupmm/core.hpp"

namespace groupmm::tool {

// The public GEMM suite (docs/testing.md): MoE expert shapes from the models' published
// configurations, M = rows routed to all G experts. `bench gemm` runs them all; `bench layer
// --recipe` the training layers among them.
struct SuiteShape {
  const char* name;
  int64_t G, M, N, K;
};
inline constexpr SuiteShape kGemmSuite[] = {
    {"dsv3_gate_up", 32, 32768, 4096, 7168},         {"dsv3_down", 32, 32768, 7168, 2048},
    {"contiguous_4x8192", 4, 32768, 4096, 7168},     {"mixtral_gate_up", 8, 16384, 28672, 4096},
    {"mixtral_down", 8, 16384, 4096, 14336},         {"qwen3_gate_up", 128, 65536, 1536, 2048},
    {"qwen3_down", 128, 65536, 2048, 768},           {"qwen3_decode", 128, 1024, 1536, 2048},
    {"llama4_scout_gate_up", 16, 8192, 16384, 5120},
};

// Round-2 cases of the 16-bit engine (`bench gemm --suite ragged|fine`), bf16 only.
// Ragged widths: expert and hidden sizes that are not multiples of the 128x256 tile (DeepSeek-V2-
// Lite / Qwen1.5-MoE experts 1408 wide, experts 1920 wide on a 5120 + 64 hidden size), 2048 rows
// per expert so the width, not the reduction, is what is measured.
inline constexpr SuiteShape kRaggedSuite[] = {
    {"ragged_1408_gate_up", 16, 32768, 2816, 2048},
    {"ragged_1408_down", 16, 32768, 2048, 1408},
    {"ragged_1920_down", 16, 32768, 5184, 1920},
};
// Fine-grained experts: many small groups (torch._grouped_mm refuses 1024 groups or more).
inline constexpr SuiteShape kFineSuite[] = {
    {"fine_g512_r64", 512, 32768, 1024, 2048},
    {"fine_g2048_r16", 2048, 32768, 1024, 2048},
};

// The benchmark split patterns (docs/testing.md): balanced, Zipf (exponent 1.1, shuffled), 25% of
// experts empty.
inline const std::vector<std::string> kSplitPatterns = {"balanced", "zipf", "empty25"};
inline std::vector<int64_t> bench_splits(const std::string& pattern, int64_t G, int64_t total,
                                         uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  std::vector<double> w(static_cast<size_t>(G), 1.0);
  if (pattern == "zipf") {
    for (int64_t i = 0; i < G; ++i) w[size_t(i)] = 1.0 / std::pow(double(i + 1), 1.1);
    std::shuffle(w.begin(), w.end(), rng);
  } else if (pattern == "empty25") {
    std::vector<int64_t> idx(static_cast<size_t>(G));
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), rng);
    for (int64_t i = 0; i < G / 4; ++i) w[size_t(idx[size_t(i)])] = 0;
  }
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<int64_t> s(static_cast<size_t>(G));
  int64_t assigned = 0;
  for (int64_t i = 0; i < G; ++i) {
    s[size_t(i)] = int64_t(std::floor(w[size_t(i)] / sum * double(total)));
    assigned += s[size_t(i)];
  }
  for (int64_t i = 0; assigned < total; i = (i + 1) % G)
    if (w[size_t(i)] > 0) ++s[size_t(i)], ++assigned;
  return s;
}

// Median over `iters` timed runs (ms), CUDA events around each run, after `warmup` runs.
template <class F>
double median_ms(cudaStream_t stream, int warmup, int iters, F&& fn) {
  GROUPMM_CHECK(iters >= 1, "median_ms: iters=", iters, " must be >= 1");
  for (int i = 0; i < warmup; ++i) fn(i);
  std::vector<cudaEvent_t> ev(size_t(iters) + 1);
  for (auto& e : ev) GROUPMM_CHECK_CUDA(cudaEventCreate(&e));
  GROUPMM_CHECK_CUDA(cudaEventRecord(ev[0], stream));
  for (int i = 0; i < iters; ++i) {
    fn(warmup + i);
    GROUPMM_CHECK_CUDA(cudaEventRecord(ev[size_t(i) + 1], stream));
  }
  GROUPMM_CHECK_CUDA(cudaEventSynchronize(ev.back()));
  std::vector<float> t(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i)
    GROUPMM_CHECK_CUDA(cudaEventElapsedTime(&t[size_t(i)], ev[size_t(i)], ev[size_t(i) + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median us of fn (CUDA events on ctx's stream, or the host clock on a CPU Context).
template <class F>
double time_us(const Context& ctx, int warmup, int iters, F&& fn) {
  if (ctx.device() == Device::CUDA) return 1e3 * median_ms(ctx.stream(), warmup, iters, fn);
  std::vector<double> t;
  for (int i = 0; i < warmup + iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(i);
    if (i >= warmup)
      t.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Host time per call of fn, called `calls` times in a row without sync, in `batches` batches with
// the device drained before each (a full launch queue would block the host and be counted):
// the per-call times of the batches, sorted.
template <class F>
std::vector<double> host_batch_us(Context& ctx, int batches, int calls, F&& fn) {
  std::vector<double> t;
  for (int b = 0; b < batches; ++b) {
    ctx.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) fn();
    t.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        calls);
  }
  ctx.synchronize();
  std::sort(t.begin(), t.end());
  return t;
}

// Copies of the inputs needed so that rotating through them touches more than 3x L2.
inline int rotation_copies(int64_t input_bytes) {
  int dev = 0, l2 = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
  if (input_bytes <= 0) return 1;
  return int(std::min<int64_t>(
      16, std::max<int64_t>(1, (3 * int64_t(l2) + input_bytes - 1) / input_bytes)));
}

// Device-to-device copy bandwidth (bytes read + written per second), the memory ceiling.
inline double copy_bandwidth_gbs(cudaStream_t stream) {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  GROUPMM_CHECK_CUDA(cudaMalloc(&a, bytes));
  GROUPMM_CHECK_CUDA(cudaMalloc(&b, bytes));
  GROUPMM_CHECK_CUDA(cudaMemsetAsync(a, 1, bytes, stream));
  const double ms = median_ms(stream, 2, 10, [&](int) {
    GROUPMM_CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

}  // namespace groupmm::tool
