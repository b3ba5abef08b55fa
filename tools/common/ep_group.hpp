// The process group of the expert-parallel benchmarks (`bench ep`, `bench moe --ep`): one
// process per GPU, the ranks from the command line or torchrun's environment, the NCCL unique id
// shared through a file. Public API only.
#pragma once

#include <cuda_runtime.h>

#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "common/timing.hpp"
#include "groupmm/ep.hpp"

namespace groupmm::tool {

// An integer from the environment, or `fallback` when unset or empty.
int env_int(const char* name, int fallback);

struct RankGroup {
  int ranks = 1, rank = 0;
};
// This process's place in the group: ranks / rank from the options when given (> 0 / >= 0), else
// WORLD_SIZE / RANK, else 1 / 0; then selects its GPU (LOCAL_RANK, else rank % device count).
// `cmd` names the command in errors.
RankGroup join_rank_group(const char* cmd, int ranks, int rank);

// This rank's end of the group on `stream`: NCCL when the build has it (with ranks > 1, rank 0
// writes the unique id to `id_file` and the others read it there), else with one rank an
// in-process transport; ranks > 1 without NCCL is a usage error.
std::unique_ptr<ep::Transport> rank_transport(const char* cmd, const RankGroup& g,
                                              const std::string& id_file, cudaStream_t stream);

// --ranks, --rank, --id-file of a command whose group is `what` ("" or "with --ep: ").
void add_rank_group_options(CLI::App& app, int& ranks, int& rank, std::string& id_file,
                            const std::string& what);

// This process's rank of a GPU group (join_rank_group; --id-file refused with one rank, where it
// has no use), calling fn(ctx, transport) on a CUDA Context of a stream of its own. Returns the
// group and fn's result.
template <class Fn>
auto run_gpu_rank(const char* cmd, int ranks, int rank, const std::string& id_file, Fn&& fn) {
  const RankGroup g = join_rank_group(cmd, ranks, rank);
  reject_option(g.ranks == 1 && !id_file.empty(), "--id-file",
                "to one rank (the NCCL unique id is shared between several ranks)");
  const GpuStream s;
  std::unique_ptr<ep::Transport> tr = rank_transport(cmd, g, id_file, s);
  Context ctx(Device::CUDA, s);
  return std::make_pair(g, fn(ctx, *tr));
}

// Capacity budgets over the uniform routing's expectation, times `factor` (rows at most T): a token
// goes to a peer holding any of its k experts, T (1 - (1 - 1/R)^k) rows; T k / R (token, slot)
// entries.
ep::EpCapacity uniform_ep_capacity(int64_t T, int64_t k, int R, double factor);

// The CPU smoke runs: `ranks` ranks as threads of this process (ep::run_in_process_group), each
// with its own CPU Context and its end of an in-process group, calling fn(ctx, transport) (a
// collective: every rank the same calls in the same order). Returns every rank's result. A rank
// that fails releases the others, and the error names it and its cause.
template <class Fn>
auto run_cpu_ranks(const char* cmd, int ranks, Fn&& fn) {
  using Result = decltype(fn(std::declval<Context&>(), std::declval<ep::Transport&>()));
  std::vector<Result> results(static_cast<size_t>(ranks));
  ep::run_in_process_group(cmd, ranks, Device::CPU, nullptr, [&](ep::InProcessTransport& tr) {
    Context ctx(Device::CPU);
    results[size_t(tr.rank())] = fn(ctx, tr);
  });
  return results;
}

}  // namespace groupmm::tool
