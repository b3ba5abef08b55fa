// The prefill path's dequantization: 4-bit weights -> the bf16 weights of the GEMM form
// (core/w4_numerics.hpp), for the experts that have rows, plus every expert's fp32 accumulator
// factor. A bandwidth kernel: one thread per 16-byte run of 32 codes (one LDG.128, four 16-byte
// stores), grid-stride over the [G * N, K / 32] runs. Graph safe: the splits are read on the
// device (a split <= 0 skips its expert; clamping is the GEMM's business).
#include <algorithm>

#include "core/gemm_w4_impl.hpp"
#include "core/w4_numerics.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/splits_scan.cuh"
#include "cuda/w4/weights.cuh"

namespace groupmm::cuda {
namespace {

struct DequantConfig {
  static constexpr int kThreads = 256;
  static constexpr int kRunK = 32;  // codes per thread and run
  static constexpr int kBlocksPerSm = 8;
  static_assert(kRunK == 32, "one 16-byte load per run");
};

struct DequantParams {
  w4::W4Weights w;
  const void* splits;
  bool splits64;
  float alpha;
  const float* s_enc;
  uint16_t* wide;  // [G * N, K] bf16
  float* factor;   // [G]
};

template <class Cfg, QuantRecipe kRecipe>
__global__ void __launch_bounds__(Cfg::kThreads) w4_dequant_kernel(DequantParams p) {
  const w4::W4Weights& w = p.w;
  const int64_t tid = int64_t(blockIdx.x) * Cfg::kThreads + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * Cfg::kThreads;
  for (int64_t g = tid; g < w.G; g += stride)
    p.factor[g] = qnum::w4_expert_factor(kRecipe, p.alpha, p.s_enc ? p.s_enc[g] : 1.0f);
  const int64_t runs_per_row = w.K / Cfg::kRunK, runs = w.G * w.N * runs_per_row;
  for (int64_t i = tid; i < runs; i += stride) {
    const int64_t row = i / runs_per_row, k = (i % runs_per_row) * Cfg::kRunK;
    const int64_t g = row / w.N, n = row % w.N;
    if (load_split(p.splits, p.splits64, g) <= 0) continue;  // never read
    const uint4 q = ldg_stream16(w.codes_at(g, n, k), true);
    const uint8_t* srow = w.scales + w.scale_row(g, n);
    uint32_t m[2], m2 = 0;  // the multipliers of codes 0..15 and 16..31
    if constexpr (kRecipe == QuantRecipe::nvfp4) {
      const uint16_t s2 =
          __ldg(reinterpret_cast<const uint16_t*>(srow + qnum::row_scale_col_offset(w.L, k / 16)));
      m[0] = qnum::w4_nvfp4_multiplier(static_cast<uint8_t>(s2));
      m[1] = qnum::w4_nvfp4_multiplier(static_cast<uint8_t>(s2 >> 8));
    } else {
      const uint8_t e = __ldg(srow + qnum::row_scale_col_offset(w.L, k / 32));
      m[0] = m[1] = qnum::w4_mxfp4_multiplier1(e);
      m2 = qnum::w4_mxfp4_multiplier2(e);
    }
    uint4* dst = reinterpret_cast<uint4*>(p.wide + row * w.K + k);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t r[4], o[4];
      if constexpr (kRecipe == QuantRecipe::nvfp4) {
        qnum::w4_weights8(words[j], m[j / 2], r);
      } else {
        qnum::w4_weights8(words[j], m[j / 2], m2, r);
      }
      qnum::w4_natural_pairs(r, o);
      dst[j] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

}  // namespace

void w4_dequantize_weights(Context& ctx, const W4Launch& l, void* wide, float* factor) {
  using Cfg = DequantConfig;
  const GemmDims& d = l.dims;
  DequantParams p{};
  p.w = w4::W4Weights::of(l);
  p.splits = l.splits.data;
  p.splits64 = l.splits.dtype == DType::int64;
  p.alpha = l.alpha;
  p.s_enc = l.s_enc;
  p.wide = static_cast<uint16_t*>(wide);
  p.factor = factor;
  const int64_t runs = d.G * d.N * (d.K / Cfg::kRunK);
  const int64_t blocks =
      std::max<int64_t>(1, std::min<int64_t>(qnum::ceil_div(runs, Cfg::kThreads),
                                             int64_t(ctx.sm_count()) * Cfg::kBlocksPerSm));
  const auto kernel = l.recipe == QuantRecipe::nvfp4 ? w4_dequant_kernel<Cfg, QuantRecipe::nvfp4>
                                                     : w4_dequant_kernel<Cfg, QuantRecipe::mxfp4>;
  kernel<<<static_cast<unsigned>(blocks), Cfg::kThreads, 0, ctx.stream()>>>(p);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
