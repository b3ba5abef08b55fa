// nn::MoE with fused_gate_up (or gathered_quantize) against the same block with the separate ops
// (the permuted copies), on one device: the
// same parameters (the same seed), inputs and two steps (the second with new inputs, so that the
// gather of backward reads the current routing); y, the losses, dx and every gradient bit for bit
// (tests/cpu/test_moe_layer.cpp, tests/cuda/test_moe_layer_gpu.cpp).
#pragma once

#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "groupmm/nn/moe.hpp"

namespace groupmm::test {

// The block's GroupedLinear layers: gate_up, down, then the shared expert's two when it has one.
inline std::vector<nn::GroupedLinear*> moe_linears(nn::MoE& m) {
  std::vector<nn::GroupedLinear*> l = {&m.gate_up(), &m.down()};
  if (m.has_shared_expert()) {
    l.push_back(&m.shared_gate_up());
    l.push_back(&m.shared_down());
  }
  return l;
}

// Two blocks of configs a and b (the same seed: the same parameters), T tokens a step.
inline void expect_moe_pair_bit_exact(Context& ctx, const nn::MoEConfig& a, const nn::MoEConfig& b,
                                      int64_t T);

// T tokens a step; c.fused_gate_up is ignored (the pair is made from c).
inline void expect_fused_gate_up_bit_exact(Context& ctx, nn::MoEConfig c, int64_t T) {
  nn::MoEConfig f = c;
  c.fused_gate_up = false;
  f.fused_gate_up = true;
  expect_moe_pair_bit_exact(ctx, c, f, T);
}

// MoEConfig::gathered_quantize against the permuted copies (c: an FP8 recipe whose layers
// gather); c.gathered_quantize is ignored.
inline void expect_gathered_quantize_bit_exact(Context& ctx, nn::MoEConfig c, int64_t T) {
  nn::MoEConfig g = c;
  c.gathered_quantize = false;
  g.gathered_quantize = true;
  {
    nn::MoE probe(ctx, g);
    ASSERT_TRUE(probe.gathered()) << g.to_string();
    nn::MoE off(ctx, c);
    ASSERT_FALSE(off.gathered());
  }
  expect_moe_pair_bit_exact(ctx, c, g, T);
}

inline void expect_moe_pair_bit_exact(Context& ctx, const nn::MoEConfig& a, const nn::MoEConfig& b,
                                      int64_t T) {
  const nn::MoEConfig& c = a;
  nn::MoE plain(ctx, a);
  nn::MoE fused(ctx, b);
  auto pl = moe_linears(plain), fl = moe_linears(fused);
  ASSERT_EQ(bytes_of(plain.router_weight()), bytes_of(fused.router_weight()));
  for (size_t i = 0; i < pl.size(); ++i)
    ASSERT_EQ(bytes_of(pl[i]->weight()), bytes_of(fl[i]->weight())) << "linear " << i;
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<uint16_t> hx(size_t(T * c.hidden)), hdy(size_t(T * c.hidden));
    const auto rx = randn(hx.size(), 1.0f), rdy = randn(hdy.size(), 0.1f);
    for (size_t i = 0; i < hx.size(); ++i) {
      hx[i] = float_to_bf16_bits(rx[i]);
      hdy[i] = float_to_bf16_bits(rdy[i]);
    }
    Tensor x = clone_to(host_view(hx, DType::bf16, {T, c.hidden}), ctx.device());
    Tensor dy = clone_to(host_view(hdy, DType::bf16, {T, c.hidden}), ctx.device());
    const TensorView yp = plain.forward(ctx, x), yf = fused.forward(ctx, x);
    EXPECT_EQ(bytes_of(yp), bytes_of(yf)) << "y";
    EXPECT_EQ(bytes_of(plain.aux_loss()), bytes_of(fused.aux_loss())) << "aux loss";
    const TensorView dxp = plain.backward(ctx, dy), dxf = fused.backward(ctx, dy);
    plain.backward_dw(ctx);
    fused.backward_dw(ctx);
    EXPECT_NO_THROW(ctx.check());
    EXPECT_EQ(bytes_of(dxp), bytes_of(dxf)) << "dx";
    EXPECT_EQ(bytes_of(plain.router_weight_grad()), bytes_of(fused.router_weight_grad()))
        << "router dW";
    for (size_t i = 0; i < pl.size(); ++i) {
      EXPECT_EQ(bytes_of(pl[i]->weight_grad()), bytes_of(fl[i]->weight_grad())) << "dW " << i;
      if (pl[i]->bias_grad().present())
        EXPECT_EQ(bytes_of(pl[i]->bias_grad()), bytes_of(fl[i]->bias_grad())) << "db " << i;
    }
  }
}

}  // namespace groupmm::test
