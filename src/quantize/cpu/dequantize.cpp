// CPU reference of group_dequantize: every element through qnum::dequant_value.
#include "quantize/backends.hpp"
#include "quantize/cpu/geom.hpp"

namespace groupmm::cpu {

void group_dequantize(Context& ctx, const GroupDequantizeArgs& a, const QuantProblem& p) {
  const qnum::Layout& L = p.L;
  const std::vector<qnum::Geom> geo =
      quant_geoms(ctx, a.in.splits, p.M, p.G, L.cb, OpId::group_dequantize, nullptr,
                  a.splits_total == SplitsTotal::at_most);
  const bool col = a.from_columnwise;
  const uint8_t* data =
      static_cast<const uint8_t*>(col ? a.in.columnwise_data.data : a.in.data.data);
  const void* scales = col ? a.in.columnwise_scale_inv.data : a.in.scale_inv.data;
  if (L.recipe == QuantRecipe::fp8_current) scales = nullptr;
  const float* per_expert = L.recipe == QuantRecipe::fp8_current ? a.in.scale_inv.ptr<float>()
                            : L.recipe == QuantRecipe::nvfp4     ? a.in.global_scale.ptr<float>()
                                                                 : nullptr;
  for (int64_t gi = 0; gi < p.G; ++gi) {
    const qnum::Geom& g = geo[static_cast<size_t>(gi)];
    if (col && qnum::is_fp4(L.recipe) && g.rows % 2 != 0) continue;  // never quantized
    for (int64_t lr = 0; lr < g.rows; ++lr)
      for (int64_t k = 0; k < p.K; ++k)
        store_f(a.out, (g.start + lr) * p.K + k,
                qnum::dequant_value(L, g, gi, lr, k, col, data, scales, per_expert));
  }
}

}  // namespace groupmm::cpu
