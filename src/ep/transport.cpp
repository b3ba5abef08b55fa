// The in-process transport: R ranks as threads sharing one hub (tests and CI run EP without
// several GPUs). A host group copies with memcpy; a device group enqueues cudaMemcpyAsync on the
// one stream every rank uses.
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "groupmm/ep.hpp"

namespace groupmm::ep {

// Each rank posts pointers to its send side, then every rank pulls its blocks from all peers.
// Two barrier phases per collective: after posting (everything is visible) and after pulling (no
// sender returns, and reuses or frees its buffer, while a peer still reads it; on a device group,
// no rank enqueues work that rewrites its buffers before every copy from them is enqueued ahead of
// it on the shared stream). The barrier can be aborted: once a rank has failed, no rank waits.
class InProcessHub {
 public:
  InProcessHub(int ranks, Device device, cudaStream_t stream)
      : ranks_(ranks), device_(device), stream_(stream), posts_(size_t(ranks)) {}
  struct Post {
    const void* data = nullptr;
    const int64_t* counts = nullptr;   // bytes (all_to_all_v) or nullptr (counts exchange)
    const int64_t* offsets = nullptr;  // bytes
  };
  int ranks() const { return ranks_; }
  Device device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  Post& post(int r) { return posts_[size_t(r)]; }

  // Waits until every rank has arrived (the barrier of one phase), or throws once a rank failed.
  void sync(int rank) {
    std::unique_lock<std::mutex> lock(mutex_);
    throw_if_failed(rank);
    const uint64_t phase = phase_;
    if (++arrived_ == ranks_) {
      arrived_ = 0;
      ++phase_;
      cv_.notify_all();
      return;
    }
    fail_if_stranded();
    cv_.wait(lock, [&] { return phase_ != phase || failed_rank_ >= 0; });
    if (phase_ == phase) throw_if_failed(rank);
  }
  void abort(int rank, const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail(rank, why);
  }
  // Rank `rank` has returned (run_in_process_group): a rank waiting for it would wait forever.
  void leave(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (left_++ == 0) first_left_ = rank;
    fail_if_stranded();
  }
  // The first failure: rank (or -1) and cause.
  std::pair<int, std::string> failure() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {failed_rank_, why_};
  }

 private:
  // The first failure is the cause; later ones are the releases it caused.
  void fail(int rank, const std::string& why) {
    if (failed_rank_ >= 0) return;
    failed_rank_ = rank;
    why_ = why;
    cv_.notify_all();
  }
  void fail_if_stranded() {
    if (arrived_ > 0 && arrived_ + left_ == ranks_)
      fail(first_left_,
           "it returned while other ranks waited for it in a collective (the ranks "
           "must make the same collectives in the same order)");
  }
  void throw_if_failed(int rank) const {
    GROUPMM_CHECK(failed_rank_ < 0, "InProcessTransport: rank ", rank, " released: rank ",
                  failed_rank_, " of the group failed: ", why_);
  }

  int ranks_;
  Device device_;
  cudaStream_t stream_;
  std::vector<Post> posts_;  // slot r is written by rank r only, between barriers
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;     // ranks waiting in the current phase
  uint64_t phase_ = 0;  // completed phases
  int left_ = 0;        // ranks that have returned
  int first_left_ = -1;
  int failed_rank_ = -1;
  std::string why_;
};

InProcessTransport::InProcessTransport(std::shared_ptr<InProcessHub> hub, int rank)
    : hub_(std::move(hub)), rank_(rank) {}

int InProcessTransport::size() const {
  return hub_->ranks();
}

Device InProcessTransport::device() const {
  return hub_->device();
}

cudaStream_t InProcessTransport::stream() const {
  return hub_->stream();
}

void InProcessTransport::all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) {
  const int R = size();
  hub_->post(rank_) = {send, nullptr, nullptr};
  hub_->sync(rank_);
  for (int p = 0; p < R; ++p) {
    const auto* src = static_cast<const int64_t*>(hub_->post(p).data) + int64_t(rank_) * n;
    if (n > 0) std::memcpy(recv + int64_t(p) * n, src, size_t(n) * sizeof(int64_t));
  }
  hub_->sync(rank_);
}

void InProcessTransport::all_to_all_v(const void* send, const int64_t* send_counts,
                                      const int64_t* send_offsets, void* recv,
                                      const int64_t* recv_counts, const int64_t* recv_offsets,
                                      cudaStream_t stream) {
  const int R = size();
  const bool dev = hub_->device() == Device::CUDA;
  // Checked on every rank before the first barrier: all ranks see the same kind of mistake.
  GROUPMM_CHECK(!dev || stream == hub_->stream(), "InProcessTransport::all_to_all_v: rank ", rank_,
                " runs on another stream than the device group's (make every rank's Context on "
                "the stream given to make_in_process_group)");
  last_sent_.assign(send_counts, send_counts + R);
  hub_->post(rank_) = {send, send_counts, send_offsets};
  hub_->sync(rank_);
  // A count mismatch is reported after the second barrier, so the peers are not left waiting.
  int bad_peer = -1;
  int64_t bad_count = 0;
  cudaError_t err = cudaSuccess;
  for (int p = 0; p < R; ++p) {
    const InProcessHub::Post& in = hub_->post(p);
    const int64_t bytes = in.counts[rank_];
    if (bytes != recv_counts[p]) {
      if (bad_peer < 0) bad_peer = p, bad_count = bytes;
      continue;
    }
    if (bytes == 0) continue;
    char* dst = static_cast<char*>(recv) + recv_offsets[p];
    const char* src = static_cast<const char*>(in.data) + in.offsets[rank_];
    if (dev) {
      if (err == cudaSuccess)
        err = cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, stream);
    } else {
      std::memcpy(dst, src, size_t(bytes));
    }
  }
  hub_->sync(rank_);
  GROUPMM_CHECK(bad_peer < 0, "InProcessTransport::all_to_all_v: rank ", rank_,
                " expected recv_counts[", bad_peer, "]=", bad_peer < 0 ? 0 : recv_counts[bad_peer],
                " bytes but peer ", bad_peer, " sends ", bad_count);
  GROUPMM_CHECK_CUDA(err);
}

void InProcessTransport::abort(const std::string& why) {
  hub_->abort(rank_, why);
}

std::vector<std::unique_ptr<InProcessTransport>> make_in_process_group(int ranks, Device device,
                                                                       cudaStream_t stream) {
  GROUPMM_CHECK(ranks >= 1, "make_in_process_group: ranks=", ranks, " must be >= 1");
  GROUPMM_CHECK(device == Device::CUDA || stream == nullptr,
                "make_in_process_group: a stream is only used by a Device::CUDA group");
  auto hub = std::make_shared<InProcessHub>(ranks, device, stream);
  std::vector<std::unique_ptr<InProcessTransport>> group;
  for (int r = 0; r < ranks; ++r) group.push_back(std::make_unique<InProcessTransport>(hub, r));
  return group;
}

void run_in_process_group(const char* op, int ranks, Device device, cudaStream_t stream,
                          const std::function<void(InProcessTransport&)>& fn) {
  auto group = make_in_process_group(ranks, device, stream);
  std::vector<std::thread> threads;
  threads.reserve(size_t(ranks));
  InProcessHub& hub = *group[0]->hub_;
  for (int r = 0; r < ranks; ++r) {
    InProcessTransport& tr = *group[size_t(r)];
    try {
      threads.emplace_back([&tr, &fn, &hub] {
        try {
          fn(tr);
          hub.leave(tr.rank());
        } catch (const std::exception& e) {
          tr.abort(e.what());
        } catch (...) {
          tr.abort("an exception that is not a std::exception");
        }
      });
    } catch (const std::system_error& e) {
      // The ranks already started are released from their first collective; none after r starts.
      tr.abort(detail::cat("its thread could not be started (", e.what(), ")"));
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  const auto [rank, why] = hub.failure();
  GROUPMM_CHECK(rank < 0, op, ": rank ", rank, " failed: ", why);
}

}  // namespace groupmm::ep
