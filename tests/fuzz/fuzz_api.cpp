// Fuzz test of the public API on the CPU backend: random shapes, dtypes, recipes and splits
// (negative, past the rows, overflowing int32/int64), malformed views (wrong rank/dtype/device,
// negative or huge dims, null or misaligned data, absent arguments) and huge sizes, for every op.
// Every call must either succeed or throw groupmm::Error; Context::check() after it too. Any other
// exception fails the run (exit 1); a crash fails it too (the failing case is printed first).
//
//   groupmm_fuzz [--seconds S] [--seed N] [--case I --op NAME] [--verbose]
//
// --case I --op NAME replays the one case a failure names (with its --seed). Each case draws its
// op family from its own seed, but a family that has taken more than a third of the run's time
// gives way to the one furthest behind: drawn by count alone, the quantized GEMM (whose CPU
// reference costs a hundred times a view check) took 88% of a run, and the other families got a
// few hundred cases in the CI's 20 s. Which family a case ran is therefore part of its name.
//
// Buffers are allocated exactly to what their views claim (so AddressSanitizer sees any read or
// write past them: scripts/sanitize_cpu.sh). A view's claim is only ever larger than its buffer
// when its data is null, which every op must reject.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fuzz_cases.hpp"
#include "fuzz_gen.hpp"
#include "groupmm/dbias.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/moe.hpp"
#include "groupmm/nn/grouped_linear.hpp"
#include "groupmm/offsets.hpp"
#include "groupmm/quantize.hpp"
#include "groupmm/random.hpp"

namespace groupmm::fuzz {
namespace {

// ---- one case per op
// ------------------------------------------------------------------------------

void case_views(Gen& g, Arena& a) {
  // The constructor: any rank, negative and overflowing dims must throw Error.
  const int rank = g.pick(0, 4);
  const int64_t d0 = g.dim(), d1 = g.dim(), d2 = g.dim(), d3 = g.dim();
  TensorView v;
  switch (rank) {
    case 0:
      v = TensorView(nullptr, g.dtype(), Device::CPU, {});
      break;
    case 1:
      v = TensorView(nullptr, g.dtype(), Device::CPU, {d0});
      break;
    case 2:
      v = TensorView(nullptr, g.dtype(), Device::CPU, {d0, d1});
      break;
    case 3:
      v = TensorView(nullptr, g.dtype(), Device::CPU, {d0, d1, d2});
      break;
    default:
      v = TensorView(nullptr, g.dtype(), Device::CPU, {d0, d1, d2, d3});
  }
  (void)v.nbytes();
  (void)v.to_string();
  // Owning tensors: small ones are used; huge ones (past any address space, 2^47 bytes and more)
  // must fail with Error, not bad_alloc, and are never touched if an allocator hands them out.
  const bool huge = g.chance(0.2);
  Tensor t = Tensor::empty({huge ? int64_t(1) << g.pick(47, 62) : g.pick(0, 64), g.pick(1, 64)},
                           g.dtype(), Device::CPU);
  if (huge) return;
  fill_bytes(t, 0xAB);
  TensorView dst = g.chance(0.5) ? a.view(t.view().dtype, {t.view().dim(0), t.view().dim(1)})
                                 : a.view(g.dtype(), {g.pick(0, 64), g.pick(1, 8)});
  g.mutate(dst, a);
  copy(dst, t);
  Tensor c = clone_to(dst, Device::CPU);
}

void case_offsets(Gen& g, Arena& a, Context& ctx) {
  const int64_t G = g.groups();
  OffsetsArgs o;
  o.splits = a.splits(g, G, g.pick(0, 300));
  o.expected_total = g.chance(0.5) ? -1 : g.pick(0, 300);
  const DType it = g.chance(0.5) ? DType::int32 : DType::int64;
  if (g.chance(0.7)) o.start = a.view(it, {G});
  if (g.chance(0.5)) o.end = a.view(it, {G});
  if (g.chance(0.4)) {
    const int64_t S = g.pick(1, 4);
    o.element_start = a.view(DType::int64, {S, G});
    for (int64_t s = 0; s < S; ++s)
      o.row_strides[size_t(s)] = g.chance(0.9) ? g.pick(0, 8192) : g.huge();
  }
  if (g.chance(0.4)) o.scale_row_start = a.view(it, {G});
  o.pad_rows = g.chance(0.9) ? 128 : g.pick(-2, 300);
  if (g.chance(0.4)) o.total = a.view(it, {1});
  g.mutate_one_of({&o.splits, &o.start, &o.end, &o.element_start, &o.scale_row_start, &o.total}, a);
  group_offsets(ctx, o);
}

void case_gemm(Gen& g, Arena& a, Context& ctx) {
  const int64_t G = g.groups(), M = g.pick(0, 200), N = g.pick(1, 6) * 8, K = g.pick(1, 6) * 8;
  GroupedGemmArgs x;
  x.pass = static_cast<GemmPass>(g.pick(0, 2));
  const DType t = g.chance(0.5) ? DType::bf16 : DType::fp16;
  const DType o = g.chance(0.3) ? DType::fp32 : t;  // forward/dgrad out: a's dtype or fp32
  if (x.pass == GemmPass::forward) {
    x.a = a.view(t, {M, K}), x.b = a.view(t, {G, N, K}), x.out = a.view(o, {M, N});
    if (g.chance(0.3)) x.bias = a.view(g.chance(0.9) ? o : t, {G, N});
  } else if (x.pass == GemmPass::dgrad) {
    x.a = a.view(t, {M, N}), x.b = a.view(t, {G, N, K}), x.out = a.view(o, {M, K});
  } else {
    const bool fp32 = g.chance(0.5);
    x.a = a.view(t, {M, N}), x.b = a.view(t, {M, K});
    x.out = a.view(fp32 ? DType::fp32 : t, {G, N, K});
    x.beta = fp32 && g.chance(0.5) ? 1.0f : 0.0f;
  }
  x.splits = a.splits(g, G, M);
  if (g.chance(0.1)) x.beta = g.chance(0.5) ? 0.5f : 1.0f;
  if (g.chance(0.1)) x.alpha = g.chance(0.5) ? 0.0f : -2.5f;
  if (g.chance(0.1)) x.engine = static_cast<GemmEngine>(g.pick(0, 3));
  if (g.chance(0.05)) x.config = g.chance(0.5) ? "fwd_bf16_128x256_coop_c12" : "nonsense";
  if (g.chance(0.05)) x.pass = static_cast<GemmPass>(g.pick(0, 2));  // shapes of another pass
  g.mutate_one_of({&x.a, &x.b, &x.out, &x.splits, &x.bias}, a);
  (void)x.to_string();
  const size_t ws = grouped_gemm_workspace_size(ctx, x);
  (void)gemm_config_name(ctx, x);
  grouped_gemm(ctx, x, g.chance(0.2) ? a.bytes(64) : nullptr, g.chance(0.2) ? 64 : ws);
}

QuantizeConfig random_config(Gen& g) {
  QuantizeConfig c;
  c.recipe = static_cast<QuantRecipe>(g.chance(0.95) ? g.pick(1, 5) : 0);  // 0: none
  c.fp8_dtype = g.chance(0.9) ? (g.chance(0.5) ? DType::fp8e4m3 : DType::fp8e5m2) : g.dtype();
  c.pow2_scales = g.chance(0.3);
  c.block_2d = g.chance(0.1);
  c.direction = static_cast<QuantDirection>(g.pick(g.chance(0.95) ? 1 : 0, 3));
  const bool gemm_layout = g.chance(0.5);
  c.scale_layout = !gemm_layout                         ? ScaleLayout::plain
                   : c.recipe == QuantRecipe::fp8_block ? ScaleLayout::mn_major
                                                        : ScaleLayout::swizzled;
  if (g.chance(0.1)) c.scale_layout = static_cast<ScaleLayout>(g.pick(0, 3));
  c.amax_schedule = static_cast<AmaxSchedule>(g.pick(0, g.chance(0.95) ? 2 : 3));
  c.amax_lag = g.chance(0.9) ? g.pick(0, 4) : -1;
  (void)c.to_string();
  return c;
}

// A view of exactly what a shape spec of group_quantize_shapes claims (absent when not present).
TensorView spec_view(Arena& a, const TensorSpec& s) {
  if (!s.present()) return TensorView();
  return s.rank == 1   ? a.view(s.dtype, {s.shape[0]})
         : s.rank == 2 ? a.view(s.dtype, {s.shape[0], s.shape[1]})
                       : a.view(s.dtype, {s.shape[0], s.shape[1], s.shape[2]});
}

// A quantize call on random recipes, then a dequantize of its output.
void case_quantize(Gen& g, Arena& a, Context& ctx, bool with_dbias) {
  GroupQuantizeArgs q;
  q.config = random_config(g);
  const bool weights = g.chance(0.2) && !with_dbias;
  const int64_t G = g.groups();
  const int64_t block =
      q.config.recipe == QuantRecipe::fp8_block                                        ? 128
      : q.config.recipe == QuantRecipe::mxfp8 || q.config.recipe == QuantRecipe::mxfp4 ? 32
                                                                                       : 16;
  const int64_t K = g.chance(0.9) ? g.pick(1, 3) * block : g.pick(1, 300);
  const int64_t M = weights ? G * g.pick(0, 3) * 16 : g.pick(0, 300);
  const DType in_t = g.chance(0.8) ? DType::bf16 : g.chance(0.5) ? DType::fp16 : DType::fp32;
  q.input = weights ? a.view(in_t, {G, M / G, K}) : a.view(in_t, {M, K});
  if (!weights) q.splits = a.splits(g, G, M);
  QuantizedShapes shapes = group_quantize_shapes(weights ? M : M, K, G, q.config);
  (void)shapes.to_string();
  auto out = [&](const TensorSpec& s) { return spec_view(a, s); };
  q.out.data = out(shapes.data), q.out.scale_inv = out(shapes.scale_inv);
  q.out.columnwise_data = out(shapes.columnwise_data);
  q.out.columnwise_scale_inv = out(shapes.columnwise_scale_inv);
  q.out.amax = out(shapes.amax), q.out.global_scale = out(shapes.global_scale);
  TensorView dbias = with_dbias ? a.view(g.chance(0.8) ? in_t : g.dtype(), {G, K}) : TensorView();
  g.mutate_one_of({&q.input, &q.splits, &q.out.data, &q.out.scale_inv, &q.out.columnwise_data,
                   &q.out.columnwise_scale_inv, &q.out.amax, &q.out.global_scale, &dbias},
                  a);
  (void)q.to_string();
  const size_t ws = group_quantize_workspace_size(ctx, q, with_dbias);
  GroupedTensor r = with_dbias ? bgrad_group_quantize(ctx, q, dbias, nullptr, ws)
                               : group_quantize(ctx, q, nullptr, ws);
  (void)r.to_string();
  ctx.check();
  // Dequantize what was produced (sometimes through a broken descriptor).
  GroupDequantizeArgs d;
  d.in = r;
  d.config = g.chance(0.9) ? q.config : random_config(g);
  d.from_columnwise =
      has_columnwise(q.config.direction) && (!has_rowwise(q.config.direction) || g.chance(0.5));
  d.out = weights ? a.view(in_t, {G, M / G, K}) : a.view(in_t, {M, K});
  g.mutate_one_of({&d.out, &d.in.data, &d.in.scale_inv, &d.in.splits}, a);
  (void)group_dequantize_workspace_size(ctx, d);
  group_dequantize(ctx, d);
}

// 4-bit weights: quantized here (nvfp4 or mxfp4, sometimes another recipe, 2D blocks or a broken
// descriptor), then the W4 GEMM on random splits and paths, and the MXFP4 checkpoint relayout.
void case_w4(Gen& g, Arena& a, Context& ctx) {
  const int64_t G = g.groups(), N = g.pick(1, 6) * 8, M = g.pick(0, 200);
  const int64_t K = g.chance(0.9) ? g.pick(1, 3) * 32 : g.pick(1, 6) * 8;
  GroupQuantizeArgs q;
  q.config.recipe = g.chance(0.9) ? (g.chance(0.5) ? QuantRecipe::nvfp4 : QuantRecipe::mxfp4)
                                  : random_config(g).recipe;
  q.config.direction = QuantDirection::rowwise;
  q.config.scale_layout = g.chance(0.5) ? ScaleLayout::swizzled : ScaleLayout::plain;
  q.config.block_2d = g.chance(0.05);
  q.input = a.view(DType::bf16, {G, N, K});
  const QuantizedShapes shapes = group_quantize_shapes(G * N, K, G, q.config);
  q.out.data = spec_view(a, shapes.data), q.out.scale_inv = spec_view(a, shapes.scale_inv);
  q.out.amax = spec_view(a, shapes.amax), q.out.global_scale = spec_view(a, shapes.global_scale);
  GroupedTensor w = group_quantize(ctx, q);
  ctx.check();
  if (g.chance(0.5)) {
    W4GemmArgs x;
    x.x = a.view(g.chance(0.9) ? DType::bf16 : g.dtype(), {M, K});
    x.w = w;
    x.out = a.view(g.chance(0.95) ? DType::bf16 : g.dtype(), {M, N});
    x.splits = a.splits(g, G, M);
    if (g.chance(0.3)) x.bias = a.view(DType::bf16, {G, N});
    if (g.chance(0.1)) x.alpha = g.chance(0.5) ? 0.0f : -2.5f;
    if (g.chance(0.1)) x.path = static_cast<W4Path>(g.pick(0, 3));
    if (g.chance(0.1)) x.engine = static_cast<GemmEngine>(g.pick(0, 3));
    if (g.chance(0.05)) x.w.recipe = static_cast<QuantRecipe>(g.pick(0, 6));
    if (g.chance(0.05)) x.w.scale_layout = static_cast<ScaleLayout>(g.pick(0, 3));
    if (g.chance(0.05)) x.w.splits = x.splits;
    g.mutate_one_of(
        {&x.x, &x.w.data, &x.w.scale_inv, &x.w.global_scale, &x.out, &x.splits, &x.bias}, a);
    (void)x.to_string();
    const size_t ws = grouped_gemm_workspace_size(ctx, x);
    (void)gemm_config_name(ctx, x);
    (void)w4_gemm_path(ctx, x);
    grouped_gemm(ctx, x, g.chance(0.2) ? a.bytes(64) : nullptr, g.chance(0.2) ? 64 : ws);
  } else {
    Mxfp4CheckpointArgs c;
    c.G = g.chance(0.95) ? G : g.pick(-1, 3);
    c.N = N;
    c.K = K;
    c.blocks = a.view(DType::e8m0, {std::max<int64_t>(G * N * K / 2, 0)});
    c.scales = a.view(DType::e8m0, {G, N, std::max<int64_t>(K / 32, 0)});
    c.weights = w;
    g.mutate_one_of({&c.blocks, &c.scales, &c.weights.data, &c.weights.scale_inv}, a);
    (void)c.to_string();
    if (g.chance(0.5)) {
      export_mxfp4_weights(ctx, c);
    } else {
      (void)import_mxfp4_weights(ctx, c).to_string();
    }
  }
}

void case_swizzle(Gen& g, Arena& a, Context& ctx) {
  SwizzleScalesArgs s;
  const int64_t G = g.groups(), M = g.pick(0, 300);
  s.splits = a.splits(g, G, M);
  if (g.chance(0.1)) {  // weights: G uniform groups, no splits (sometimes a bad count)
    s.splits = TensorView();
    s.groups = g.chance(0.9) ? G : g.pick(-1, 3);
  }
  s.rows_total = g.chance(0.9) ? M : g.chance(0.8) ? g.pick(-5, 400) : g.huge();
  s.columnwise = g.chance(0.5);
  s.block = g.chance(0.9) ? (g.chance(0.5) ? 16 : 32) : g.pick(-1, 64);
  s.cols = s.columnwise ? g.pick(1, 3) * 32 : g.pick(1, 12);
  if (g.chance(0.05)) s.cols = g.chance(0.5) ? g.pick(-2, 0) : g.huge();
  s.unswizzle = g.chance(0.5);
  int64_t pn = 0, sn = 0;
  if (s.rows_total >= 0 && s.cols > 0 && s.block > 0) {
    pn = plain_scales_numel(s.rows_total, s.cols, G, s.columnwise, s.block);
    sn = swizzled_scales_numel(s.rows_total, s.cols, G, s.columnwise, s.block);
  }
  const DType t = g.chance(0.9) ? (g.chance(0.5) ? DType::e8m0 : DType::fp8e4m3) : g.dtype();
  auto scales = [&](int64_t n) {  // a buffer when it is small; else a claim on null data
    return n <= (int64_t(1) << 24) ? a.view(t, {std::max<int64_t>(n, 0)})
                                   : TensorView(nullptr, t, Device::CPU, {n});
  };
  s.plain = scales(pn);
  s.swizzled = scales(sn);
  g.mutate_one_of({&s.splits, &s.plain, &s.swizzled}, a);
  (void)s.to_string();
  (void)swizzle_scales_workspace_size(g.chance(0.95) ? G : g.huge());
  swizzle_scales(ctx, s);
}

void case_dbias(Gen& g, Arena& a, Context& ctx) {
  const int64_t G = g.groups(), M = g.pick(0, 300), N = g.pick(1, 70);
  const DType t = g.chance(0.9) ? (g.chance(0.5) ? DType::bf16 : DType::fp32) : g.dtype();
  TensorView dy = a.view(t, {M, N}), splits = a.splits(g, G, M);
  const bool acc = g.chance(0.3);
  TensorView db = a.view(acc || g.chance(0.5) ? DType::fp32 : t, {G, N});
  g.mutate_one_of({&dy, &splits, &db}, a);
  (void)group_dbias_workspace_size(ctx, M, N, G);
  group_dbias(ctx, dy, splits, db, acc);
}

void case_swiglu(Gen& g, Arena& a, Context& ctx) {
  const int64_t M = g.pick(0, 100), I = g.pick(1, 70);
  const DType t = g.chance(0.9) ? (g.chance(0.5) ? DType::bf16 : DType::fp32) : g.dtype();
  TensorView gu = a.view(t, {M, 2 * I}), out = a.view(t, {M, I});
  TensorView dgu = a.view(t, {M, 2 * I});
  g.mutate_one_of({&gu, &out, &dgu}, a);
  if (g.chance(0.5)) {
    swiglu_forward(ctx, gu, out);
  } else {
    swiglu_backward(ctx, out, gu, g.chance(0.05) ? gu : dgu);  // aliasing must be rejected
  }
}

void case_fill(Gen& g, Arena& a, Context& ctx) {
  TensorView v = a.view(g.dtype(), {g.pick(0, 100), g.pick(1, 9)});
  g.mutate(v, a);
  fill_uniform(ctx, v, g.chance(0.9) ? -1.0f : NAN, g.chance(0.9) ? 1.0f : -INFINITY, g.rng());
}

void case_layer(Gen& g, Arena& a, Context& ctx) {
  nn::GroupedLinearConfig c;
  c.experts = g.chance(0.95) ? g.pick(1, 6) : g.pick(-1, 0);
  c.in_features = g.chance(0.95) ? g.pick(1, 4) * 8 : g.pick(-1, 13);
  c.out_features = g.chance(0.95) ? g.pick(1, 4) * 8 : g.pick(-1, 13);
  c.max_tokens = g.chance(0.95) ? g.pick(1, 64) : (g.chance(0.5) ? g.pick(-1, 0) : g.huge());
  c.bias = g.chance(0.5);
  c.dtype = g.chance(0.9) ? (g.chance(0.5) ? DType::bf16 : DType::fp16) : g.dtype();
  c.delay_wgrad = g.chance(0.3);
  c.accumulate_into_main_grad = g.chance(0.3);
  c.seed = g.rng();
  if (g.chance(0.15)) {  // the inference recipes of 4-bit weights (forward only)
    c.recipe = g.chance(0.5) ? nn::nvfp4_weight_recipe() : nn::mxfp4_weight_recipe();
    if (g.chance(0.9)) c.in_features = g.pick(1, 2) * 32;
  }
  (void)c.to_string();
  nn::GroupedLinear layer(ctx, c);
  const int64_t K = c.in_features, N = c.out_features, G = c.experts;
  for (int step = 0; step < g.pick(1, 3); ++step) {
    // Past max_tokens sometimes; never more rows than a small buffer (max_tokens may be huge).
    const int64_t cap = std::min<int64_t>(c.max_tokens, 64);
    const int64_t M = g.chance(0.9) || c.max_tokens > 64 ? g.pick(0, cap) : cap + g.pick(1, 5);
    TensorView x = a.view(c.dtype, {M, K}), splits = a.splits(g, G, M);
    TensorView dy = a.view(c.dtype, {g.chance(0.95) ? M : M + 1, N});
    g.mutate_one_of({&x, &splits, &dy}, a);
    const int op = g.pick(0, 9);
    if (op <= 6) {
      (void)layer.forward(ctx, x, splits);
      if (op <= 4) (void)layer.backward(ctx, dy);
      if (op <= 2) layer.backward_dw(ctx);
    } else if (op == 7) {
      (void)layer.backward(ctx, dy);  // maybe without a forward
    } else if (op == 8) {
      layer.zero_grad(ctx);
    } else {
      std::vector<TensorView> w, b;
      for (int64_t e = 0; e < G + (g.chance(0.1) ? 1 : 0); ++e)
        w.push_back(a.view(g.chance(0.95) ? DType::fp32 : g.dtype(), {N, K}));
      if (c.bias || g.chance(0.1))
        for (int64_t e = 0; e < G; ++e) b.push_back(a.view(DType::fp32, {N}));
      if (g.chance(0.5)) {
        layer.import_weights(ctx, w, b);
      } else {
        layer.export_weights(ctx, w, b);
      }
    }
    ctx.check();
  }
}

// ---- the driver
// -----------------------------------------------------------------------------------

const char* g_current = "";  // the case in flight, for the crash handler
char g_case_text[256];

void on_crash(int sig) {
  std::fprintf(stderr, "\ngroupmm_fuzz: signal %d in case: %s\n", sig, g_case_text);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

int run(int argc, char** argv) {
  double seconds = 3;
  uint64_t seed = 1;
  bool verbose = false;
  long only_case = -1;
  const char* only_op = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc)
      seed = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--case") && i + 1 < argc)
      only_case = std::atol(argv[++i]);
    else if (!std::strcmp(argv[i], "--op") && i + 1 < argc)
      only_op = argv[++i];
    else if (!std::strcmp(argv[i], "--verbose"))
      verbose = true;
    else {
      std::fprintf(
          stderr,
          "usage: groupmm_fuzz [--seconds S] [--seed N] [--case I --op NAME] [--verbose]\n");
      return 2;
    }
  }
  std::signal(SIGSEGV, on_crash);
  std::signal(SIGABRT, on_crash);
  std::signal(SIGFPE, on_crash);
  std::signal(SIGBUS, on_crash);
  using Op = std::function<void(Gen&, Arena&, Context&)>;
  const std::vector<std::pair<const char*, Op>> ops = {
      {"views", [](Gen& g, Arena& a, Context&) { case_views(g, a); }},
      {"offsets", case_offsets},
      {"gemm", case_gemm},
      {"quantize", [](Gen& g, Arena& a, Context& c) { case_quantize(g, a, c, false); }},
      {"bgrad_quantize", [](Gen& g, Arena& a, Context& c) { case_quantize(g, a, c, true); }},
      {"swizzle", case_swizzle},
      {"w4", case_w4},
      {"dbias", case_dbias},
      {"swiglu", case_swiglu},
      {"fill", case_fill},
      {"layer", case_layer},
      {"quantized_gemm", case_quantized_gemm},
      {"moe_ops", case_moe_ops},
      {"moe_block", case_moe_block}};
  struct Stat {
    long ok = 0, rejected = 0;
    double seconds = 0;
  };
  std::vector<Stat> stats(ops.size());  // by family, in the order of ops
  double total_seconds = 0;
  size_t forced = ops.size();
  if (only_op != nullptr) {
    for (size_t i = 0; i < ops.size(); ++i)
      if (!std::strcmp(ops[i].first, only_op)) forced = i;
    if (forced == ops.size()) {
      std::fprintf(stderr, "groupmm_fuzz: --op %s is not an op family\n", only_op);
      return 2;
    }
  }
  // The family of a case: the drawn one unless it has taken more than kMaxShare of the time so
  // far; then the family furthest behind in time runs instead (a replay forces its family).
  constexpr double kMaxShare = 1.0 / 3;
  auto family = [&](size_t drawn) {
    if (stats[drawn].seconds <= kMaxShare * total_seconds) return drawn;
    size_t behind = 0;
    for (size_t i = 1; i < ops.size(); ++i)
      if (stats[i].seconds < stats[behind].seconds) behind = i;
    return behind;
  };
  Context ctx(Device::CPU);
  const auto t0 = std::chrono::steady_clock::now();
  long n = 0;
  for (; std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds;
       ++n) {
    if (only_case >= 0 && n != only_case) {
      if (n > only_case) break;
      continue;
    }
    const uint64_t case_seed = seed * 1000003ull + uint64_t(n);
    Gen g(case_seed);
    // The draw is made in every mode, so that a replay's generator is in the same state after it.
    const size_t drawn = size_t(g.pick(0, int64_t(ops.size()) - 1));
    const size_t f = forced < ops.size() ? forced : family(drawn);
    const auto& [name, op] = ops[f];
    std::snprintf(g_case_text, sizeof g_case_text, "%s (--seed %llu --case %ld --op %s)", name,
                  (unsigned long long)seed, n, name);
    g_current = name;
    if (verbose) std::fprintf(stderr, "%s\n", g_case_text);
    Arena arena;
    Stat& st = stats[f];
    const auto c0 = std::chrono::steady_clock::now();
    try {
      op(g, arena, ctx);
      ctx.check();
      ++st.ok;
    } catch (const Error& e) {
      ++st.rejected;
      (void)ctx.take_status();  // a throw may leave a fault bit for the next case
      if (verbose) std::fprintf(stderr, "  Error: %s\n", e.what());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "groupmm_fuzz: FAILED: %s threw a non-groupmm exception: %s\n",
                   g_case_text, e.what());
      return 1;
    } catch (...) {
      std::fprintf(stderr, "groupmm_fuzz: FAILED: %s threw a non-exception\n", g_case_text);
      return 1;
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    st.seconds += dt;
    total_seconds += dt;
  }
  // The families first, the total last (scripts/sanitize_cpu.sh reports a log's last line).
  for (size_t i = 0; i < ops.size(); ++i) {
    const Stat& st = stats[i];
    if (st.ok + st.rejected > 0)
      std::printf("  %-16s %6ld ok %6ld rejected %7.2f s\n", ops[i].first, st.ok, st.rejected,
                  st.seconds);
  }
  std::printf(
      "groupmm_fuzz: %ld cases in %.1f s (seed %llu), each succeeded or threw groupmm::Error\n", n,
      seconds, (unsigned long long)seed);
  return 0;
}

}  // namespace
}  // namespace groupmm::fuzz

int main(int argc, char** argv) {
  return groupmm::fuzz::run(argc, argv);
}
