// Fuzz cases of the quantized grouped GEMM and of the MoE ops and block (fuzz_cases.hpp).
#include <algorithm>

#include "fuzz_cases.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/moe.hpp"
#include "groupmm/nn/moe.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm::fuzz {
namespace {

TensorView spec(Arena& a, const TensorSpec& s) {
  if (!s.present()) return TensorView();
  return s.rank == 1   ? a.view(s.dtype, {s.shape[0]})
         : s.rank == 2 ? a.view(s.dtype, {s.shape[0], s.shape[1]})
                       : a.view(s.dtype, {s.shape[0], s.shape[1], s.shape[2]});
}

// group_quantize of x ([M, K] with splits, or [G, N, K] weights when splits is absent); both
// copies. Returns the GroupedTensor it wrote.
GroupedTensor quantize(Context& ctx, Arena& a, const TensorView& x, const TensorView& splits,
                       int64_t G, QuantizeConfig c) {
  GroupQuantizeArgs q;
  q.config = c;
  q.input = x;
  q.splits = splits;
  const int64_t rows = x.rank == 3 ? x.dim(0) * x.dim(1) : x.dim(0);
  const QuantizedShapes s = group_quantize_shapes(rows, x.dim(x.rank - 1), G, c);
  q.out.data = spec(a, s.data), q.out.scale_inv = spec(a, s.scale_inv);
  q.out.columnwise_data = spec(a, s.columnwise_data);
  q.out.columnwise_scale_inv = spec(a, s.columnwise_scale_inv);
  q.out.amax = spec(a, s.amax), q.out.global_scale = spec(a, s.global_scale);
  return group_quantize(ctx, q);
}

// [G] int32 splits of M rows in whole 16-row units (M % 16 == 0): what wgrad's TMA needs.
TensorView splits16(Gen& g, Arena& a, int64_t G, int64_t M) {
  TensorView v = a.view(DType::int32, {G});
  auto* s = static_cast<int32_t*>(v.data);
  std::fill(s, s + G, 0);
  for (int64_t u = 0; u < M / 16; ++u) s[g.pick(0, G - 1)] += 16;
  return v;
}

}  // namespace

// Operands quantized with a random recipe (the GEMM's scale layouts, mostly valid shapes), then
// one pass with random options; sometimes a recipe, layout, dtype or view is broken.
void case_quantized_gemm(Gen& g, Arena& a, Context& ctx) {
  const QuantRecipe r = static_cast<QuantRecipe>(g.chance(0.95) ? g.pick(1, 3) : g.pick(0, 4));
  const int64_t unit = r == QuantRecipe::fp8_block ? 128 : r == QuantRecipe::mxfp8 ? 32 : 16;
  const int64_t G = g.groups(), N = g.pick(1, 3) * unit, K = g.pick(1, 3) * unit;
  const int64_t M = g.chance(0.8) ? g.pick(0, 8) * 16 : g.pick(0, 200);
  QuantizeConfig c;
  c.recipe = r;
  c.direction = QuantDirection::both;
  c.scale_layout = r == QuantRecipe::fp8_block ? ScaleLayout::plain
                   : r == QuantRecipe::mxfp8   ? ScaleLayout::swizzled
                                               : ScaleLayout::plain;
  if (g.chance(0.05)) c.scale_layout = static_cast<ScaleLayout>(g.pick(0, 2));
  QuantizedGemmArgs x;
  x.pass = static_cast<GemmPass>(g.pick(0, 2));
  x.splits = M % 16 == 0 && g.chance(0.7) ? splits16(g, a, G, M) : a.splits(g, G, M);
  const TensorView act = a.view(DType::bf16, {M, x.pass == GemmPass::forward ? K : N});
  QuantizeConfig cw = c;
  cw.block_2d = r == QuantRecipe::fp8_block;
  x.a = quantize(ctx, a, act, x.splits, G, c);
  if (x.pass == GemmPass::wgrad) {
    x.b = quantize(ctx, a, a.view(DType::bf16, {M, K}), x.splits, G, c);
    x.out = a.view(g.chance(0.5) ? DType::fp32 : DType::bf16, {G, N, K});
    x.beta = x.out.dtype == DType::fp32 && g.chance(0.5) ? 1.0f : 0.0f;
  } else {
    x.b = quantize(ctx, a, a.view(DType::bf16, {G, N, K}), TensorView(), G, cw);
    x.out = a.view(DType::bf16, {M, x.pass == GemmPass::forward ? N : K});
    if (x.pass == GemmPass::forward && g.chance(0.3)) x.bias = a.view(DType::bf16, {G, N});
  }
  ctx.check();  // the quantizers' split faults end the case here (a groupmm::Error)
  if (g.chance(0.2)) x.fast_accum = true;
  if (g.chance(0.1)) x.alpha = g.chance(0.5) ? 0.0f : -2.5f;
  if (g.chance(0.05)) x.beta = 0.5f;
  if (g.chance(0.1)) x.engine = static_cast<GemmEngine>(g.pick(0, 3));
  if (g.chance(0.05)) x.config = g.chance(0.5) ? "fwd_e4m3_bf16_128x192_coop_c21" : "nonsense";
  if (g.chance(0.05)) x.b.recipe = static_cast<QuantRecipe>(g.pick(0, 4));
  if (g.chance(0.05)) x.a.scale_layout = static_cast<ScaleLayout>(g.pick(0, 2));
  if (g.chance(0.05)) x.pass = static_cast<GemmPass>(g.pick(0, 2));  // operands of another pass
  g.mutate_one_of({&x.a.data, &x.a.scale_inv, &x.a.columnwise_data, &x.b.data,
                   &x.b.columnwise_scale_inv, &x.out, &x.splits, &x.bias},
                  a);
  (void)x.to_string();
  const size_t ws = grouped_gemm_workspace_size(ctx, x);
  (void)gemm_config_name(ctx, x);
  grouped_gemm(ctx, x, g.chance(0.2) ? a.bytes(64) : nullptr, g.chance(0.2) ? 64 : ws);
}

// The MoE ops in the order a block calls them, each on the outputs of the one before; at most one
// stage gets a malformed view (so that most cases reach the later ops).
void case_moe_ops(Gen& g, Arena& a, Context& ctx) {
  const int broken = g.chance(0.5) ? int(g.pick(0, 9)) : -1;
  auto maybe_break = [&](int stage, std::initializer_list<TensorView*> views) {
    if (stage == broken) g.mutate_one_of(views, a);
  };
  const int64_t T = g.pick(0, 64), E = g.chance(0.97) ? g.pick(1, 40) : g.pick(-2, 2000);
  const int64_t k =
      g.chance(0.97) ? g.pick(1, std::max<int64_t>(1, std::min<int64_t>(E, 8))) : g.pick(-1, 40);
  const int64_t H = g.pick(1, 8) * 8, F = g.pick(1, 4) * 8;
  const DType t = g.chance(0.5) ? DType::bf16 : DType::fp16;
  RouterConfig rc;
  rc.experts = E, rc.topk = k;
  rc.score = g.chance(0.5) ? RouterScore::softmax : RouterScore::sigmoid;
  if (g.chance(0.2)) {  // group-limited: mostly a valid grouping
    rc.n_group = E % 4 == 0 && g.chance(0.8) ? 4 : g.pick(1, 5);
    rc.topk_group = std::min<int64_t>(g.pick(1, 3), std::max<int64_t>(k, 1));
  }
  rc.renormalize = g.chance(0.5);
  rc.aux_loss_coeff = g.chance(0.5) ? 0.01f : 0.0f;
  rc.z_loss_coeff = g.chance(0.3) ? 0.001f : 0.0f;
  if (g.chance(0.05)) rc.scaling_factor = -1.0f;
  (void)rc.to_string();
  const int64_t Ev = std::max<int64_t>(E, 1), kv = std::max<int64_t>(k, 1);
  TensorView x = a.view(t, {T, H}), w = a.view(t, {Ev, H}), logits = a.view(DType::fp32, {T, Ev});
  maybe_break(0, {&x, &w, &logits});
  moe_router_logits(ctx, x, w, logits);
  RouterArgs ra;
  ra.logits = logits;
  ra.expert_ids = a.view(DType::int32, {T, kv});
  ra.weights = a.view(DType::fp32, {T, kv});
  ra.counts = a.view(DType::int32, {Ev});
  ra.aux_loss = a.view(DType::fp32, {1});
  ra.z_loss = a.view(DType::fp32, {1});
  if (g.chance(0.2)) ra.expert_bias = a.view(DType::fp32, {Ev});
  maybe_break(1, {&ra.expert_ids, &ra.weights, &ra.counts, &ra.aux_loss, &ra.expert_bias});
  moe_router_forward(ctx, rc, ra);
  PermuteMap m;
  m.tokens = T, m.topk = k, m.experts = E;
  m.align = g.chance(0.7) ? 1 : g.chance(0.9) ? 16 : g.pick(-1, 3);
  m.capacity = g.chance(0.8) ? 0 : g.pick(g.chance(0.9) ? 1 : -1, 10);
  m.rows = g.chance(0.97) ? moe_permuted_rows(T, kv, Ev, std::max<int64_t>(m.align, 1),
                                              std::max<int64_t>(m.capacity, 0))
                          : g.pick(-1, 50);
  m.dest_row = a.view(DType::int32, {T, kv});
  m.row_start = a.view(DType::int32, {Ev});
  m.kept = a.view(DType::int32, {Ev});
  m.splits = a.view(DType::int32, {Ev});
  maybe_break(2, {&m.dest_row, &m.row_start, &m.kept, &m.splits});
  (void)m.to_string();
  // ids from the router, or arbitrary ints (out of range: skipped and reported)
  moe_permute_plan(ctx, g.chance(0.9) ? ra.expert_ids : a.view(DType::int32, {T, kv}), m);
  const int64_t R = std::max<int64_t>(m.rows, 0);
  TensorView xp = a.view(t, {R, H}), probs = a.view(DType::fp32, {R});
  maybe_break(3, {&xp, &probs});
  moe_permute(ctx, x, m, xp, ra.weights, probs);
  TensorView gu = a.view(t, {R, 2 * F}), act = a.view(t, {R, F});
  maybe_break(4, {&gu, &act});
  weighted_swiglu_forward(ctx, gu, probs, act);
  TensorView yp = a.view(t, {R, H}), y = a.view(t, {T, H});
  maybe_break(5, {&yp, &y});
  moe_unpermute(ctx, yp, m, y, g.chance(0.3) ? a.view(t, {T, H}) : TensorView());
  // backward
  TensorView dyp = a.view(t, {R, H});
  moe_unpermute_backward(ctx, y, m, dyp);
  TensorView dgu = a.view(t, {R, 2 * F}), dprob = a.view(DType::fp32, {R});
  maybe_break(6, {&dgu, &dprob});
  weighted_swiglu_backward(ctx, act, gu, probs, dgu, dprob);
  TensorView dx = a.view(t, {T, H}), dw = a.view(DType::fp32, {T, kv});
  maybe_break(7, {&dx, &dw});
  moe_permute_backward(ctx, xp, m, dx, dprob, dw);
  RouterBackwardArgs rb;
  rb.logits = logits, rb.expert_ids = ra.expert_ids, rb.counts = ra.counts, rb.d_weights = dw;
  rb.d_logits = a.view(DType::fp32, {T, Ev});
  maybe_break(8, {&rb.d_weights, &rb.d_logits, &rb.expert_ids});
  moe_router_backward(ctx, rc, rb);
  moe_router_logits_backward(ctx, rb.d_logits, x, w, g.chance(0.8) ? dx : TensorView(),
                             g.chance(0.8) ? a.view(DType::fp32, {Ev, H}) : TensorView(),
                             g.chance(0.5), g.chance(0.5));
}

// The whole block on random configurations (some invalid), a forward and a backward.
void case_moe_block(Gen& g, Arena& a, Context& ctx) {
  nn::MoEConfig c;
  c.hidden = g.chance(0.9) ? g.pick(1, 4) * 8 : g.pick(-1, 20);
  c.ffn_hidden = g.chance(0.9) ? g.pick(1, 4) * 8 : g.pick(-1, 20);
  c.experts = g.chance(0.9) ? g.pick(1, 16) : g.pick(-1, 2000);
  c.topk = g.chance(0.9) ? g.pick(1, std::max<int64_t>(1, std::min<int64_t>(c.experts, 4)))
                         : g.pick(-1, 40);
  c.max_tokens = g.chance(0.9) ? g.pick(1, 48) : g.pick(-1, 2);
  c.score = g.chance(0.5) ? RouterScore::softmax : RouterScore::sigmoid;
  c.renormalize = g.chance(0.5);
  c.aux_loss_coeff = g.chance(0.5) ? 0.01f : 0.0f;
  c.shared_ffn_hidden = g.chance(0.3) ? 8 : 0;
  c.capacity_factor = g.chance(0.2) ? 1.0 : 0.0;
  c.pad_align = g.chance(0.8) ? 1 : 16;
  c.bias = g.chance(0.3);
  c.dtype = g.chance(0.9) ? DType::bf16 : g.dtype();
  c.delay_wgrad = g.chance(0.3);
  c.seed = g.rng();
  (void)c.to_string();
  nn::MoE moe(ctx, c);
  const int64_t T = g.chance(0.9) ? g.pick(0, c.max_tokens) : g.pick(-1, 100);
  TensorView x = a.view(c.dtype, {T, c.hidden}), dy = a.view(c.dtype, {T, c.hidden});
  g.mutate_one_of({&x, &dy}, a);
  (void)moe.forward(ctx, x);
  (void)moe.backward(ctx, dy);
  if (c.delay_wgrad) moe.backward_dw(ctx);
}

}  // namespace groupmm::fuzz
