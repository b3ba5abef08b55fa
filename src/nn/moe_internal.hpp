// nn::MoE's internals shared by moe.cpp (the layer) and moe_chunked.cpp (the chunked
// expert-parallel step): the exchanges' stream and small rules of the configuration.
#pragma once

#include <memory>
#include <vector>

#include "groupmm/nn/moe.hpp"

namespace groupmm::nn {

// Capacity mode's expert buffer is sized for the budget (R * C_e rows); the experts own only the
// rows received, so the expert MLP runs with SplitsTotal::at_most over the plan's
// splits_at_most and neither reads nor writes the tail.
inline bool capacity_ep(const MoEConfig& c) {
  return c.ep.enabled() && c.ep.mode == ep::EpMode::capacity;
}

// The expert-parallel layout of the block: all E experts over R ranks, hidden H, top-k.
inline ep::EpConfig ep_config_of(const MoEConfig& c, int64_t ranks) {
  return {c.experts, ranks, c.hidden, c.topk};
}

// The exchanges' stream of a chunked step (CUDA, over a transport with concurrent_streams()):
// a Context on a stream of the layer's own, and the events that order it against the caller's
// stream. Every forward and backward forks onto it after the plan and joins back before its last
// op, so a captured step stays one graph and nothing is left on it between calls. Without it
// (x() is the caller's Context) the chunks run in order on one stream.
struct MoE::Streams {
  cudaStream_t stream = nullptr;
  std::unique_ptr<Context> xctx;
  cudaEvent_t to_x = nullptr, to_main = nullptr;  // re-recorded before each wait
  std::vector<cudaEvent_t> dispatched;            // [chunks]: chunk c's rows have arrived

  Streams(const Context& ctx, int64_t chunks) {
    GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    try {
      xctx = std::make_unique<Context>(ctx.device(), stream);
      for (cudaEvent_t* e : {&to_x, &to_main})
        GROUPMM_CHECK_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
      dispatched.assign(size_t(chunks), nullptr);
      for (cudaEvent_t& e : dispatched)
        GROUPMM_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } catch (...) {
      release();
      throw;
    }
  }
  ~Streams() { release(); }
  void release() noexcept {
    for (cudaEvent_t e : dispatched)
      if (e != nullptr) cudaEventDestroy(e);
    for (cudaEvent_t e : {to_x, to_main})
      if (e != nullptr) cudaEventDestroy(e);
    xctx.reset();
    if (stream != nullptr) cudaStreamDestroy(stream);
    stream = nullptr;
  }
  // `to` waits for what `from` has enqueued so far.
  static void order(cudaEvent_t e, cudaStream_t from, cudaStream_t to) {
    GROUPMM_CHECK_CUDA(cudaEventRecord(e, from));
    GROUPMM_CHECK_CUDA(cudaStreamWaitEvent(to, e, 0));
  }

  // The chunk pipeline of both directions (moe_chunked.cpp), s null: everything in order on ctx
  // (xc is ctx). move(c) sends chunk c's rows to the experts on xc, one chunk ahead; beside() runs
  // on ctx while chunk 0's rows move; compute(c) runs chunk c's experts on ctx once its rows
  // arrived; home(c) sends its results home on xc after them. xc waits for what ctx enqueued
  // before (the inputs), and ctx for every exchange at the end.
  template <class Move, class Beside, class Compute, class Home>
  static void pipeline(Streams* s, Context& ctx, Context& xc, int64_t n, Move&& move,
                       Beside&& beside, Compute&& compute, Home&& home) {
    const auto send = [&](int64_t c) {
      move(c);
      if (s) GROUPMM_CHECK_CUDA(cudaEventRecord(s->dispatched[size_t(c)], xc.stream()));
    };
    if (s) order(s->to_x, ctx.stream(), xc.stream());
    send(0);
    beside();
    for (int64_t c = 0; c < n; ++c) {
      if (c + 1 < n) send(c + 1);
      if (s) GROUPMM_CHECK_CUDA(cudaStreamWaitEvent(ctx.stream(), s->dispatched[size_t(c)], 0));
      compute(c);
      if (s) order(s->to_x, ctx.stream(), xc.stream());  // its results written
      home(c);
    }
    if (s) order(s->to_main, xc.stream(), ctx.stream());  // join
  }
};

}  // namespace groupmm::nn
