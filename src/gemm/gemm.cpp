// grouped_gemm: validation and engine dispatch.
#include <cstdint>

#include "gemm/backends.hpp"
#include "gemm/cuda/configs.hpp"

namespace groupmm {

const char* gemm_pass_name(GemmPass p) {
  switch (p) {
    case GemmPass::forward:
      return "forward";
    case GemmPass::dgrad:
      return "dgrad";
    case GemmPass::wgrad:
      return "wgrad";
  }
  return "?";
}

const char* splits_total_name(SplitsTotal t) {
  return t == SplitsTotal::at_most ? "at_most" : "exact";
}

const char* gemm_engine_name(GemmEngine e) {
  switch (e) {
    case GemmEngine::automatic:
      return "automatic";
    case GemmEngine::cutlass_sm90:
      return "cutlass_sm90";
    case GemmEngine::cublas_loop:
      return "cublas_loop";
    case GemmEngine::reference:
      return "reference";
  }
  return "?";
}

std::string GroupedGemmArgs::to_string() const {
  std::ostringstream os;
  os << "GroupedGemmArgs(pass=" << gemm_pass_name(pass) << ", a=" << a.to_string()
     << ", b=" << b.to_string() << ", out=" << out.to_string() << ", splits=" << splits.to_string()
     << ", bias=" << bias.to_string() << ", alpha=" << alpha << ", beta=" << beta
     << ", engine=" << gemm_engine_name(engine)
     << (splits_total == SplitsTotal::exact ? "" : ", splits_total=at_most")
     << (zero_tail ? ", zero_tail" : "")
     << (expected_rows > 0 ? ", expected_rows=" + std::to_string(expected_rows) : "")
     << (config.empty() ? "" : ", config=" + config) << ")";
  return os.str();
}

static void check_aligned(const char* arg, const TensorView& v) {
  GROUPMM_CHECK(reinterpret_cast<uintptr_t>(v.data) % 16 == 0, "grouped_gemm: ", arg,
                ".data=", v.data, " must be 16-byte aligned");
}

GemmDims validate_gemm_args(const Context& ctx, const GroupedGemmArgs& a) {
  const char* op = "grouped_gemm";
  const Device dev = ctx.device();
  GROUPMM_CHECK(a.a.present() && a.b.present() && a.out.present(), op,
                ": a, b and out are required (", a.to_string(), ")");
  const DType t = a.a.dtype;
  const bool fwd = a.pass == GemmPass::forward, wgrad = a.pass == GemmPass::wgrad;
  const char* a_name = fwd ? "a (x)" : "a (dy)";
  const char* b_name = wgrad ? "b (x)" : "b (W)";
  GROUPMM_CHECK(t == DType::bf16 || t == DType::fp16 || (t == DType::fp32 && dev == Device::CPU),
                op, ": ", a_name, ".dtype=", dtype_name(t),
                " must be bf16 or fp16 (fp32 only on a CPU context: gradient checks)");
  // Named from a's side: a layer's weight has the layer's dtype, so an input in another dtype
  // is what a caller most often got wrong.
  GROUPMM_CHECK(a.b.dtype == t, op, ": ", a_name, ".dtype=", dtype_name(t), " must equal ", b_name,
                ".dtype=", dtype_name(a.b.dtype), " (both operands in one dtype)");
  GemmDims d;
  if (wgrad) {
    check_view(op, a_name, a.a, t, 2, dev);
    check_view(op, b_name, a.b, t, 2, dev);
    GROUPMM_CHECK(a.out.dtype == DType::fp32 || a.out.dtype == t, op,
                  ": out.dtype=", dtype_name(a.out.dtype), " must be fp32 or ", dtype_name(t),
                  " for wgrad");
    check_view(op, "out (dW)", a.out, a.out.dtype, 3, dev);
    d.M = a.a.dim(0);
    d.N = a.a.dim(1);
    d.K = a.b.dim(1);
    d.G = a.out.dim(0);
    GROUPMM_CHECK(a.b.dim(0) == d.M, op, ": b (x).shape[0]=", a.b.dim(0),
                  " must equal a (dy).shape[0]=", d.M, " (the rows M)");
    check_dim(op, "out (dW)", a.out, 1, d.N);
    check_dim(op, "out (dW)", a.out, 2, d.K);
    GROUPMM_CHECK(a.beta == 0.0f || a.beta == 1.0f, op, ": beta=", a.beta, " must be 0 or 1");
    GROUPMM_CHECK(a.beta == 0.0f || a.out.dtype == DType::fp32, op,
                  ": beta=1 (accumulate) needs "
                  "an fp32 out, got ",
                  dtype_name(a.out.dtype));
    GROUPMM_CHECK(!a.bias.present(), op, ": bias is only valid for the forward pass");
  } else {
    check_view(op, a_name, a.a, t, 2, dev);
    check_view(op, b_name, a.b, t, 3, dev);
    // An fp32 out is the accumulator without the 16-bit rounding, for callers that keep fp32
    // (twice the store bytes).
    const DType o = a.out.dtype;
    GROUPMM_CHECK(o == t || o == DType::fp32, op, ": out.dtype=", dtype_name(o), " must be ",
                  dtype_name(t), t == DType::fp32 ? "" : " or fp32", " for ",
                  gemm_pass_name(a.pass));
    check_view(op, fwd ? "out (y)" : "out (dx)", a.out, o, 2, dev);
    d.M = a.a.dim(0);
    d.G = a.b.dim(0);
    d.N = a.b.dim(1);
    d.K = a.b.dim(2);
    GROUPMM_CHECK(a.a.dim(1) == (fwd ? d.K : d.N), op, ": ", a_name, ".shape[1]=", a.a.dim(1),
                  " must equal b (W).shape[", fwd ? 2 : 1, "]=", fwd ? d.K : d.N,
                  fwd ? " (K: W is [G, N, K])" : " (N: W is [G, N, K])");
    check_dim(op, fwd ? "out (y)" : "out (dx)", a.out, 0, d.M);
    check_dim(op, fwd ? "out (y)" : "out (dx)", a.out, 1, fwd ? d.N : d.K);
    GROUPMM_CHECK(a.beta == 0.0f, op, ": beta=", a.beta, " must be 0 for ", gemm_pass_name(a.pass));
    if (a.bias.present()) {
      GROUPMM_CHECK(fwd, op, ": bias is only valid for the forward pass");
      // The epilogue reads bias in the type it writes (one broadcast per output dtype).
      GROUPMM_CHECK(a.bias.dtype == o, op, ": bias.dtype=", dtype_name(a.bias.dtype),
                    " must equal out.dtype=", dtype_name(o));
      check_view(op, "bias", a.bias, o, 2, dev);
      check_dim(op, "bias", a.bias, 0, d.G);
      check_dim(op, "bias", a.bias, 1, d.N);
    }
  }
  GROUPMM_CHECK(d.G >= 1, op, ": number of groups G=", d.G, " must be >= 1");
  check_splits(op, a.splits, d.G, dev);
  GROUPMM_CHECK(!a.zero_tail || a.splits_total == SplitsTotal::at_most, op,
                ": zero_tail needs splits_total=at_most (with exact splits there are no rows past "
                "their sum)");
  GROUPMM_CHECK(!a.zero_tail || a.pass != GemmPass::wgrad, op,
                ": zero_tail is for forward and dgrad (wgrad's out [G, N, K] has no row tail)");
  GROUPMM_CHECK(d.M <= INT32_MAX, op, ": M_total=", d.M, " must fit int32");
  check_expected_rows(op, a.splits_total, a.expected_rows, d.M);

  GemmEngine e = a.engine;
  GROUPMM_CHECK(a.config.empty() || (dev == Device::CUDA && e != GemmEngine::cublas_loop), op,
                ": config '", a.config, "' selects a cutlass_sm90 kernel; engine ",
                gemm_engine_name(e), " on ", device_name(dev), " has none");
  if (dev == Device::CPU) {
    GROUPMM_CHECK(e == GemmEngine::automatic || e == GemmEngine::reference, op, ": engine ",
                  gemm_engine_name(e), " needs a CUDA context");
  } else {
    GROUPMM_CHECK(e != GemmEngine::reference, op, ": the reference engine needs a CPU context");
    GROUPMM_CHECK(d.N % 8 == 0, op, ": N=", d.N, " must be a multiple of 8 (16-byte rows)");
    GROUPMM_CHECK(d.K % 8 == 0, op, ": K=", d.K, " must be a multiple of 8 (16-byte rows)");
    check_aligned("a", a.a);
    check_aligned("b", a.b);
    check_aligned("out", a.out);
    if (a.bias.present()) check_aligned("bias", a.bias);
  }
  return d;
}

std::string GemmLaunch::to_string() const {
  return detail::cat(
      "GemmLaunch(", gemm_pass_name(pass), " M=", dims.M, " N=", dims.N, " K=", dims.K,
      " G=", dims.G, " ", dtype_name(a_dtype), " x ", dtype_name(b_dtype), " -> ",
      dtype_name(out_dtype), ", ", recipe_name(recipe), fast_accum ? ", fast accumulation" : "",
      splits_at_most ? ", splits at most M" : "",
      expected_rows > 0 ? detail::cat(", expected rows ", expected_rows) : std::string(),
      config.empty() ? "" : ", config=" + config, ")");
}

void check_expected_rows(const char* op, SplitsTotal total, int64_t expected_rows, int64_t M) {
  GROUPMM_CHECK(expected_rows == 0 ||
                    (total == SplitsTotal::at_most && expected_rows > 0 && expected_rows <= M),
                op, ": expected_rows=", expected_rows,
                " must be 0, or with splits_total=at_most in [1, M_total=", M, "]");
}

GemmLaunch make_launch(const GroupedGemmArgs& a, const GemmDims& d) {
  GemmLaunch l;
  l.pass = a.pass;
  l.dims = d;
  l.a_dtype = l.b_dtype = a.a.dtype;
  l.out_dtype = a.out.dtype;
  l.a = a.a.data;
  l.b = a.b.data;
  l.out = a.out.data;
  l.bias = a.bias.present() ? a.bias.data : nullptr;
  l.splits = a.splits;
  l.alpha = a.alpha;
  l.beta = a.beta;
  l.config = a.config;
  l.splits_at_most = a.splits_total == SplitsTotal::at_most;
  l.expected_rows = a.expected_rows;
  return l;
}

static bool use_cutlass(const Context& ctx, GemmEngine e) {
  return ctx.device() == Device::CUDA &&
         (e == GemmEngine::automatic || e == GemmEngine::cutlass_sm90);
}

size_t grouped_gemm_workspace_size(const Context& ctx, const GroupedGemmArgs& args) {
  const GemmDims d = validate_gemm_args(ctx, args);
  return use_cutlass(ctx, args.engine)
             ? cuda::cutlass_gemm_workspace_size(make_launch(args, d), ctx.gemm_sm_count())
             : 0;
}

void grouped_gemm(Context& ctx, const GroupedGemmArgs& args, void* workspace, size_t ws_bytes) {
  const GemmDims d = validate_gemm_args(ctx, args);
  if (ctx.device() == Device::CPU) {
    cpu::grouped_gemm(ctx, args, d);
  } else if (args.engine == GemmEngine::cublas_loop) {
    cuda::cublas_loop_gemm(ctx, args, d);
  } else {
    cuda::cutlass_grouped_gemm(ctx, make_launch(args, d), workspace, ws_bytes);
  }
  if (args.zero_tail) {
    if (ctx.device() == Device::CPU) {
      cpu::zero_rows_past_splits(args.splits, args.out);
    } else {
      cuda::zero_rows_past_splits(ctx, args.splits, args.out);
    }
  }
  ctx.after_op();
}

void gemm_forward(Context& ctx, const TensorView& x, const TensorView& w, const TensorView& splits,
                  const TensorView& y, const TensorView& bias) {
  GroupedGemmArgs a;
  a.pass = GemmPass::forward;
  a.a = x;
  a.b = w;
  a.out = y;
  a.splits = splits;
  a.bias = bias;
  grouped_gemm(ctx, a);
}

void gemm_dgrad(Context& ctx, const TensorView& dy, const TensorView& w, const TensorView& splits,
                const TensorView& dx) {
  GroupedGemmArgs a;
  a.pass = GemmPass::dgrad;
  a.a = dy;
  a.b = w;
  a.out = dx;
  a.splits = splits;
  grouped_gemm(ctx, a);
}

void gemm_wgrad(Context& ctx, const TensorView& dy, const TensorView& x, const TensorView& splits,
                const TensorView& dw, bool accumulate) {
  GroupedGemmArgs a;
  a.pass = GemmPass::wgrad;
  a.a = dy;
  a.b = x;
  a.out = dw;
  a.splits = splits;
  a.beta = accumulate ? 1.0f : 0.0f;
  grouped_gemm(ctx, a);
}

std::string gemm_config_name(const Context& ctx, const GroupedGemmArgs& args) {
  const GemmDims d = validate_gemm_args(ctx, args);
  return use_cutlass(ctx, args.engine) ? cuda::cutlass_config_name(make_launch(args, d))
                                       : gemm_engine_name(args.engine);
}

// From the configuration table (host data, also in a CPU-only library).
std::vector<std::string> gemm_config_names() {
  std::vector<std::string> v;
  for (int i = 0; i < cuda::kConfigCount; ++i) v.push_back(cuda::config_name(cuda::GemmConfig(i)));
  return v;
}

}  // namespace groupmm
