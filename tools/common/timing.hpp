// Timing and the GPU stream of the commands (bench suites and demos): CUDA events on a CUDA
// Context's stream, the host clock on a CPU one, CUDA-graph replay, host time per call.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "groupmm/core.hpp"

namespace groupmm::tool {

// Throws groupmm::Error "CMD: needs an sm_90 GPU (none visible)HINT" when no GPU is usable.
inline void require_gpu(const std::string& cmd, const std::string& hint = "") {
  GROUPMM_CHECK(cuda_available(), cmd, ": needs an sm_90 GPU (none visible)", hint);
}

// A non-blocking stream of the current GPU for a command's run (none when `gpu` is false: the
// CPU backend). Declare it before the Context and buffers that use it, so they go first.
class GpuStream {
 public:
  explicit GpuStream(bool gpu = true) {
    if (gpu) GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  }
  ~GpuStream() {
    if (s_) cudaStreamDestroy(s_);
  }
  GpuStream(const GpuStream&) = delete;
  GpuStream& operator=(const GpuStream&) = delete;
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

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

// Median ms of `fn` over `iters` runs after 3 warm-ups, each run alone between two CUDA events and
// synchronized (the host's launch work of each call is in the number).
template <class F>
double synced_median_ms(cudaStream_t stream, int iters, F&& fn) {
  cudaEvent_t a, b;
  GROUPMM_CHECK_CUDA(cudaEventCreate(&a));
  GROUPMM_CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    GROUPMM_CHECK_CUDA(cudaEventRecord(a, stream));
    fn();
    GROUPMM_CHECK_CUDA(cudaEventRecord(b, stream));
    GROUPMM_CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    GROUPMM_CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Device time per call: `reps` calls captured into one CUDA graph, the median over `iters`
// replays (synced_median_ms) divided by reps. The GPU runs the calls back to back, as in a
// captured training step, so the host's per-call launch work is not in the number.
template <class F>
double graph_per_call_ms(cudaStream_t stream, int iters, int reps, F&& fn) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) fn();
  GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double ms =
      synced_median_ms(stream, iters, [&] { GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms / reps;
}

// Median us of one CUDA-graph replay of the work `enqueue` puts on ctx's stream (captured once),
// after `warmup` replays.
double graph_replay_us(Context& ctx, int warmup, int iters, const std::function<void()>& enqueue);

// The GPU of a Context, for the first line of a report: name and SM count.
struct GpuInfo {
  std::string name;
  int sms = 0;
};
GpuInfo gpu_info(const Context& ctx);

}  // namespace groupmm::tool
