// groupmm/nn/moe.hpp: the MoE block (router, permute, expert MLP, unpermute, shared expert).
//
//   y = sum_j w_tj * down_e(swiglu(gate_up_e(x_t)))  over the k experts e = ids_tj chosen for token
//       t by the router, + shared_down(swiglu(shared_gate_up(x_t)))  (when shared_ffn_hidden > 0)
//
// built from the public ops of moe.hpp and four GroupedLinear layers (experts: E groups; shared
// expert: one group):
//
//   MoE moe(ctx, {.hidden = 2048, .ffn_hidden = 768, .experts = 128, .topk = 8,
//                 .max_tokens = 16384, .renormalize = true});
//   TensorView y  = moe.forward(ctx, x);    // [T, H], layer-owned
//   TensorView dx = moe.backward(ctx, dy);  // [T, H]; every parameter grad too
//   moe.backward_dw(ctx);                   // only with delay_wgrad
//
// Backward computes dx and the grads of the router weight, the expert weights (and biases) and the
// shared expert's; the router's aux loss and z-loss (when their coefficients are set) enter the
// backward with gradient 1. With delay_wgrad the weight grads (router, experts, shared expert) wait
// for backward_dw(); with accumulate_into_main_grad they accumulate into fp32 main grads.
//
// Graph safety (CUDA): all buffers are sized for max_tokens at construction and the Context
// workspace is reserved there (prepare(); call it for another Context before capturing on that
// one). forward, backward and backward_dw never read device data on the host, never synchronize
// and never allocate, so a whole step captures in one CUDA graph and replays correctly with new
// inputs, whatever the routing (token counts per expert change on the device only). The token
// count T of a captured step is fixed by the capture. Results are deterministic: two runs give the
// same bits. Minimum SM: sm_90 (CUDA); the CPU backend runs anywhere (same API, reference ops).
//
// Lifetimes (like GroupedLinear): x passed to forward must stay alive and unchanged until backward
// (or backward_dw with delay_wgrad) has been enqueued; with delay_wgrad and a shared expert, dy
// passed to backward too. One micro-batch in flight at a time. The returned views point into
// layer buffers that the next call overwrites.
//
// Expert parallelism (MoEConfig::ep with a transport, groupmm/ep.hpp): the block is one rank of R.
// Every rank holds the router (all E experts) and the shared expert, and its E_l = E / R local
// experts (rank r: experts [r E_l, (r + 1) E_l); gate_up() and down() then have E_l groups). A
// step on every rank (each a collective: all ranks call forward, backward, in the same order):
//   forward:  router on this rank's tokens -> plan (ep_dispatch_plan, or ep_capacity_plan on the
//             plan made at construction) -> ep_dispatch (rows and router weights, as probs) ->
//             local experts (gate_up, weighted_swiglu, down; E_l groups, plan.splits) ->
//             ep_combine (unweighted, + the shared expert's output, moe_unpermute's order)
//   backward: ep_combine_backward (unweighted) -> local experts backward -> ep_dispatch_backward
//             (+ the shared expert's dx, d_weights from d_probs) -> router backward
// so that y, dx and the local experts' weight and bias grads are, bit for bit, the one-rank
// block's on the global tokens (rank 0's, then rank 1's, ...; the experts' rows arrive in the
// one-rank permute order). The router weight and the shared expert are replicated: their grads
// here are this rank's tokens' share (sum them over the ranks, as data parallelism does; equal to
// the one-rank grads up to fp32 summation order). aux_loss and z_loss are over this rank's tokens
// (the aux loss's counts too). delay_wgrad and accumulate_into_main_grad work as without EP.
// Capacity mode computes the rows received only: the local experts' GroupedLinear layers are
// built with SplitsTotal::at_most and run, like weighted_swiglu, over the plan's splits_at_most,
// so the tail of the R * C_e grouped rows is neither read nor written by the expert MLP (its
// cost is that of the exchanged rows, whatever the capacity; the plan is made with
// EpCapacity::zero_tail false, so the movers leave the tail unwritten too).
// Restrictions: capacity_factor 0 and pad_align 1 (EP's capacity is ep.capacity, and the grouped
// rows come unpadded: recipes whose wgrad needs aligned splits are not served yet), E divisible by
// R. Capacity mode is graph safe (the plan is allocated at construction for max_tokens tokens and
// rebuilt, allocating, when a forward sees another T: capture with the T of the first eager step);
// throughput mode synchronizes with the host in every forward (its count exchange) and is not.
// The local experts are initialized from the seed as a GroupedLinear of E_l groups (not as the
// slice of a one-rank block's): import the weights to compare with a one-rank block.
//
// Overlap (ep.chunks = n > 1): the local experts run in n consecutive chunks (ep.hpp,
// EpChunkedPlan), each with its own exchanges, so that the dispatch of chunk c + 1 and the combine
// of chunk c - 1 run while the experts of chunk c compute (forward), and the combine backward of
// chunk c + 1 and the dispatch backward of chunk c - 1 under chunk c's backward. Every result (y,
// dx, d_weights, every expert's weight and bias grads) is the unchunked block's, bit for bit: a
// chunk's experts see exactly their unchunked rows in the unchunked order (so per-expert
// quantization scales and wgrad sums are unchanged), and each token's k outputs (and gradients)
// are summed once, after the last chunk, in slot order. On CUDA with a transport whose
// concurrent_streams() is true (NcclTransport) the exchanges run on a second stream the layer
// owns, ordered against the Context's stream with events (fork and join inside each forward and
// backward: graph capturable, nothing allocated in capacity mode); otherwise (the CPU backend,
// the in-process device group, a torch process group) the chunks run in order on the Context's
// stream, with the same results. The shared expert computes while the first chunk's rows move.
// Costs: gate_up() and down() then hold the parameters and grads, and the chunks run through
// parts of them (GroupedLinear's part constructor), each with its own y / dx buffers (and a
// quantized recipe's copies) for a chunk's most rows: about n times the expert layers' activation
// buffers. Throughput mode builds n plans a forward (n count exchanges and host waits); capacity
// mode applies ep.capacity to each chunk (n fixed blocks per exchange; the grouped buffers hold
// n R C_e rows: divide C by n to keep the unchunked bytes) and decides overflow per chunk, so it
// equals the unchunked block whenever no chunk overflows. The stage hook reports gate_up,
// activation and down once per chunk; an exchange's exposed time shows in the stage that waits
// for it (gate_up for a dispatch, unpermute for the last combine; backward: down, permute).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "groupmm/ep.hpp"
#include "groupmm/moe.hpp"
#include "groupmm/nn/grouped_linear.hpp"

namespace groupmm::nn {

// The expert-parallel configuration of a MoE block (see the header). transport null: one rank.
struct MoEExpertParallel {
  // This rank's end of the group (ep::InProcessTransport for tests, ep::NcclTransport over a
  // communicator); not owned, must outlive the layer. Its rank() and size() are the rank and the
  // world size R; its device() must be the Context's device.
  ep::Transport* transport = nullptr;
  ep::EpMode mode = ep::EpMode::throughput;
  // Capacity mode: the per-(home rank, expert rank) bounds (every rank the same); overflow is
  // dropped and reported as kFaultEpCapacity (ep.hpp). The grouped rows are R * C_e, of which
  // the expert MLP computes the received ones only (see the header).
  ep::EpCapacity capacity;
  // Throughput mode: the most grouped rows a forward may receive (expert buffers are sized for
  // it); 0 = R * max_tokens * topk (every token of every rank on this rank's experts). A forward
  // that receives more throws (on that rank, after the exchange: size it for the worst case).
  int64_t max_rows = 0;
  // Overlap: the local experts in this many chunks whose exchanges run beside the other chunks'
  // compute (see the header). 1 = one exchange each way; at most E / R (a chunk holds an expert).
  int64_t chunks = 1;
  // With chunks > 1 on CUDA: the SMs the chunked step leaves to the exchanges, its grouped GEMMs
  // running on the others (Context::gemm_sm_count): a persistent GEMM on every SM leaves an
  // exchange's NCCL kernels no SM until it ends. 0 = the GEMMs take every SM. Results do not
  // depend on it; the CPU backend ignores it. Below the device's SM count.
  int exchange_sms = 0;
  bool enabled() const { return transport != nullptr; }
  std::string to_string() const;
};

struct MoEConfig {
  int64_t hidden = 0;      // H
  int64_t ffn_hidden = 0;  // F: each expert is gate_up [2F, H], down [H, F]
  int64_t experts = 0;     // E, 1..1024
  int64_t topk = 0;        // k, 1..min(E, 32)
  int64_t max_tokens = 0;  // largest T a forward may see
  // Router (RouterConfig in moe.hpp says what each does).
  RouterScore score = RouterScore::softmax;
  int64_t n_group = 1, topk_group = 1;
  bool renormalize = false;
  float scaling_factor = 1.0f;
  bool expert_bias = false;  // a selection-only bias [E] fp32 (expert_bias(); starts at 0)
  float aux_loss_coeff = 0.0f;
  float z_loss_coeff = 0.0f;
  // Shared expert: a dense SwiGLU MLP of width shared_ffn_hidden on every token (0 = none).
  int64_t shared_ffn_hidden = 0;
  // Capacity: each expert keeps ceil(capacity_factor * T k / E) tokens (token order) and drops the
  // rest (counts() - the map's kept). 0 = dropless.
  double capacity_factor = 0.0;
  // Per-expert padding of the permuted rows to a multiple of this (zero rows; 16 or 128 for
  // quantized recipes), 1 = none.
  int64_t pad_align = 1;
  bool bias = false;          // biases in the expert and shared-expert linears
  DType dtype = DType::bf16;  // bf16 / fp16 (fp32 on a CPU context): weights, activations, grads
  bool delay_wgrad = false;
  bool accumulate_into_main_grad = false;
  uint64_t seed = 0;  // initialization (router weight like nn.Linear; the linears as GroupedLinear)
  std::shared_ptr<const LinearRecipe> recipe;  // of the expert linears; null = high precision
  MoEExpertParallel ep;                        // expert parallelism (off by default)
  // The gate_up projection and the weighted SwiGLU as one op of the kernel layer
  // (moe_gate_up_swiglu: x gathered through the row map inside the GEMM, the activation in its
  // epilogue), and no permuted copy of x in forward; backward gathers it for gate_up's wgrad.
  // Results are bit for bit those of the separate ops. High precision (no recipe), no bias, no
  // expert parallelism; on CUDA the shapes moe_gate_up_swiglu_supported takes.
  bool fused_gate_up = false;
  // The FP8 recipes' expert layers quantize straight from the tokens (GroupedLinear::
  // forward_gathered / backward_gathered through moe_permute_sources' row map): gate_up's input
  // from x and down's gradient from dy, with no permuted copy of either (moe_permute and
  // moe_unpermute_backward do not run). Results bit for bit the permuted copies'. Applies where
  // the layers gather (GroupedLinear::gathers(): fp8_current, fp8_block, without
  // high_precision_wgrad or a bias gradient into a main grad) and neither expert parallelism nor
  // fused_gate_up is on; elsewhere the copies are made.
  bool gathered_quantize = true;
  RouterConfig router_config() const;
  std::string to_string() const;
};

// The stages of a step, reported to the stage hook after each one ends (benchmarks put CUDA events
// there). Forward: router, permute, gate_up, activation, down, shared_expert, unpermute. Backward:
// unpermute, down, activation, gate_up, shared_expert, permute, router.
enum class MoEStage : uint8_t {
  router,
  permute,
  gate_up,
  activation,
  down,
  shared_expert,
  unpermute
};
const char* moe_stage_name(MoEStage s);
using MoEStageHook = std::function<void(MoEStage stage, bool backward)>;

class MoE {
 public:
  // Allocates every parameter, grad and buffer on ctx's device and initializes the router weight
  // [E, H] to U(-1/sqrt(H), 1/sqrt(H)) (fill_uniform), the expert bias to 0. Throws on a bad
  // config (naming the field).
  MoE(Context& ctx, const MoEConfig& cfg);
  ~MoE();
  MoE(const MoE&) = delete;
  MoE& operator=(const MoE&) = delete;

  // Reserves ctx's workspace for every op at max_tokens (allocates: not during capture).
  void prepare(Context& ctx);

  // x [T, H] in dtype, 0 <= T <= max_tokens. Returns y [T, H].
  TensorView forward(Context& ctx, const TensorView& x);
  // dy [T, H] with forward's T. Returns dx [T, H].
  TensorView backward(Context& ctx, const TensorView& dy);
  // With delay_wgrad: the queued weight grads (router, experts, shared expert).
  void backward_dw(Context& ctx);
  void zero_grad(Context& ctx);
  void set_stage_hook(MoEStageHook hook) { hook_ = std::move(hook); }

  // ---- parameters and grads (device views, writable) ----
  const TensorView& router_weight() const { return wr_.view(); }        // [E, H] dtype
  const TensorView& router_weight_grad() const { return dwr_.view(); }  // dtype or fp32 main grad
  const TensorView& expert_bias() const { return bias_.view(); }        // [E] fp32, absent if off
  GroupedLinear& gate_up() { return *gate_up_; }  // E groups (E_l with EP), [2F, H]
  GroupedLinear& down() { return *down_; }        // E groups (E_l with EP), [H, F]
  bool has_shared_expert() const { return shared_up_ != nullptr; }
  GroupedLinear& shared_gate_up();  // 1 group, [2 Fs, H]
  GroupedLinear& shared_down();     // 1 group, [H, Fs]

  // ---- routing of the last forward (device views) ----
  TensorView expert_ids() const;                               // [T, k] int32
  TensorView router_weights() const;                           // [T, k] fp32
  const TensorView& counts() const { return counts_.view(); }  // [E] int32, before capacity
  const PermuteMap& permute_map() const {
    return map_;
  }  // dest_row, kept, splits, rows
     // (one rank only)
  // Expert parallelism: this rank, the world size R (1 without EP), the first local expert, and
  // the plan of the last forward (null without EP; its splits are the local experts' rows).
  int rank() const;
  int ranks() const;
  int64_t local_experts() const { return cfg_.experts / ranks(); }
  int64_t first_expert() const { return int64_t(rank()) * local_experts(); }
  const ep::EpPlan* ep_plan() const { return plan_.get(); }
  // With ep.chunks > 1: the chunked plan of the last forward (null otherwise; ep_plan() is then
  // null).
  const ep::EpChunkedPlan* ep_chunked_plan() const { return cplan_.get(); }
  TensorView aux_loss() const;  // [1] fp32 (0 when the coefficient is 0)
  TensorView z_loss() const;    // [1] fp32

  // Activation memory: the bytes of the layer's own buffers that the pending forward wrote and
  // its backward reads (0 when no forward is pending): the routing (router logits, expert ids and
  // weights, the permute map's destination rows), each grouped row's router weight (and the row
  // map with fused_gate_up or gathered_quantize), the permuted rows (not with fused_gate_up:
  // backward gathers them again; not when gathered: no copy exists), the gate_up pre-activation,
  // the activation, and the shared expert's pre-activation and activation. Not counted: x (the
  // caller's, which backward also reads) and, with expert parallelism, the plan's own metadata;
  // with a quantized recipe, the layers' quantized copies of their operands. Host arithmetic on the
  // pending forward's sizes.
  int64_t saved_bytes() const;
  // Whether MoEConfig::gathered_quantize applies to this block (decided at construction).
  bool gathered() const { return gathered_; }

  const MoEConfig& config() const { return cfg_; }
  Device device() const { return device_; }
  std::string to_string() const;

 private:
  void check_ctx(const Context& ctx, const char* fn) const;
  void stage(MoEStage s, bool backward) const {
    if (hook_) hook_(s, backward);
  }
  PermuteMap map_for(int64_t T) const;
  int64_t expert_rows_bound() const;  // rows of the expert buffers
  void ep_plan_for(Context& ctx, int64_t T);
  bool chunked() const { return cfg_.ep.enabled() && cfg_.ep.chunks > 1; }
  int64_t chunk_rows_bound() const;  // rows of one chunk's part buffers
  TensorView forward_chunked(Context& ctx, const TensorView& x, const TensorView& weights);
  void backward_chunked(Context& ctx, const TensorView& dy, const TensorView& dx,
                        const TensorView& dweights);
  TensorView shared_forward(Context& ctx, const TensorView& x, int64_t T);
  TensorView shared_backward(Context& ctx, const TensorView& dy, int64_t T);
  // A [rows, cols] (cols 0: [rows]) view of t starting at row `first`.
  TensorView region(const Tensor& t, int64_t first, int64_t rows, int64_t cols, DType dt) const;
  ep::Transport& transport() const { return *cfg_.ep.transport; }
  TensorView rows_view(const Tensor& t, int64_t rows, int64_t cols, DType dt) const;

  MoEConfig cfg_;
  Device device_;
  std::unique_ptr<GroupedLinear> gate_up_, down_, shared_up_, shared_down_;
  Tensor wr_, dwr_, bias_;
  Tensor logits_, ids_, weights_, counts_, losses_;  // router
  Tensor map_buf_, dest_;                            // permute map: [3E] starts|kept|splits
  Tensor xp_, probs_, h_, y_;                        // forward
  Tensor src_row_;  // fused_gate_up, gathered(): the row map [rows]
  bool gathered_ = false;
  Tensor dyp_, dprobs_, dgu_, dx_, dweights_, dlogits_;  // backward
  Tensor sh_h_, sh_dgu_, token_counts_;                  // shared expert; [max_tokens + 1] = 0..T
  PermuteMap map_;
  TensorView saved_x_, gu_, sh_gu_;
  int64_t saved_t_ = -1;
  std::unique_ptr<ep::EpPlan> plan_;  // expert parallelism
  // Overlap (ep.chunks > 1): the chunked plan, the experts' parts (one per chunk; declared after
  // gate_up_ / down_ so that they are destroyed first), each chunk's gate_up output, and the
  // exchanges' stream with its events (moe_internal.hpp, moe_chunked.cpp).
  std::unique_ptr<ep::EpChunkedPlan> cplan_;
  std::vector<std::unique_ptr<GroupedLinear>> gate_up_parts_, down_parts_;
  std::vector<TensorView> chunk_gu_;
  struct Streams;
  std::unique_ptr<Streams> streams_;
  class GemmSms;       // the GEMMs' SM limit of a chunked step (ep.exchange_sms)
  int64_t rows_ = 0;   // grouped rows of the last forward
  TensorView splits_;  // their splits (map_.splits, or plan_->entry_splits())
  bool pending_dw_ = false;
  MoEStageHook hook_;
};

}  // namespace groupmm::nn
