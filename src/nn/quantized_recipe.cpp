// GroupedLinear's quantized recipes (fp8_current, fp8_block, mxfp8): grouped quantization of x, W
// and dy into executor-owned buffers sized for max_tokens (x and dy optionally gathered through a
// row map), and the quantized grouped GEMMs over them (wgrad: the bf16 GEMM of dy and x with
// high_precision_wgrad). Built only from public ops.
#include <algorithm>

#include "groupmm/dbias.hpp"
#include "groupmm/nn/grouped_linear.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm::nn {
namespace {

// A quantized tensor's buffers (sized once for the largest call) and its config.
struct QuantSlot {
  QuantizeConfig cfg;
  QuantizedBuffers buf;
  int64_t G = 0, K = 0;

  void allocate(const QuantizeConfig& c, int64_t rows, int64_t cols, int64_t groups, Device d,
                cudaStream_t s) {
    cfg = c;
    G = groups;
    K = cols;
    buf = allocate_quantized(group_quantize_shapes(rows, cols, groups, c), d, s);
  }

  // The slot's buffers viewed with the shapes of `rows` rows (the GEMMs derive M from them).
  GroupedTensor view(int64_t rows, const TensorView& splits) const {
    GroupedTensor t = buf.view(G, splits, cfg);
    const QuantizedShapes s = group_quantize_shapes(rows, K, G, cfg);
    auto fit = [](TensorView& v, const TensorSpec& spec) {
      if (!v.present()) return;
      v.rank = spec.rank;
      v.shape = spec.shape;
    };
    fit(t.data, s.data);
    fit(t.scale_inv, s.scale_inv);
    fit(t.columnwise_data, s.columnwise_data);
    fit(t.columnwise_scale_inv, s.columnwise_scale_inv);
    fit(t.amax, s.amax);
    fit(t.global_scale, s.global_scale);
    return t;
  }

  // row_map: the input's rows gathered (GroupQuantizeArgs::row_map).
  GroupQuantizeArgs args(const TensorView& input, const TensorView& splits,
                         SplitsTotal total = SplitsTotal::exact,
                         const TensorView& row_map = TensorView()) const {
    GroupQuantizeArgs a;
    a.input = input;
    a.splits = splits;
    a.row_map = row_map;
    a.splits_total = splits.present() ? total : SplitsTotal::exact;
    a.config = cfg;
    const int64_t rows = row_map.present()  ? row_map.dim(0)
                         : splits.present() ? input.dim(0)
                                            : input.dim(0) * input.dim(1);
    a.out = view(rows, splits);
    return a;
  }
};

class QuantizedExecutor final : public LinearExecutor {
 public:
  QuantizedExecutor(Context& ctx, const GroupedLinearConfig& c, QuantRecipe r,
                    const QuantizedRecipeOptions& o)
      : w_rows_(c.experts * c.out_features),
        fuse_dbias_(c.bias && !c.accumulate_into_main_grad),
        has_bias_(c.bias),
        hp_wgrad_(o.high_precision_wgrad),
        total_(c.splits_total),
        expected_(c.expected_rows) {
    QuantizeConfig base;
    base.recipe = r;
    base.pow2_scales = o.pow2_scales;
    base.direction = QuantDirection::both;
    QuantizeConfig w = base;
    w.block_2d = r == QuantRecipe::fp8_block;
    // A 16-bit wgrad reads the bf16 x and dy: their columnwise copies are never made.
    if (hp_wgrad_) base.direction = QuantDirection::rowwise;
    QuantizeConfig g = base;
    g.fp8_dtype = o.grad_dtype;
    const Device d = ctx.device();
    const int64_t G = c.experts, N = c.out_features, K = c.in_features, T = c.max_tokens;
    x_.allocate(base, T, K, G, d, ctx.stream());
    w_.allocate(w, G * N, K, G, d, ctx.stream());
    dy_.allocate(g, T, N, G, d, ctx.stream());
    if (fuse_dbias_) db_ = Tensor::empty({G, N}, c.dtype, d, ctx.stream());
  }

  size_t workspace_bytes(const Context& ctx, const LinearPassViews& v) const override {
    size_t need = 0;
    for (const TensorView* s : {&v.splits32, &v.splits64}) {
      const int64_t T = v.x.dim(0);
      need =
          std::max({need, group_quantize_workspace_size(ctx, x_.args(v.x, *s, total_)),
                    group_quantize_workspace_size(ctx, w_.args(v.w, TensorView())),
                    group_quantize_workspace_size(ctx, dy_.args(v.dy, *s, total_), fuse_dbias_)});
      need = std::max(need, grouped_gemm_workspace_size(ctx, gemm(GemmPass::forward, x_.view(T, *s),
                                                                  weights(), v.y, *s, T, v.bias)));
      need = std::max(need, grouped_gemm_workspace_size(ctx, gemm(GemmPass::dgrad, dy_.view(T, *s),
                                                                  weights(), v.dx, *s, T)));
      const float beta = v.dw.dtype == DType::fp32 ? 1.0f : 0.0f;
      if (hp_wgrad_) {
        need = std::max(need, grouped_gemm_workspace_size(ctx, wgrad16(v.dy, v.x, v.dw, *s, beta)));
      } else {
        QuantizedGemmArgs wg = gemm(GemmPass::wgrad, dy_.view(T, *s), x_.view(T, *s), v.dw, *s, T);
        wg.beta = beta;
        need = std::max(need, grouped_gemm_workspace_size(ctx, wg));
      }
      if (v.db.present())
        need = std::max(need, group_dbias_workspace_size(ctx, T, v.dy.dim(1), v.db.dim(0)));
    }
    return need;
  }

  void forward(Context& ctx, const TensorView& x, const TensorView& w, const TensorView& bias,
               const TensorView& splits, const TensorView& y) override {
    forward_rows(ctx, x, TensorView(), w, bias, splits, y);
  }
  void forward_gathered(Context& ctx, const TensorView& x_src, const TensorView& row_map,
                        const TensorView& w, const TensorView& bias, const TensorView& splits,
                        const TensorView& y) override {
    forward_rows(ctx, x_src, row_map, w, bias, splits, y);
  }

  void dgrad(Context& ctx, const TensorView& dy, const TensorView&, const TensorView& splits,
             const TensorView& dx) override {
    dgrad_rows(ctx, dy, TensorView(), splits, dx);
  }
  void dgrad_gathered(Context& ctx, const TensorView& dy_src, const TensorView& row_map,
                      const TensorView&, const TensorView& splits, const TensorView& dx) override {
    dgrad_rows(ctx, dy_src, row_map, splits, dx);
  }

  // A 16-bit wgrad reads the bf16 x and dy, and a bias gradient into a main grad the bf16 dy:
  // neither exists when they were gathered.
  // mxfp8 quantizes no gathered rows (GroupQuantizeArgs::row_map).
  bool gathers() const override {
    return x_.cfg.recipe != QuantRecipe::mxfp8 && !hp_wgrad_ && (!has_bias_ || fuse_dbias_);
  }

  void wgrad(Context& ctx, const TensorView& dy, const TensorView& x, const TensorView& splits,
             const TensorView& dw, const TensorView& db, bool accumulate) override {
    const float beta = accumulate ? 1.0f : 0.0f;
    if (hp_wgrad_) {
      grouped_gemm(ctx, wgrad16(dy, x, dw, splits, beta));
    } else {
      // The quantized copies' rows (x and dy may be the sources of gathered passes).
      QuantizedGemmArgs a = gemm(GemmPass::wgrad, dy_.view(dy_rows_, splits),
                                 x_.view(x_rows_, splits), dw, splits, dy_rows_);
      a.beta = beta;
      grouped_gemm(ctx, a);
    }
    if (!db.present()) return;
    if (fuse_dbias_) {
      copy(db, db_, ctx.stream());  // computed with dy's quantization
    } else {
      group_dbias(ctx, dy, splits, db, accumulate, total_);
    }
  }

  void weights_changed() override { weights_valid_ = false; }

 private:
  // forward of x [M, K], or of the rows row_map [M] picks from x (row_map present).
  void forward_rows(Context& ctx, const TensorView& x, const TensorView& row_map,
                    const TensorView& w, const TensorView& bias, const TensorView& splits,
                    const TensorView& y) {
    if (!weights_valid_) {
      group_quantize(ctx, w_.args(w, TensorView()));
      weights_valid_ = true;
    }
    x_rows_ = row_map.present() ? row_map.dim(0) : x.dim(0);
    group_quantize(ctx, x_.args(x, splits, total_, row_map));
    grouped_gemm(ctx, gemm(GemmPass::forward, x_.view(x_rows_, splits), weights(), y, splits,
                           x_rows_, bias));
  }
  void dgrad_rows(Context& ctx, const TensorView& dy, const TensorView& row_map,
                  const TensorView& splits, const TensorView& dx) {
    dy_rows_ = row_map.present() ? row_map.dim(0) : dy.dim(0);
    if (fuse_dbias_) {
      bgrad_group_quantize(ctx, dy_.args(dy, splits, total_, row_map), db_);
    } else {
      group_quantize(ctx, dy_.args(dy, splits, total_, row_map));
    }
    grouped_gemm(
        ctx, gemm(GemmPass::dgrad, dy_.view(dy_rows_, splits), weights(), dx, splits, dy_rows_));
  }

  GroupedTensor weights() const { return w_.view(w_rows_, TensorView()); }

  // rows: the call's (x or dy rows), which caps the expected rows.
  QuantizedGemmArgs gemm(GemmPass pass, const GroupedTensor& a, const GroupedTensor& b,
                         const TensorView& out, const TensorView& splits, int64_t rows,
                         const TensorView& bias = TensorView()) const {
    QuantizedGemmArgs q;
    q.splits_total = total_;
    q.expected_rows = std::min(expected_, rows);
    q.pass = pass;
    q.a = a;
    q.b = b;
    q.out = out;
    q.splits = splits;
    q.bias = bias;
    return q;
  }

  // high_precision_wgrad: the bf16 wgrad GEMM, as the high-precision recipe runs it.
  GroupedGemmArgs wgrad16(const TensorView& dy, const TensorView& x, const TensorView& dw,
                          const TensorView& splits, float beta) const {
    GroupedGemmArgs g;
    g.pass = GemmPass::wgrad;
    g.a = dy;
    g.b = x;
    g.out = dw;
    g.splits = splits;
    g.beta = beta;
    g.splits_total = total_;
    g.expected_rows = std::min(expected_, dy.dim(0));
    return g;
  }

  QuantSlot x_, w_, dy_;
  int64_t x_rows_ = 0, dy_rows_ = 0;  // the rows the last forward / dgrad quantized
  int64_t w_rows_;                    // G * N
  Tensor db_;                         // dy's bias gradient from the fused quantization, until wgrad
  bool fuse_dbias_;
  bool has_bias_;
  bool hp_wgrad_;      // QuantizedRecipeOptions::high_precision_wgrad
  SplitsTotal total_;  // of the activations' quantizers, the GEMMs and dbias
  int64_t expected_;   // GroupedLinearConfig::expected_rows (the GEMMs' kernel choice)
  bool weights_valid_ = false;
};

class QuantizedRecipe final : public LinearRecipe {
 public:
  QuantizedRecipe(QuantRecipe r, const QuantizedRecipeOptions& o) : recipe_(r), opt_(o) {
    GROUPMM_CHECK(
        r == QuantRecipe::fp8_current || r == QuantRecipe::fp8_block || r == QuantRecipe::mxfp8,
        "quantized_recipe: recipe=", recipe_name(r),
        " must be fp8_current, fp8_block or mxfp8 (4-bit weights for inference: "
        "nvfp4_weight_recipe(), mxfp4_weight_recipe())");
    GROUPMM_CHECK(o.grad_dtype == DType::fp8e4m3 || o.grad_dtype == DType::fp8e5m2,
                  "quantized_recipe: options.grad_dtype=", dtype_name(o.grad_dtype),
                  " must be fp8e4m3 or fp8e5m2");
    GROUPMM_CHECK(recipe_traits(r).e5m2_gradients || o.grad_dtype == DType::fp8e4m3,
                  "quantized_recipe: fp8_block gradients are fp8e4m3 (the block GEMMs' operands)");
  }
  std::string name() const override {
    return detail::cat(
        recipe_name(recipe_), opt_.grad_dtype == DType::fp8e5m2 ? "(e5m2 grads)" : "",
        opt_.pow2_scales ? "(pow2 scales)" : "", opt_.high_precision_wgrad ? "(bf16 wgrad)" : "");
  }
  QuantRecipe quantization() const override { return recipe_; }
  std::unique_ptr<LinearExecutor> make_executor(Context& ctx,
                                                const GroupedLinearConfig& cfg) const override {
    GROUPMM_CHECK(cfg.dtype == DType::bf16, name(), ": dtype=", dtype_name(cfg.dtype),
                  " must be bf16 (quantized GEMMs write bf16)");
    // The same multiple for both (a training recipe quantizes x along K and dy along N).
    const int64_t align = recipe_traits(recipe_).in_features_multiple;
    GROUPMM_CHECK(cfg.in_features % align == 0 && cfg.out_features % align == 0, name(),
                  ": in_features=", cfg.in_features, " and out_features=", cfg.out_features,
                  " must be multiples of ", align);
    return std::make_unique<QuantizedExecutor>(ctx, cfg, recipe_, opt_);
  }

 private:
  QuantRecipe recipe_;
  QuantizedRecipeOptions opt_;
};

}  // namespace

std::shared_ptr<const LinearRecipe> quantized_recipe(QuantRecipe recipe,
                                                     QuantizedRecipeOptions options) {
  return std::make_shared<QuantizedRecipe>(recipe, options);
}

}  // namespace groupmm::nn
