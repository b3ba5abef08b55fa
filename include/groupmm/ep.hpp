// groupmm/ep.hpp: expert parallelism (EP): token dispatch to the ranks that hold a token's experts,
// the combine that brings the expert outputs back, and the backward of both, over an abstract
// transport (in-process for tests, NCCL in groupmm/ep_nccl.hpp).
//
// Setting: R ranks, E experts split evenly (rank r holds experts [r E/R, (r + 1) E/R), its
// E_l = E/R *local* experts). Each rank has its own T_r tokens x [T_r, H] and their routing
// expert_ids [T_r, k] and weights [T_r, k] (moe_router_forward's outputs). One EP layer step on
// every rank:
//
//   plan = ep_dispatch_plan(ctx, tr, cfg, expert_ids)        throughput mode (or: a capacity plan)
//   xg   = Tensor [plan.rows, H]                             caller-allocated, host-known now
//   ep_dispatch(ctx, tr, plan, x, xg)                        rows to the expert ranks
//   yg   = grouped expert MLP(xg, plan.splits)               E_l groups, ready for grouped GEMMs
//   ep_combine(ctx, tr, plan, yg, weights, y)                outputs home, weighted fixed-order sum
//   ...
//   ep_combine_backward(ctx, tr, plan, dy, weights, yg, d_yg, d_weights)
//   d_xg = grouped expert MLP backward(d_yg)
//   ep_dispatch_backward(ctx, tr, plan, d_xg, dx)
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
// - The backward passes move the same data the other way round. ep_combine_backward sends dy[t]
//   (and its k weights) once to each rank holding one of t's experts, where
//   d_yg[(t, j)] = weights[t, j] * dy[t] (fp32 product, rounded once) and
//   d_weights[t, j] = dot(dy[t], y_(t, j)) in fp32 in the fixed order of ep_dot_order (below),
//   which travels home as one float per entry. ep_dispatch_backward returns every entry's gradient
//   row home, which sums them in slot order (fp32, rounded once): dx[t] = sum_j d_xg[(t, j)], the
//   one-rank moe_permute_backward bit for bit (a row copied into two local groups gets both
//   gradients).
//
// Two modes (EpPlan::mode), the same four data movers:
// - *throughput* (ep_dispatch_plan): the per-peer row counts are exchanged first, so every transfer
//   moves exact bytes and the buffers are sized from them. The sizes are read on the host, so the
//   plan is not graph safe: a CUDA plan is built by kernels, exchanges the counts device to device
//   and synchronizes once, to read them (no host pass over the tokens; past E / R = 1021 or
//   R = 511 the host code builds it from the ids read on the host); the CPU plan is host loops.
//   The movers allocate their staging buffers (stream-ordered) per call, for the rows other ranks
//   send or get only (none at R = 1: a rank's own rows are read in place).
// - *capacity* (ep_capacity_plan_create once, ep_capacity_plan every step): a host-known capacity
//   per peer, EpCapacity{rows_per_peer C, entries_per_peer C_e}. Every buffer is sized from it and
//   allocated once, in the plan; each exchange moves fixed blocks (C rows, or C_e entries, per
//   peer) whatever the routing, with the counts carried in-band; the plan data lives on the
//   Context's device. ep_capacity_plan and the four movers are graph safe on CUDA: no host sync,
//   no host read of counts or ids, no allocation; routing may change between graph replays.
//   Overflow is dropped deterministically and reported, never written out of bounds: a home rank
//   sends peer q its tokens that need q in token order while both budgets hold (at most C rows
//   and C_e (token, slot) entries); the first token that does not fit and every later token that
//   needs q are not sent to q (their slots on q are dropped: the combine skips them, their
//   d_weights and d_x contributions are 0, as moe_permute's capacity drops). Each drop sets
//   kFaultEpCapacity in the Context's status block (op ep_dispatch, group = the peer rank,
//   value = the rows that peer needed, or the entries when the rows fit); Context::check() throws
//   it. The expert-grouped buffer has plan.rows = R * C_e rows; the rows past the last local
//   expert's are zero (unless EpCapacity::zero_tail is false) and counted in splits[E_l - 1], so
//   sum(splits) == rows (the grouped GEMM's contract, as moe_permute's tail). plan.splits_at_most
//   holds the same splits without the tail (plan.entry_splits()): the splits of the expert MLP's
//   ops in their SplitsTotal::at_most mode (grouped GEMMs, the quantizers, weighted SwiGLU, dbias),
//   which then neither read nor write the tail, so the experts compute the rows received only,
//   whatever the capacity (nn::MoE does this). When nothing overflows, every output equals
//   throughput mode's bit for bit (xg's first sum(entries) rows and all of y, dx, d_weights).
//
// Backends: the CPU backend (Device::CPU contexts, host memory, a host transport) is the
// reference; the CUDA backend (sm_90) runs on a CUDA Context with a transport whose buffers live on
// the device (Transport::device() == Device::CUDA: the NCCL transport, or the in-process group made
// with Device::CUDA) and agrees with the CPU backend bit for bit. Host-side validation throws
// groupmm::Error naming the op, the argument and the value; it happens before the first exchange,
// so an error every rank sees (E % R != 0, bad shapes) fails every rank cleanly, while one seen by
// only some ranks (an expert id out of range on one rank) leaves the others waiting in the
// exchange. The throughput plan throws on an id outside [0, E) (naming the first one; a CUDA plan
// finds it on the device and throws when it reads the sizes, after the count exchange); the
// capacity plan (device data on CUDA) skips such an entry and reports kFaultBadIndex. An id of -1
// is no error: the slot names no expert (nothing moves for it, the combine skips it, its
// d_weights are 0), which the chunked plans below use for the experts of other chunks.
//
// Chunked steps (EpChunkedPlan, below) split the local experts into n consecutive groups and give
// each group its own plan, so that the exchange of one group runs while the experts of another
// compute; every result stays the unchunked step's, bit for bit.
// Minimum SM: sm_90 (CUDA); the CPU backend runs anywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "groupmm/core.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm::ep {

// ================================================================================================
// Transport: the collectives the EP algorithms need
// ================================================================================================

// A group of size() ranks; this object is rank(). Implementations: InProcessTransport (R ranks as
// threads of one process, host or device buffers) and NcclTransport (groupmm/ep_nccl.hpp).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where all_to_all_v's buffers live: host memory (Device::CPU: the call is blocking) or device
  // memory (Device::CUDA: the call is enqueued on `stream` and returns without waiting for it).
  virtual Device device() const = 0;
  // The count exchange, on host memory, blocking (a device transport synchronizes): send
  // [size() * n] int64, block p (n values) goes to peer p; recv [size() * n] receives peer p's
  // block for this rank at block p. Used by the throughput plan's host build only (the CPU
  // backend's; a CUDA plan exchanges its counts in device memory with all_to_all_v).
  virtual void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) = 0;
  // Variable-size all-to-all of bytes: send_counts[p] bytes from send + send_offsets[p] go to peer
  // p and land at recv + recv_offsets[p] there; recv_counts[p] must equal what peer p sends to this
  // rank. The count and offset arrays are host memory with size() entries; send and recv are
  // device() memory. A device transport orders the transfer on `stream` (graph safe when the
  // transport's transfers are: NCCL's and the in-process group's are).
  virtual void all_to_all_v(const void* send, const int64_t* send_counts,
                            const int64_t* send_offsets, void* recv, const int64_t* recv_counts,
                            const int64_t* recv_offsets, cudaStream_t stream) = 0;
  // Whether all_to_all_v may be ordered on a stream other than the caller's compute stream (a
  // second stream of the same device, ordered against the first with events), so that a chunked
  // step's exchanges run beside its compute. False (the default) keeps every exchange on the
  // Context's stream: the in-process device group orders every rank's copies on its one stream,
  // and a torch process group exchanges on torch's current stream. NcclTransport says true.
  virtual bool concurrent_streams() const { return false; }
};

class InProcessHub;  // mailboxes + barrier shared by the ranks of one in-process group

// R ranks as threads of one process: each collective posts this rank's send buffer in the shared
// hub, waits at a barrier, copies what every peer posted for it, and waits again (so no peer frees
// or rewrites its buffer early). Each rank's transport must be used by one thread at a time, and
// all R ranks must take part in every collective. A device group (Device::CUDA) exchanges device
// buffers of one GPU with cudaMemcpyAsync on the group's stream, which every rank's Context must
// use (one stream orders every rank's kernels and copies, so no events are needed; the copies are
// graph capturable). Records the bytes of the last all_to_all_v, per peer (tests check that a row
// crosses to a rank once).
//
// A rank that fails calls abort(why) (run_in_process_group does it for every exception): from then
// on every collective of the group, on every rank, throws an Error naming the failed rank and the
// cause instead of waiting for it, so no rank is left waiting on a peer that will not come.
class InProcessTransport final : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessHub> hub, int rank);
  int rank() const override { return rank_; }
  int size() const override;
  Device device() const override;
  // The stream of a device group (nullptr for a host group).
  cudaStream_t stream() const;
  void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) override;
  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                    void* recv, const int64_t* recv_counts, const int64_t* recv_offsets,
                    cudaStream_t stream) override;
  // Bytes this rank sent to each peer (itself included) in its last all_to_all_v.
  const std::vector<int64_t>& last_sent_bytes() const { return last_sent_; }
  // This rank has failed: releases every rank waiting in a collective of the group, and makes
  // every later collective throw "rank <rank()> failed: <why>". The first abort of a group is the
  // one reported. Thread safe.
  void abort(const std::string& why);

 private:
  friend void run_in_process_group(const char*, int, Device, cudaStream_t,
                                   const std::function<void(InProcessTransport&)>&);
  std::shared_ptr<InProcessHub> hub_;
  int rank_;
  std::vector<int64_t> last_sent_;
};

// R >= 1 transports of one group; element r is rank r. Hand each to its own thread. A Device::CUDA
// group exchanges device buffers on `stream` (every rank's Context must be made on it).
std::vector<std::unique_ptr<InProcessTransport>> make_in_process_group(
    int ranks, Device device = Device::CPU, cudaStream_t stream = nullptr);

// Runs fn(transport) for every rank of a new in-process group, each on its own thread, and returns
// when all have ended. A rank whose fn throws aborts the group (the others are released from their
// collectives); a thread that cannot be started aborts it too, before any rank waits for it. Then
// throws Error("<op>: rank r failed: <cause>") for the first rank that failed (an exception that is
// not a std::exception is named as such); the other ranks' "released" errors are not reported.
void run_in_process_group(const char* op, int ranks, Device device, cudaStream_t stream,
                          const std::function<void(InProcessTransport&)>& fn);

// ================================================================================================
// Plans
// ================================================================================================

struct EpConfig {
  int64_t experts = 0;  // E, >= 1, divisible by ranks
  int64_t ranks = 0;    // R, must equal transport.size()
  int64_t hidden = 0;   // H, >= 1
  int64_t topk = 0;     // k, 1..min(E, 32)
  std::string to_string() const;
};

// Capacity mode's host-known bounds, per (home rank, expert rank) pair.
struct EpCapacity {
  int64_t rows_per_peer = 0;     // C >= 1: token rows a rank sends one peer (itself included)
  int64_t entries_per_peer = 0;  // C_e: (token, slot) entries for one peer's experts; 0 means
                                 // C * k, which C rows can never exceed
  // The expert-grouped buffers' tail (the rows past the entries received): written as zero by
  // ep_dispatch / ep_dispatch_fp8 (rows, scales, probs) and ep_combine_backward (d_y_grouped), so
  // that sum(plan.splits) == rows holds for ops with exact splits. false: the tail is left as it
  // was, for consumers that run over plan.entry_splits() with SplitsTotal::at_most and never read
  // it (nn::MoE does; it saves writing R * C_e - entries rows twice a step).
  bool zero_tail = true;
  std::string to_string() const;
};

enum class EpMode : uint8_t { throughput, capacity };
const char* ep_mode_name(EpMode m);

// What a dispatch decided, for the four movers. The index arrays and splits live on the Context's
// device (host memory on a CPU Context); the per-peer counts are host vectors. Treat every field
// as read-only: build a plan with ep_dispatch_plan or ep_capacity_plan_create + ep_capacity_plan.
struct EpPlan {
  EpConfig cfg;
  EpMode mode = EpMode::throughput;
  EpCapacity cap;  // capacity mode only (entries_per_peer resolved)
  int rank = 0;
  int64_t tokens = 0;         // T of this rank
  int64_t local_experts = 0;  // E_l = E / R
  int64_t rows = 0;  // rows of the expert-grouped buffer: exact (throughput) or R * C_e (capacity)
  Tensor splits;     // [E_l] int32: rows of each local expert in the grouped buffer
  // Capacity mode only: [E_l] int32, the rows of each local expert that hold entries, without
  // the zero tail: sum <= rows (splits_at_most[e] == splits[e] except in the last expert). The
  // splits of ops run with SplitsTotal::at_most, which neither read nor write the tail.
  Tensor splits_at_most;
  // The splits that cover only the rows holding entries: splits_at_most in capacity mode, splits
  // in throughput mode (whose buffer has no tail). For SplitsTotal::at_most ops over the grouped
  // buffer; equal to splits wherever sum(splits) == rows.
  TensorView entry_splits() const;
  std::vector<int64_t> splits_host;  // throughput mode: the same on the host (capacity: empty)
  // Routes, per peer (host, [R] each; offsets in rows or entries of the staging buffers). Forward
  // (home -> expert): token rows. Back (expert -> home): (token, slot) entries. Capacity mode: the
  // fixed blocks C and C_e.
  std::vector<int64_t> send_rows, send_offsets, recv_rows, recv_offsets;
  std::vector<int64_t> back_send, back_send_offsets, back_recv, back_recv_offsets;
  int64_t send_total = 0, recv_total = 0, back_send_total = 0, back_recv_total = 0;
  // Index arrays (int32, -1 = none), on the Context's device:
  Tensor send_token;     // [send_total] token of each forward send row
  Tensor grouped_entry;  // [rows] received row * k + slot of each grouped row (-1: a zero tail row)
  Tensor entry_grouped;  // [recv_total * k] its inverse (-1: a slot with no entry here)
  Tensor back_grouped;   // [back_send_total] grouped row of each entry sent back
  Tensor slot_entry;     // [T, k] back-receive row of (t, j) (-1: no expert / dropped)
  // Capacity mode only: the in-band metadata blocks [R, 1 + C k] int32 (count, then the local
  // expert of each slot of each row, -1 elsewhere), the plan kernels' scratch (CUDA), and the
  // staging buffers every mover uses: rows ([(R - 1) max(C, C_e)] rows of stage_row_bytes: every
  // peer's block but the rank's own, which the movers read in place) and fp32 values (weights
  // [R C k] and d_weights [R C_e]), each side.
  Tensor meta_send, meta_recv, scratch;
  Tensor stage_send, stage_recv, stage_aux_send, stage_aux_recv;
  int64_t stage_row_bytes = 0;
  // Throughput mode: the host time ep_dispatch_plan took to build this plan, in microseconds,
  // outside its one wait for the device (the count read): launches, the exchanges' enqueueing,
  // allocation and the host loops over peers and experts. What a step pays on the host per plan.
  double host_us = 0;
  std::string to_string() const;
};

// Throughput mode: the count and metadata exchange of a dispatch (collective: two exchanges).
// expert_ids [T, k] int32 or int64 on the Context's device, ids in [0, E). T may differ per rank
// (0 too). Sends each peer the number of rows it will get (and the entries per local expert of
// it), then per row its token's local expert slots. Not graph safe: reads the counts on the host
// (on CUDA one synchronization, the ids stay on the device) and allocates the plan.
EpPlan ep_dispatch_plan(Context& ctx, Transport& tr, const EpConfig& cfg,
                        const TensorView& expert_ids);

// Capacity mode: allocates a plan for T tokens on this rank and the largest row dtype it will
// move (bf16, fp16 or fp32: the staging rows are H of it). Not graph safe (allocates): call it
// once, before capture. rows = R * C_e. Every rank must use the same cap. On CUDA, E_l and R must
// be below 1024 (the plan ranks entries with moe_permute_plan's kernels).
EpPlan ep_capacity_plan_create(Context& ctx, const Transport& tr, const EpConfig& cfg,
                               const EpCapacity& cap, int64_t tokens, DType row_dtype);
// Capacity mode: fills `plan` for this step's routing (collective: one fixed-size metadata
// exchange). expert_ids [T, k] int32 on the Context's device. Graph safe; drops and reports
// overflow as the header says.
void ep_capacity_plan(Context& ctx, Transport& tr, const TensorView& expert_ids, EpPlan& plan);

// ================================================================================================
// The movers (collectives; any plan). Row tensors are bf16, fp16 or fp32 (moved as bytes),
// row-major, contiguous, on the Context's device; outputs may not alias inputs. Graph safe on CUDA
// with a capacity plan.
// ================================================================================================

// Two ways to apply the router weights, as the header's step shows or as the one-rank MoE block
// does (nn/moe.hpp: the weight enters the expert's activation, weighted_swiglu, and the combine is
// moe_unpermute's unweighted sum): pass weights to ep_combine / ep_combine_backward, or route
// them with ep_dispatch (probs) and leave them out of the combine. Either way every result is the
// corresponding one-rank op's, bit for bit.

// x [T, H] -> x_grouped [plan.rows, H], x's dtype, ordered as the header says (ready for grouped
// GEMMs with plan.splits; capacity mode's tail rows are zero, or left alone without
// EpCapacity::zero_tail). weights [T, k] fp32 and probs
// [plan.rows] fp32, optional (both or none): probs[g] = weights[t, j] of the grouped row's entry
// (0 for tail rows, as the rows), moe_permute's probs.
void ep_dispatch(Context& ctx, Transport& tr, const EpPlan& plan, const TensorView& x,
                 const TensorView& x_grouped, const TensorView& weights = TensorView(),
                 const TensorView& probs = TensorView());

// y_grouped [plan.rows, H] (the expert MLP's output in x_grouped's row order), weights [T, k] fp32
// or absent, out [T, H], y_grouped's dtype: out[t] = sum_j weights[t, j] * y_(t, j) (absent:
// sum_j y_(t, j), moe_unpermute's) in fp32, slot order, then + add[t] when add [T, H] (out's
// dtype, e.g. the shared expert's output; may not overlap out) is given, rounded once: add is
// moe_unpermute's addend, same order. A token with no (kept) experts gets 0 (or add[t]).
void ep_combine(Context& ctx, Transport& tr, const EpPlan& plan, const TensorView& y_grouped,
                const TensorView& weights, const TensorView& out,
                const TensorView& add = TensorView());

// Backward of ep_combine: dy [T, H], weights [T, k] fp32, y_grouped [plan.rows, H] (the forward's,
// saved) -> d_y_grouped [plan.rows, H] (d_y_(t, j) = fp32(weights[t, j] * dy[t]) rounded once;
// tail rows 0, as ep_dispatch's) and d_weights [T, k] fp32 (dot(dy[t], y_(t, j)) in the
// ep_dot_order; 0 where the slot was dropped). dy, y_grouped and d_y_grouped share one dtype.
// Unweighted (weights and d_weights absent, y_grouped unused and may be absent): d_y_(t, j) =
// dy[t], moe_unpermute_backward.
void ep_combine_backward(Context& ctx, Transport& tr, const EpPlan& plan, const TensorView& dy,
                         const TensorView& weights, const TensorView& y_grouped,
                         const TensorView& d_y_grouped, const TensorView& d_weights);

// Backward of ep_dispatch (and of ep_dispatch_fp8, whose gradient rows are 16-bit): d_x_grouped
// [plan.rows, H] -> dx [T, H], one dtype: dx[t] = sum_j d_x_grouped[(t, j)] in fp32 in slot order
// (dropped slots skipped), then + add[t] when add [T, H] (dx's dtype, e.g. the shared expert's
// dx; may not overlap dx) is given, rounded once: moe_permute_backward's sum and addend. A token
// with no (kept) experts gets 0 (or add[t]). Tail rows are not read. d_probs [plan.rows] fp32 and
// d_weights [T, k] fp32, optional (both or none): d_weights[t, j] = d_probs[(t, j)'s grouped row]
// (0 when dropped), moe_permute_backward's.
void ep_dispatch_backward(Context& ctx, Transport& tr, const EpPlan& plan,
                          const TensorView& d_x_grouped, const TensorView& dx,
                          const TensorView& d_probs = TensorView(),
                          const TensorView& d_weights = TensorView(),
                          const TensorView& add = TensorView());

// ================================================================================================
// FP8 dispatch: the rows travel quantized (DeepSeek-V3's recipe), the combine stays 16-bit
// ================================================================================================
//
// The home rank quantizes its tokens once with the quantize op, in the recipe the FP8 block
// grouped GEMM reads for activations (ep_fp8_dispatch_config(): fp8_block, e4m3, 1x128 rowwise
// blocks along H, fp32 scale_inv, plain layout), and ep_dispatch_fp8 moves each row's H fp8 bytes
// and its H / 128 fp32 scales together (one exchange: a wire row of ep_fp8_wire_row_bytes(H)
// bytes, about 0.52x of a bf16 row). The receiving rank unpacks them straight into the FP8 GEMM's
// operand: data [plan.rows, H] and scale_inv [plan.rows, H / 128], grouped by local expert in the
// dispatch order, with plan.splits as its device splits (no conversion pass):
//
//   xq  = group_quantize(ctx, {x [T, H], splits {T} (one group), ep_fp8_dispatch_config(),
//                              out: data [T, H] e4m3, scale_inv [T, H / 128] fp32})
//   xg  = ep_dispatch_fp8(ctx, tr, plan, xq, {data [plan.rows, H], scale_inv [plan.rows, H/128]})
//   grouped_gemm(ctx, QuantizedGemmArgs{forward, a = xg, b = W (fp8_block, 128x128), out,
//                                      splits = plan.splits})
//
// A 1x128 rowwise block lies within one token row, so quantizing before the dispatch gives exactly
// the bytes and scales that quantizing the grouped rows would (bit for bit: the slice of a one-rank
// group_quantize of moe_permute's rows). The backward and the combine are those of ep_dispatch
// (bf16 / fp16 gradient rows), as in DeepEP.

// The quantize config of ep_dispatch_fp8's input (pow2_scales: power-of-two scales).
QuantizeConfig ep_fp8_dispatch_config(bool pow2_scales = false);
// Bytes of one token on the wire: H fp8 values, then H / 128 fp32 scales, padded to 16 bytes.
int64_t ep_fp8_wire_row_bytes(int64_t hidden);

// x_q: this rank's tokens quantized with ep_fp8_dispatch_config() (or the same recipe with
// pow2_scales): data [T, H] fp8e4m3 (fp8e5m2 is moved too, but the FP8 GEMM takes e4m3) and
// scale_inv [T, H / 128] fp32, recipe fp8_block, 1x128 blocks (block_2d false), plain layout
// (group_quantize's output over any splits: rowwise blocks do not depend on them).
// x_grouped: caller-allocated data [plan.rows, H] of x_q's dtype and scale_inv [plan.rows, H / 128]
// fp32 (group_quantize_shapes(plan.rows, H, E_l, config) sizes them); other fields ignored.
// Returns x_grouped with num_groups E_l, splits plan.splits, recipe fp8_block, plain layout: the
// `a` operand of the FP8 block GEMM forward. Rows are ordered as ep_dispatch's; capacity mode's
// tail rows get zero data and zero scales (EpCapacity::zero_tail). weights / probs as ep_dispatch.
// H must be a multiple of 128; on a capacity plan the wire row must fit the staging row (any 16-bit
// row_dtype does). Graph safe on CUDA with a capacity plan (two strided gathers and one exchange,
// plus the weights' exchange with probs).
GroupedTensor ep_dispatch_fp8(Context& ctx, Transport& tr, const EpPlan& plan,
                              const GroupedTensor& x_q, const GroupedTensor& x_grouped,
                              const TensorView& weights = TensorView(),
                              const TensorView& probs = TensorView());

// ================================================================================================
// Chunked steps: the exchanges beside the experts' compute
// ================================================================================================
//
// The E_l local experts of every rank in n consecutive chunks: chunk c holds local experts
// [lo_c, lo_(c+1)) with lo_c = c E_l / n (rounded down; 1 <= n <= E_l, the same n on every rank).
// Chunk c has a plan of its own (plans[c], an ordinary EpPlan of the same EpConfig, built from the
// ids with every slot naming another chunk's expert set to -1 and chunk c's experts renumbered to
// local experts 0 .. lo_(c+1) - lo_c - 1 of each rank), so its exchanges move only the rows and
// entries of its experts. A step:
//
//   cp = ep_dispatch_plan_chunked(ctx, tr, cfg, expert_ids, n, row_dtype)   (or the capacity pair)
//   for c: ep_dispatch(ctx, tr, cp.plans[c], x, xg_c, weights, probs_c)     xg_c: cp.rows_of(c)
//          expert MLP of chunk c on xg_c (cp.splits(c): its experts' rows, the unchunked order)
//          ep_combine_chunk(ctx, tr, cp, c, yg_c)                            entries home
//   ep_combine_finish(ctx, cp, weights, y, add)                              the sum, once
//   for c: ep_combine_backward(ctx, tr, cp.plans[c], dy, {}, {}, d_yg_c, {}) (unweighted)
//          expert MLP backward of chunk c
//          ep_dispatch_backward_chunk(ctx, tr, cp, c, d_xg_c, d_probs_c)     gradients home
//   ep_dispatch_backward_finish(ctx, cp, dx, d_weights, add)                 the sum, once
//
// Each call is a collective as before (every rank, the same order), and the calls of different
// chunks may run on different streams of one device (an exchange of chunk c + 1 beside the
// experts of chunk c) when the transport's concurrent_streams() says so; nn::MoE does that.
// Bit-identity with the unchunked step: chunk c's grouped rows (expert-major, within an expert in
// (source rank, token, slot) order) are exactly the unchunked grouped rows of its experts, so
// every expert computes on the same rows in the same order; the finish ops sum each token's k
// entries in slot order, rounded once, as ep_combine and ep_dispatch_backward do. What changes:
// a token row goes once to each (rank, chunk) that holds one of its experts (a row two chunks of
// one rank need crosses twice; the entries, k per token at most, cross once as before), and
// throughput mode builds n plans (n count exchanges, n host waits). Capacity mode: each chunk's
// plan has the budgets EpCapacity gives (per chunk: C rows and C_e entries to each peer), so a
// step moves n fixed blocks of each size and the grouped buffer is n R C_e rows (divide C by n to
// keep the bytes of the unchunked step); overflow is decided per chunk (a token dropped for one
// chunk's experts on q may be kept for another's), so results equal the unchunked step's whenever
// no chunk overflows. Graph safe like the unchunked capacity step. A chunk's combine backward is
// the unweighted form (a chunked step routes the weights as probs, as nn::MoE does): the weighted
// form writes every slot of d_weights, so one chunk's call would clear the others' values.
struct EpChunkedPlan {
  int64_t chunks = 0;                // n
  std::vector<int64_t> first_local;  // [n + 1]: chunk c holds [first_local[c], first_local[c + 1])
  std::vector<EpPlan> plans;         // [n]: chunk c's plan (its local experts renumbered from 0)
  // Grouped rows: chunk c's are rows [row_base[c], row_base[c + 1]) of the chunks' concatenated
  // grouped buffer (throughput mode: exactly the unchunked buffer; capacity mode: n blocks of
  // R C_e rows, each with its own zero tail).
  std::vector<int64_t> row_base;  // [n + 1]
  // The way back: chunk c's entries land at rows [back_base[c], back_base[c + 1]) of back_rows
  // (and back_values, one fp32 each); slot_entry [T, k] int32 is (t, j)'s row there (-1: none).
  std::vector<int64_t> back_base;                  // [n + 1]
  Tensor slot_entry, back_rows, back_values, ids;  // ids: [T, k] int32 scratch (chunk ids)
  int64_t back_row_bytes = 0;  // bytes of a back_rows row (row_dtype's H values)
  int64_t tokens() const { return plans.empty() ? 0 : plans[0].tokens; }
  int64_t rows() const { return row_base.empty() ? 0 : row_base.back(); }
  int64_t experts_of(int64_t c) const {
    return first_local[size_t(c + 1)] - first_local[size_t(c)];
  }
  // Chunk c's grouped rows (plans[c].rows) and the splits of its experts ([experts_of(c)] views of
  // plans[c].splits / entry_splits(): capacity mode's at-most splits without the tail).
  int64_t rows_of(int64_t c) const { return plans[size_t(c)].rows; }
  TensorView splits(int64_t c) const;
  TensorView entry_splits(int64_t c) const;
  std::string to_string() const;
};

// Throughput mode, chunked: n plans (each as ep_dispatch_plan: not graph safe), the merged
// slot_entry and the way back's buffers, for rows of row_dtype (bf16, fp16 or fp32: the widest
// the combine and dispatch backward will move). Throws for n outside [1, E_l] naming n.
EpChunkedPlan ep_dispatch_plan_chunked(Context& ctx, Transport& tr, const EpConfig& cfg,
                                       const TensorView& expert_ids, int64_t chunks,
                                       DType row_dtype);
// Capacity mode, chunked: allocates n capacity plans (each as ep_capacity_plan_create, with cap)
// and the way back's buffers, once, before capture.
EpChunkedPlan ep_capacity_plan_chunked_create(Context& ctx, const Transport& tr,
                                              const EpConfig& cfg, const EpCapacity& cap,
                                              int64_t chunks, int64_t tokens, DType row_dtype);
// Capacity mode, chunked: fills every chunk's plan for this step's routing (n metadata exchanges)
// and the merged slot_entry. Graph safe. expert_ids [T, k] int32 on the Context's device.
void ep_capacity_plan_chunked(Context& ctx, Transport& tr, const TensorView& expert_ids,
                              EpChunkedPlan& plan);

// Chunk c's entries home: y_grouped [plan.rows_of(c), H] (chunk c's expert outputs) -> rows
// [back_base[c], back_base[c + 1]) of plan.back_rows. Collective; graph safe with capacity plans.
void ep_combine_chunk(Context& ctx, Transport& tr, EpChunkedPlan& plan, int64_t c,
                      const TensorView& y_grouped);
// After every chunk's ep_combine_chunk: out [T, H] as ep_combine (weights [T, k] fp32 or absent,
// add optional), from plan.back_rows; out's dtype is y_grouped's. Local (no exchange).
void ep_combine_finish(Context& ctx, const EpChunkedPlan& plan, const TensorView& weights,
                       const TensorView& out, const TensorView& add = TensorView());
// Chunk c's gradient rows home: d_x_grouped [plan.rows_of(c), H] -> plan.back_rows, and with
// d_probs [plan.rows_of(c)] fp32 one value per entry -> plan.back_values. Collective.
void ep_dispatch_backward_chunk(Context& ctx, Transport& tr, EpChunkedPlan& plan, int64_t c,
                                const TensorView& d_x_grouped,
                                const TensorView& d_probs = TensorView());
// After every chunk's ep_dispatch_backward_chunk: dx [T, H] (+ add) and d_weights [T, k] fp32
// (given only when every chunk sent d_probs) as ep_dispatch_backward. Local.
void ep_dispatch_backward_finish(Context& ctx, const EpChunkedPlan& plan, const TensorView& dx,
                                 const TensorView& d_weights = TensorView(),
                                 const TensorView& add = TensorView());

// The fixed summation order of d_weights' dot products (both backends): 32 lane partials, lane l
// summing p_h = a_h * b_h (fp32, rounded) for h = l, l + 32, ... in order, then a butterfly:
// for m = 16, 8, 4, 2, 1, partial[l] += partial[l ^ m]; the result is partial[0]. A host
// function for tests and references: a, b are n fp32 values.
float ep_dot_order(const float* a, const float* b, int64_t n);

}  // namespace groupmm::ep
