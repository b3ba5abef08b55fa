// groupmm/moe.hpp: the MoE block's ops around the grouped GEMMs: router, permute / unpermute,
// SwiGLU and the router-weighted SwiGLU. nn/moe.hpp composes them into a layer.
//
// The block, forward (T tokens, hidden H, E experts, top-k, R = permuted rows):
//   logits  = moe_router_logits(x, W_r)                       [T, E] fp32
//   ids, w  = moe_router_forward(logits)                      [T, k] int32, [T, k] fp32, counts [E]
//   map     = moe_permute_plan(ids)                           dest_row [T, k], splits [E]
//   xp, pp  = moe_permute(x, w, map)                          [R, H], probs [R] fp32
//   gu      = grouped GEMM (gate_up)                          [R, 2F]
//   h       = weighted_swiglu_forward(gu, pp)                 [R, F]  (router weight applied here)
//   yp      = grouped GEMM (down)                             [R, H]
//   y       = moe_unpermute(yp, map, add = shared expert(x))  [T, H]  (unweighted fixed-order sum)
// and backward mirrors it: moe_unpermute_backward (a scatter), weighted_swiglu_backward (d prob out
// of the activation), moe_permute_backward (a k-way sum and the d weight gather),
// moe_router_backward (d logits), moe_router_logits_backward (dx, dW_r).
//
// Conventions (docs/conventions.md): sizes are host-known (R from moe_permuted_rows), splits and
// maps live on the device; results are bit-identical run to run (fixed-order sums, no
// floating-point atomics); router ties break toward the lower expert id on both backends.
//
// Every op below is graph safe on CUDA (no host read of device data, no sync, no allocation once
// the Context workspace is reserved for the ops that use it) unless it says otherwise. Minimum SM:
// sm_90 (CUDA); the CPU reference backend runs anywhere. Host-side validation throws
// groupmm::Error naming the op, the argument and the value. Device-side faults (an expert id out
// of range) skip the entry and set a bit in the Context's status block (Context::check()).
#pragma once

#include <limits>
#include <string>

#include "groupmm/core.hpp"

namespace groupmm {

// ================================================================================================
// Router
// ================================================================================================

enum class RouterScore : uint8_t { softmax, sigmoid };
const char* router_score_name(RouterScore s);

// With s = score(logits) per token (softmax over the E logits, or sigmoid of each):
//   selection key  sel_e = s_e + expert_bias_e          (bias optional: selection only)
//   group-limited  (n_group > 1): experts form n_group contiguous groups of E / n_group; a group's
//                  score is the sum of its top (k / topk_group) sel values (in descending order);
//                  only the topk_group best groups stay selectable (ties: lower group id)
//   ids            the k best selectable sel values, best first (ties: lower expert id)
//   weights        w_j = s_{ids_j}; with renormalize w_j = w_j / (sum_j' w_j' + 1e-20); then
//                  w_j *= scaling_factor
//   counts         counts_e = number of (token, j) with ids = e (before any capacity drop)
//   aux_loss       aux_loss_coeff * E / (k T^2) * sum_e (sum_t P_te) * counts_e, with P = softmax
//                  (score softmax) or s / (sum_e s_e + 1e-20) (score sigmoid)      (Switch/GShard)
//   z_loss         z_loss_coeff / T * sum_t logsumexp(logits_t)^2
// NaN logits are ranked below every number. Logits may be -inf as long as one per token is finite.
// Numerics are bit-identical on both backends (own exp, fixed summation order: see
// src/numerics/router.hpp) except the two losses (logsumexp and cross-token sums differ in
// rounding only; each is still deterministic run to run).
// The router's limits: E in [1, kRouterMaxExperts], k in [1, min(E, kRouterMaxTopk)].
inline constexpr int64_t kRouterMaxExperts = 1024, kRouterMaxTopk = 32;
struct RouterConfig {
  int64_t experts = 0;  // E, 1..1024
  int64_t topk = 0;     // k, 1..min(E, 32)
  RouterScore score = RouterScore::softmax;
  int64_t n_group = 1;     // 1 = plain top-k; else divides E, <= 32
  int64_t topk_group = 1;  // groups kept, 1..n_group, <= k
  bool renormalize = false;
  float scaling_factor = 1.0f;
  float aux_loss_coeff = 0.0f;  // 0: no aux loss (aux_loss output may then be absent)
  float z_loss_coeff = 0.0f;    // 0: no z-loss
  std::string to_string() const;
};

// logits [T, E] = x [T, H] W_r [E, H]^T (+ bias [E], optional, in x's dtype: added to each fp32
// sum). x and w bf16 or fp16 (one dtype; fp32 too on a CPU context); logits fp32; fp32
// accumulation (on CUDA: one kernel, the bias in it, for T <= 16; cuBLAS above; loops on CPU).
// Row-major, contiguous. Uses ctx's workspace for cuBLAS (moe_router_logits_workspace_size:
// reserve it before capture).
void moe_router_logits(Context& ctx, const TensorView& x, const TensorView& w,
                       const TensorView& logits, const TensorView& bias = {});
// Backward of moe_router_logits with g = d_logits rounded to x's dtype ([T, E] scratch in ctx's
// workspace):  dx (+)= g W_r   [T, H] in x's dtype;   dw (+)= g^T x   [E, H] fp32 or x's dtype.
// Either output may be absent (skipped): delayed wgrad calls it again with dw only. accumulate_*
// adds into the output (dx in its dtype: one rounding of fp32(dx) + the product).
void moe_router_logits_backward(Context& ctx, const TensorView& d_logits, const TensorView& x,
                                const TensorView& w, const TensorView& dx, const TensorView& dw,
                                bool accumulate_dx, bool accumulate_dw);
size_t moe_router_logits_workspace_size(const Context& ctx, int64_t tokens, int64_t experts);

struct RouterArgs {
  TensorView logits;       // [T, E] fp32, required
  TensorView expert_bias;  // [E] fp32, optional (selection only)
  TensorView expert_ids;   // out [T, k] int32
  TensorView weights;      // out [T, k] fp32
  TensorView counts;       // out [E] int32
  TensorView aux_loss;     // out [1] fp32, required when aux_loss_coeff != 0; optional otherwise
                           // (then written 0, so a caller needs no fill of its own)
  TensorView z_loss;       // out [1] fp32, likewise for z_loss_coeff
};
// One warp per token (its E scores in registers); per-chunk partial counts and loss sums are
// reduced by a second kernel in a fixed order. T may be 0 (counts zeroed, losses 0). Workspace:
// moe_router_workspace_size (ctx's workspace when none is passed).
void moe_router_forward(Context& ctx, const RouterConfig& cfg, const RouterArgs& args,
                        void* workspace = nullptr, size_t workspace_bytes = 0);
size_t moe_router_workspace_size(const Context& ctx, const RouterConfig& cfg, int64_t tokens);

struct RouterBackwardArgs {
  TensorView logits;      // [T, E] fp32 (forward's input)
  TensorView expert_ids;  // [T, k] int32 (forward's output)
  TensorView counts;      // [E] int32 (forward's output; read only when aux_loss_coeff != 0)
  TensorView d_weights;   // [T, k] fp32
  TensorView d_logits;    // out [T, E] fp32
};
// d_logits of  sum_tj d_weights_tj * w_tj + aux_loss + z_loss  (the losses enter with gradient 1;
// counts are constants). Scores and weights are recomputed from logits and ids. Bit-identical on
// both backends without z-loss (its logsumexp differs by rounding).
void moe_router_backward(Context& ctx, const RouterConfig& cfg, const RouterBackwardArgs& args);

// ================================================================================================
// Permute plan: where every (token, choice) goes
// ================================================================================================

// The permuted buffer holds expert 0's rows, then expert 1's, ...; within an expert, tokens in
// order (stable: the order of t * k + j). With capacity c > 0, an expert keeps its first c tokens
// in that order and drops the rest (dest_row = -1; counts - kept says how many). With align > 1
// each expert's rows are padded to a multiple of align with zero rows. The buffer has `rows` rows
// (host-known, moe_permuted_rows); rows past the last expert's padded end (the tail: dropped
// tokens, bad ids) are zero too and are counted in splits[E - 1], so that sum(splits) == rows,
// the grouped GEMM's contract; every expert starts at a multiple of align and every split is one.
// A zero row's prob is 0, so the expert MLP turns it into bias rows nobody gathers, and its
// gradients into zeros: padding and tail cost GEMM rows, never correctness.
struct PermuteMap {
  int64_t tokens = 0, topk = 0, experts = 0;
  int64_t align = 1;     // per-expert row padding (1, 16, 128, ...)
  int64_t capacity = 0;  // tokens kept per expert, 0 = dropless
  int64_t rows = 0;      // R = moe_permuted_rows(tokens, topk, experts, align, capacity)
  TensorView dest_row;   // [T, k] int32: row of (t, j) in the buffer, or -1 (dropped / bad id)
  TensorView row_start;  // [E] int32: first row of expert e
  TensorView kept;       // [E] int32: tokens expert e keeps (min(count, capacity))
  TensorView splits;     // [E] int32: rows of expert e's group (kept + padding; + tail for E - 1)
  std::string to_string() const;
};

// R = roundup(kept_max + E * (align - 1), align), kept_max = T k (dropless) or min(T k, E c).
int64_t moe_permuted_rows(int64_t tokens, int64_t topk, int64_t experts, int64_t align = 1,
                          int64_t capacity = 0);
// Capacity from a factor: ceil(factor * T k / E); 0 when factor <= 0 (dropless).
int64_t moe_capacity(int64_t tokens, int64_t topk, int64_t experts, double capacity_factor);

// Fills dest_row, row_start, kept and splits of `map` from expert_ids [T, k] int32 (any source:
// each entry is one row; an id outside [0, E) is skipped with kFaultBadIndex, group = its token).
// Three launches (chunk histograms, per-expert scan, stable ranks); workspace
// moe_permute_plan_workspace_size. E <= 1024; any k >= 1 (a token naming an expert twice gets two
// rows).
void moe_permute_plan(Context& ctx, const TensorView& expert_ids, const PermuteMap& map,
                      void* workspace = nullptr, size_t workspace_bytes = 0);
size_t moe_permute_plan_workspace_size(const Context& ctx, int64_t tokens, int64_t topk,
                                       int64_t experts);

// ================================================================================================
// Permute / unpermute (memory-bound row moves; 16-byte vectors when H * sizeof(dtype) % 16 == 0
// and the pointers are 16-byte aligned). x-like tensors are [T, H], permuted ones [R, H], all in
// one dtype (bf16, fp16 or fp32), row-major, contiguous. Outputs may not alias inputs.
// ================================================================================================

// x_perm[dest_row[t, j]] = x[t]; probs[dest_row[t, j]] = weights[t, j]; padding and tail rows (and
// their probs) = 0. One read of each token row, k writes. weights/probs optional (both or none).
void moe_permute(Context& ctx, const TensorView& x, const PermuteMap& map, const TensorView& x_perm,
                 const TensorView& weights = TensorView(), const TensorView& probs = TensorView());
// dx[t] = sum_j d_x_perm[dest_row[t, j]] (j in order, dropped entries skipped) + add[t], in fp32,
// rounded once; d_weights[t, j] = d_probs[dest_row[t, j]] (0 when dropped). add [T, H] and the
// d_probs/d_weights pair are optional.
void moe_permute_backward(Context& ctx, const TensorView& d_x_perm, const PermuteMap& map,
                          const TensorView& dx, const TensorView& d_probs = TensorView(),
                          const TensorView& d_weights = TensorView(),
                          const TensorView& add = TensorView());
// The router-weighted expert bias of a layer whose experts' second projection has a bias
// (gpt-oss's down bias): the router weight multiplies the whole expert output, bias included,
// but it is applied inside weighted_swiglu_forward, before that projection, so the projection's
// own bias would be unweighted; moe_unpermute adds sum_j weights[t, j] bias[expert_ids[t, j]]
// over the kept (t, j) instead. All three or none.
struct RoutedBias {
  TensorView bias;        // [E, H] in y's dtype
  TensorView expert_ids;  // [T, k] int32: the ids the map was planned from
  TensorView weights;     // [T, k] fp32 (the router weights)
  bool present() const { return bias.present(); }
};

// y[t] = sum_j y_perm[dest_row[t, j]], then + weights[t, j] bias[expert_ids[t, j]] for each kept
// j (fused multiply-add, j order) when `routed` is given, then + add[t]; all in fp32, rounded
// once: the combine (unweighted: the router weight was applied inside weighted_swiglu_forward).
// A kept (t, j) whose id is outside [0, E) adds no bias and reports kFaultBadIndex.
void moe_unpermute(Context& ctx, const TensorView& y_perm, const PermuteMap& map,
                   const TensorView& y, const TensorView& add = TensorView(),
                   const RoutedBias& routed = RoutedBias());
// dy_perm[dest_row[t, j]] = dy[t]; padding and tail rows = 0.
void moe_unpermute_backward(Context& ctx, const TensorView& dy, const PermuteMap& map,
                            const TensorView& dy_perm);

// ================================================================================================
// SwiGLU on a fused gate_up projection
// ================================================================================================
//
// gate_up [M, 2I] holds gate = columns [0, I) and up = columns [I, 2I) of each row (the layout of a
// fused gate_up GroupedLinear with out features 2I).
//
//   forward:  out[m][i]      = silu(gate) * up,  silu(g) = g * sigmoid(g)
//   backward: dgate_up[m][i]   = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g)))   (d gate)
//             dgate_up[m][I+i] = dout * silu(g)                                        (d up)
//
// dtypes: gate_up, out, dout and dgate_up all bf16, fp16 or fp32 (one dtype); math in fp32, one
// rounding per output. sigmoid(g) = 1 / (1 + exp(-g)); the CUDA kernel's expf may differ from the
// host's by an ulp, so CUDA and CPU agree to within one ulp of the output format (not bit for bit).
// Layout: row-major, contiguous. Rows are independent: expert boundaries do not matter, so no
// splits are needed. Each direction is one memory-bound pass: 16-byte vectorized loads/stores when
// I is a multiple of 16/sizeof(dtype) and the pointers are 16-byte aligned, scalar otherwise.
// Graph safe (one launch, no workspace, no sync). Minimum SM: sm_90 (CUDA); CPU anywhere.
// dgate_up may not alias gate_up or dout; out may not alias gate_up.
void swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& out);
void swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                     const TensorView& dgate_up);

// ---- Router-weighted SwiGLU (the expert MLP's activation) --------------------------------------
//
// prob [M] fp32 is each row's router weight (moe_permute's probs):
//   forward:  out[m][i] = swiglu(gate, up) * prob[m]
//   backward: dgate_up  = swiglu_backward(dout * prob[m])  (element formulas as above)
//             dprob[m]  = sum_i dout[m][i] * swiglu(gate, up)[m][i]   (fp32)
// Element math is swiglu's formulas (src/moe/swiglu_backends.hpp); the CUDA kernel divides with the
// hardware's fast reciprocal (__fdividef: at most 2 ulp, where swiglu divides exactly), which keeps
// CUDA and CPU within one ulp of bf16/fp16 outputs and a few ulp of fp32 (a sigmoid below 2^-126
// becomes 0 on CUDA). dprob is a per-row sum in a fixed order on CUDA (one warp a
// row: lane-strided partial sums, then a butterfly), deterministic run to run; the CPU sums in
// column order (agreement within fp32 sum-order rounding). Same dtypes, layouts, vectorization and
// aliasing rules as swiglu; graph safe, one launch per direction.
void weighted_swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& prob,
                             const TensorView& out);
void weighted_swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                              const TensorView& prob, const TensorView& dgate_up,
                              const TensorView& dprob);

// ---- The parameterized weighted SwiGLU (gpt-oss's clamped form) --------------------------------
//
// The same op with a SwigluForm (defaults: the plain weighted SwiGLU above, bit for bit):
//   g' = min(g, limit), u' = clamp(u, -limit, limit)   (torch.clamp: a NaN stays NaN)
//   s  = sigmoid(alpha * g')
//   forward:  out[m][i] = g' * s * (u' + up_offset) * prob[m]
//   backward: with d = dout[m][i] * prob[m],
//             d gate = d * (u' + up_offset) * s * (1 + alpha * g' * (1 - s))   where g <= limit,
//                      0 where the gate was clamped (g > limit or NaN)
//             d up   = d * g' * s                         where -limit <= u <= limit, else 0
//             dprob[m] = sum_i dout[m][i] * g' * s * (u' + up_offset)   (fp32, as above)
// gpt-oss: alpha = 1.702, limit = 7, up_offset = 1, layout interleaved.
// layout: halves (gate = columns [0, I), up = [I, 2I)) or interleaved (gate = column 2i, up =
// column 2i + 1, as gpt-oss's fused gate_up projection); dgate_up has gate_up's layout, out and
// dout are [M, I] either way. alpha and up_offset finite, limit > 0 (+infinity: no clamp).
// Everything else (dtypes, the CUDA sigmoid, agreement with the CPU, dprob's order, aliasing,
// vectorization: I a multiple of 16/sizeof(dtype) in either layout) as weighted_swiglu; graph
// safe, one launch per direction.
//
// splits (optional, both directions): [G] int32|int64 row counts on the Context's device (host
// memory on a CPU context), the experts' rows of a buffer whose tail belongs to no expert (expert
// parallelism's capacity mode, ep.hpp; with SplitsTotal::at_most GEMMs around it). Only the rows
// [0, S), S = sum(splits) (negative splits count as 0), are computed: the rows past S of gate_up,
// prob and dout are not read, and those of out, dgate_up and dprob are not written. S <= M is the
// contract; a sum above M computes the M rows and reports kFaultSplitsOverflow (at the first
// expert that crosses M) and kFaultSplitsTotalMismatch (value: the sum) against weighted_swiglu;
// a negative split reports kFaultNegativeSplit. The sum is read on the device (graph safe; no
// host read). Rows [0, S) are bit for bit those of the call without splits. Absent: every row.
enum class SwigluLayout : uint8_t { halves, interleaved };
const char* swiglu_layout_name(SwigluLayout l);
struct SwigluForm {
  float alpha = 1.0f;
  float limit = std::numeric_limits<float>::infinity();
  float up_offset = 0.0f;
  SwigluLayout layout = SwigluLayout::halves;
  // The plain SwiGLU (the defaults): its kernels and element math run unchanged.
  bool plain() const;
  std::string to_string() const;
};
void weighted_swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& prob,
                             const TensorView& out, const SwigluForm& form,
                             const TensorView& splits = TensorView());
void weighted_swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                              const TensorView& prob, const TensorView& dgate_up,
                              const TensorView& dprob, const SwigluForm& form,
                              const TensorView& splits = TensorView());

// ================================================================================================
// The fused gate_up projection: gathered x, the weighted SwiGLU in the GEMM's epilogue
// ================================================================================================
//
// One launch of groupmm's own sm_90a grouped GEMM (src/kernels/sm90/gathered_gemm.cuh) in place of
// moe_permute + the gate_up grouped GEMM + weighted_swiglu_forward: the A operand is gathered from
// x through the row map (no permuted copy of x), and the weighted SwiGLU runs on the tile in
// registers while the other consumer warpgroup's MMAs run (no gate_up round trip through HBM).
//
// For every row r of expert g (rows [start_g, start_g + splits_g), starts from the splits):
//   gu[r, n]  = round(sum_k x[src_row[r], k] * w[g, n, k])   fp32 accumulation, rounded to x's
//                dtype (the grouped GEMM's output); src_row[r] = -1: a zero row
//   out[r, i] = weighted_swiglu(gu[r, i], gu[r, F + i], prob[r])   (moe.hpp's forward formula)
// Numerics: exactly the unfused composition's (the same rounding points; on CUDA the same fast
// sigmoid as weighted_swiglu_forward), so fused and unfused agree bit for bit where their fp32
// sums agree (the CUDA GEMMs add each K block of 64 in the same wgmma order; tested).
//
// Arguments (x's dtype: bf16 or fp16; all row-major, contiguous):
//   x        [T, H]             the tokens (never permuted)
//   src_row  [R] int32          row of x behind permuted row r, or -1 (moe_permute_sources)
//   splits   [E] int32 | int64  rows per expert, sum == R (the PermuteMap's splits)
//   w        [E, 2F, H]         gate rows [0, F), up rows [F, 2F) of each expert
//   prob     [R] fp32           each row's router weight (moe_permute_sources)
//   out      [R, F]             the activation, input of the down projection
//   gate_up  [R, 2F] optional   the pre-activation (what weighted_swiglu_backward reads)
// x may be fp32 on a CPU context (gradient checks). Requirements (CUDA): H % 8 == 0,
// F % 64 == 0, E <= 1024, 16-byte aligned x and w; R, T < 2^31.
// Graph safe (one launch, no workspace, no host read of the splits). Device faults: a split
// negative or past R (kFaultNegativeSplit / kFaultSplitsOverflow / kFaultSplitsTotalMismatch),
// a src_row outside [-1, T) (kFaultBadIndex, read as a zero row); nothing is written out of
// bounds. Minimum SM: sm_90a (CUDA); the CPU reference composes the unfused CPU ops.
struct MoeGateUpArgs {
  TensorView x, src_row, splits, w, prob, out;
  TensorView gate_up;  // optional
  // CUDA kernel configuration (tests and tuning; results are bit-identical in each): "" = the
  // default (coop_128x256 when F % 128 == 0, else pingpong_128x128); "coop_128x256"
  // (cooperative 128 x 256 tiles), "coop_128x256_c2" (the same on 2-CTA clusters that multicast
  // the weight tile; both need F % 128 == 0) or "pingpong_128x128".
  std::string config;
};
void moe_gate_up_swiglu(Context& ctx, const MoeGateUpArgs& args);
// Whether moe_gate_up_swiglu takes these sizes on ctx's device (CPU: always; CUDA: an sm_90 device
// and the requirements above), so a layer can choose it or the unfused ops without a try.
bool moe_gate_up_swiglu_supported(const Context& ctx, DType dtype, int64_t hidden, int64_t ffn,
                                  int64_t experts);

// ================================================================================================
// The fused down-projection backward: gathered dy, the weighted SwiGLU's backward in the dgrad
// ================================================================================================
//
// One launch of the kernel layer's gathered GEMM (B read N-major) in place of
// moe_unpermute_backward + the down projection's grouped dgrad + weighted_swiglu_backward, for the
// block whose router weight is applied inside the activation (its combine is a plain sum, so the
// down output's gradient is dy gathered). For every row r of expert g:
//   da[r, i]  = round(sum_h dy[src_row[r], h] * w[g, h, i])   fp32 accumulation, rounded to dy's
//               dtype (the dgrad's output); src_row[r] = -1: a zero row
//   dgate_up[r, i], dgate_up[r, F + i], dprob[r] = weighted_swiglu_backward(da[r], gate_up[r],
//               prob[r])   (moe.hpp's backward formula)
// Numerics: da and dgate_up exactly the unfused composition's (the same rounding points and, on
// CUDA, the same fast sigmoid; the dgrad's K blocks of 64 added in the same wgmma order: tested
// bit for bit). dprob is each row's fp32 sum of da * swiglu in a fixed order, deterministic run to
// run but not the unfused kernel's order (CUDA: the column tiles of 256 in order, each tile's
// part summed over 8-column groups per lane and then a butterfly, over the quad (coop_128x256)
// or the warp (epi_warps); CPU: the composition's).
//
// Arguments (dy's dtype: bf16 or fp16; all row-major, contiguous):
//   dy        [T, H]            gradient of the block's output (never permuted)
//   src_row   [R] int32         row of dy behind permuted row r, or -1 (moe_permute_sources)
//   splits    [E] int32 | int64 rows per expert, sum == R (the PermuteMap's splits)
//   w         [E, H, F]         the down projection's weight (GroupedLinear's [G, N, K])
//   gate_up   [R, 2F]           the pre-activation forward kept (moe_gate_up_swiglu's gate_up)
//   prob      [R] fp32          each row's router weight (moe_permute_sources)
//   dgate_up  [R, 2F]           out: the gradient of the pre-activation
//   dprob     [R] fp32          out: the gradient of each row's router weight
// dy may be fp32 on a CPU context (gradient checks). Requirements (CUDA): H % 8 == 0, F % 8 == 0,
// E <= 1024, 16-byte aligned dy, w, gate_up and dgate_up; R, T < 2^31.
// Graph safe (one launch, no workspace, no host read of the splits). Device faults: as
// moe_gate_up_swiglu's (splits rule, src_row outside [-1, T) read as a zero row); nothing is
// written out of bounds. Minimum SM: sm_90a (CUDA); the CPU reference composes the unfused ops.
struct MoeDownDgradArgs {
  TensorView dy, src_row, splits, w, gate_up, prob, dgate_up, dprob;
  // CUDA kernel configuration (tests and tuning): "" = the default (coop_128x256);
  // "coop_128x256" (the consumers run the epilogue after each tile's mainloop) or
  // "epi_warps" (two warps of the producer warpgroup run it under the next tile's mainloop). da and
  // dgate_up are bit-identical in each; dprob's order of sums is each configuration's own.
  std::string config;
};
void moe_down_dgrad_swiglu(Context& ctx, const MoeDownDgradArgs& args);
// Whether moe_down_dgrad_swiglu takes these sizes on ctx's device (CPU: always; CUDA: an sm_90
// device and the requirements above).
bool moe_down_dgrad_swiglu_supported(const Context& ctx, DType dtype, int64_t hidden, int64_t ffn,
                                     int64_t experts);

// The row map of the gathered ops: src_row[dest_row[t, j]] = t and probs[dest_row[t, j]] =
// weights[t, j]; padding and tail rows get src_row -1 and prob 0 (what moe_permute writes as a
// zero row). src_row [R] int32, weights [T, k] fp32 and probs [R] fp32 (both or neither).
// Graph safe; two launches (fill, scatter).
void moe_permute_sources(Context& ctx, const PermuteMap& map, const TensorView& src_row,
                         const TensorView& weights = TensorView(),
                         const TensorView& probs = TensorView());

}  // namespace groupmm
