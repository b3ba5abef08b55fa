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
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "groupmm/moe.hpp"
#include "groupmm/nn/grouped_linear.hpp"

namespace groupmm::nn {

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
  GroupedLinear& gate_up() { return *gate_up_; }                        // E groups, [2F, H]
  GroupedLinear& down() { return *down_; }                              // E groups, [H, F]
  bool has_shared_expert() const { return shared_up_ != nullptr; }
  GroupedLinear& shared_gate_up();  // 1 group, [2 Fs, H]
  GroupedLinear& shared_down();     // 1 group, [H, Fs]

  // ---- routing of the last forward (device views) ----
  TensorView expert_ids() const;                               // [T, k] int32
  TensorView router_weights() const;                           // [T, k] fp32
  const TensorView& counts() const { return counts_.view(); }  // [E] int32, before capacity
  const PermuteMap& permute_map() const { return map_; }       // dest_row, kept, splits, rows
  TensorView aux_loss() const;  // [1] fp32 (0 when the coefficient is 0)
  TensorView z_loss() const;    // [1] fp32

  const MoEConfig& config() const { return cfg_; }
  Device device() const { return device_; }
  std::string to_string() const;

 private:
  void check_ctx(const Context& ctx, const char* fn) const;
  void stage(MoEStage s, bool backward) const {
    if (hook_) hook_(s, backward);
  }
  PermuteMap map_for(int64_t T) const;
  TensorView rows_view(const Tensor& t, int64_t rows, int64_t cols, DType dt) const;

  MoEConfig cfg_;
  Device device_;
  std::unique_ptr<GroupedLinear> gate_up_, down_, shared_up_, shared_down_;
  Tensor wr_, dwr_, bias_;
  Tensor logits_, ids_, weights_, counts_, losses_;      // router
  Tensor map_buf_, dest_;                                // permute map: [3E] starts|kept|splits
  Tensor xp_, probs_, h_, y_;                            // forward
  Tensor dyp_, dprobs_, dgu_, dx_, dweights_, dlogits_;  // backward
  Tensor sh_h_, sh_dgu_, token_counts_;                  // shared expert; [max_tokens + 1] = 0..T
  PermuteMap map_;
  TensorView saved_x_, gu_, sh_gu_;
  int64_t saved_t_ = -1;
  bool pending_dw_ = false;
  MoEStageHook hook_;
};

}  // namespace groupmm::nn
