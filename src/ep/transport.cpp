// The in-process transport: R ranks as threads sharing one hub (tests and CI run EP without
// several GPUs). A host group copies with memcpy; a device group enqueues cudaMemcpyAsync on the
// one stream every rank uses.
#include <barrier>
#include <cstring>

#include "groupmm/ep.hpp"

namespace groupmm::ep {

// Each rank posts pointers to its send side, then every rank pulls its blocks from all peers.
// Two barrier phases per collective: after posting (everything is visible) and after pulling (no
// sender returns, and reuses or frees its buffer, while a peer still reads it; on a device group,
// no rank enqueues work that rewrites its buffers before every copy from them is enqueued ahead of
// it on the shared stream).
class InProcessHub {
 public:
  InProcessHub(int ranks, Device device, cudaStream_t stream)
      : ranks_(ranks), device_(device), stream_(stream), barrier_(ranks), posts_(size_t(ranks)) {}
  struct Post {
    const void* data = nullptr;
    const int64_t* counts = nullptr;   // bytes (all_to_all_v) or nullptr (counts exchange)
    const int64_t* offsets = nullptr;  // bytes
  };
  int ranks() const { return ranks_; }
  Device device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  Post& post(int r) { return posts_[size_t(r)]; }
  void sync() { barrier_.arrive_and_wait(); }

 private:
  int ranks_;
  Device device_;
  cudaStream_t stream_;
  std::barrier<> barrier_;
  std::vector<Post> posts_;  // slot r is written by rank r only, between barriers
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
  hub_->sync();
  for (int p = 0; p < R; ++p) {
    const auto* src = static_cast<const int64_t*>(hub_->post(p).data) + int64_t(rank_) * n;
    if (n > 0) std::memcpy(recv + int64_t(p) * n, src, size_t(n) * sizeof(int64_t));
  }
  hub_->sync();
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
  hub_->sync();
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
  hub_->sync();
  GROUPMM_CHECK(bad_peer < 0, "InProcessTransport::all_to_all_v: rank ", rank_,
                " expected recv_counts[", bad_peer, "]=", bad_peer < 0 ? 0 : recv_counts[bad_peer],
                " bytes but peer ", bad_peer, " sends ", bad_count);
  GROUPMM_CHECK_CUDA(err);
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

}  // namespace groupmm::ep
