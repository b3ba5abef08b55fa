// grouped_gemm over quantized operands: validation, which copy each pass reads, and dispatch
// (CUTLASS FP8 kernels, the MXFP8 dequantize-then-bf16 path, the CPU reference).
#include <algorithm>
#include <cstdint>

#include "gemm/backends.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm {

namespace {

constexpr const char* kOp = "grouped_gemm";

// The copy of one operand a pass reads: data, its block scales (or per-expert scale_inv), and the
// shape group_quantize would have given it.
struct OperandCopy {
  const char* name;  // for messages: "a (x)", ...
  bool columnwise;
  TensorView data, scales;
};

OperandCopy pick_copy(const char* name, const GroupedTensor& t, bool columnwise) {
  OperandCopy c{name, columnwise, columnwise ? t.columnwise_data : t.data,
                columnwise ? t.columnwise_scale_inv : t.scale_inv};
  if (t.recipe == QuantRecipe::fp8_current) c.scales = t.scale_inv;  // [G], both copies
  return c;
}

const char* operand_name(GemmPass pass, bool is_a) {
  switch (pass) {
    case GemmPass::forward:
      return is_a ? "a (x)" : "b (W)";
    case GemmPass::dgrad:
      return is_a ? "a (dy)" : "b (W, columnwise)";
    case GemmPass::wgrad:
      return is_a ? "a (dy, columnwise)" : "b (x, columnwise)";
  }
  return "?";
}

// Checks one operand against the shapes group_quantize gives (rows_total rows of `cols` columns
// in G experts) and returns the copy the pass reads.
OperandCopy check_operand(const Context& ctx, const QuantizedGemmArgs& a, bool is_a, int64_t rows,
                          int64_t cols, int64_t G) {
  const GroupedTensor& t = is_a ? a.a : a.b;
  const char* name = operand_name(a.pass, is_a);
  const bool weight = !is_a && a.pass != GemmPass::wgrad;
  const bool columnwise = (a.pass == GemmPass::wgrad) || (!is_a && a.pass == GemmPass::dgrad);
  const OperandCopy c = pick_copy(name, t, columnwise);
  GROUPMM_CHECK(c.data.present(), kOp, ": ", name, " has no ",
                columnwise ? "columnwise" : "rowwise", " copy (quantize it with direction ",
                columnwise ? "columnwise" : "rowwise", " or both)");
  const DType dt = c.data.dtype;
  GROUPMM_CHECK(dt == DType::fp8e4m3 || dt == DType::fp8e5m2, kOp, ": ", name,
                ".dtype=", dtype_name(dt), " must be fp8e4m3 or fp8e5m2");
  GROUPMM_CHECK(t.num_groups == G, kOp, ": ", name, ".num_groups=", t.num_groups,
                " must equal G=", G);
  if (a.a.recipe == QuantRecipe::fp8_block) {
    GROUPMM_CHECK(t.block_2d == weight, kOp, ": ", name, " must be quantized with ",
                  weight ? "128x128 blocks (block_2d, the weights' recipe)"
                         : "1x128 blocks (block_2d false, the activations' recipe)");
    GROUPMM_CHECK(t.scale_layout == ScaleLayout::plain, kOp, ": ", name,
                  ".scale_layout=", scale_layout_name(t.scale_layout),
                  " must be plain (the layout the FP8 block GEMM reads)");
  }
  QuantizeConfig cfg = quantize_config_of(t);
  cfg.direction = columnwise ? QuantDirection::columnwise : QuantDirection::rowwise;
  const QuantizedShapes s = group_quantize_shapes(rows, cols, G, cfg);
  const TensorSpec& ds = columnwise ? s.columnwise_data : s.data;
  const TensorSpec& ss = t.recipe == QuantRecipe::fp8_current ? s.scale_inv
                         : columnwise                         ? s.columnwise_scale_inv
                                                              : s.scale_inv;
  auto check = [&](const TensorView& v, const TensorSpec& spec, const char* what) {
    GROUPMM_CHECK(v.present(), kOp, ": ", name, " ", what, " are required (", spec.to_string(),
                  ")");
    GROUPMM_CHECK(v.dtype == spec.dtype, kOp, ": ", name, " ", what, ".dtype=", dtype_name(v.dtype),
                  " must be ", dtype_name(spec.dtype));
    GROUPMM_CHECK(v.numel() >= spec.numel(), kOp, ": ", name, " ", what, ".numel=", v.numel(),
                  " is too small for ", rows, " rows of ", cols, " in ", G, " experts: needs ",
                  spec.to_string());
    GROUPMM_CHECK(v.device == ctx.device(), kOp, ": ", name, " ", what, " is on ",
                  device_name(v.device), " but the context is ", device_name(ctx.device()));
    GROUPMM_CHECK(v.data != nullptr || spec.numel() == 0, kOp, ": ", name, " ", what,
                  ".data is null");
  };
  check(c.data, ds, "data");
  check(c.scales, ss, "scales");
  GROUPMM_CHECK(ctx.device() == Device::CPU || reinterpret_cast<uintptr_t>(c.data.data) % 16 == 0,
                kOp, ": ", name, " data must be 16-byte aligned");
  return c;
}

struct Resolved {
  GemmDims d;
  OperandCopy a, b;
};

Resolved resolve(const Context& ctx, const QuantizedGemmArgs& a) {
  const QuantRecipe r = a.a.recipe;
  GROUPMM_CHECK(
      r == QuantRecipe::fp8_current || r == QuantRecipe::fp8_block || r == QuantRecipe::mxfp8, kOp,
      ": a.recipe=", recipe_name(r),
      " must be fp8_current, fp8_block or mxfp8 (16-bit operands take GroupedGemmArgs, nvfp4 / "
      "mxfp4 weights W4GemmArgs)");
  GROUPMM_CHECK(a.b.recipe == r, kOp, ": b.recipe=", recipe_name(a.b.recipe),
                " must equal a.recipe=", recipe_name(r));
  GROUPMM_CHECK(!a.fast_accum || (r == QuantRecipe::fp8_current && a.pass == GemmPass::forward),
                kOp, ": fast_accum is an option of the fp8_current forward pass");
  const Device dev = ctx.device();
  GROUPMM_CHECK(a.out.present(), kOp, ": out is required");
  GemmDims d;
  d.G = a.splits.present() ? a.splits.dim(0) : 0;
  if (a.pass == GemmPass::wgrad) {
    check_view(kOp, "out (dW)", a.out, a.out.dtype, 3, dev);
    GROUPMM_CHECK(a.out.dtype == DType::fp32 || a.out.dtype == DType::bf16, kOp,
                  ": out.dtype=", dtype_name(a.out.dtype), " must be fp32 or bf16 for wgrad");
    GROUPMM_CHECK(a.beta == 0.0f || a.beta == 1.0f, kOp, ": beta=", a.beta, " must be 0 or 1");
    GROUPMM_CHECK(a.beta == 0.0f || a.out.dtype == DType::fp32, kOp,
                  ": beta=1 (accumulate) needs an fp32 out, got ", dtype_name(a.out.dtype));
    d.G = a.out.dim(0);
    d.N = a.out.dim(1);
    d.K = a.out.dim(2);
    const TensorView& dy = a.a.columnwise_data;
    d.M = dy.present() && dy.rank == 2 ? dy.dim(1) : 0;
  } else {
    const bool fwd = a.pass == GemmPass::forward;
    check_view(kOp, fwd ? "out (y)" : "out (dx)", a.out, DType::bf16, 2, dev);
    GROUPMM_CHECK(a.beta == 0.0f, kOp, ": beta=", a.beta, " must be 0 for ",
                  gemm_pass_name(a.pass));
    const TensorView& in = a.a.data;
    GROUPMM_CHECK(in.present() && in.rank == 2, kOp, ": ", operand_name(a.pass, true),
                  " needs its rowwise data [M, ", fwd ? "K" : "N", "]");
    d.M = in.dim(0);
    (fwd ? d.K : d.N) = in.dim(1);
    check_dim(kOp, fwd ? "out (y)" : "out (dx)", a.out, 0, d.M);
    (fwd ? d.N : d.K) = a.out.dim(1);
  }
  GROUPMM_CHECK(d.G >= 1, kOp, ": number of groups G=", d.G, " must be >= 1");
  check_splits(kOp, a.splits, d.G, dev);
  GROUPMM_CHECK(d.M <= INT32_MAX, kOp, ": M_total=", d.M, " must fit int32");
  check_expected_rows(kOp, a.splits_total, a.expected_rows, d.M);
  if (a.bias.present()) {
    GROUPMM_CHECK(a.pass == GemmPass::forward, kOp, ": bias is only valid for the forward pass");
    check_view(kOp, "bias", a.bias, DType::bf16, 2, dev);
    check_dim(kOp, "bias", a.bias, 0, d.G);
    check_dim(kOp, "bias", a.bias, 1, d.N);
  }
  if (dev == Device::CUDA) {
    const RecipeTraits t = recipe_traits(r);
    GROUPMM_CHECK(d.N % t.gemm_n_multiple == 0, kOp, ": N=", d.N, " must be a multiple of ",
                  t.gemm_n_multiple, " for ", recipe_name(r));
    GROUPMM_CHECK(d.K % t.gemm_k_multiple == 0, kOp, ": K=", d.K, " must be a multiple of ",
                  t.gemm_k_multiple, " for ", recipe_name(r));
    for (const auto& [v, n] : {std::pair{a.out, "out"}, {a.bias, "bias"}})
      GROUPMM_CHECK(!v.present() || reinterpret_cast<uintptr_t>(v.data) % 16 == 0, kOp, ": ", n,
                    ".data must be 16-byte aligned");
  }
  Resolved res{d, {}, {}};
  switch (a.pass) {
    case GemmPass::forward:
      res.a = check_operand(ctx, a, true, d.M, d.K, d.G);
      res.b = check_operand(ctx, a, false, d.G * d.N, d.K, d.G);
      break;
    case GemmPass::dgrad:
      res.a = check_operand(ctx, a, true, d.M, d.N, d.G);
      res.b = check_operand(ctx, a, false, d.G * d.N, d.K, d.G);
      break;
    case GemmPass::wgrad:
      res.a = check_operand(ctx, a, true, d.M, d.N, d.G);
      res.b = check_operand(ctx, a, false, d.M, d.K, d.G);
      break;
  }
  GemmEngine e = a.engine;
  GROUPMM_CHECK(e != GemmEngine::cublas_loop, kOp, ": the cublas_loop engine has no FP8 kernels");
  GROUPMM_CHECK(dev == Device::CUDA || e != GemmEngine::cutlass_sm90, kOp,
                ": engine cutlass_sm90 needs a CUDA context");
  GROUPMM_CHECK(dev == Device::CPU || e != GemmEngine::reference, kOp,
                ": the reference engine needs a CPU context");
  GROUPMM_CHECK(a.config.empty() || (dev == Device::CUDA && r != QuantRecipe::mxfp8), kOp,
                ": config '", a.config, "' selects a cutlass_sm90 FP8 kernel; ",
                dev == Device::CPU ? "a CPU context has none" : "mxfp8 runs the bf16 engine");
  return res;
}

GemmLaunch fp8_launch(const QuantizedGemmArgs& a, const Resolved& r) {
  GemmLaunch l;
  l.pass = a.pass;
  l.dims = r.d;
  l.a_dtype = r.a.data.dtype;
  l.b_dtype = r.b.data.dtype;
  l.out_dtype = a.out.dtype;
  l.recipe = a.a.recipe;
  l.fast_accum = a.fast_accum;
  l.a = r.a.data.data;
  l.b = r.b.data.data;
  l.out = a.out.data;
  l.bias = a.bias.present() ? a.bias.data : nullptr;
  l.splits = a.splits;
  l.alpha = a.alpha;
  l.beta = a.beta;
  l.scale_a = r.a.scales.ptr<const float>();
  l.scale_b = r.b.scales.ptr<const float>();
  l.config = a.config;
  l.splits_at_most = a.splits_total == SplitsTotal::at_most;
  l.expected_rows = a.expected_rows;
  return l;
}

// ---- MXFP8 on sm_90: dequantize both operands to bf16 in the workspace, then the bf16 engine ----
struct DequantPlan {
  GroupDequantizeArgs a, b;
  GroupedGemmArgs gemm;
  size_t a_bytes = 0, b_bytes = 0;
};

DequantPlan dequant_plan(const QuantizedGemmArgs& q, const Resolved& r, void* base, DType wide) {
  DequantPlan p;
  const GemmDims& d = r.d;
  const Device dev = q.out.device;
  const bool wg = q.pass == GemmPass::wgrad;
  const int64_t a_cols = q.pass == GemmPass::forward ? d.K : d.N;
  p.a_bytes = (static_cast<size_t>(d.M * a_cols) * dtype_bits(wide) / 8 + 255) / 256 * 256;
  char* bytes = static_cast<char*>(base);
  TensorView a_wide(bytes, wide, dev, {d.M, a_cols});
  TensorView b_wide(bytes ? bytes + p.a_bytes : nullptr, wide, dev,
                    wg ? std::initializer_list<int64_t>{d.M, d.K}
                       : std::initializer_list<int64_t>{d.G, d.N, d.K});
  p.b_bytes = (static_cast<size_t>(b_wide.numel()) * dtype_bits(wide) / 8 + 255) / 256 * 256;
  auto plan = [&](GroupDequantizeArgs& dq, const GroupedTensor& t, const OperandCopy& c,
                  const TensorView& out, bool weight) {
    dq.in = t;
    dq.in.splits = weight ? TensorView() : q.splits;
    dq.splits_total = weight ? SplitsTotal::exact : q.splits_total;
    dq.config = quantize_config_of(t);
    dq.from_columnwise = c.columnwise;
    dq.out = out;
  };
  plan(p.a, q.a, r.a, a_wide, false);
  plan(p.b, q.b, r.b, b_wide, !wg);
  GroupedGemmArgs& g = p.gemm;
  g.pass = q.pass;
  g.a = a_wide;
  g.b = b_wide;
  g.out = q.out;
  g.splits = q.splits;
  g.bias = q.bias;
  g.alpha = q.alpha;
  g.beta = q.beta;
  g.splits_total = q.splits_total;
  g.expected_rows = q.expected_rows;
  g.engine = GemmEngine::cutlass_sm90;
  return p;
}

// Sizes only (the plan's views may still be null): the bf16 GEMM's own need from its dims.
size_t dequant_workspace(const Context& ctx, const DequantPlan& p, const GemmDims& d) {
  return p.a_bytes + p.b_bytes +
         std::max({cuda::cutlass_gemm_workspace_size(make_launch(p.gemm, d), ctx.gemm_sm_count()),
                   group_dequantize_workspace_size(ctx, p.a),
                   group_dequantize_workspace_size(ctx, p.b)});
}

// FP8 recipes run FP8 kernels (and their alignment rules); MXFP8 runs the bf16 engine.
bool use_fp8_rules(const QuantizedGemmArgs& a) {
  return a.a.recipe != QuantRecipe::mxfp8;
}
bool use_fp8_kernels(const Context& ctx, const QuantizedGemmArgs& a) {
  return ctx.device() == Device::CUDA && use_fp8_rules(a);
}

}  // namespace

std::string QuantizedGemmArgs::to_string() const {
  return detail::cat(
      "QuantizedGemmArgs(pass=", gemm_pass_name(pass), ", a=", a.to_string(), ", b=", b.to_string(),
      ", out=", out.to_string(), ", splits=", splits.to_string(), ", bias=", bias.to_string(),
      ", alpha=", alpha, ", beta=", beta, fast_accum ? ", fast_accum" : "",
      splits_total == SplitsTotal::at_most ? ", splits_total=at_most" : "",
      expected_rows > 0 ? detail::cat(", expected_rows=", expected_rows) : std::string(),
      ", engine=", gemm_engine_name(engine), config.empty() ? "" : ", config=" + config, ")");
}

GemmDims validate_gemm_args(const Context& ctx, const QuantizedGemmArgs& args) {
  return resolve(ctx, args).d;
}

size_t grouped_gemm_workspace_size(const Context& ctx, const QuantizedGemmArgs& args) {
  const Resolved r = resolve(ctx, args);
  if (ctx.device() == Device::CPU) return 0;
  if (use_fp8_kernels(ctx, args))
    return cuda::cutlass_gemm_workspace_size(fp8_launch(args, r), ctx.gemm_sm_count());
  return dequant_workspace(ctx, dequant_plan(args, r, nullptr, DType::bf16), r.d);
}

void grouped_gemm(Context& ctx, const QuantizedGemmArgs& args, void* workspace, size_t ws_bytes) {
  const Resolved r = resolve(ctx, args);
  if (ctx.device() == Device::CPU) {
    // Reference: every operand dequantized exactly (fp32 holds every FP8 value times its scale),
    // products summed in fp64. The dequantization reports no faults of its own: the GEMM's
    // expert_rows reports them against grouped_gemm, as the CUDA engine does.
    Context quiet(Device::CPU);
    const DequantPlan p = dequant_plan(args, r, nullptr, DType::fp32);
    std::vector<float> A(static_cast<size_t>(p.gemm.a.numel()));
    std::vector<float> B(static_cast<size_t>(p.gemm.b.numel()));
    GroupDequantizeArgs da = p.a, db = p.b;
    da.out.data = A.data();
    db.out.data = B.data();
    group_dequantize(quiet, da);
    group_dequantize(quiet, db);
    cpu::grouped_gemm_dequantized(ctx, args.pass, A, B, args.splits, r.d, args.alpha, args.beta,
                                  args.bias, args.out, recipe_traits(args.a.recipe).split_multiple,
                                  args.splits_total == SplitsTotal::at_most);
  } else if (use_fp8_kernels(ctx, args)) {
    cuda::cutlass_grouped_gemm(ctx, fp8_launch(args, r), workspace, ws_bytes);
  } else {
    DequantPlan probe = dequant_plan(args, r, nullptr, DType::bf16);
    const size_t need = dequant_workspace(ctx, probe, r.d);
    if (workspace == nullptr) {
      workspace = ctx.workspace(need);
      ws_bytes = ctx.workspace_size();
    }
    GROUPMM_CHECK(ws_bytes >= need, "grouped_gemm: workspace_bytes=", ws_bytes,
                  " must be >= ", need, " (grouped_gemm_workspace_size)");
    const DequantPlan p = dequant_plan(args, r, workspace, DType::bf16);
    char* rest = static_cast<char*>(workspace) + p.a_bytes + p.b_bytes;
    const size_t rest_bytes = ws_bytes - p.a_bytes - p.b_bytes;
    group_dequantize(ctx, p.a, rest, rest_bytes);
    group_dequantize(ctx, p.b, rest, rest_bytes);
    grouped_gemm(ctx, p.gemm, rest, rest_bytes);
  }
  ctx.after_op();
}

std::string gemm_config_name(const Context& ctx, const QuantizedGemmArgs& args) {
  const Resolved r = resolve(ctx, args);
  if (ctx.device() == Device::CPU) return gemm_engine_name(GemmEngine::reference);
  if (use_fp8_kernels(ctx, args)) return cuda::cutlass_config_name(fp8_launch(args, r));
  return "mxfp8_dequantize+" + cuda::cutlass_config_name(make_launch(
                                   dequant_plan(args, r, nullptr, DType::bf16).gemm, r.d));
}

}  // namespace groupmm
