// GroupedLinear's inference recipes with 4-bit weights (nvfp4_weight, mxfp4_weight): the layer's
// weights quantized once into executor-owned buffers, the forward pass on the 4-bit weight GEMM.
// Built only from public ops.
#include <algorithm>

#include "groupmm/nn/grouped_linear.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm::nn {
namespace {

class W4Executor final : public LinearExecutor {
 public:
  W4Executor(Context& ctx, const GroupedLinearConfig& c, QuantRecipe r, std::string name)
      : name_(std::move(name)),
        G_(c.experts),
        N_(c.out_features),
        K_(c.in_features),
        total_(c.splits_total),
        expected_(c.expected_rows) {
    cfg_.recipe = r;
    cfg_.direction = QuantDirection::rowwise;
    cfg_.scale_layout = ScaleLayout::plain;
    buf_ = allocate_quantized(group_quantize_shapes(G_ * N_, K_, G_, cfg_), ctx.device(),
                              ctx.stream());
  }

  size_t workspace_bytes(const Context& ctx, const LinearPassViews& v) const override {
    size_t need = group_quantize_workspace_size(ctx, quantize_args(v.w));
    for (const TensorView* s : {&v.splits32, &v.splits64})
      need = std::max(need, grouped_gemm_workspace_size(ctx, gemm(v.x, v.bias, *s, v.y)));
    return need;
  }

  void forward(Context& ctx, const TensorView& x, const TensorView& w, const TensorView& bias,
               const TensorView& splits, const TensorView& y) override {
    if (!weights_valid_) {
      group_quantize(ctx, quantize_args(w));
      weights_valid_ = true;
    }
    grouped_gemm(ctx, gemm(x, bias, splits, y));
  }

  void dgrad(Context&, const TensorView&, const TensorView&, const TensorView&,
             const TensorView&) override {
    refuse();
  }
  void wgrad(Context&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
             const TensorView&, bool) override {
    refuse();
  }
  void weights_changed() override { weights_valid_ = false; }

 private:
  [[noreturn]] void refuse() const {
    detail::throw_error(__FILE__, __LINE__,
                        detail::cat(name_,
                                    ": backward is not supported: an inference recipe (forward "
                                    "only, weights held in 4 bits); train with "
                                    "high_precision_recipe() or quantized_recipe()"));
  }

  GroupedTensor weights() const {
    GroupedTensor t = buf_.view(G_, TensorView(), cfg_);
    t.data = TensorView(t.data.data, t.data.dtype, t.data.device, {G_, N_, K_});
    return t;
  }

  GroupQuantizeArgs quantize_args(const TensorView& w) const {
    GroupQuantizeArgs a;
    a.input = w;
    a.config = cfg_;
    a.out = buf_.view(G_, TensorView(), cfg_);
    return a;
  }

  W4GemmArgs gemm(const TensorView& x, const TensorView& bias, const TensorView& splits,
                  const TensorView& y) const {
    W4GemmArgs a;
    a.x = x;
    a.w = weights();
    a.out = y;
    a.splits = splits;
    a.bias = bias;
    a.splits_total = total_;
    a.expected_rows = std::min(expected_, x.dim(0));  // capped at the call's rows
    return a;
  }

  std::string name_;
  int64_t G_, N_, K_;
  SplitsTotal total_;
  int64_t expected_;
  QuantizeConfig cfg_;
  QuantizedBuffers buf_;
  bool weights_valid_ = false;
};

class W4Recipe final : public LinearRecipe {
 public:
  explicit W4Recipe(QuantRecipe r) : recipe_(r) {}
  std::string name() const override {
    return recipe_ == QuantRecipe::nvfp4 ? "nvfp4_weight" : "mxfp4_weight";
  }
  QuantRecipe quantization() const override { return recipe_; }
  std::unique_ptr<LinearExecutor> make_executor(Context& ctx,
                                                const GroupedLinearConfig& cfg) const override {
    GROUPMM_CHECK(cfg.dtype == DType::bf16, name(), ": dtype=", dtype_name(cfg.dtype),
                  " must be bf16 (the 4-bit weight GEMM takes and writes bf16)");
    const RecipeTraits t = recipe_traits(recipe_);
    GROUPMM_CHECK(cfg.in_features % t.in_features_multiple == 0 &&
                      cfg.out_features % t.out_features_multiple == 0,
                  name(), ": in_features=", cfg.in_features, " must be a multiple of ",
                  t.in_features_multiple, " and out_features=", cfg.out_features, " a multiple of ",
                  t.out_features_multiple);
    return std::make_unique<W4Executor>(ctx, cfg, recipe_, name());
  }

 private:
  QuantRecipe recipe_;
};

}  // namespace

std::shared_ptr<const LinearRecipe> nvfp4_weight_recipe() {
  return std::make_shared<W4Recipe>(QuantRecipe::nvfp4);
}
std::shared_ptr<const LinearRecipe> mxfp4_weight_recipe() {
  return std::make_shared<W4Recipe>(QuantRecipe::mxfp4);
}

}  // namespace groupmm::nn
