// grouped_gemm over 4-bit weights (W4GemmArgs): validation, the decode / prefill choice, the
// workspace and dispatch (the decode kernel, the dequantize-then-bf16-engine path, the CPU
// reference).
#include <algorithm>
#include <cstdint>

#include "gemm/w4_backends.hpp"
#include "quantize/backends.hpp"

namespace groupmm {

namespace {

constexpr const char* kOp = "grouped_gemm";

bool w4_recipe(QuantRecipe r) {
  return r == QuantRecipe::nvfp4 || r == QuantRecipe::mxfp4;
}

// The rowwise quantize config the weights were written with (what their sizes follow).
QuantizeConfig weight_config(const GroupedTensor& w) {
  QuantizeConfig c;
  c.recipe = w.recipe;
  c.direction = QuantDirection::rowwise;
  c.scale_layout = w.scale_layout;
  return c;
}

// The fused path's kernel named by W4GemmArgs::config ("" is the default, the RS kernel with its
// scale warps); none for a name that is not a fused kernel's.
enum class FusedKernel { rs_sw, rs, coop, none };
FusedKernel fused_kernel(const std::string& config) {
  if (config.empty() || config == "rs_sw_256x128") return FusedKernel::rs_sw;
  if (config == "rs_256x128") return FusedKernel::rs;
  if (config == "coop_128x256") return FusedKernel::coop;
  return FusedKernel::none;
}

// The decode path's forced tokens a pass (config "pass8", "pass16", "pass32"), 0 for any other.
int decode_pass_tokens(const std::string& config) {
  return config == "pass8" ? 8 : config == "pass16" ? 16 : config == "pass32" ? 32 : 0;
}

void check_aligned(const char* arg, const TensorView& v) {
  GROUPMM_CHECK(reinterpret_cast<uintptr_t>(v.data) % 16 == 0, kOp, ": ", arg, ".data=", v.data,
                " must be 16-byte aligned");
}

GemmDims validate(const Context& ctx, const W4GemmArgs& a) {
  const Device dev = ctx.device();
  const GroupedTensor& w = a.w;
  GROUPMM_CHECK(w4_recipe(w.recipe), kOp, ": w.recipe=", recipe_name(w.recipe),
                " must be nvfp4 or mxfp4 (4-bit weights)");
  GROUPMM_CHECK(a.x.present() && a.out.present(), kOp, ": x and out are required");
  GROUPMM_CHECK(a.x.dtype == DType::bf16, kOp, ": x.dtype=", dtype_name(a.x.dtype),
                " must be bf16 (4-bit weight GEMMs take bf16 activations)");
  check_view(kOp, "x", a.x, DType::bf16, 2, dev);
  check_view(kOp, "out (y)", a.out, DType::bf16, 2, dev);
  GemmDims d;
  d.M = a.x.dim(0);
  d.K = a.x.dim(1);
  d.N = a.out.dim(1);
  d.G = w.num_groups;
  check_dim(kOp, "out (y)", a.out, 0, d.M);
  GROUPMM_CHECK(d.G >= 1, kOp, ": w.num_groups=", d.G, " must be >= 1");
  GROUPMM_CHECK(!w.splits.present(), kOp, ": w must be weights (splits absent), not activations");
  const RecipeTraits t = recipe_traits(w.recipe);
  GROUPMM_CHECK(!w.block_2d, kOp, ": w must be quantized in 1x", t.row_block,
                " blocks along K (block_2d is not served)");
  const int sl = static_cast<int>(w.scale_layout);
  GROUPMM_CHECK(w.scale_layout == ScaleLayout::plain || w.scale_layout == ScaleLayout::swizzled,
                kOp, ": w.scale_layout=", sl < 3 ? scale_layout_name(w.scale_layout) : "?",
                " must be plain or swizzled");
  GROUPMM_CHECK(d.K % t.gemm_k_multiple == 0 && d.K > 0, kOp, ": K=x.shape[1]=", d.K,
                " must be a positive multiple of ", t.gemm_k_multiple);
  GROUPMM_CHECK(d.N > 0 && d.N % t.gemm_n_multiple == 0, kOp, ": N=out.shape[1]=", d.N,
                " must be a positive multiple of ", t.gemm_n_multiple);
  GROUPMM_CHECK(d.M <= INT32_MAX && d.N <= INT32_MAX && d.K <= INT32_MAX, kOp, ": M=", d.M,
                ", N=", d.N, ", K=", d.K, " must fit int32");
  const QuantizedShapes s = group_quantize_shapes(d.G * d.N, d.K, d.G, weight_config(w));
  auto check = [&](const char* arg, const TensorView& v, const TensorSpec& spec) {
    GROUPMM_CHECK(v.present(), kOp, ": ", arg, " is required (", spec.to_string(), ")");
    GROUPMM_CHECK(v.dtype == spec.dtype, kOp, ": ", arg, ".dtype=", dtype_name(v.dtype),
                  " must be ", dtype_name(spec.dtype));
    GROUPMM_CHECK(v.numel() >= spec.numel(), kOp, ": ", arg, ".numel=", v.numel(), " (shape ",
                  v.shape_string(), ") is too small for [G, N, K]=[", d.G, ", ", d.N, ", ", d.K,
                  "]: needs ", spec.to_string());
    GROUPMM_CHECK(v.device == dev, kOp, ": ", arg, " is on ", device_name(v.device),
                  " but the context is ", device_name(dev));
    GROUPMM_CHECK(v.data != nullptr, kOp, ": ", arg, ".data is null");
    // Both backends read the elements through typed pointers.
    const int64_t eb = dtype_bits(v.dtype) / 8;
    GROUPMM_CHECK(eb <= 1 || reinterpret_cast<uintptr_t>(v.data) % uintptr_t(eb) == 0, kOp, ": ",
                  arg, ".data=", v.data, " must be aligned to its ", eb, "-byte elements");
  };
  check("w.data", w.data, s.data);
  check("w.scale_inv", w.scale_inv, s.scale_inv);
  if (w.recipe == QuantRecipe::nvfp4) {
    TensorSpec gs;
    gs.dtype = DType::fp32;
    gs.rank = 1;
    gs.shape = {d.G, 0, 0};
    check("w.global_scale", w.global_scale, gs);
  }
  if (w.data.rank == 3)
    GROUPMM_CHECK(w.data.dim(0) == d.G && w.data.dim(1) == d.N && w.data.dim(2) == d.K, kOp,
                  ": w.data.shape=", w.data.shape_string(), " must be [", d.G, ", ", d.N, ", ", d.K,
                  "]");
  check_splits(kOp, a.splits, d.G, dev);
  if (a.bias.present()) {
    check_view(kOp, "bias", a.bias, DType::bf16, 2, dev);
    check_dim(kOp, "bias", a.bias, 0, d.G);
    check_dim(kOp, "bias", a.bias, 1, d.N);
  }
  const GemmEngine e = a.engine;
  GROUPMM_CHECK(e == GemmEngine::automatic || (e == GemmEngine::reference && dev == Device::CPU),
                kOp, ": engine ", gemm_engine_name(e),
                " does not run 4-bit weights (automatic, or reference on a CPU context)");
  const int p = static_cast<int>(a.path);
  GROUPMM_CHECK(p >= 0 && p <= 3, kOp, ": path=", p,
                " must be automatic, decode, prefill or fused");
  GROUPMM_CHECK(a.config.empty() ||
                    (fused_kernel(a.config) != FusedKernel::none && a.path == W4Path::fused) ||
                    (decode_pass_tokens(a.config) > 0 && a.path == W4Path::decode),
                kOp, ": config='", a.config,
                "' must be empty, or with path fused 'rs_sw_256x128', 'rs_256x128' or "
                "'coop_128x256', or with path decode 'pass8', 'pass16' or 'pass32'");
  const bool at_most = a.splits_total == SplitsTotal::at_most;
  GROUPMM_CHECK(a.splits_total == SplitsTotal::exact || at_most, kOp,
                ": splits_total=", static_cast<int>(a.splits_total), " must be exact or at_most");
  check_expected_rows(kOp, a.splits_total, a.expected_rows, d.M);
  GROUPMM_CHECK(!at_most || fused_kernel(a.config) != FusedKernel::coop, kOp,
                ": config='coop_128x256' takes exact splits (splits_total=at_most runs on the "
                "default fused kernel)");
  GROUPMM_CHECK(a.path != W4Path::fused || d.G <= kW4FusedMaxGroups, kOp,
                ": path fused runs at most ", kW4FusedMaxGroups, " experts, w.num_groups=", d.G,
                " (use prefill)");
  if (dev == Device::CUDA) {
    check_aligned("x", a.x);
    check_aligned("out", a.out);
    check_aligned("w.data", w.data);
    if (a.bias.present()) check_aligned("bias", a.bias);
    // The kernels read an nvfp4 row's two 1x16 scales of 32 codes as one 16-bit word.
    GROUPMM_CHECK(
        w.recipe != QuantRecipe::nvfp4 || reinterpret_cast<uintptr_t>(w.scale_inv.data) % 2 == 0,
        kOp, ": w.scale_inv.data=", w.scale_inv.data,
        " must be 2-byte aligned (nvfp4 scale pairs are read as 16-bit words)");
  }
  return d;
}

W4Launch make_w4_launch(const W4GemmArgs& a, const GemmDims& d) {
  W4Launch l;
  l.dims = d;
  l.recipe = a.w.recipe;
  l.L = make_layout(weight_config(a.w), d.G * d.N, d.K, d.G);
  l.x = a.x.data;
  l.w = a.w.data.data;
  l.scales = a.w.scale_inv.data;
  l.s_enc = a.w.recipe == QuantRecipe::nvfp4 ? a.w.global_scale.ptr<const float>() : nullptr;
  l.bias = a.bias.present() ? a.bias.data : nullptr;
  l.out = a.out.data;
  l.splits = a.splits;
  l.splits_at_most = a.splits_total == SplitsTotal::at_most;
  l.expected_rows = a.expected_rows;
  l.alpha = a.alpha;
  if (a.path == W4Path::decode) l.decode_tokens = decode_pass_tokens(a.config);
  return l;
}

// By the rows the splits are expected to reach (expected_rows, else M).
W4Path choose_path(const W4GemmArgs& a, const GemmDims& d) {
  if (a.path != W4Path::automatic) return a.path;
  const int64_t rows = a.expected_rows > 0 ? a.expected_rows : d.M;
  if (rows <= kW4DecodeMaxAvgRows * d.G) return W4Path::decode;
  if (rows <= kW4FusedMaxAvgRows * d.G && d.G <= kW4FusedMaxGroups) return W4Path::fused;
  return W4Path::prefill;
}

// ---- prefill: [bf16 weights G*N*K][factors G][the bf16 GEMM's workspace] ------------------------
struct Prefill {
  size_t wide_bytes = 0, factor_bytes = 0;
  GemmLaunch gemm;
};

size_t align256(size_t b) {
  return (b + 255) / 256 * 256;
}

// The bf16 GEMM over the dequantized weights: nvfp4 applies each expert's factor as a per-expert
// alpha (the bf16 kernel with per-expert scaling), mxfp4's factor is alpha itself.
Prefill prefill_plan(const W4GemmArgs& a, const GemmDims& d, void* ws) {
  Prefill p;
  p.wide_bytes = align256(static_cast<size_t>(d.G * d.N * d.K) * 2);
  p.factor_bytes = align256(static_cast<size_t>(d.G) * 4);
  char* base = static_cast<char*>(ws);
  GemmLaunch& g = p.gemm;
  g.pass = GemmPass::forward;
  g.dims = d;
  g.a = a.x.data;
  g.b = base;
  g.out = a.out.data;
  g.bias = a.bias.present() ? a.bias.data : nullptr;
  g.splits = a.splits;
  g.splits_at_most = a.splits_total == SplitsTotal::at_most;
  g.expected_rows = a.expected_rows;
  if (a.w.recipe == QuantRecipe::nvfp4) {
    g.recipe = QuantRecipe::nvfp4;
    g.scale_b = base ? reinterpret_cast<const float*>(base + p.wide_bytes) : nullptr;
  } else {
    g.alpha = a.alpha;
  }
  return p;
}

size_t prefill_workspace(const Context& ctx, const Prefill& p) {
  return p.wide_bytes + p.factor_bytes +
         cuda::cutlass_gemm_workspace_size(p.gemm, ctx.gemm_sm_count());
}

}  // namespace

const char* w4_path_name(W4Path p) {
  switch (p) {
    case W4Path::automatic:
      return "automatic";
    case W4Path::decode:
      return "decode";
    case W4Path::prefill:
      return "prefill";
    case W4Path::fused:
      return "fused";
  }
  return "?";
}

std::string W4GemmArgs::to_string() const {
  return detail::cat(
      "W4GemmArgs(x=", x.to_string(), ", w=", w.to_string(), ", out=", out.to_string(),
      ", splits=", splits.to_string(), ", bias=", bias.to_string(), ", alpha=", alpha,
      ", path=", w4_path_name(path), ", config=", config, ", engine=", gemm_engine_name(engine),
      splits_total == SplitsTotal::at_most ? ", splits_total=at_most" : "",
      expected_rows > 0 ? detail::cat(", expected_rows=", expected_rows) : std::string(), ")");
}

GemmDims validate_gemm_args(const Context& ctx, const W4GemmArgs& args) {
  return validate(ctx, args);
}

W4Path w4_gemm_path(const Context& ctx, const W4GemmArgs& args) {
  const GemmDims d = validate(ctx, args);
  return ctx.device() == Device::CPU ? W4Path::automatic : choose_path(args, d);
}

size_t grouped_gemm_workspace_size(const Context& ctx, const W4GemmArgs& args) {
  const GemmDims d = validate(ctx, args);
  if (ctx.device() == Device::CPU) return 0;
  const W4Path path = choose_path(args, d);
  if (path == W4Path::decode)
    return cuda::w4_decode_workspace_size(make_w4_launch(args, d), ctx.sm_count());
  if (path == W4Path::fused) return 0;
  return prefill_workspace(ctx, prefill_plan(args, d, nullptr));
}

void grouped_gemm(Context& ctx, const W4GemmArgs& args, void* ws, size_t ws_bytes) {
  const GemmDims d = validate(ctx, args);
  if (ctx.device() == Device::CPU) {
    cpu::w4_gemm(ctx, args, d);
    ctx.after_op();
    return;
  }
  const size_t need = grouped_gemm_workspace_size(ctx, args);
  if (ws == nullptr) {
    ws = ctx.workspace(need);
    ws_bytes = ctx.workspace_size();
  }
  GROUPMM_CHECK(ws_bytes >= need, kOp, ": workspace_bytes=", ws_bytes, " must be >= ", need,
                " (grouped_gemm_workspace_size)");
  const W4Launch l = make_w4_launch(args, d);
  const W4Path path = choose_path(args, d);
  if (path == W4Path::decode) {
    cuda::w4_decode_gemm(ctx, l, ws, ws_bytes);
  } else if (path == W4Path::fused) {
    const FusedKernel k = fused_kernel(args.config);
    if (k == FusedKernel::coop)
      cuda::w4_fused_gemm(ctx, l);
    else
      cuda::w4_fused_rs_gemm(ctx, l, k == FusedKernel::rs_sw);
  } else {
    const Prefill p = prefill_plan(args, d, ws);
    char* base = static_cast<char*>(ws);
    cuda::w4_dequantize_weights(ctx, l, base, reinterpret_cast<float*>(base + p.wide_bytes));
    cuda::cutlass_grouped_gemm(ctx, p.gemm, base + p.wide_bytes + p.factor_bytes,
                               ws_bytes - p.wide_bytes - p.factor_bytes);
  }
  ctx.after_op();
}

std::string gemm_config_name(const Context& ctx, const W4GemmArgs& args) {
  const GemmDims d = validate(ctx, args);
  if (ctx.device() == Device::CPU) return gemm_engine_name(GemmEngine::reference);
  const W4Path path = choose_path(args, d);
  if (path == W4Path::decode) return cuda::w4_decode_name(make_w4_launch(args, d), ctx.sm_count());
  if (path == W4Path::fused) {
    switch (fused_kernel(args.config)) {
      case FusedKernel::coop:
        return cuda::w4_fused_name(make_w4_launch(args, d));
      case FusedKernel::rs:
        return detail::cat("w4_fused(", recipe_name(args.w.recipe), ", rs_256x128)");
      default:
        return detail::cat("w4_fused(", recipe_name(args.w.recipe), ", rs_sw_256x128)");
    }
  }
  return detail::cat("w4_prefill(", recipe_name(args.w.recipe), ")+",
                     cuda::cutlass_config_name(prefill_plan(args, d, nullptr).gemm));
}

}  // namespace groupmm
