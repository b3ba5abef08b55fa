// The expert-parallel benchmarks' process group (ep_group.hpp).
#include "common/ep_group.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli.hpp"
#include "groupmm/version.hpp"
#if GROUPMM_WITH_NCCL
#include "groupmm/ep_nccl.hpp"
#endif

namespace groupmm::tool {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

ep::EpCapacity uniform_ep_capacity(int64_t T, int64_t k, int R, double factor) {
  const double rows = double(T) * (1.0 - std::pow(1.0 - 1.0 / double(R), double(k)));
  // A rank sends each peer at most its T rows: a larger C only sizes unused metadata and staging.
  return {std::max<int64_t>(1, std::min(T, int64_t(std::ceil(factor * rows)))),
          std::max<int64_t>(1, int64_t(std::ceil(factor * double(T * k) / double(R))))};
}

void add_rank_group_options(CLI::App& app, int& ranks, int& rank, std::string& id_file,
                            const std::string& what) {
  add_int(app, "--ranks", ranks, 1, 1024,
          what +
              "ranks in the group, a divisor of every chosen case's experts (default: WORLD_SIZE, "
              "else 1; --cpu: threads, default 2)");
  add_int(app, "--rank", rank, 0, 1023,
          what + "this process's rank (default: RANK, else 0; not with --cpu)");
  app.add_option("--id-file", id_file,
                 (what.empty() ? "with " : what.substr(0, what.size() - 2) + " and ") +
                     "several ranks: rank 0 writes the NCCL unique id here and the others read it "
                     "(a fresh path every run, seen by every process; not with --cpu)");
}

RankGroup join_rank_group(const char* cmd, int ranks, int rank) {
  RankGroup g;
  g.ranks = ranks > 0 ? ranks : env_int("WORLD_SIZE", 1);
  g.rank = rank >= 0 ? rank : env_int("RANK", 0);
  if (g.rank < 0 || g.rank >= g.ranks)
    throw UsageError(detail::cat(cmd, ": rank ", g.rank, " must be in [0, ranks=", g.ranks, ")"));
  int devices = 0;
  GROUPMM_CHECK_CUDA(cudaGetDeviceCount(&devices));
  GROUPMM_CHECK_CUDA(cudaSetDevice(env_int("LOCAL_RANK", g.rank % std::max(devices, 1))));
  return g;
}

#if GROUPMM_WITH_NCCL
namespace {

// Rank 0 makes the NCCL unique id and writes it to `path` (atomically, through a rename); the
// other ranks wait for it there.
ncclUniqueId shared_unique_id(const char* cmd, int rank, const std::string& path) {
  ncclUniqueId id;
  if (rank == 0) {
    id = ep::NcclTransport::unique_id();
    const std::string tmp = path + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(&id), sizeof(id));
      GROUPMM_CHECK(f.good(), cmd, ": cannot write the NCCL unique id to ", tmp);
    }
    std::filesystem::rename(tmp, path);
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(path, std::ios::binary);
    if (f && f.read(reinterpret_cast<char*>(&id), sizeof(id)) && f.gcount() == sizeof(id))
      return id;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  GROUPMM_CHECK(false, cmd, ": rank ", rank, " waited 120 s for the NCCL unique id in ", path,
                " (rank 0 writes it)");
  return id;
}

}  // namespace
#endif

std::unique_ptr<ep::Transport> rank_transport(const char* cmd, const RankGroup& g,
                                              const std::string& id_file, cudaStream_t stream) {
#if GROUPMM_WITH_NCCL
  (void)stream;
  if (g.ranks > 1 && id_file.empty())
    throw UsageError(detail::cat(cmd, ": ranks > 1 needs --id-file (a path every process sees)"));
  return ep::NcclTransport::create(
      g.ranks > 1 ? shared_unique_id(cmd, g.rank, id_file) : ep::NcclTransport::unique_id(),
      g.ranks, g.rank);
#else
  (void)id_file;
  if (g.ranks > 1)
    throw UsageError(
        detail::cat(cmd, ": ranks > 1 needs a build with NCCL (GROUPMM_WITH_NCCL is 0)"));
  return std::move(ep::make_in_process_group(1, Device::CUDA, stream)[0]);
#endif
}

}  // namespace groupmm::tool
