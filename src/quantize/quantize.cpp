// group_quantize / bgrad_group_quantize: configs, output shapes, validation, backend dispatch.
#include <algorithm>
#include <numeric>

#include "quantize/backends.hpp"

namespace groupmm {

const char* quant_direction_name(QuantDirection d) {
  switch (d) {
    case QuantDirection::rowwise:
      return "rowwise";
    case QuantDirection::columnwise:
      return "columnwise";
    case QuantDirection::both:
      return "both";
  }
  return "?";
}

const char* scale_layout_name(ScaleLayout l) {
  switch (l) {
    case ScaleLayout::plain:
      return "plain";
    case ScaleLayout::swizzled:
      return "swizzled";
    case ScaleLayout::mn_major:
      return "mn_major";
  }
  return "?";
}

RecipeTraits recipe_traits(QuantRecipe r) {
  RecipeTraits t;  // none: no quantization, every multiple 1
  switch (r) {
    case QuantRecipe::none:
      break;
    case QuantRecipe::fp8_current:
      t.row_block = t.gemm_k_multiple = t.gemm_n_multiple = t.split_multiple = 16;
      t.col_block = 128;
      t.e5m2_gradients = true;
      break;
    case QuantRecipe::fp8_block:
      t.row_block = t.col_block = t.gemm_k_multiple = t.gemm_n_multiple = 128;
      t.split_multiple = 16;
      break;
    case QuantRecipe::mxfp8:  // the bf16 engine after an exact dequantization: no split rule
      t.row_block = t.col_block = 32;
      t.scale_dtype = DType::e8m0;
      t.gemm_k_multiple = t.gemm_n_multiple = 16;
      t.e5m2_gradients = true;
      break;
    case QuantRecipe::nvfp4:
    case QuantRecipe::mxfp4:
      t.row_block = t.col_block = r == QuantRecipe::nvfp4 ? 16 : 32;
      t.scale_dtype = r == QuantRecipe::nvfp4 ? DType::fp8e4m3 : DType::e8m0;
      t.fp4 = true;
      t.gemm_k_multiple = 32;
      t.gemm_n_multiple = 8;
      break;
  }
  // A layer quantizes x [M, K] (and, when it trains, dy [M, N]) rowwise and runs the GEMM: K
  // (N) must serve both. The 4-bit recipes quantize only the weights [G, N, K], along K.
  auto lcm = [](int a, int b) { return a / std::gcd(a, b) * b; };
  t.in_features_multiple = lcm(t.row_block, t.gemm_k_multiple);
  t.out_features_multiple = t.fp4 ? t.gemm_n_multiple : lcm(t.row_block, t.gemm_n_multiple);
  return t;
}

std::string RecipeTraits::to_string() const {
  return detail::cat("RecipeTraits(row_block=", row_block, ", col_block=", col_block,
                     ", scales=", dtype_name(scale_dtype), fp4 ? ", fp4" : "",
                     ", gemm K/N multiples=", gemm_k_multiple, "/", gemm_n_multiple,
                     ", split_multiple=", split_multiple,
                     ", features in/out multiples=", in_features_multiple, "/",
                     out_features_multiple, e5m2_gradients ? ", e5m2 gradients" : "", ")");
}

int QuantizeConfig::row_block() const {
  return recipe_traits(recipe).row_block;
}

int QuantizeConfig::col_block() const {
  return recipe_traits(recipe).col_block;
}

DType QuantizeConfig::data_dtype() const {
  return recipe_traits(recipe).fp4 ? DType::fp4e2m1x2 : fp8_dtype;
}

DType QuantizeConfig::scale_dtype() const {
  return recipe_traits(recipe).scale_dtype;
}

const char* amax_schedule_name(AmaxSchedule s) {
  switch (s) {
    case AmaxSchedule::automatic:
      return "automatic";
    case AmaxSchedule::separate:
      return "separate";
    case AmaxSchedule::fused:
      return "fused";
  }
  return "?";
}

std::string QuantizeConfig::to_string() const {
  const std::string amax = amax_schedule == AmaxSchedule::automatic
                               ? ""
                               : detail::cat(", amax ", amax_schedule_name(amax_schedule),
                                             amax_lag > 0 ? detail::cat(" lag ", amax_lag) : "");
  return detail::cat("QuantizeConfig(", recipe_name(recipe), ", data=", dtype_name(data_dtype()),
                     ", scales=", dtype_name(scale_dtype()), " ", scale_layout_name(scale_layout),
                     ", ", quant_direction_name(direction), pow2_scales ? ", pow2" : "",
                     block_2d ? ", 2d blocks" : "", amax, ")");
}

int64_t TensorSpec::numel() const {
  if (rank == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

std::string TensorSpec::to_string() const {
  if (!present()) return "(absent)";
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << shape[static_cast<size_t>(i)];
  os << "]";
  return os.str();
}

std::string QuantizedShapes::to_string() const {
  return detail::cat("QuantizedShapes(data=", data.to_string(),
                     ", scale_inv=", scale_inv.to_string(),
                     ", columnwise_data=", columnwise_data.to_string(),
                     ", columnwise_scale_inv=", columnwise_scale_inv.to_string(),
                     ", amax=", amax.to_string(), ", global_scale=", global_scale.to_string(), ")");
}

std::string GroupQuantizeArgs::to_string() const {
  return detail::cat("GroupQuantizeArgs(input=", input.to_string(), ", splits=", splits.to_string(),
                     splits_total == SplitsTotal::at_most ? ", splits_total=at_most" : "",
                     row_map.present() ? ", row_map=" + row_map.to_string() : "", ", ",
                     config.to_string(), ", out=", out.to_string(), ")");
}

static TensorSpec spec(DType t, int64_t a, int64_t b = -1) {
  TensorSpec s;
  s.dtype = t;
  s.rank = b < 0 ? 1 : 2;
  s.shape = {a, b < 0 ? 0 : b, 0};
  return s;
}

static void check_config(const QuantizeConfig& c, int64_t K, const char* op) {
  GROUPMM_CHECK(c.recipe != QuantRecipe::none, op, ": config.recipe=none is not a quantization");
  if (!qnum::is_fp4(c.recipe))
    GROUPMM_CHECK(c.fp8_dtype == DType::fp8e4m3 || c.fp8_dtype == DType::fp8e5m2, op,
                  ": config.fp8_dtype=", dtype_name(c.fp8_dtype), " must be fp8e4m3 or fp8e5m2");
  GROUPMM_CHECK(K > 0, op, ": input.shape[-1]=K=", K, " must be > 0");
  GROUPMM_CHECK(K % c.row_block() == 0, op, ": input.shape[-1]=K=", K, " must be a multiple of ",
                c.row_block(), " (", recipe_name(c.recipe), " block)");
  const int sl = static_cast<int>(c.scale_layout);
  GROUPMM_CHECK(sl >= 0 && sl <= 2, op, ": config.scale_layout=", sl,
                " must be plain, swizzled or mn_major");
  GROUPMM_CHECK(c.scale_layout != ScaleLayout::swizzled || c.recipe == QuantRecipe::mxfp8 ||
                    qnum::is_fp4(c.recipe),
                op, ": config.scale_layout=swizzled needs mxfp8, nvfp4 or mxfp4, not ",
                recipe_name(c.recipe));
  GROUPMM_CHECK(c.scale_layout != ScaleLayout::mn_major || c.recipe == QuantRecipe::fp8_block, op,
                ": config.scale_layout=mn_major needs fp8_block, not ", recipe_name(c.recipe));
  GROUPMM_CHECK(!c.block_2d || c.recipe == QuantRecipe::fp8_block || c.recipe == QuantRecipe::nvfp4,
                op, ": config.block_2d needs fp8_block or nvfp4, not ", recipe_name(c.recipe));
  const int d = static_cast<int>(c.direction);
  GROUPMM_CHECK(d >= 1 && d <= 3, op, ": config.direction=", d,
                " must be rowwise, columnwise or both");
  const int s = static_cast<int>(c.amax_schedule);
  GROUPMM_CHECK(s >= 0 && s <= 2, op, ": config.amax_schedule=", s,
                " must be automatic, separate or fused");
  GROUPMM_CHECK(c.amax_lag >= 0, op, ": config.amax_lag=", c.amax_lag, " must be >= 0");
}

// mn_major fp8_block rowwise scales: the leading dimension (rows, or 128-row blocks for 128x128
// blocks: at most tile_bound of them), padded to 4 for 16-byte aligned rows.
static int64_t mn_major_row_ld(int64_t M, int64_t G, bool fp8_2d) {
  return qnum::round_up(fp8_2d ? qnum::tile_bound(M, G) : M, 4);
}

QuantizedShapes group_quantize_shapes(int64_t M, int64_t K, int64_t G, const QuantizeConfig& c) {
  check_config(c, K, "group_quantize_shapes");
  GROUPMM_CHECK(M >= 0 && G >= 1, "group_quantize_shapes: rows_total=", M, ", G=", G,
                " must be >= 0 and >= 1");
  // Past these every size below would overflow int64 (and any memory): refused, not wrapped.
  GROUPMM_CHECK(G <= (int64_t(1) << 24) && K <= (int64_t(1) << 32) &&
                    M <= (int64_t(1) << 56) / std::max<int64_t>(K, 1),
                "group_quantize_shapes: rows_total=", M, ", K=", K, ", G=", G,
                " are too large (G <= 2^24, K <= 2^32, rows_total * K <= 2^56)");
  QuantizedShapes s;
  const DType dt = c.data_dtype(), st = c.scale_dtype();
  const bool swz = c.scale_layout == ScaleLayout::swizzled;
  const bool mn = c.scale_layout == ScaleLayout::mn_major;
  const int64_t rb = c.row_block(), cb = c.col_block();
  const bool fp8_2d = c.recipe == QuantRecipe::fp8_block && c.block_2d;
  if (has_rowwise(c.direction)) {
    s.data = spec(dt, M, K);
    if (c.recipe == QuantRecipe::fp8_block && mn)
      s.scale_inv = spec(st, K / 128, mn_major_row_ld(M, G, fp8_2d));
    else if (c.recipe == QuantRecipe::fp8_block)
      s.scale_inv = fp8_2d ? spec(st, qnum::tile_bound(M, G), K / 128) : spec(st, M, K / 128);
    else if (c.recipe != QuantRecipe::fp8_current)
      s.scale_inv = swz ? spec(st, M + 127 * G, qnum::round_up(K / rb, 4)) : spec(st, M, K / rb);
  }
  if (has_columnwise(c.direction)) {
    s.columnwise_data = spec(dt, K, M);
    if (fp8_2d)
      s.columnwise_scale_inv = spec(st, qnum::tile_bound(M, G), K / 128);
    else if (c.recipe != QuantRecipe::fp8_current)
      s.columnwise_scale_inv =
          swz ? spec(st, M / cb + 4 * G, qnum::round_up(K, 128)) : spec(st, M / cb + G, K);
  }
  if (c.recipe == QuantRecipe::fp8_current) s.scale_inv = spec(DType::fp32, G);
  if (c.recipe == QuantRecipe::fp8_current || c.recipe == QuantRecipe::nvfp4)
    s.amax = spec(DType::fp32, G);
  if (c.recipe == QuantRecipe::nvfp4) s.global_scale = spec(DType::fp32, G);
  return s;
}

static Tensor alloc_spec(const TensorSpec& s, Device d, cudaStream_t stream) {
  if (!s.present()) return Tensor();
  if (s.rank == 1) return Tensor::empty({s.shape[0]}, s.dtype, d, stream);
  return Tensor::empty({s.shape[0], s.shape[1]}, s.dtype, d, stream);
}

QuantizedBuffers allocate_quantized(const QuantizedShapes& s, Device d, cudaStream_t stream) {
  QuantizedBuffers b;
  b.data = alloc_spec(s.data, d, stream);
  b.scale_inv = alloc_spec(s.scale_inv, d, stream);
  b.columnwise_data = alloc_spec(s.columnwise_data, d, stream);
  b.columnwise_scale_inv = alloc_spec(s.columnwise_scale_inv, d, stream);
  b.amax = alloc_spec(s.amax, d, stream);
  b.global_scale = alloc_spec(s.global_scale, d, stream);
  return b;
}

GroupedTensor QuantizedBuffers::view(int64_t G, const TensorView& splits,
                                     const QuantizeConfig& cfg) const {
  GroupedTensor t;
  t.num_groups = G;
  t.splits = splits;
  t.data = data.view();
  t.scale_inv = scale_inv.view();
  t.columnwise_data = columnwise_data.view();
  t.columnwise_scale_inv = columnwise_scale_inv.view();
  t.amax = amax.view();
  t.global_scale = global_scale.view();
  t.recipe = cfg.recipe;
  t.scale_layout = cfg.scale_layout;
  t.block_2d = cfg.block_2d;
  return t;
}

qnum::Layout make_layout(const QuantizeConfig& c, int64_t M, int64_t K, int64_t G) {
  qnum::Layout L;
  L.recipe = c.recipe;
  L.K = K;
  L.rb = c.row_block();
  L.cb = c.col_block();
  L.cb_shift = qnum::log2_exact(L.cb);
  L.fp8_2d = c.recipe == QuantRecipe::fp8_block && c.block_2d;
  L.swizzled = c.scale_layout == ScaleLayout::swizzled;
  L.mn_major = c.scale_layout == ScaleLayout::mn_major;
  L.rs_ld = mn_major_row_ld(M, G, L.fp8_2d);
  L.e5m2 = c.fp8_dtype == DType::fp8e5m2 && !qnum::is_fp4(c.recipe);
  L.pow2 = c.pow2_scales;
  L.block_2d = c.block_2d;
  L.row_ncols = K / L.rb;
  L.row_kp = qnum::round_up(L.row_ncols, 4);
  L.col_k128 = qnum::round_up(K, 128);
  return L;
}

qnum::ScaleSlack scale_slack(const qnum::Layout& L, const TensorSpec& s, bool columnwise) {
  qnum::ScaleSlack z;
  if (!s.present() || L.recipe == QuantRecipe::fp8_current) return z;
  const int64_t esize = dtype_bits(s.dtype) / 8;
  z.lines = 1;
  z.line_bytes = s.numel() * esize;
  if (columnwise) {  // per expert blocks at K * cb_start (swizzled: roundup(K, 128) * cs4_start)
    z.unit = L.swizzled ? qnum::SlackUnit::col_blocks4 : qnum::SlackUnit::col_blocks;
    z.unit_bytes = L.swizzled ? L.col_k128 : (L.fp8_2d ? L.K / 128 : L.K) * esize;
  } else if (L.mn_major) {  // [K/128, ld]: each scale column's tokens (or 128-row blocks)
    z.lines = s.shape[0];
    z.line_bytes = s.shape[1] * esize;
    z.unit = L.fp8_2d ? qnum::SlackUnit::tiles : qnum::SlackUnit::rows;
    z.unit_bytes = esize;
  } else if (L.fp8_2d || L.swizzled) {  // per 128-row tile of an expert
    z.unit = qnum::SlackUnit::tiles;
    z.unit_bytes = L.fp8_2d ? L.row_ncols * esize : 128 * L.row_kp;
  } else {  // plain 1xB: rows past the splits' sum stay unwritten, as their data
    z.lines = 0;
  }
  return z;
}

static void check_out(const char* op, const char* arg, const TensorView& v, const TensorSpec& s,
                      Device dev, bool aligned16) {
  if (!s.present()) return;
  GROUPMM_CHECK(v.present(), op, ": ", arg, " is required (", s.to_string(), ")");
  GROUPMM_CHECK(v.dtype == s.dtype, op, ": ", arg, ".dtype=", dtype_name(v.dtype), " must be ",
                dtype_name(s.dtype));
  GROUPMM_CHECK(v.device == dev, op, ": ", arg, " is on ", device_name(v.device),
                " but the context is ", device_name(dev));
  GROUPMM_CHECK(v.numel() >= s.numel(), op, ": ", arg, ".numel=", v.numel(), " (shape ",
                v.shape_string(), ") is too small: needs ", s.numel(), " (", s.to_string(), ")");
  GROUPMM_CHECK(v.data != nullptr || s.numel() == 0, op, ": ", arg, ".data is null");
  GROUPMM_CHECK(!aligned16 || reinterpret_cast<uintptr_t>(v.data) % 16 == 0, op, ": ", arg,
                ".data must be 16-byte aligned");
  const uintptr_t elem = static_cast<uintptr_t>(std::max(1, dtype_bits(v.dtype) / 8));
  GROUPMM_CHECK(reinterpret_cast<uintptr_t>(v.data) % elem == 0, op, ": ", arg,
                ".data must be aligned to its ", elem, "-byte elements");
}

QuantProblem validate_quantize_args(const Context& ctx, const GroupQuantizeArgs& a, const char* op,
                                    const char* iname, const char* qname) {
  const TensorView& x = a.input;
  GROUPMM_CHECK(x.present(), op, ": ", iname, " is required");
  (void)x.numel();  // the rank, dims and size of a hand-written view
  GROUPMM_CHECK(x.dtype == DType::bf16 || x.dtype == DType::fp16 || x.dtype == DType::fp32, op,
                ": ", iname, ".dtype=", dtype_name(x.dtype), " must be bf16, fp16 or fp32");
  GROUPMM_CHECK(x.device == ctx.device(), op, ": ", iname, " is on ", device_name(x.device),
                " but the context is ", device_name(ctx.device()));
  QuantProblem p;
  if (a.splits.present()) {
    GROUPMM_CHECK(x.rank == 2, op, ": ", iname, ".rank=", x.rank,
                  " must be 2 ([M, K] with splits)");
    check_splits(op, a.splits, -1, ctx.device());
    p.G = a.splits.dim(0);
    p.M = x.dim(0);
    p.K = x.dim(1);
    if (a.row_map.present()) {
      const TensorView& m = a.row_map;
      GROUPMM_CHECK(m.dtype == DType::int32 && m.rank == 1, op, ": row_map must be int32 [M], not ",
                    dtype_name(m.dtype), " ", m.shape_string());
      GROUPMM_CHECK(m.device == ctx.device(), op, ": row_map is on ", device_name(m.device),
                    " but the context is ", device_name(ctx.device()));
      GROUPMM_CHECK(m.data != nullptr || m.dim(0) == 0, op, ": row_map.data is null");
      const QuantRecipe r = a.config.recipe;
      GROUPMM_CHECK(r == QuantRecipe::fp8_current || r == QuantRecipe::fp8_block, op,
                    ": row_map needs fp8_current or fp8_block, not ", recipe_name(r));
      GROUPMM_CHECK(x.dtype == DType::bf16, op, ": row_map needs a bf16 ", iname, ", not ",
                    dtype_name(x.dtype));
      GROUPMM_CHECK(a.config.amax_schedule != AmaxSchedule::separate, op,
                    ": row_map needs the fused amax schedule, not amax_schedule=separate");
      p.gathered = true;
      p.M = m.dim(0);  // the gathered rows: what the splits and the outputs describe
    }
  } else {
    GROUPMM_CHECK(x.rank == 3, op, ": ", iname, ".rank=", x.rank,
                  " must be 3 ([G, N, K] weights) when splits is absent");
    GROUPMM_CHECK(!a.row_map.present(), op, ": row_map needs splits (activations)");
    p.uniform = true;
    p.G = x.dim(0);
    p.M = x.dim(0) * x.dim(1);
    p.K = x.dim(2);
  }
  GROUPMM_CHECK(p.G >= 1, op, ": the number of groups G=", p.G, " must be >= 1");
  GROUPMM_CHECK(a.splits_total == SplitsTotal::exact || a.splits.present(), op,
                ": splits_total=at_most needs splits (weights have none)");
  GROUPMM_CHECK(x.data != nullptr || x.numel() == 0, op, ": ", iname, ".data is null");
  GROUPMM_CHECK(reinterpret_cast<uintptr_t>(x.data) % 16 == 0, op, ": ", iname,
                ".data must be 16-byte aligned");
  const QuantizeConfig& c = a.config;
  check_config(c, p.K, op);
  GROUPMM_CHECK(!c.block_2d || p.uniform, op,
                ": config.block_2d is for weights ([G, N, K], no splits)");
  p.L = make_layout(c, p.M, p.K, p.G);
  p.rowwise = has_rowwise(c.direction);
  p.columnwise = has_columnwise(c.direction);
  const QuantizedShapes s = group_quantize_shapes(p.M, p.K, p.G, c);
  const Device d = ctx.device();
  check_out(op, detail::cat(qname, ".data").c_str(), a.out.data, s.data, d, true);
  check_out(op, detail::cat(qname, ".scale_inv").c_str(), a.out.scale_inv, s.scale_inv, d, false);
  check_out(op, detail::cat(qname, ".columnwise_data").c_str(), a.out.columnwise_data,
            s.columnwise_data, d, false);
  check_out(op, detail::cat(qname, ".columnwise_scale_inv").c_str(), a.out.columnwise_scale_inv,
            s.columnwise_scale_inv, d, false);
  check_out(op, detail::cat(qname, ".amax").c_str(), a.out.amax, s.amax, d, false);
  check_out(op, detail::cat(qname, ".global_scale").c_str(), a.out.global_scale, s.global_scale, d,
            false);
  if (p.rowwise) p.row_slack = scale_slack(p.L, s.scale_inv, false);
  if (p.columnwise) p.col_slack = scale_slack(p.L, s.columnwise_scale_inv, true);
  return p;
}

size_t group_quantize_workspace_size(const Context& ctx, const GroupQuantizeArgs& a,
                                     bool with_dbias) {
  // Bounds under which the products below fit (the arguments are not validated yet).
  (void)a.input.numel();
  int64_t G = 1, M = 0, K = 0;
  if (a.splits.present()) {
    G = a.splits.dim(0);
    M = a.row_map.present() ? a.row_map.dim(0) : a.input.dim(0);
    K = a.input.dim(1);
  } else if (a.input.rank == 3) {
    G = a.input.dim(0);
    M = a.input.dim(0) * a.input.dim(1);
    K = a.input.dim(2);
  }
  GROUPMM_CHECK(G >= 1 && G <= (int64_t(1) << 24) && K <= (int64_t(1) << 32),
                "group_quantize_workspace_size: G=", G, ", K=", K,
                " must be in [1, 2^24] and at most 2^32");
  // The CPU backend needs none (and a CPU-only build has no CUDA side to ask).
  return ctx.device() == Device::CUDA
             ? cuda::group_quantize_workspace_size(M, K, G, a.config.recipe, with_dbias)
             : 0;
}

static GroupedTensor run(Context& ctx, const GroupQuantizeArgs& a, const TensorView& dbias,
                         void* ws, size_t ws_bytes, const char* op) {
  const QuantProblem p = validate_quantize_args(ctx, a, op);
  if (dbias.present()) {
    GROUPMM_CHECK(!p.uniform, op, ": dbias needs activations with splits, not weights");
    GROUPMM_CHECK(
        dbias.dtype == DType::bf16 || dbias.dtype == DType::fp16 || dbias.dtype == DType::fp32, op,
        ": dbias.dtype=", dtype_name(dbias.dtype), " must be bf16, fp16 or fp32");
    GROUPMM_CHECK(dbias.rank == 2 && dbias.dim(0) == p.G && dbias.dim(1) == p.K, op,
                  ": dbias.shape=", dbias.shape_string(), " must be [", p.G, ", ", p.K, "]");
    GROUPMM_CHECK(dbias.device == ctx.device(), op, ": dbias is on ", device_name(dbias.device),
                  " but the context is ", device_name(ctx.device()));
    GROUPMM_CHECK(dbias.data != nullptr, op, ": dbias.data is null");
    GROUPMM_CHECK(
        reinterpret_cast<uintptr_t>(dbias.data) % uintptr_t(dtype_bits(dbias.dtype) / 8) == 0, op,
        ": dbias.data must be aligned to its elements");
  }
  if (ctx.device() == Device::CPU) {
    cpu::group_quantize(ctx, a, p, dbias);
  } else {
    const size_t need = group_quantize_workspace_size(ctx, a, dbias.present());
    if (ws == nullptr) {
      ws = ctx.workspace(need);
      ws_bytes = need;
    }
    GROUPMM_CHECK(ws_bytes >= need, op, ": workspace_bytes=", ws_bytes, " must be >= ", need);
    cuda::group_quantize(ctx, a, p, dbias, ws, ws_bytes);
  }
  ctx.after_op();
  GroupedTensor out = a.out;
  out.num_groups = p.G;
  out.splits = a.splits;
  out.recipe = a.config.recipe;
  out.scale_layout = a.config.scale_layout;
  out.block_2d = a.config.block_2d;
  return out;
}

QuantizeConfig quantize_config_of(const GroupedTensor& t) {
  QuantizeConfig c;
  c.recipe = t.recipe;
  const TensorView& d = t.data.present() ? t.data : t.columnwise_data;
  if (d.present() && (d.dtype == DType::fp8e4m3 || d.dtype == DType::fp8e5m2))
    c.fp8_dtype = d.dtype;
  c.block_2d = t.block_2d;
  c.scale_layout = t.scale_layout;
  c.direction = !t.columnwise_data.present() ? QuantDirection::rowwise
                : t.data.present()           ? QuantDirection::both
                                             : QuantDirection::columnwise;
  return c;
}

GroupedTensor group_quantize(Context& ctx, const GroupQuantizeArgs& a, void* ws, size_t ws_bytes) {
  return run(ctx, a, TensorView(), ws, ws_bytes, "group_quantize");
}

GroupedTensor bgrad_group_quantize(Context& ctx, const GroupQuantizeArgs& a,
                                   const TensorView& dbias, void* ws, size_t ws_bytes) {
  GROUPMM_CHECK(dbias.present(), "bgrad_group_quantize: dbias is required");
  return run(ctx, a, dbias, ws, ws_bytes, "bgrad_group_quantize");
}

}  // namespace groupmm
