// Helpers of the quantize suites: run group_quantize into poisoned buffers, read bytes back.
#pragma once

#include <cstring>

#include "common/test_util.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm::test {

inline std::vector<uint8_t> quant_bytes(const TensorView& v) {
  return bytes_of(v);
}

// Any float view (any device) as fp32 values.
inline std::vector<float> cpu_floats(const TensorView& v) {
  const std::vector<uint8_t> b = quant_bytes(v);
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h = 0;
    if (dtype_bits(v.dtype) == 16) std::memcpy(&h, &b[2 * i], 2);
    switch (v.dtype) {
      case DType::fp32:
        std::memcpy(&out[i], &b[4 * i], 4);
        break;
      case DType::bf16:
        out[i] = bf16_bits_to_float(h);
        break;
      case DType::fp16:
        out[i] = fp16_bits_to_float(h);
        break;
      default:
        out[i] = NAN;
    }
  }
  return out;
}

// Input values rounded to `t` (bf16/fp16/fp32), as a tensor on device d.
inline Tensor make_input(const std::vector<float>& v, DType t, std::initializer_list<int64_t> dims,
                         Device d) {
  Tensor h = Tensor::empty(dims, t, Device::CPU);
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::fp32) h.ptr<float>()[i] = v[i];
    if (t == DType::bf16) h.ptr<uint16_t>()[i] = float_to_bf16_bits(v[i]);
    if (t == DType::fp16) h.ptr<uint16_t>()[i] = float_to_fp16_bits(v[i]);
  }
  if (d == Device::CPU) return h;
  return clone_to(h, d);
}

struct Quantized {
  QuantizedBuffers buf;
  GroupedTensor gt;
};

// Allocates (poisoned 0xFF) and runs group_quantize (or bgrad_group_quantize with dbias).
inline Quantized run_quantize(Context& ctx, const TensorView& x, const TensorView& splits,
                              const QuantizeConfig& cfg, const TensorView& dbias = TensorView()) {
  const bool weights = !splits.present();
  const int64_t G = weights ? x.dim(0) : splits.dim(0);
  const int64_t M = weights ? x.dim(0) * x.dim(1) : x.dim(0);
  const int64_t K = weights ? x.dim(2) : x.dim(1);
  Quantized q;
  q.buf = allocate_quantized(group_quantize_shapes(M, K, G, cfg), ctx.device(), ctx.stream());
  for (const Tensor* t : {&q.buf.data, &q.buf.scale_inv, &q.buf.columnwise_data,
                          &q.buf.columnwise_scale_inv, &q.buf.amax, &q.buf.global_scale})
    if (t->view().present()) fill_bytes(*t, 0xFF, ctx.stream());
  GroupQuantizeArgs a;
  a.input = x;
  a.splits = splits;
  a.config = cfg;
  a.out = q.buf.view(G, splits, cfg);
  q.gt = dbias.present() ? bgrad_group_quantize(ctx, a, dbias) : group_quantize(ctx, a);
  return q;
}

// run_quantize with the rows gathered: output row r quantizes x's row row_map[r] (row_map [M]
// int32 on x's device, M the rows the splits describe).
inline Quantized run_quantize_gathered(Context& ctx, const TensorView& x, const TensorView& row_map,
                                       const TensorView& splits, const QuantizeConfig& cfg,
                                       const TensorView& dbias = TensorView()) {
  const int64_t G = splits.dim(0), M = row_map.dim(0), K = x.dim(1);
  Quantized q;
  q.buf = allocate_quantized(group_quantize_shapes(M, K, G, cfg), ctx.device(), ctx.stream());
  for (const Tensor* t : {&q.buf.data, &q.buf.scale_inv, &q.buf.columnwise_data,
                          &q.buf.columnwise_scale_inv, &q.buf.amax, &q.buf.global_scale})
    if (t->view().present()) fill_bytes(*t, 0xFF, ctx.stream());
  GroupQuantizeArgs a;
  a.input = x;
  a.row_map = row_map;
  a.splits = splits;
  a.config = cfg;
  a.out = q.buf.view(G, splits, cfg);
  q.gt = dbias.present() ? bgrad_group_quantize(ctx, a, dbias) : group_quantize(ctx, a);
  return q;
}

// A row map of M rows over a T-row input: random sources (repeats, as top-k routing has), every
// `pad_every`-th row -1 (padding; 0: none).
inline std::vector<int32_t> random_row_map(int64_t M, int64_t T, uint64_t seed, int pad_every = 7) {
  std::vector<int32_t> m(static_cast<size_t>(M));
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t r = 0; r < M; ++r) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    const bool pad = pad_every > 0 && r % pad_every == pad_every - 1;
    m[static_cast<size_t>(r)] = pad || T == 0 ? -1 : static_cast<int32_t>((z >> 33) % uint64_t(T));
  }
  return m;
}

// The rows of x [T, K] (host) gathered by map (an entry outside [0, T): a zero row), [M, K].
inline Tensor gather_rows_host(const Tensor& x, const std::vector<int32_t>& map) {
  const int64_t T = x.view().dim(0), K = x.view().dim(1), M = static_cast<int64_t>(map.size());
  const size_t row = static_cast<size_t>(K) * static_cast<size_t>(dtype_bits(x.view().dtype) / 8);
  Tensor out = Tensor::empty({M, K}, x.view().dtype, Device::CPU);
  const auto* src = static_cast<const uint8_t*>(x.data());
  auto* dst = static_cast<uint8_t*>(out.data());
  for (int64_t r = 0; r < M; ++r) {
    const int64_t s = map[static_cast<size_t>(r)];
    if (s >= 0 && s < T)
      std::memcpy(dst + r * row, src + s * row, row);
    else
      std::memset(dst + r * row, 0, row);
  }
  return out;
}

// Dequantizes q (from its rowwise or columnwise copy) into out.
inline void run_dequantize(Context& ctx, const Quantized& q, const QuantizeConfig& cfg, bool col,
                           const TensorView& out) {
  GroupDequantizeArgs d;
  d.in = q.gt;
  d.config = cfg;
  d.from_columnwise = col;
  d.out = out;
  group_dequantize(ctx, d);
}

inline std::string cfg_name(const QuantizeConfig& c) {
  std::string s = recipe_name(c.recipe);
  if (c.recipe != QuantRecipe::nvfp4 && c.fp8_dtype == DType::fp8e5m2) s += "_e5m2";
  if (c.pow2_scales) s += "_pow2";
  if (c.block_2d) s += "_2d";
  s += std::string("_") + quant_direction_name(c.direction);
  if (c.scale_layout == ScaleLayout::swizzled) s += "_swz";
  if (c.scale_layout == ScaleLayout::mn_major) s += "_mn";
  if (c.amax_schedule != AmaxSchedule::automatic)
    s += std::string("_") + amax_schedule_name(c.amax_schedule);
  if (c.amax_lag > 0) s += "_lag" + std::to_string(c.amax_lag);
  return s;
}

inline QuantizeConfig qcfg(QuantRecipe r, QuantDirection d = QuantDirection::both,
                           ScaleLayout l = ScaleLayout::plain, DType fp8 = DType::fp8e4m3,
                           bool pow2 = false, bool block_2d = false) {
  QuantizeConfig c;
  c.recipe = r;
  c.direction = d;
  c.scale_layout = l;
  c.fp8_dtype = fp8;
  c.pow2_scales = pow2;
  c.block_2d = block_2d;
  return c;
}

// cfg with an explicit amax schedule (fp8_current, nvfp4; lag for the fused one).
inline QuantizeConfig with_amax(QuantizeConfig c, AmaxSchedule s, int lag = 0) {
  c.amax_schedule = s;
  c.amax_lag = lag;
  return c;
}

}  // namespace groupmm::test

namespace groupmm {
// Readable parameter values in test listings.
inline void PrintTo(const QuantizeConfig& c, std::ostream* os) {
  *os << test::cfg_name(c);
}
}  // namespace groupmm
