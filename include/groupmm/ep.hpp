// groupmm/ep.hpp: expert parallelism (EP): token dispatch to the ranks that hold a token's experts,
// and the combine that brings the expert outputs back, over an abstract transport.
//
// Setting: R ranks, E experts split evenly (rank r holds experts [r E/R, (r + 1) E/R), its
// E_l = E/R *local* experts). Each rank has its own T_r tokens x [T_r, H] and their routing
// expert_ids [T_r, k] (moe_router_forward's output). One EP layer step on every rank:
//
//   plan = ep_dispatch_plan(ctx, tr, cfg, expert_ids)        count + metadata exchange
//   xg   = Tensor [plan.rows, H]                             caller-allocated, host-known now
//   ep_dispatch(ctx, tr, plan, x, xg)                        rows to the expert ranks
//   yg   = grouped expert MLP(xg, plan.splits)               E_l groups, ready for grouped GEMMs
//   ep_combine(ctx, tr, plan, yg, weights, y)                outputs home, weighted fixed-order sum
//
// Every call is a collective: all R ranks make the same calls in the same order (like NCCL).
//
// Ordering rules (what makes the results reproducible and equal to a one-rank layer):
// - Dispatch sends each token row ONCE to each rank that holds at least one of its k experts (not
//   once per (token, slot)). A receiving rank orders its received rows by source rank, then source
//   token index.
// - The expert-grouped buffer xg holds local expert 0's rows, then expert 1's, ...; within an
//   expert, the entries (token, slot j) naming it, in (source rank, token, j) order. A row two
//   local experts need is received once and copied into both groups (and a token naming one expert
//   twice gets two rows, as moe_permute does). With the global token order "rank 0's tokens, then
//   rank 1's, ...", xg is exactly the slice of a one-rank dropless moe_permute (align 1) that holds
//   this rank's experts.
// - Combine returns every (token, slot) output row to the token's home rank (k rows per token at
//   most: summing on the expert rank would reorder the fp32 sum), and the home rank computes
//   y[t] = sum_j weights[t, j] * y_(t, j) in fp32, slot 0 first, rounded once: bit-identical to a
//   one-rank layer that loops the slots in order, whatever R is.
//
// Mode: *throughput* (implemented): the per-peer row counts are exchanged first, so every transfer
// moves exact bytes and the receive buffers are sized from them; this reads counts on the host, so
// it is not graph safe. A graph-safe *capacity* mode (fixed per-peer capacity, buffers sized from
// host-known bounds, counts carried in-band, overflow reported through the status block) is future
// work, as are FP8 dispatch (quantized rows + scales) and the backward passes
// (ep_dispatch_backward, ep_combine_backward).
//
// Backends: the CPU backend (Device::CPU contexts, host memory) is the reference. On a CUDA Context
// every op throws "not implemented yet on CUDA". Host-side validation throws groupmm::Error naming
// the op, the argument and the value; it happens before the first exchange, so an error every
// rank sees (E % R != 0, bad shapes) fails every rank cleanly, while one seen by only some ranks
// (an expert id out of range on one rank) leaves the others waiting in the exchange.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "groupmm/core.hpp"

namespace groupmm::ep {

// ================================================================================================
// Transport: the collectives the EP algorithms need
// ================================================================================================

// A group of size() ranks; this object is rank(). Both calls are blocking collectives on host
// memory. Implementations: InProcessTransport (below: R ranks as threads of one process, for tests
// and CI) and, planned, an NCCL transport that wraps a caller-created ncclComm_t (the caller owns
// the communicator and its lifetime; it uses grouped ncclSend/ncclRecv on the Context's stream and
// leaves NVLS off: NCCL_NVLS_ENABLE=0, NVLink multicast is not used).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The count exchange: send [size() * n] int64, block p (n values) goes to peer p; recv
  // [size() * n] receives peer p's block for this rank at block p.
  virtual void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) = 0;
  // Variable-size all-to-all of bytes: send_counts[p] bytes from send + send_offsets[p] go to peer
  // p and land at recv + recv_offsets[p] there; recv_counts[p] must equal what peer p sends to this
  // rank (exchanged beforehand with all_to_all_counts). All arrays have size() entries.
  virtual void all_to_all_v(const void* send, const int64_t* send_counts,
                            const int64_t* send_offsets, void* recv, const int64_t* recv_counts,
                            const int64_t* recv_offsets) = 0;
};

class InProcessHub;  // mailboxes + barrier shared by the ranks of one in-process group

// R ranks as threads of one process: each collective posts this rank's send buffer in the shared
// hub, waits at a barrier, copies what every peer posted for it, and waits again (so no peer frees
// its buffer early). Each rank's transport must be used by one thread at a time, and all R ranks
// must take part in every collective. Records the bytes of the last all_to_all_v, per peer (tests
// check that a row crosses to a rank once).
class InProcessTransport final : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessHub> hub, int rank);
  int rank() const override { return rank_; }
  int size() const override;
  void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) override;
  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                    void* recv, const int64_t* recv_counts, const int64_t* recv_offsets) override;
  // Bytes this rank sent to each peer (itself included) in its last all_to_all_v.
  const std::vector<int64_t>& last_sent_bytes() const { return last_sent_; }

 private:
  std::shared_ptr<InProcessHub> hub_;
  int rank_;
  std::vector<int64_t> last_sent_;
};

// R >= 1 transports of one group; element r is rank r. Hand each to its own thread.
std::vector<std::unique_ptr<InProcessTransport>> make_in_process_group(int ranks);

// ================================================================================================
// Dispatch and combine
// ================================================================================================

struct EpConfig {
  int64_t experts = 0;  // E, >= 1, divisible by ranks
  int64_t ranks = 0;    // R, must equal transport.size()
  int64_t hidden = 0;   // H, >= 1
  int64_t topk = 0;     // k, 1..min(E, 32)
  std::string to_string() const;
};

// What a dispatch decided, for the dispatch itself and the combine that undoes it. Host metadata
// (std::vector) plus the local splits on the Context's device. Built by ep_dispatch_plan; treat
// the vectors as read-only.
struct EpPlan {
  EpConfig cfg;
  int rank = 0;
  int64_t tokens = 0;         // T of this rank
  int64_t local_experts = 0;  // E_l = E / R
  int64_t rows_received = 0;  // unique rows this rank receives (each sent once)
  int64_t rows = 0;           // rows of the expert-grouped buffer (entries for local experts)
  Tensor splits;              // [E_l] int32: rows of each local expert in the grouped buffer
  std::vector<int64_t> splits_host;  // the same, on the host
  // Sender side (forward rows): per peer, the local tokens sent to it, in token order.
  std::vector<int64_t> send_rows, send_offsets;  // [R] counts / prefix offsets into send_token
  std::vector<int64_t> send_token;               // [sum send_rows] token index
  // Receiver side: per peer, rows received; for each grouped row, the received row it copies.
  std::vector<int64_t> recv_rows, recv_offsets;  // [R]
  std::vector<int64_t> grouped_src;              // [rows] received row index
  // Combine: entries sent back, in (source rank, received row, slot) order, as grouped rows.
  std::vector<int64_t> back_send_entries;  // [R] entries sent back to each home rank
  std::vector<int64_t> back_grouped;       // [rows] grouped row of each entry, in send order
  // Home side of combine: entries coming back from each expert rank, and their (t, j) slot.
  std::vector<int64_t> back_recv_entries;  // [R]
  std::vector<int64_t> back_slot;          // [sum back_recv_entries] t * k + j
  std::string to_string() const;
};

// The count and metadata exchange of a dispatch (collective). expert_ids [T, k] int32 or int64
// (host memory on a CPU Context), ids in [0, E). T may differ per rank (0 too). Sends each peer the
// number of rows it will get, then per row its token's local expert slots. Not graph safe.
EpPlan ep_dispatch_plan(Context& ctx, Transport& tr, const EpConfig& cfg,
                        const TensorView& expert_ids);

// Moves the token rows (collective): x [T, H] bf16, fp16 or fp32 (moved as bytes), row-major,
// contiguous; x_grouped out [plan.rows, H], x's dtype, ordered as the header says (ready for
// grouped GEMMs with plan.splits). May not alias. Not graph safe.
void ep_dispatch(Context& ctx, Transport& tr, const EpPlan& plan, const TensorView& x,
                 const TensorView& x_grouped);

// Brings the expert outputs home and sums them (collective): y_grouped [plan.rows, H] (the
// expert MLP's output in x_grouped's row order), weights [T, k] fp32 (router weights), out [T, H];
// y_grouped and out bf16, fp16 or fp32 (one dtype). out[t] = sum_j weights[t, j] * y_(t, j) in
// fp32, slot order, rounded once; a token with no experts gets 0. Not graph safe.
void ep_combine(Context& ctx, Transport& tr, const EpPlan& plan, const TensorView& y_grouped,
                const TensorView& weights, const TensorView& out);

}  // namespace groupmm::ep
