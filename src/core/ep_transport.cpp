// The in-process transport: R ranks as threads sharing one hub (tests and CI run EP without GPUs).
#include <barrier>
#include <cstring>
#include <mutex>

#include "groupmm/ep.hpp"

namespace groupmm::ep {

// Each rank posts pointers to its send side, then every rank pulls its blocks from all peers.
// Two barrier phases per collective: after posting (everything is visible) and after pulling (no
// sender returns, and reuses or frees its buffer, while a peer still reads it).
class InProcessHub {
 public:
  explicit InProcessHub(int ranks) : ranks_(ranks), barrier_(ranks), posts_(size_t(ranks)) {}
  struct Post {
    const void* data = nullptr;
    const int64_t* counts = nullptr;   // bytes (all_to_all_v) or nullptr (counts exchange)
    const int64_t* offsets = nullptr;  // bytes
  };
  int ranks() const { return ranks_; }
  Post& post(int r) { return posts_[size_t(r)]; }
  void sync() { barrier_.arrive_and_wait(); }

 private:
  int ranks_;
  std::barrier<> barrier_;
  std::vector<Post> posts_;  // slot r is written by rank r only, between barriers
};

InProcessTransport::InProcessTransport(std::shared_ptr<InProcessHub> hub, int rank)
    : hub_(std::move(hub)), rank_(rank) {}

int InProcessTransport::size() const {
  return hub_->ranks();
}

void InProcessTransport::all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) {
  const int R = size();
  hub_->post(rank_) = {send, nullptr, nullptr};
  hub_->sync();
  for (int p = 0; p < R; ++p) {
    const auto* src = static_cast<const int64_t*>(hub_->post(p).data) + int64_t(rank_) * n;
    std::memcpy(recv + int64_t(p) * n, src, size_t(n) * sizeof(int64_t));
  }
  hub_->sync();
}

void InProcessTransport::all_to_all_v(const void* send, const int64_t* send_counts,
                                      const int64_t* send_offsets, void* recv,
                                      const int64_t* recv_counts, const int64_t* recv_offsets) {
  const int R = size();
  last_sent_.assign(send_counts, send_counts + R);
  hub_->post(rank_) = {send, send_counts, send_offsets};
  hub_->sync();
  // A count mismatch is reported after the second barrier, so the peers are not left waiting.
  int bad_peer = -1;
  int64_t bad_count = 0;
  for (int p = 0; p < R; ++p) {
    const InProcessHub::Post& in = hub_->post(p);
    const int64_t bytes = in.counts[rank_];
    if (bytes != recv_counts[p]) {
      if (bad_peer < 0) bad_peer = p, bad_count = bytes;
      continue;
    }
    if (bytes > 0)
      std::memcpy(static_cast<char*>(recv) + recv_offsets[p],
                  static_cast<const char*>(in.data) + in.offsets[rank_], size_t(bytes));
  }
  hub_->sync();
  GROUPMM_CHECK(bad_peer < 0, "InProcessTransport::all_to_all_v: rank ", rank_,
                " expected recv_counts[", bad_peer, "]=", bad_peer < 0 ? 0 : recv_counts[bad_peer],
                " bytes but peer ", bad_peer, " sends ", bad_count);
}

std::vector<std::unique_ptr<InProcessTransport>> make_in_process_group(int ranks) {
  GROUPMM_CHECK(ranks >= 1, "make_in_process_group: ranks=", ranks, " must be >= 1");
  auto hub = std::make_shared<InProcessHub>(ranks);
  std::vector<std::unique_ptr<InProcessTransport>> group;
  for (int r = 0; r < ranks; ++r) group.push_back(std::make_unique<InProcessTransport>(hub, r));
  return group;
}

}  // namespace groupmm::ep
