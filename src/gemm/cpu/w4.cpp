// CPU reference of the 4-bit weight GEMM: x and the exactly dequantized weights (qnum's
// dequant_value, the rule group_dequantize follows) in fp32, products summed in fp64.
#include "gemm/w4_backends.hpp"
#include "quantize/backends.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::cpu {

void w4_gemm(Context& ctx, const W4GemmArgs& a, const GemmDims& d) {
  QuantizeConfig cfg;
  cfg.recipe = a.w.recipe;
  cfg.direction = QuantDirection::rowwise;
  cfg.scale_layout = a.w.scale_layout;
  const qnum::Layout L = make_layout(cfg, d.G * d.N, d.K, d.G);
  const auto* codes = a.w.data.ptr<const uint8_t>();
  const float* per_expert =
      a.w.recipe == QuantRecipe::nvfp4 ? a.w.global_scale.ptr<float>() : nullptr;
  const int64_t tiles = qnum::ceil_div(d.N, qnum::kTileRows);
  std::vector<float> W(static_cast<size_t>(d.G * d.N * d.K));
#pragma omp parallel for
  for (int64_t g = 0; g < d.G; ++g) {
    const qnum::Geom geom{g * d.N, d.N, g * tiles, 0, 0};
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t k = 0; k < d.K; ++k)
        W[static_cast<size_t>((g * d.N + n) * d.K + k)] =
            qnum::dequant_value(L, geom, g, n, k, false, codes, a.w.scale_inv.data, per_expert);
  }
  grouped_gemm_dequantized(ctx, GemmPass::forward, to_floats(a.x), W, a.splits, d, a.alpha, 0.0f,
                           a.bias, a.out, 1, a.splits_total == SplitsTotal::at_most);
}

}  // namespace groupmm::cpu
