// groupmm/nn/grouped_linear.hpp: the GroupedLinear layer MoE frameworks call.
//
// One layer = G experts, each y_g = x_g W_g^T (+ b_g), with one contiguous grouped weight
// W [G, N, K] (out, in) and bias b [G, N]. Rows of x are sorted by expert; splits [G] (device int32
// or int64 row counts) say how many rows each expert owns.
//
//   GroupedLinear gate_up(ctx, {.experts = 128, .in_features = 2048, .out_features = 1536,
//                               .max_tokens = 32768});
//   TensorView y  = gate_up.forward(ctx, x, splits);   // [M, N], layer-owned
//   TensorView dx = gate_up.backward(ctx, dy);         // [M, K], layer-owned; dW, db too
//   gate_up.backward_dw(ctx);                          // only with delay_wgrad
//
// Context: every call takes the Context to run on (its stream and workspace). The constructor's
// Context decides the device and the allocation stream, and the constructor calls prepare() on it,
// which reserves that Context's workspace for the largest call of every pass. Running on another
// Context of the same device? Call prepare(other) once before capturing on it.
//
// Graph safety (CUDA): forward, backward and backward_dw never read splits on the host, never
// synchronize and never allocate (all outputs, grads and the splits copy are allocated for
// max_tokens rows at construction), so the whole forward + backward + backward_dw sequence can be
// captured in one CUDA graph and replayed with new splits (same M). Minimum SM: sm_90 for CUDA;
// the CPU backend runs anywhere (same API, reference numerics).
//
// Lifetimes (like autograd's saved tensors, nothing is copied): x passed to forward must stay
// alive and unchanged until backward (immediate wgrad) or backward_dw (delayed wgrad) has been
// enqueued; with delay_wgrad, dy passed to backward must too. splits is copied into the layer at
// forward (G values), so the caller may reuse its buffer right away. One micro-batch is in flight
// at a time: forward may be called again after backward (or backward_dw when delay_wgrad), and as
// often as wanted without backward (inference), but not while a delayed wgrad is pending.
// The returned y / dx views point into layer buffers that the next forward / backward overwrites.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "groupmm/core.hpp"
#include "groupmm/gemm.hpp"

namespace groupmm::nn {

class LinearRecipe;

struct GroupedLinearConfig {
  int64_t experts = 0;       // G
  int64_t in_features = 0;   // K
  int64_t out_features = 0;  // N
  bool bias = false;
  // bf16 or fp16: weight, bias, activations and gradients (fp32 too on a CPU context, for
  // gradient checks)
  DType dtype = DType::bf16;
  // Wgrad (dW and db) is computed by backward_dw() instead of backward().
  bool delay_wgrad = false;
  // dW and db accumulate into fp32 main grads ([G, N, K] and [G, N]; beta = 1) instead of being
  // written in dtype. A zero-row expert leaves its main grads unchanged.
  bool accumulate_into_main_grad = false;
  int64_t max_tokens = 0;  // most rows a forward may see (buffers are sized for it)
  uint64_t seed = 0;       // initialization (see GroupedLinear)
  // What the layer quantizes and which GEMM it calls; null = high_precision_recipe().
  std::shared_ptr<const LinearRecipe> recipe;
  // exact: sum(splits) == M for every forward's x [M, K]. at_most: sum(splits) <= M, the rows past
  // the sum belong to no expert: every op of the layer (the grouped GEMMs, the quantizers of the
  // quantized recipes, dbias) runs with SplitsTotal::at_most, so those rows of x and dy are not
  // read and those of y and dx are not written (they keep what the layer's buffers held); dW and
  // db are the experts' rows' only. What expert parallelism's capacity mode uses (nn::MoE). The
  // 4-bit weight recipes (inference) take exact only.
  SplitsTotal splits_total = SplitsTotal::exact;
  // at_most only: the rows a forward's splits are expected to sum to (e.g. T k for expert
  // parallelism's capacity buffer of R C_e rows), passed to the grouped GEMMs (16-bit and
  // quantized) as their args' expected_rows (their kernel choice; capped at each call's rows).
  // 0: the rows of each call. A part of the layer (the part constructor) expects its share of the
  // experts'.
  int64_t expected_rows = 0;
  std::string to_string() const;
};

// ---- Recipe seam
// ---------------------------------------------------------------------------------
//
// A recipe decides how the layer's three GEMMs (and dbias) run: which operands are quantized into
// which format and which grouped GEMM engine consumes them. The layer owns the parameters, grads
// and the bookkeeping; the recipe's per-layer executor owns anything format-specific (quantized
// copies of x / dy / W with their scales, sized for max_tokens at construction) and may keep, at
// forward, whatever its wgrad needs (e.g. a columnwise-quantized x) instead of x itself.
// Every executor call must be graph safe in the sense above.

// Views at their largest size (max_tokens rows), for workspace sizing and format buffers.
struct LinearPassViews {
  TensorView x, dy;    // [max_tokens, K], [max_tokens, N] (stand-ins of the right shape/dtype)
  TensorView y, dx;    // layer outputs
  TensorView w, bias;  // [G, N, K], [G, N] (bias absent when the layer has none)
  TensorView dw, db;   // weight / bias grad (dtype or fp32 main grad)
  TensorView splits32, splits64;  // [G] stand-ins of both index types
};

class LinearExecutor {
 public:
  virtual ~LinearExecutor() = default;
  // Bytes of Context workspace the largest call of any pass needs (host-known).
  virtual size_t workspace_bytes(const Context& ctx, const LinearPassViews& v) const = 0;
  // y = x W^T (+ b) per expert.
  virtual void forward(Context& ctx, const TensorView& x, const TensorView& w,
                       const TensorView& bias, const TensorView& splits, const TensorView& y) = 0;
  // dx = dy W per expert.
  virtual void dgrad(Context& ctx, const TensorView& dy, const TensorView& w,
                     const TensorView& splits, const TensorView& dx) = 0;
  // dW = dy^T x (beta 0 or, with accumulate, 1 into fp32) and db = colsum(dy) (when present).
  virtual void wgrad(Context& ctx, const TensorView& dy, const TensorView& x,
                     const TensorView& splits, const TensorView& dw, const TensorView& db,
                     bool accumulate) = 0;
  // The layer's weights changed (import, optimizer step): drop cached quantized weights.
  virtual void weights_changed() {}
  // Executors that quantize their inputs may read them through a row map (GroupQuantizeArgs::
  // row_map): forward on x = the rows row_map [M] picks from x_src [T, K], dgrad on dy likewise;
  // results bit for bit those of forward / dgrad on the gathered copy. wgrad then reads what
  // they quantized (its x and dy views are the sources).
  virtual bool gathers() const { return false; }
  virtual void forward_gathered(Context& ctx, const TensorView& x_src, const TensorView& row_map,
                                const TensorView& w, const TensorView& bias,
                                const TensorView& splits, const TensorView& y);
  virtual void dgrad_gathered(Context& ctx, const TensorView& dy_src, const TensorView& row_map,
                              const TensorView& w, const TensorView& splits, const TensorView& dx);
};

class LinearRecipe {
 public:
  virtual ~LinearRecipe() = default;
  virtual std::string name() const = 0;
  virtual QuantRecipe quantization() const = 0;  // QuantRecipe::none = bf16/fp16 GEMMs
  // Throws groupmm::Error naming the recipe when it cannot serve cfg (dtype, alignment).
  virtual std::unique_ptr<LinearExecutor> make_executor(Context& ctx,
                                                        const GroupedLinearConfig& cfg) const = 0;
};

// bf16/fp16 end to end, fp32 accumulation: grouped_gemm with `engine` (automatic = the graph-safe
// cutlass_sm90 engine on CUDA, the reference on CPU; cublas_loop is a NOT graph safe baseline) and
// group_dbias. The default recipe; the quantized training recipes (quantized_recipe: fp8_current,
// fp8_block, mxfp8) and the 4-bit weight inference recipes (nvfp4_weight_recipe,
// mxfp4_weight_recipe) below implement the same LinearRecipe interface.
std::shared_ptr<const LinearRecipe> high_precision_recipe(
    GemmEngine engine = GemmEngine::automatic);

// Quantized recipes: the layer's three GEMMs on quantized operands (gemm.hpp, QuantizedGemmArgs).
//   forward  x is quantized in both directions (rowwise for this GEMM, columnwise kept for wgrad;
//            rowwise only with high_precision_wgrad, which keeps the bf16 x instead);
//            W is quantized once in both directions (rowwise for forward, columnwise for dgrad;
//            128x128 blocks for fp8_block) and reused until weights_changed(), so micro-batches
//            share it. Under a CUDA graph, W's quantization is part of the graph only when the
//            cache was invalid at capture: call weights_changed() before capturing a training
//            step (the optimizer changes W every step); leave it valid for inference graphs.
//   backward dy is quantized in both directions (rowwise only with high_precision_wgrad), with
//            the bias gradient fused into that pass
//            when the bias grad is written (not accumulated); dgrad reads dy rowwise and W
//            columnwise; wgrad reads the columnwise copies of dy and x (so splits must be
//            multiples of recipe_traits(recipe).split_multiple, 16 for fp8_current and
//            fp8_block: pad experts, see the MoE permute), accumulating into the fp32 main grad
//            when asked.
//   recipes  fp8_current (per-expert scales), fp8_block (DeepSeek-V3 1x128 / 128x128 blocks) and
//            mxfp8 (on sm_90: exact dequantization to bf16, then the bf16 engine).
// Layers must be bf16 with K and N multiples of recipe_traits(recipe).in_features_multiple
// (quantize.hpp: 16 for fp8_current, 32 for mxfp8, 128 for fp8_block). Graph safe like the
// high-precision recipe: every quantized buffer is sized for max_tokens at construction.
struct QuantizedRecipeOptions {
  DType grad_dtype = DType::fp8e4m3;  // dy: fp8e4m3, or fp8e5m2 (fp8_current and mxfp8)
  bool pow2_scales = false;           // fp8_current, fp8_block: power-of-two scales
  // wgrad as the 16-bit GEMM of dy and x (the layer's bf16 operands, what the high-precision
  // recipe runs), forward and dgrad still FP8: TransformerEngine's
  // override_linear_precision=(False, False, True). x and dy are then quantized rowwise only (no
  // columnwise copies). Pays where the FP8 wgrad is not faster than the bf16 one, e.g. fp8_block
  // on fine-grained experts (performance.md).
  bool high_precision_wgrad = false;
};
std::shared_ptr<const LinearRecipe> quantized_recipe(QuantRecipe recipe,
                                                     QuantizedRecipeOptions options = {});

// Inference recipes with 4-bit expert weights (gemm.hpp, W4GemmArgs): the layer's weights are
// quantized once (rowwise, plain scales: nvfp4 in 1x16 blocks with E4M3 scales and a per-expert
// S_enc, mxfp4 in 1x32 blocks with E8M0 scales) and kept until weights_changed(); forward runs
// the 4-bit weight GEMM (decode or prefill by the average rows per expert). Forward only:
// backward throws groupmm::Error naming the recipe. Layers must be bf16 with in_features a
// multiple of 32 and out_features a multiple of 8 (recipe_traits: in_features_multiple,
// out_features_multiple). Graph safe like the other recipes (capture
// after the first forward, or with the weights valid, so that their quantization stays out of the
// graph).
std::shared_ptr<const LinearRecipe> nvfp4_weight_recipe();
std::shared_ptr<const LinearRecipe> mxfp4_weight_recipe();

// ---- The layer
// -----------------------------------------------------------------------------------

class GroupedLinear {
 public:
  // Allocates W [G, N, K], b [G, N], grads, y [max_tokens, N], dx [max_tokens, K] on ctx's device
  // (stream-ordered on ctx's stream) and initializes like nn.Linear: every weight and bias element
  // is U(-1/sqrt(K), 1/sqrt(K)) from fill_uniform (random.hpp: counter-based, a function of
  // (seed, element index) only, so independent of max_tokens and the same on CPU and CUDA).
  // Grads (and main grads) start at zero.
  // Throws on bad config (G, K, N, max_tokens >= 1; dtype bf16/fp16; the recipe's constraints).
  GroupedLinear(Context& ctx, const GroupedLinearConfig& cfg);
  // A part of `whole`: its experts [first, first + count), with views of the whole's parameters
  // and grads (weight(), bias() and their grads are slices of the whole's; a main grad set on the
  // whole later is followed, and the whole's weights_changed() reaches its parts) but an executor,
  // saved state and y / dx buffers (max_tokens rows) of its own. An expert's results through its
  // part are the whole's, bit for bit, when the part sees that expert's rows: every recipe
  // computes (and quantizes) each expert from its own rows and weights. nn::MoE's expert-chunked
  // steps run one part per chunk (the whole only holds the parameters then). The whole must
  // outlive its parts; set_main_grad and import / export go through the whole.
  GroupedLinear(Context& ctx, GroupedLinear& whole, int64_t first, int64_t count,
                int64_t max_tokens);
  ~GroupedLinear();
  GroupedLinear(const GroupedLinear&) = delete;
  GroupedLinear& operator=(const GroupedLinear&) = delete;

  // Reserves ctx's workspace for every pass at max_tokens (allocates: not during capture).
  void prepare(Context& ctx);

  // x [M, K] (M <= max_tokens) in dtype, splits [G] int32/int64 on the layer's device.
  // Returns y [M, N]. Saves x (by reference) and a copy of splits for backward.
  TensorView forward(Context& ctx, const TensorView& x, const TensorView& splits);
  // The forward of a caller whose fused kernel computes y itself (nn::MoE's fused gate_up
  // projection: moe_gate_up_swiglu): everything forward does but the GEMM. Saves x by reference
  // (x may be filled later: it must hold the layer's input when backward runs) and the splits, and
  // returns y [M, N], the layer's buffer, for the caller to write. High-precision recipe without
  // bias only (a quantized recipe's forward keeps its own copies for backward).
  TensorView forward_external(Context& ctx, const TensorView& x, const TensorView& splits);
  // forward on x = the rows of x_src [T, K] that row_map [M] int32 picks (-1 a zero row:
  // moe_permute_sources' row map), without the gathered copy: the quantized recipes quantize
  // straight from x_src (when gathers()). y, and everything backward computes, bit for bit
  // forward's on the gathered copy. x_src must stay alive until the wgrad is enqueued, as x.
  TensorView forward_gathered(Context& ctx, const TensorView& x_src, const TensorView& row_map,
                              const TensorView& splits);
  // dy [M, N] with forward's M. Returns dx [M, K]; computes dW/db now unless delay_wgrad.
  TensorView backward(Context& ctx, const TensorView& dy);
  // backward on dy = the rows of dy_src [T, N] that row_map [M] picks (M: forward's), when
  // gathers(); bit for bit backward's on the gathered copy. Either forward may precede it.
  TensorView backward_gathered(Context& ctx, const TensorView& dy_src, const TensorView& row_map);
  // Whether forward_gathered / backward_gathered run (fp8_current and fp8_block, without
  // high_precision_wgrad and without a bias gradient into a main grad).
  bool gathers() const;
  // With delay_wgrad: computes the queued dW/db (throws if nothing is queued).
  void backward_dw(Context& ctx);
  bool wgrad_pending() const { return pending_wgrad_; }

  // ---- parameters and grads (device views; writable, e.g. by an optimizer) ----
  const TensorView& weight() const { return w_view_; }  // [G, N, K] dtype
  const TensorView& bias() const { return b_view_; }    // [G, N] dtype, absent without bias
  // dW: [G, N, K] in dtype, or the fp32 main grad with accumulate_into_main_grad.
  const TensorView& weight_grad() const { return dw_view_; }
  // db: [G, N] in dtype, or the fp32 bias main grad. Absent without bias.
  const TensorView& bias_grad() const { return db_view_; }
  // Zeroes the grads (stream-ordered, graph safe).
  void zero_grad(Context& ctx);
  // Points the main grads at caller buffers (fp32 [G, N, K] / [G, N], e.g. a distributed
  // optimizer's grad buffer); only with accumulate_into_main_grad.
  void set_main_grad(const TensorView& dw, const TensorView& db = TensorView());
  // Call after changing weight()/bias() in place (lets a quantized recipe drop cached copies).
  void weights_changed();

  // ---- checkpoint compatibility: per-expert [N, K] weights and [N] biases, any device, dtype ----
  void import_weights(Context& ctx, const std::vector<TensorView>& w,
                      const std::vector<TensorView>& b = {});
  void export_weights(Context& ctx, const std::vector<TensorView>& w,
                      const std::vector<TensorView>& b = {}) const;

  const GroupedLinearConfig& config() const { return cfg_; }
  Device device() const { return device_; }
  const LinearRecipe& recipe() const { return *cfg_.recipe; }
  std::string to_string() const;

 private:
  void check_ctx(const Context& ctx, const char* fn) const;
  TensorView forward_impl(Context& ctx, const TensorView& x, const TensorView& splits,
                          const char* op, bool run_gemm, const TensorView& row_map = TensorView());
  TensorView backward_impl(Context& ctx, const TensorView& dy, const TensorView& row_map,
                           const char* op);
  void run_wgrad(Context& ctx, const TensorView& dy, const TensorView& x);
  void follow_whole();  // a part: its views of the whole's parameters and grads

  GroupedLinearConfig cfg_;
  Device device_;
  std::unique_ptr<LinearExecutor> exec_;
  Tensor w_, b_, dw_, db_, y_, dx_, splits_;
  TensorView w_view_, b_view_, dw_view_, db_view_;
  GroupedLinear* whole_ = nullptr;     // a part's whole (null: this layer owns its parameters)
  int64_t first_ = 0;                  // a part's first expert in the whole
  std::vector<GroupedLinear*> parts_;  // a whole's parts (they unregister when destroyed)
  TensorView saved_x_, saved_splits_, pending_dy_;
  int64_t saved_m_ = -1;
  bool pending_wgrad_ = false;
};

}  // namespace groupmm::nn
