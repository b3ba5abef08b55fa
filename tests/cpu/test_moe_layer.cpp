// nn::MoE on the CPU backend: forward against a naive per-token composition (each token through its
// k experts and the shared expert), with capacity and padding; every gradient of a tiny fp32 block
// against finite differences of L = sum(r * y) + aux_loss + z_loss; delayed wgrad and main grads;
// the validation messages.
#include <cmath>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "common/moe_fused_case.hpp"
#include "common/test_util.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/nn/moe.hpp"

namespace groupmm::test {
namespace {

using nn::MoE;
using nn::MoEConfig;

// One OpenMP thread while alive: the finite-difference test runs hundreds of tiny forwards whose
// parallel regions would cost more to start than they compute (seconds on a loaded machine).
struct SerialOmp {
#if defined(_OPENMP)
  int saved = omp_get_max_threads();
  SerialOmp() {
    omp_set_num_threads(1);
  }
  ~SerialOmp() {
    omp_set_num_threads(saved);
  }
#endif
};

MoEConfig small_cfg(DType t) {
  return MoEConfig{.hidden = 6,
                   .ffn_hidden = 4,
                   .experts = 4,
                   .topk = 2,
                   .max_tokens = 8,
                   .renormalize = true,
                   .scaling_factor = 1.25f,
                   .aux_loss_coeff = 0.05f,
                   .z_loss_coeff = 0.01f,
                   .shared_ffn_hidden = 3,
                   .bias = true,
                   .dtype = t,
                   .seed = 3};
}

std::vector<float> floats(const TensorView& v) {
  return cpu::to_floats(v);
}

// y_t = sum_j w_tj * down_e(swiglu(gate_up_e(x_t))) + shared(x_t), in fp64 from the layer's own
// routing (ids and weights) and parameters; tokens the capacity dropped contribute nothing.
std::vector<double> naive_forward(MoE& moe, const std::vector<float>& x, int64_t T) {
  const auto& c = moe.config();
  const int64_t H = c.hidden, F = c.ffn_hidden, k = c.topk;
  const auto W1 = floats(moe.gate_up().weight()), B1 = floats(moe.gate_up().bias());
  const auto W2 = floats(moe.down().weight()), B2 = floats(moe.down().bias());
  const auto ids = moe.expert_ids();
  const auto w = floats(moe.router_weights());
  std::vector<double> y(size_t(T * H), 0.0);
  auto mlp = [&](const float* w1, const float* b1, const float* w2, const float* b2, int64_t f,
                 const float* xt, double scale, double* out) {
    std::vector<double> h(static_cast<size_t>(f));
    for (int64_t i = 0; i < f; ++i) {
      double g = b1[i], u = b1[f + i];
      for (int64_t d = 0; d < H; ++d) {
        g += double(w1[i * H + d]) * xt[d];
        u += double(w1[(f + i) * H + d]) * xt[d];
      }
      h[size_t(i)] = g / (1 + std::exp(-g)) * u * scale;
    }
    for (int64_t d = 0; d < H; ++d) {
      double s = b2[d];
      for (int64_t i = 0; i < f; ++i) s += double(w2[d * f + i]) * h[size_t(i)];
      out[d] += s;
    }
  };
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      if (moe.permute_map().dest_row.ptr<int32_t>()[t * k + j] < 0) continue;  // dropped
      const int64_t e = ids.ptr<int32_t>()[t * k + j];
      // the weight scales the activation; down's bias is added per expert row unscaled
      mlp(&W1[size_t(e * 2 * F * H)], &B1[size_t(e * 2 * F)], &W2[size_t(e * H * F)],
          &B2[size_t(e * H)], F, &x[size_t(t * H)], w[size_t(t * k + j)], &y[size_t(t * H)]);
    }
    if (moe.has_shared_expert()) {
      const int64_t f = c.shared_ffn_hidden;
      const auto S1 = floats(moe.shared_gate_up().weight()),
                 SB1 = floats(moe.shared_gate_up().bias());
      const auto S2 = floats(moe.shared_down().weight()), SB2 = floats(moe.shared_down().bias());
      mlp(S1.data(), SB1.data(), S2.data(), SB2.data(), f, &x[size_t(t * H)], 1.0,
          &y[size_t(t * H)]);
    }
  }
  return y;
}

TEST(MoECpu, ForwardMatchesNaiveComposition) {
  SerialOmp serial;
  for (int variant = 0; variant < 3; ++variant) {
    Context ctx(Device::CPU);
    MoEConfig c = small_cfg(DType::bf16);
    c.hidden = 16;
    c.ffn_hidden = 8;
    c.experts = 6;
    c.max_tokens = 24;
    if (variant == 1) c.pad_align = 4;
    if (variant == 2) c.capacity_factor = 0.6, c.shared_ffn_hidden = 0;
    MoE moe(ctx, c);
    const int64_t T = 21;
    std::vector<float> xf = randn(size_t(T * c.hidden));
    std::vector<uint16_t> xb(xf.size());
    for (size_t i = 0; i < xf.size(); ++i) {
      xb[i] = float_to_bf16_bits(xf[i]);
      xf[i] = bf16_bits_to_float(xb[i]);
    }
    const TensorView y = moe.forward(ctx, host_view(xb, DType::bf16, {T, c.hidden}));
    ctx.check();
    const auto ref = naive_forward(moe, xf, T);
    const auto got = floats(y);
    EXPECT_LE(rel_error(got, std::vector<float>(ref.begin(), ref.end())), 2e-2) << variant;
    if (variant == 2) {
      int dropped = 0;
      for (int64_t i = 0; i < T * c.topk; ++i)
        dropped += moe.permute_map().dest_row.ptr<int32_t>()[i] < 0;
      EXPECT_GT(dropped, 0);  // the capacity bites
    }
  }
}

// Every gradient of a tiny fp32 block by central differences. L = sum(r * y) + aux + z.
TEST(MoECpu, GradientsMatchFiniteDifferences) {
  SerialOmp serial;
  for (bool delayed : {false, true}) {
    Context ctx(Device::CPU);
    MoEConfig c = small_cfg(DType::fp32);
    c.delay_wgrad = delayed;
    c.accumulate_into_main_grad = delayed;
    c.score = delayed ? RouterScore::sigmoid : RouterScore::softmax;
    MoE moe(ctx, c);
    const int64_t T = 7, H = c.hidden;
    std::vector<float> x = randn(size_t(T * H)), r = randn(size_t(T * H));
    // sharpen the router so a small step never changes the routing
    for (int64_t i = 0; i < moe.router_weight().numel(); ++i)
      moe.router_weight().ptr<float>()[i] *= 4;
    const TensorView X = host_view(x, DType::fp32, {T, H});
    auto loss = [&]() {
      const auto y = floats(moe.forward(ctx, X));
      double s = double(moe.aux_loss().ptr<float>()[0]) + moe.z_loss().ptr<float>()[0];
      for (size_t i = 0; i < y.size(); ++i) s += double(r[i]) * y[i];
      return s;
    };
    loss();
    const std::vector<int32_t> ids0(moe.expert_ids().ptr<int32_t>(),
                                    moe.expert_ids().ptr<int32_t>() + T * c.topk);
    const auto dx = floats(moe.backward(ctx, host_view(r, DType::fp32, {T, H})));
    moe.backward_dw(ctx);
    ctx.check();
    auto check = [&](const char* name, float* p, int64_t n, const std::vector<float>& grad) {
      int checked = 0;
      for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 12)) {
        const float keep = p[i], h = 1e-2f;
        auto routed_as_before = [&] {
          return std::equal(ids0.begin(), ids0.end(), moe.expert_ids().ptr<int32_t>());
        };
        p[i] = keep + h;
        const double lp = loss();
        bool same = routed_as_before();
        p[i] = keep - h;
        const double lm = loss();
        same = same && routed_as_before();
        p[i] = keep;
        if (!same) continue;  // the step changed the routing: not differentiable there
        ++checked;
        const double fd = (lp - lm) / (2 * h);
        EXPECT_NEAR(grad[size_t(i)], fd, 3e-3 + 3e-3 * std::fabs(fd))
            << name << "[" << i << "] delayed=" << delayed;
      }
      EXPECT_GE(checked, 6) << name;
    };
    check("x", x.data(), T * H, dx);
    check("router W", moe.router_weight().ptr<float>(), moe.router_weight().numel(),
          floats(moe.router_weight_grad()));
    nn::GroupedLinear* layers[] = {&moe.gate_up(), &moe.down(), &moe.shared_gate_up(),
                                   &moe.shared_down()};
    const char* names[] = {"gate_up", "down", "shared gate_up", "shared down"};
    for (int l = 0; l < 4; ++l) {
      check(names[l], layers[l]->weight().ptr<float>(), layers[l]->weight().numel(),
            floats(layers[l]->weight_grad()));
      check(names[l], layers[l]->bias().ptr<float>(), layers[l]->bias().numel(),
            floats(layers[l]->bias_grad()));
    }
  }
}

TEST(MoECpu, ClearErrors) {
  Context ctx(Device::CPU);
  MoEConfig c = small_cfg(DType::bf16);
  c.topk = 5;
  EXPECT_THROW_MSG(MoE m(ctx, c), "MoE: topk=5 must be in [1, min(experts=4, 32)]");
  c = small_cfg(DType::bf16);
  MoE moe(ctx, c);
  std::vector<uint16_t> x(size_t(9 * 6)), dy(size_t(8 * 6));
  EXPECT_THROW_MSG(moe.forward(ctx, host_view(x, DType::bf16, {9, 6})),
                   "MoE.forward: x.shape[0]=9 exceeds max_tokens=8");
  EXPECT_THROW_MSG(moe.forward(ctx, host_view(x, DType::bf16, {9, 5})),
                   "MoE.forward: x.shape[1]=5 must equal 6");
  EXPECT_THROW_MSG(moe.backward(ctx, host_view(dy, DType::bf16, {8, 6})),
                   "MoE.backward: no saved forward (each backward consumes one forward)");
  moe.forward(ctx, host_view(x, DType::bf16, {8, 6}));
  EXPECT_THROW_MSG(moe.backward(ctx, host_view(dy, DType::bf16, {7, 6})),
                   "MoE.backward: dy.shape[0]=7 must equal 8");
}

// fused_gate_up (moe_gate_up_swiglu, whose CPU reference is the separate ops, and the backward's
// gather of the permuted rows) changes no bit: dropless, with padding and capacity, delayed wgrad
// and main grads, a shared expert.
TEST(MoECpu, FusedGateUpEqualsTheSeparateOps) {
  Context ctx(Device::CPU);
  MoEConfig c = small_cfg(DType::bf16);
  c.bias = false;
  expect_fused_gate_up_bit_exact(ctx, c, 8);
  c.capacity_factor = 0.75;
  c.pad_align = 4;
  c.delay_wgrad = true;
  c.accumulate_into_main_grad = true;
  expect_fused_gate_up_bit_exact(ctx, c, 7);
}

// gathered_quantize (the FP8 layers quantizing straight from x and dy through the row map) equals
// the permuted copies bit for bit: both FP8 recipes, padding and capacity, bias (fused dbias),
// delayed wgrad; a main grad without bias (T a multiple of 16: the shared expert's FP8 wgrad).
TEST(MoECpu, GatheredQuantizeEqualsThePermutedCopies) {
  Context ctx(Device::CPU);
  for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block}) {
    SCOPED_TRACE(recipe_name(r));
    MoEConfig c{.hidden = 256,
                .ffn_hidden = 128,
                .experts = 4,
                .topk = 2,
                .max_tokens = 48,
                .renormalize = true,
                .shared_ffn_hidden = 128,
                .pad_align = 16,
                .bias = true,
                .seed = 5};
    c.recipe = nn::quantized_recipe(r);
    expect_gathered_quantize_bit_exact(ctx, c, 48);
    c.capacity_factor = 0.75;
    c.delay_wgrad = true;
    expect_gathered_quantize_bit_exact(ctx, c, 32);
    c.bias = false;
    c.accumulate_into_main_grad = true;
    expect_gathered_quantize_bit_exact(ctx, c, 16);
  }
}

// saved_bytes(): what a forward leaves for backward, by the layer's buffers and the rows of this
// forward's map (padding included); 0 once backward consumed it; fused_gate_up keeps the row map
// instead of the permuted rows.
TEST(MoECpu, SavedBytesCountTheBuffersBackwardReads) {
  Context ctx(Device::CPU);
  for (const bool fused : {false, true}) {
    MoEConfig c = small_cfg(DType::bf16);
    c.bias = false;
    c.pad_align = 4;
    c.fused_gate_up = fused;
    MoE moe(ctx, c);
    EXPECT_EQ(moe.saved_bytes(), 0);
    const int64_t T = 7, H = c.hidden, F = c.ffn_hidden, k = c.topk, E = c.experts;
    std::vector<float> xf = randn(size_t(T * H));
    std::vector<uint16_t> xb(xf.size());
    const TensorView x = host_view(xb, DType::bf16, {T, H});
    for (size_t i = 0; i < xf.size(); ++i) cpu::store_f(x, int64_t(i), xf[i]);
    moe.forward(ctx, x);
    const int64_t R = moe.permute_map().rows;
    ASSERT_GT(R, T * k) << "the case should have padding rows";
    const int64_t want = T * E * 4 + 3 * T * k * 4 + R * 4 * (fused ? 2 : 1) +
                         (fused ? 0 : R * H * 2) + R * 3 * F * 2 + T * 3 * c.shared_ffn_hidden * 2;
    EXPECT_EQ(moe.saved_bytes(), want) << "fused " << fused;
    std::vector<uint16_t> dyb(xb.size(), 0);
    moe.backward(ctx, host_view(dyb, DType::bf16, {T, H}));
    EXPECT_EQ(moe.saved_bytes(), 0);
  }
}

TEST(MoECpu, FusedGateUpRefusesWhatItCannotServe) {
  Context ctx(Device::CPU);
  MoEConfig c = small_cfg(DType::bf16);
  c.fused_gate_up = true;  // small_cfg has biases
  EXPECT_THROW_MSG(MoE m(ctx, c),
                   "MoE: fused_gate_up needs the high-precision recipe (recipe=bf16), no bias "
                   "(bias=true) and no expert parallelism (ep=off)");
}

}  // namespace
}  // namespace groupmm::test
