// GroupedLinear: parameters, grads and saved state around a recipe's executor. Built only from the
// public ops (grouped_gemm, group_dbias); nothing here knows about the backends.
#include "groupmm/nn/grouped_linear.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "groupmm/dbias.hpp"
#include "groupmm/random.hpp"

namespace groupmm::nn {

std::string GroupedLinearConfig::to_string() const {
  std::ostringstream os;
  os << "GroupedLinearConfig(G=" << experts << ", K=" << in_features << ", N=" << out_features
     << ", bias=" << (bias ? "true" : "false") << ", dtype=" << dtype_name(dtype)
     << ", delay_wgrad=" << (delay_wgrad ? "true" : "false")
     << ", main_grad=" << (accumulate_into_main_grad ? "true" : "false")
     << ", max_tokens=" << max_tokens << ", seed=" << seed
     << (splits_total == SplitsTotal::at_most ? ", splits_total=at_most" : "")
     << (expected_rows > 0 ? ", expected_rows=" + std::to_string(expected_rows) : "")
     << ", recipe=" << (recipe ? recipe->name() : std::string("default")) << ")";
  return os.str();
}

// ================================================================================================
// High-precision recipe: bf16/fp16 operands straight into grouped_gemm, dbias by group_dbias
// ================================================================================================
namespace {

class HighPrecisionExecutor final : public LinearExecutor {
 public:
  HighPrecisionExecutor(GemmEngine e, SplitsTotal total, int64_t expected_rows)
      : engine_(e), total_(total), expected_(expected_rows) {}

  size_t workspace_bytes(const Context& ctx, const LinearPassViews& v) const override {
    size_t need = 0;
    for (const TensorView* s : {&v.splits32, &v.splits64}) {
      need = std::max(need, grouped_gemm_workspace_size(
                                ctx, args(GemmPass::forward, v.x, v.w, v.y, *s, v.bias)));
      need = std::max(need,
                      grouped_gemm_workspace_size(ctx, args(GemmPass::dgrad, v.dy, v.w, v.dx, *s)));
      GroupedGemmArgs wg = args(GemmPass::wgrad, v.dy, v.x, v.dw, *s);
      wg.beta = v.dw.dtype == DType::fp32 ? 1.0f : 0.0f;
      need = std::max(need, grouped_gemm_workspace_size(ctx, wg));
    }
    if (v.db.present())
      need = std::max(need, group_dbias_workspace_size(ctx, v.dy.dim(0), v.dy.dim(1), v.db.dim(0)));
    return need;
  }

  void forward(Context& ctx, const TensorView& x, const TensorView& w, const TensorView& bias,
               const TensorView& splits, const TensorView& y) override {
    grouped_gemm(ctx, args(GemmPass::forward, x, w, y, splits, bias));
  }

  void dgrad(Context& ctx, const TensorView& dy, const TensorView& w, const TensorView& splits,
             const TensorView& dx) override {
    grouped_gemm(ctx, args(GemmPass::dgrad, dy, w, dx, splits));
  }

  void wgrad(Context& ctx, const TensorView& dy, const TensorView& x, const TensorView& splits,
             const TensorView& dw, const TensorView& db, bool accumulate) override {
    GroupedGemmArgs a = args(GemmPass::wgrad, dy, x, dw, splits);
    a.beta = accumulate ? 1.0f : 0.0f;
    grouped_gemm(ctx, a);
    if (db.present()) group_dbias(ctx, dy, splits, db, accumulate, total_);
  }

 private:
  GroupedGemmArgs args(GemmPass pass, const TensorView& a, const TensorView& b,
                       const TensorView& out, const TensorView& splits,
                       const TensorView& bias = TensorView()) const {
    GroupedGemmArgs g;
    g.pass = pass;
    g.a = a;
    g.b = b;
    g.out = out;
    g.splits = splits;
    g.bias = bias;
    g.engine = engine_;
    g.splits_total = total_;
    g.expected_rows = std::min(expected_, a.dim(0));  // a: x or dy, the call's rows
    return g;
  }
  GemmEngine engine_;
  SplitsTotal total_;
  int64_t expected_;
};

class HighPrecisionRecipe final : public LinearRecipe {
 public:
  explicit HighPrecisionRecipe(GemmEngine e) : engine_(e) {}
  std::string name() const override {
    return std::string("high_precision(") + gemm_engine_name(engine_) + ")";
  }
  QuantRecipe quantization() const override { return QuantRecipe::none; }
  std::unique_ptr<LinearExecutor> make_executor(Context& ctx,
                                                const GroupedLinearConfig& cfg) const override {
    GROUPMM_CHECK(cfg.dtype == DType::bf16 || cfg.dtype == DType::fp16 ||
                      (cfg.dtype == DType::fp32 && ctx.device() == Device::CPU),
                  name(), ": dtype=", dtype_name(cfg.dtype),
                  " must be bf16 or fp16 (fp32 only on a CPU context)");
    const bool cpu_engine = engine_ == GemmEngine::automatic || engine_ == GemmEngine::reference;
    const bool cuda_engine = engine_ != GemmEngine::reference;
    GROUPMM_CHECK(ctx.device() == Device::CPU ? cpu_engine : cuda_engine, name(),
                  ": engine cannot run on a ", device_name(ctx.device()), " context");
    GROUPMM_CHECK(!(cfg.bias && engine_ == GemmEngine::cublas_loop), name(),
                  ": the cublas_loop engine does not apply bias");
    GROUPMM_CHECK(engine_ != GemmEngine::cublas_loop || cfg.splits_total == SplitsTotal::exact,
                  name(), ": splits_total=at_most needs the cutlass_sm90 or reference engine");
    return std::make_unique<HighPrecisionExecutor>(engine_, cfg.splits_total, cfg.expected_rows);
  }

 private:
  GemmEngine engine_;
};

// ---- initialization: fill_uniform (random.hpp) with one derived seed per parameter
// ---------------
uint64_t param_seed(uint64_t seed, uint64_t which) {
  uint64_t x = seed * 2 + which + 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::shared_ptr<const LinearRecipe> high_precision_recipe(GemmEngine engine) {
  return std::make_shared<HighPrecisionRecipe>(engine);
}

// ================================================================================================
// GroupedLinear
// ================================================================================================

GroupedLinear::GroupedLinear(Context& ctx, const GroupedLinearConfig& cfg)
    : cfg_(cfg), device_(ctx.device()) {
  const char* op = "GroupedLinear";
  GROUPMM_CHECK(cfg.experts >= 1, op, ": experts=", cfg.experts, " must be >= 1");
  GROUPMM_CHECK(cfg.in_features >= 1, op, ": in_features=", cfg.in_features, " must be >= 1");
  GROUPMM_CHECK(cfg.out_features >= 1, op, ": out_features=", cfg.out_features, " must be >= 1");
  GROUPMM_CHECK(cfg.max_tokens >= 1, op, ": max_tokens=", cfg.max_tokens, " must be >= 1");
  GROUPMM_CHECK(
      cfg.expected_rows == 0 || (cfg.expected_rows > 0 && cfg.splits_total == SplitsTotal::at_most),
      op, ": expected_rows=", cfg.expected_rows, " must be 0, or > 0 with splits_total=at_most");
  GROUPMM_CHECK(cfg.dtype == DType::bf16 || cfg.dtype == DType::fp16 ||
                    (cfg.dtype == DType::fp32 && ctx.device() == Device::CPU),
                op, ": dtype=", dtype_name(cfg.dtype),
                " must be bf16 or fp16 (fp32 only on a CPU context)");
  if (!cfg_.recipe) cfg_.recipe = high_precision_recipe();
  exec_ = cfg_.recipe->make_executor(ctx, cfg_);

  const int64_t G = cfg.experts, K = cfg.in_features, N = cfg.out_features;
  const DType t = cfg.dtype, gt = cfg.accumulate_into_main_grad ? DType::fp32 : t;
  cudaStream_t s = ctx.stream();
  w_ = Tensor::empty({G, N, K}, t, device_, s);
  dw_ = Tensor::empty({G, N, K}, gt, device_, s);
  if (cfg.bias) {
    b_ = Tensor::empty({G, N}, t, device_, s);
    db_ = Tensor::empty({G, N}, gt, device_, s);
  }
  y_ = Tensor::empty({cfg.max_tokens, N}, t, device_, s);
  dx_ = Tensor::empty({cfg.max_tokens, K}, t, device_, s);
  splits_ = Tensor::empty({G}, DType::int64, device_, s);
  w_view_ = w_.view();
  b_view_ = b_.view();
  dw_view_ = dw_.view();
  db_view_ = db_.view();

  const float bound = 1.0f / std::sqrt(static_cast<float>(K));
  fill_uniform(ctx, w_, -bound, bound, param_seed(cfg.seed, 0));
  if (cfg.bias) fill_uniform(ctx, b_, -bound, bound, param_seed(cfg.seed, 1));
  zero_grad(ctx);
  prepare(ctx);
}

namespace {
// Groups [first, first + count) of a [G, ...] view (absent stays absent).
TensorView group_slice(const TensorView& t, int64_t first, int64_t count) {
  if (!t.present()) return t;
  TensorView v = t;
  const int64_t per = t.numel() / t.dim(0);
  v.data = static_cast<char*>(t.data) + dtype_storage_bytes(t.dtype, first * per);
  v.shape[0] = count;
  return v;
}
}  // namespace

GroupedLinear::GroupedLinear(Context& ctx, GroupedLinear& whole, int64_t first, int64_t count,
                             int64_t max_tokens)
    : cfg_(whole.cfg_), device_(whole.device_), whole_(&whole), first_(first) {
  const char* op = "GroupedLinear(part)";
  check_ctx(ctx, "part");
  GROUPMM_CHECK(whole.whole_ == nullptr, op, ": the whole is itself a part");
  GROUPMM_CHECK(first >= 0 && count >= 1 && first + count <= whole.cfg_.experts, op, ": experts [",
                first, ", ", first + count, ") must lie in [0, experts=", whole.cfg_.experts, ")");
  GROUPMM_CHECK(max_tokens >= 1, op, ": max_tokens=", max_tokens, " must be >= 1");
  cfg_.experts = count;
  cfg_.max_tokens = max_tokens;
  cfg_.expected_rows = whole.cfg_.expected_rows * count / whole.cfg_.experts;
  exec_ = cfg_.recipe->make_executor(ctx, cfg_);
  cudaStream_t s = ctx.stream();
  y_ = Tensor::empty({max_tokens, cfg_.out_features}, cfg_.dtype, device_, s);
  dx_ = Tensor::empty({max_tokens, cfg_.in_features}, cfg_.dtype, device_, s);
  splits_ = Tensor::empty({count}, DType::int64, device_, s);
  follow_whole();
  whole.parts_.push_back(this);
  prepare(ctx);
}

void GroupedLinear::follow_whole() {
  const int64_t n = cfg_.experts;
  w_view_ = group_slice(whole_->w_view_, first_, n);
  b_view_ = group_slice(whole_->b_view_, first_, n);
  dw_view_ = group_slice(whole_->dw_view_, first_, n);
  db_view_ = group_slice(whole_->db_view_, first_, n);
}

GroupedLinear::~GroupedLinear() {
  if (whole_ != nullptr) {
    auto& v = whole_->parts_;
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }
  for (GroupedLinear* p : parts_) p->whole_ = nullptr;  // (a whole outlives its parts)
}

void LinearExecutor::forward_gathered(Context&, const TensorView&, const TensorView&,
                                      const TensorView&, const TensorView&, const TensorView&,
                                      const TensorView&) {
  GROUPMM_CHECK(false, "LinearExecutor.forward_gathered: this executor does not gather");
}
void LinearExecutor::dgrad_gathered(Context&, const TensorView&, const TensorView&,
                                    const TensorView&, const TensorView&, const TensorView&) {
  GROUPMM_CHECK(false, "LinearExecutor.dgrad_gathered: this executor does not gather");
}

void GroupedLinear::check_ctx(const Context& ctx, const char* fn) const {
  GROUPMM_CHECK(ctx.device() == device_, "GroupedLinear.", fn, ": the context is ",
                device_name(ctx.device()), " but the layer lives on ", device_name(device_));
}

void GroupedLinear::prepare(Context& ctx) {
  check_ctx(ctx, "prepare");
  LinearPassViews v;
  v.x = dx_.view();
  v.dy = y_.view();
  v.y = y_.view();
  v.dx = dx_.view();
  v.w = w_view_;
  v.bias = b_view_;
  v.dw = dw_view_;
  v.db = db_view_;
  v.splits64 = splits_.view();
  v.splits32 = TensorView(splits_.data(), DType::int32, device_, {cfg_.experts});
  const size_t need = exec_->workspace_bytes(ctx, v);
  if (need > 0) ctx.reserve_workspace(need);
}

TensorView GroupedLinear::forward_external(Context& ctx, const TensorView& x,
                                           const TensorView& splits) {
  const char* op = "GroupedLinear.forward_external";
  GROUPMM_CHECK(cfg_.recipe->quantization() == QuantRecipe::none && !cfg_.bias, op,
                ": only a high-precision layer without bias (recipe=", cfg_.recipe->name(),
                ", bias=", cfg_.bias ? "true" : "false", ")");
  return forward_impl(ctx, x, splits, op, false);
}

TensorView GroupedLinear::forward(Context& ctx, const TensorView& x, const TensorView& splits) {
  return forward_impl(ctx, x, splits, "GroupedLinear.forward", true);
}

TensorView GroupedLinear::forward_gathered(Context& ctx, const TensorView& x_src,
                                           const TensorView& row_map, const TensorView& splits) {
  return forward_impl(ctx, x_src, splits, "GroupedLinear.forward_gathered", true, row_map);
}

bool GroupedLinear::gathers() const {
  return exec_->gathers();
}

// The row map of a gathered pass: int32 [M] on the layer's device, M <= max_tokens.
static void check_row_map(const char* op, const TensorView& m, Device d, int64_t max_rows) {
  check_view(op, "row_map", m, DType::int32, 1, d);
  GROUPMM_CHECK(m.dim(0) <= max_rows, op, ": row_map.shape[0]=", m.dim(0),
                " exceeds max_tokens=", max_rows);
}

TensorView GroupedLinear::forward_impl(Context& ctx, const TensorView& x, const TensorView& splits,
                                       const char* op, bool run_gemm, const TensorView& row_map) {
  check_ctx(ctx, "forward");
  GROUPMM_CHECK(!pending_wgrad_, op,
                ": a delayed wgrad is pending; call backward_dw() before the "
                "next forward");
  const bool gathered = row_map.present();
  GROUPMM_CHECK(!gathered || exec_->gathers(), op, ": recipe ", cfg_.recipe->name(),
                " does not gather its input (gathers() is false)");
  const char* xname = gathered ? "x_src" : "x";
  check_view(op, xname, x, cfg_.dtype, 2, device_);
  check_dim(op, xname, x, 1, cfg_.in_features);
  if (gathered) check_row_map(op, row_map, device_, cfg_.max_tokens);
  const int64_t M = gathered ? row_map.dim(0) : x.dim(0);
  GROUPMM_CHECK(M <= cfg_.max_tokens, op, ": x.shape[0]=", M,
                " exceeds max_tokens=", cfg_.max_tokens);
  check_splits(op, splits, cfg_.experts, device_);

  saved_splits_ = TensorView(splits_.data(), splits.dtype, device_, {cfg_.experts});
  copy(saved_splits_, splits, ctx.stream());
  const TensorView y(y_.data(), cfg_.dtype, device_, {M, cfg_.out_features});
  if (gathered) {
    exec_->forward_gathered(ctx, x, row_map, w_view_, b_view_, saved_splits_, y);
  } else if (run_gemm) {
    exec_->forward(ctx, x, w_view_, b_view_, saved_splits_, y);
  }
  saved_x_ = x;
  saved_m_ = M;
  return y;
}

TensorView GroupedLinear::backward(Context& ctx, const TensorView& dy) {
  return backward_impl(ctx, dy, TensorView(), "GroupedLinear.backward");
}

TensorView GroupedLinear::backward_gathered(Context& ctx, const TensorView& dy_src,
                                            const TensorView& row_map) {
  const char* op = "GroupedLinear.backward_gathered";
  GROUPMM_CHECK(row_map.present(), op, ": row_map is required");
  return backward_impl(ctx, dy_src, row_map, op);
}

TensorView GroupedLinear::backward_impl(Context& ctx, const TensorView& dy,
                                        const TensorView& row_map, const char* op) {
  check_ctx(ctx, "backward");
  GROUPMM_CHECK(saved_m_ >= 0, op,
                ": no saved forward (call forward first; each backward "
                "consumes one forward)");
  const bool gathered = row_map.present();
  GROUPMM_CHECK(!gathered || exec_->gathers(), op, ": recipe ", cfg_.recipe->name(),
                " does not gather its input (gathers() is false)");
  const char* dyname = gathered ? "dy_src" : "dy";
  check_view(op, dyname, dy, cfg_.dtype, 2, device_);
  if (gathered) {
    check_row_map(op, row_map, device_, cfg_.max_tokens);
    GROUPMM_CHECK(row_map.dim(0) == saved_m_, op, ": row_map.shape[0]=", row_map.dim(0),
                  " must equal forward's rows ", saved_m_);
  } else {
    GROUPMM_CHECK(dy.dim(0) == saved_m_, op, ": dy.shape[0]=", dy.dim(0),
                  " must equal forward's x.shape[0]=", saved_m_);
  }
  check_dim(op, dyname, dy, 1, cfg_.out_features);

  const TensorView dx(dx_.data(), cfg_.dtype, device_, {saved_m_, cfg_.in_features});
  if (gathered) {
    exec_->dgrad_gathered(ctx, dy, row_map, w_view_, saved_splits_, dx);
  } else {
    exec_->dgrad(ctx, dy, w_view_, saved_splits_, dx);
  }
  if (cfg_.delay_wgrad) {
    pending_dy_ = dy;
    pending_wgrad_ = true;
  } else {
    run_wgrad(ctx, dy, saved_x_);
    saved_x_ = TensorView();
  }
  saved_m_ = -1;
  return dx;
}

void GroupedLinear::backward_dw(Context& ctx) {
  check_ctx(ctx, "backward_dw");
  if (!cfg_.delay_wgrad) return;  // wgrad already ran in backward
  GROUPMM_CHECK(pending_wgrad_,
                "GroupedLinear.backward_dw: no wgrad is pending (call backward "
                "first; each backward queues one)");
  run_wgrad(ctx, pending_dy_, saved_x_);
  pending_wgrad_ = false;
  pending_dy_ = TensorView();
  saved_x_ = TensorView();
}

void GroupedLinear::run_wgrad(Context& ctx, const TensorView& dy, const TensorView& x) {
  exec_->wgrad(ctx, dy, x, saved_splits_, dw_view_, db_view_, cfg_.accumulate_into_main_grad);
}

void GroupedLinear::zero_grad(Context& ctx) {
  check_ctx(ctx, "zero_grad");
  fill_bytes(dw_view_, 0, ctx.stream());
  if (db_view_.present()) fill_bytes(db_view_, 0, ctx.stream());
}

void GroupedLinear::set_main_grad(const TensorView& dw, const TensorView& db) {
  const char* op = "GroupedLinear.set_main_grad";
  GROUPMM_CHECK(whole_ == nullptr, op, ": set it on the whole layer (this is a part of it)");
  GROUPMM_CHECK(cfg_.accumulate_into_main_grad, op,
                ": the layer was built with "
                "accumulate_into_main_grad=false");
  check_view(op, "dw", dw, DType::fp32, 3, device_);
  check_dim(op, "dw", dw, 0, cfg_.experts);
  check_dim(op, "dw", dw, 1, cfg_.out_features);
  check_dim(op, "dw", dw, 2, cfg_.in_features);
  if (cfg_.bias) {
    check_view(op, "db", db, DType::fp32, 2, device_);
    check_dim(op, "db", db, 0, cfg_.experts);
    check_dim(op, "db", db, 1, cfg_.out_features);
  } else {
    GROUPMM_CHECK(!db.present(), op, ": db given but the layer has no bias");
  }
  dw_view_ = dw;
  db_view_ = db;
  for (GroupedLinear* p : parts_) p->follow_whole();
}

void GroupedLinear::weights_changed() {
  exec_->weights_changed();
  for (GroupedLinear* p : parts_) p->exec_->weights_changed();
}

// ---- checkpoint import / export
// ------------------------------------------------------------------

namespace {
// Views of expert g's [N, K] weight slice (k > 0) or [N] bias slice (k == 0).
TensorView expert_slice(const TensorView& t, int64_t g, int64_t n, int64_t k) {
  const int64_t esz = dtype_bits(t.dtype) / 8;
  void* p = static_cast<char*>(t.data) + g * n * (k > 0 ? k : 1) * esz;
  return k > 0 ? TensorView(p, t.dtype, t.device, {n, k}) : TensorView(p, t.dtype, t.device, {n});
}

void check_lists(const char* op, const GroupedLinearConfig& c, const std::vector<TensorView>& w,
                 const std::vector<TensorView>& b) {
  GROUPMM_CHECK(static_cast<int64_t>(w.size()) == c.experts, op, ": ", w.size(),
                " weights given, expected experts=", c.experts);
  GROUPMM_CHECK(b.empty() || c.bias, op, ": biases given but the layer has no bias");
  GROUPMM_CHECK(b.empty() || static_cast<int64_t>(b.size()) == c.experts, op, ": ", b.size(),
                " biases given, expected experts=", c.experts);
  for (size_t g = 0; g < w.size(); ++g) {
    const TensorView& v = w[g];
    GROUPMM_CHECK(v.present() && v.dtype == c.dtype && v.rank == 2 && v.dim(0) == c.out_features &&
                      v.dim(1) == c.in_features && v.data != nullptr,
                  op, ": weight[", g, "]=", v.to_string(), " must be ", dtype_name(c.dtype), "[",
                  c.out_features, ", ", c.in_features, "]");
  }
  for (size_t g = 0; g < b.size(); ++g) {
    const TensorView& v = b[g];
    GROUPMM_CHECK(v.present() && v.dtype == c.dtype && v.rank == 1 && v.dim(0) == c.out_features &&
                      v.data != nullptr,
                  op, ": bias[", g, "]=", v.to_string(), " must be ", dtype_name(c.dtype), "[",
                  c.out_features, "]");
  }
}
}  // namespace

void GroupedLinear::import_weights(Context& ctx, const std::vector<TensorView>& w,
                                   const std::vector<TensorView>& b) {
  check_ctx(ctx, "import_weights");
  check_lists("GroupedLinear.import_weights", cfg_, w, b);
  const int64_t N = cfg_.out_features, K = cfg_.in_features;
  for (size_t g = 0; g < w.size(); ++g)
    copy(expert_slice(w_view_, static_cast<int64_t>(g), N, K), w[g], ctx.stream());
  for (size_t g = 0; g < b.size(); ++g)
    copy(expert_slice(b_view_, static_cast<int64_t>(g), N, 0), b[g], ctx.stream());
  weights_changed();
}

void GroupedLinear::export_weights(Context& ctx, const std::vector<TensorView>& w,
                                   const std::vector<TensorView>& b) const {
  check_ctx(ctx, "export_weights");
  check_lists("GroupedLinear.export_weights", cfg_, w, b);
  const int64_t N = cfg_.out_features, K = cfg_.in_features;
  for (size_t g = 0; g < w.size(); ++g)
    copy(w[g], expert_slice(w_view_, static_cast<int64_t>(g), N, K), ctx.stream());
  for (size_t g = 0; g < b.size(); ++g)
    copy(b[g], expert_slice(b_view_, static_cast<int64_t>(g), N, 0), ctx.stream());
  ctx.synchronize();  // device destinations are complete when this returns, like host ones
}

std::string GroupedLinear::to_string() const {
  return detail::cat("GroupedLinear(", cfg_.to_string(), ", device=", device_name(device_), ")");
}

}  // namespace groupmm::nn
