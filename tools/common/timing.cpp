// Timing helpers of the commands (timing.hpp).
#include "common/timing.hpp"

namespace groupmm::tool {

double graph_replay_us(Context& ctx, int warmup, int iters, const std::function<void()>& enqueue) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal));
  enqueue();
  GROUPMM_CHECK_CUDA(cudaStreamEndCapture(ctx.stream(), &graph));
  GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double us = time_us(ctx, warmup, iters,
                            [&](int) { GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, ctx.stream())); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

GpuInfo gpu_info(const Context& ctx) {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, ctx.device_index());
  return {prop.name, prop.multiProcessorCount};
}

}  // namespace groupmm::tool
