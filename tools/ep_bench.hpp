// `groupmm bench ep`: expert-parallel dispatch and combine (tools/ep_bench.cpp), as a function the
// command line calls. Public API only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace groupmm::tool {

struct EpBenchOptions {
  // Cases: dsv3 (DeepSeek-V3-like: H=7168, E=256, k=8) and qwen3 (Qwen3-30B-A3B: H=2048, E=128,
  // k=8), T tokens a rank, bf16 rows, uniform random top-k routing. Empty = all.
  std::vector<std::string> cases;
  int64_t tokens = 0;            // T per rank; 0: 4096 (GPU), 64 (CPU)
  double capacity_factor = 1.5;  // capacity mode's budgets over the uniform routing's expectation
  int iters = 20;
  int warmup = 3;
  // The process group: one process per GPU. ranks / rank default to the WORLD_SIZE / RANK
  // environment (torchrun's), else 1 / 0; the GPU is LOCAL_RANK, else rank % device count. With
  // ranks > 1 (NCCL builds only), rank 0 writes the NCCL unique id to id_file and the others
  // read it there (a path every process sees).
  int ranks = 0, rank = -1;
  std::string id_file;
  bool cpu = false;  // smoke run: `ranks` (default 2) ranks as threads on the CPU reference backend
  std::string json;  // rank 0 writes its records here
};

// Per case and mode (throughput, capacity): the plan, dispatch and combine times of this rank
// (median; each is a collective, so it includes waiting for the slowest peer), the bytes this rank
// sends to other ranks and its GB/s. Each case is validated first (identity experts: the combine
// of the dispatched rows gives x[t] * sum_j w[t, j]). Rank 0 prints. Returns 0 when every case
// validated. A third mode, throughput_fp8 (cases with H a multiple of 128): quantizing this rank's
// tokens plus ep_dispatch_fp8 on the throughput plan, timed together (its combine is the 16-bit
// one), checked against quantizing ep_dispatch's rows.
int run_bench_ep(const EpBenchOptions& o);

}  // namespace groupmm::tool
