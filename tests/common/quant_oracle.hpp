// An independent model of grouped quantization, written from the format definitions
// (docs/numerics.md) and the layouts documented in include/groupmm/quantize.hpp. It shares no code
// with the library: no convert.hpp encoder or decoder, no qnum rule, no index function. A format is
// the list of its values, derived from the bit fields; rounding is a search for the nearest value
// with ties to the even code; scale rules are the spelled-out fp32 expressions; every index is
// recomputed here from the documented formulas. The CPU tests hold the reference backend to it,
// the GPU tests the kernels.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "groupmm/quantize.hpp"

namespace groupmm::test::oracle {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- minifloat formats, from their bit fields
// ----------------------------------------------------
struct Format {
  int ebits, mbits, bias;
  uint32_t max_code;          // largest finite magnitude code
  std::vector<double> value;  // value[c] of every finite magnitude code c, increasing
};

inline Format make_format(int ebits, int mbits, int bias, uint32_t max_code) {
  Format f{ebits, mbits, bias, max_code, {}};
  for (uint32_t c = 0; c <= max_code; ++c) {
    const int e = static_cast<int>(c >> mbits), m = static_cast<int>(c & ((1u << mbits) - 1));
    f.value.push_back(e == 0 ? std::ldexp(double(m), 1 - bias - mbits)  // subnormal
                             : std::ldexp(double((1 << mbits) + m), e - bias - mbits));
  }
  return f;
}
// OCP E4M3 ("fn"): no Inf, S.1111.111 is NaN, max 448. E5M2: IEEE-like, exponent 31 is Inf/NaN,
// max 57344. E2M1: every code finite, max 6.
inline const Format& e4m3() {
  static const Format f = make_format(4, 3, 7, 0x7E);
  return f;
}
inline const Format& e5m2() {
  static const Format f = make_format(5, 2, 15, 0x7B);
  return f;
}
inline const Format& e2m1() {
  static const Format f = make_format(2, 1, 1, 0x7);
  return f;
}

// The nearest magnitude code to a >= 0 (finite), ties to the even code, saturating at max.
inline uint32_t round_mag(const Format& f, double a) {
  const auto it = std::upper_bound(f.value.begin(), f.value.end(), a);  // first value > a
  if (it == f.value.end()) return f.max_code;
  const uint32_t hi = static_cast<uint32_t>(it - f.value.begin()), lo = hi - 1;  // value[0] = 0
  const double dl = a - f.value[lo], dh = f.value[hi] - a;
  if (dl != dh) return dl < dh ? lo : hi;
  return (lo & 1u) ? hi : lo;
}

// The most a correct rounding to f can move a >= 0: half the gap between the two values around
// it, or the distance to the largest value past it (saturation; NVFP4 reaches it when the E4M3
// block scale rounds down).
inline double rounding_bound(const Format& f, double a) {
  const auto it = std::upper_bound(f.value.begin(), f.value.end(), a);
  if (it == f.value.end()) return a - f.value.back();
  return 0.5 * (*it - *(it - 1));
}

// fp8 code of a scaled value as the quantizers store it: round to nearest even, saturate (Inf
// too), -0 keeps its sign; NaN -> 0x7F (positive: GPU arithmetic drops NaN signs and the CPU
// reference canonicalizes to match).
inline uint8_t fp8_code(float v, bool is_e5m2) {
  if (std::isnan(v)) return 0x7F;
  const Format& f = is_e5m2 ? e5m2() : e4m3();
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isinf(v)) return static_cast<uint8_t>(sign | f.max_code);
  return static_cast<uint8_t>(sign | round_mag(f, std::fabs(double(v))));
}
inline float e4m3_value(uint8_t c) {  // NaN for S.1111.111
  if ((c & 0x7F) == 0x7F) return std::numeric_limits<float>::quiet_NaN();
  const float a = static_cast<float>(e4m3().value[c & 0x7F]);
  return (c & 0x80) ? -a : a;
}
// E2M1 has no NaN: NaN -> +6 (code 7, whatever its sign), Inf saturates.
inline uint8_t e2m1_code(float v) {
  if (std::isnan(v)) return 0x7;
  const uint8_t sign = std::signbit(v) ? 0x8 : 0x0;
  if (std::isinf(v)) return static_cast<uint8_t>(sign | 0x7);
  return static_cast<uint8_t>(sign | round_mag(e2m1(), std::fabs(double(v))));
}

// max |x| of a block; NaN if the block holds a NaN.
inline float amax_of(float acc, float x) {
  if (std::isnan(acc) || std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
  return std::max(acc, std::fabs(x));
}

// ---- scale rules, docs/numerics.md
// --------------------------------------------------------------
inline float fp8_max(bool is_e5m2) {
  return is_e5m2 ? 57344.0f : 448.0f;
}

struct BlockScale {
  float mul = 1;        // what x is multiplied by before rounding
  float scale_inv = 1;  // fp8 recipes: the stored fp32 scale (dequant multiplies by it)
  uint8_t code = 0;     // mxfp8, mxfp4: the E8M0 exponent; nvfp4: the E4M3 block scale
};

// FP8 current scaling: scale = fmax / amax_g (1 when amax is 0 or not finite, or the quotient is
// not finite); pow2: rounded down to a power of two.
inline BlockScale fp8_current(float amax, bool is_e5m2, bool pow2) {
  float s = 1.0f;
  if (amax > 0 && std::isfinite(amax)) {
    s = fp8_max(is_e5m2) / amax;
    if (!std::isfinite(s)) s = 1.0f;
  }
  if (pow2) s = std::ldexp(1.0f, std::ilogb(s));
  return {s, 1.0f / s, 0};
}

// FP8 blockwise: scale_inv = amax / fmax, scale = fmax / amax; pow2: scale_inv rounded up to a
// power of two and scale = 1 / scale_inv. amax 0 or not finite, or scale_inv not a normal fp32:
// both 1.
inline BlockScale fp8_block(float amax, bool is_e5m2, bool pow2) {
  const float fmax = fp8_max(is_e5m2);
  if (!(amax > 0) || !std::isfinite(amax)) return {};
  const float v = amax / fmax;
  if (v < FLT_MIN) return {};
  if (pow2) {
    float p = std::ldexp(1.0f, std::ilogb(v));
    if (p != v) p *= 2;
    return {1.0f / p, p, 0};
  }
  return {fmax / amax, v, 0};
}

// MX (OCP): v = amax * fp32(1/fmax); e = exponent field of v, plus one when its mantissa field is
// non-zero; 0 -> 0, Inf -> 254, NaN -> 255, at most 254. Multiplier 2^(127 - e). MXFP8: fmax is
// the fp8 format's largest value; MXFP4: 6, E2M1's.
inline BlockScale mx(float amax, float fmax) {
  const float v = amax * (1.0f / fmax);
  BlockScale b;
  if (std::isnan(v)) {
    b.code = 255;
    b.mul = std::numeric_limits<float>::quiet_NaN();
    return b;
  }
  int e = 0;
  if (std::isinf(v)) {
    e = 254;
  } else if (v >= FLT_MIN) {
    e = std::ilogb(v) + 127 + (std::ldexp(1.0f, std::ilogb(v)) != v ? 1 : 0);
  } else if (v > 0) {
    e = 1;  // subnormal: exponent field 0, mantissa non-zero
  }
  e = std::min(e, 254);
  b.code = static_cast<uint8_t>(e);
  b.mul = std::ldexp(1.0f, 127 - e);
  return b;
}
inline BlockScale mxfp8(float amax, bool is_e5m2) {
  return mx(amax, fp8_max(is_e5m2));
}
inline BlockScale mxfp4(float amax) {
  return mx(amax, 6.0f);
}

// NVFP4: S_enc = 448 * 6 / amax_g (1 when amax is 0 / not finite / the quotient is not finite).
inline float nvfp4_s_enc(float amax) {
  if (amax > 0 && std::isfinite(amax)) {
    const float s = 2688.0f / amax;
    if (std::isfinite(s)) return s;
  }
  return 1.0f;
}
// s_b = e4m3(amax_block * (S_enc / 6)); multiplier S_enc / fp32(s_b), saturated to FLT_MAX
// (quantize.hpp); elements of a block with s_b = 0 encode as 0.
inline BlockScale nvfp4(float amax_block, float s_enc) {
  BlockScale b;
  b.code = fp8_code(amax_block * (s_enc / 6.0f), false);
  const float m = s_enc / e4m3_value(b.code);
  b.mul = m > FLT_MAX ? FLT_MAX : m;
  return b;
}
inline uint8_t nvfp4_elem(float x, const BlockScale& b) {
  return (b.code & 0x7F) == 0 ? 0 : e2m1_code(x * b.mul);
}

// ---- the swizzled 128x4 index, docs/numerics.md
// ------------------------------------------------
inline int64_t swizzle(int64_t r, int64_t c, int64_t Kp) {
  const int64_t tile = r / 128, col4 = c / 4, r32 = r % 32, rq = (r % 128) / 32, c4 = c % 4;
  return tile * 128 * Kp + col4 * 512 + r32 * 16 + rq * 4 + c4;
}

// ---- grouped quantization
// --------------------------------------------------------------------------- x: the fp32 values
// the library reads ([M, K] activations in G experts of splits[g] rows, or G weight experts of M/G
// rows); cfg: as passed to group_quantize.
struct Problem {
  std::vector<float> x;
  int64_t M = 0, K = 0;
  std::vector<int64_t> splits;  // G entries summing to M
};

// Where an expected byte comes from: the buffer, the expert, and (row, column) in the expert's
// un-transposed [m_g, K] (data), or (row, block column) / (block row, column) (scales).
enum class Part : uint8_t { data, scale, col_data, col_scale, scale_pad, col_scale_pad, slack };
inline uint64_t tag(Part part, int64_t g, int64_t r, int64_t c) {
  return (uint64_t(part) + 1) << 60 | uint64_t(g & 0xFFFF) << 44 | uint64_t(r & 0x3FFFFF) << 22 |
         uint64_t(c & 0x3FFFFF);
}
inline std::string describe(uint64_t t) {
  static const char* names[] = {"data",
                                "scale_inv",
                                "columnwise_data",
                                "columnwise_scale_inv",
                                "scale_inv padding",
                                "columnwise_scale_inv padding",
                                "scale slack"};
  if (t == 0) return "unspecified byte";
  return std::string(names[(t >> 60) - 1]) + " of expert " + std::to_string((t >> 44) & 0xFFFF) +
         " at (" + std::to_string((t >> 22) & 0x3FFFFF) + ", " + std::to_string(t & 0x3FFFFF) + ")";
}

// Expected bytes of one output buffer; tag 0 marks bytes the library need not write (rows past
// the splits' sum of data and plain 1xB rowwise scales).
struct Expected {
  std::vector<uint8_t> bytes;
  std::vector<uint64_t> tags;
  explicit Expected(int64_t n = 0)
      : bytes(static_cast<size_t>(n), 0), tags(static_cast<size_t>(n), 0) {}
  bool set(int64_t i, uint8_t v, uint64_t t) {
    if (i < 0 || i >= static_cast<int64_t>(bytes.size())) return false;
    bytes[size_t(i)] = v;
    tags[size_t(i)] = t;
    return true;
  }
  bool set_nibble(int64_t e, uint8_t v, uint64_t t) {  // element e of packed e2m1 data
    if (e < 0 || e / 2 >= static_cast<int64_t>(bytes.size())) return false;
    uint8_t& b = bytes[size_t(e / 2)];
    b = (e % 2 == 0) ? static_cast<uint8_t>((b & 0xF0) | v)
                     : static_cast<uint8_t>((b & 0x0F) | (v << 4));
    if (e % 2 == 0) tags[size_t(e / 2)] = t;
    return true;
  }
  bool set_f32(int64_t i, float v, uint64_t t) {
    uint8_t b[4];
    std::memcpy(b, &v, 4);
    bool ok = true;
    for (int j = 0; j < 4; ++j) ok = set(4 * i + j, b[j], t) && ok;
    return ok;
  }
};

struct Outputs {
  Expected data, scale_inv, columnwise_data, columnwise_scale_inv;
  std::vector<float> amax, global_scale;  // per expert (fp8_current amax, nvfp4 both)
  std::vector<float> expert_scale_inv;    // fp8_current scale_inv [G]
  // Per element [M, K] of each copy: the multiplier before rounding and the dequantization
  // factor (dequant = code value * factor); a factor 0 marks an NVFP4 block whose scale is 0.
  std::vector<float> row_mul, row_dq, col_mul, col_dq;
  std::string error;  // an index outside the library's buffer
};

// The expected outputs for buffers of the byte sizes in `bytes` (data, scale_inv, columnwise_data,
// columnwise_scale_inv), e.g. from group_quantize_shapes.
inline Outputs quantize(const Problem& p, const QuantizeConfig& cfg,
                        const std::array<int64_t, 4>& bytes) {
  Outputs o{Expected(bytes[0]), Expected(bytes[1]), Expected(bytes[2]), Expected(bytes[3])};
  const size_t n = static_cast<size_t>(p.M * p.K);
  o.row_mul = o.row_dq = o.col_mul = o.col_dq =
      std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
  const QuantRecipe R = cfg.recipe;
  // fp4: packed E2M1 data (nvfp4, mxfp4); nvfp4 alone has per-expert scalars and E4M3 scales.
  const bool nv = R == QuantRecipe::nvfp4, fp4 = nv || R == QuantRecipe::mxfp4;
  const bool e5 = cfg.fp8_dtype == DType::fp8e5m2 && !fp4;
  const bool mxr = R == QuantRecipe::mxfp8 || R == QuantRecipe::mxfp4;  // 1x32 / 32x1, E8M0
  const bool two_d = cfg.block_2d;
  const int64_t K = p.K, G = static_cast<int64_t>(p.splits.size());
  // Rowwise block length along K and columnwise block length along M (docs/numerics.md).
  const int64_t rb = R == QuantRecipe::fp8_block ? 128 : mxr ? 32 : 16;
  const int64_t cb = mxr ? 32 : nv ? 16 : 128;
  const int64_t bs2 = R == QuantRecipe::fp8_block ? 128 : 16;  // 2D block edge
  const bool fp8_2d = two_d && R == QuantRecipe::fp8_block;
  const bool swz = cfg.scale_layout == ScaleLayout::swizzled;
  const bool mn = cfg.scale_layout == ScaleLayout::mn_major;
  const int64_t ncols = K / rb, Kp = (ncols + 3) / 4 * 4;
  auto fail = [&](uint64_t t) {
    if (o.error.empty()) o.error = "index outside the library's buffer: " + describe(t);
  };

  int64_t start = 0, tile_start = 0, cb_start = 0, cs4_start = 0;
  // Tiles over all experts (for the 128x128 mn_major leading dimension).
  const int64_t rs_ld_2d = (p.M / 128 + G + 3) / 4 * 4, Mp = (p.M + 3) / 4 * 4;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t m = p.splits[size_t(g)];
    auto X = [&](int64_t lr, int64_t k) { return p.x[size_t((start + lr) * K + k)]; };
    float ea = 0;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t k = 0; k < K; ++k) ea = amax_of(ea, X(r, k));
    const BlockScale cur = fp8_current(ea, e5, cfg.pow2_scales);
    const float s_enc = nvfp4_s_enc(ea);
    if (R == QuantRecipe::fp8_current) {
      o.amax.push_back(ea);
      o.expert_scale_inv.push_back(cur.scale_inv);
    }
    if (nv) {
      o.amax.push_back(ea);
      o.global_scale.push_back(s_enc);
    }
    // The scale of a block [r0, r1) x [k0, k1) of expert g (2D blocks computed once).
    std::map<std::pair<int64_t, int64_t>, BlockScale> blocks_2d;
    auto block = [&](int64_t r0, int64_t r1, int64_t k0, int64_t k1) -> BlockScale {
      if (R == QuantRecipe::fp8_current) return cur;
      if (two_d) {
        const auto it = blocks_2d.find({r0, k0});
        if (it != blocks_2d.end()) return it->second;
      }
      float a = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t k = k0; k < k1; ++k) a = amax_of(a, X(r, k));
      const BlockScale b = R == QuantRecipe::fp8_block ? fp8_block(a, e5, cfg.pow2_scales)
                           : R == QuantRecipe::mxfp8   ? mxfp8(a, e5)
                           : R == QuantRecipe::mxfp4   ? mxfp4(a)
                                                       : nvfp4(a, s_enc);
      if (two_d) blocks_2d[{r0, k0}] = b;
      return b;
    };
    auto dq = [&](const BlockScale& b) -> float {
      if (mxr)
        return b.code == 255 ? std::numeric_limits<float>::quiet_NaN()
                             : std::ldexp(1.0f, b.code - 127);
      if (nv) return (b.code & 0x7F) == 0 ? 0.0f : e4m3_value(b.code) / s_enc;
      return b.scale_inv;
    };
    auto code = [&](float x, const BlockScale& b) -> uint8_t {
      if (R == QuantRecipe::mxfp4) return e2m1_code(x * b.mul);  // a NaN block: all 6s
      return nv ? nvfp4_elem(x, b) : fp8_code(x * b.mul, e5);
    };
    auto put_scale = [&](Expected& E, int64_t i, const BlockScale& b, uint64_t t) {
      const bool ok =
          R == QuantRecipe::fp8_block ? E.set_f32(i, b.scale_inv, t) : E.set(i, b.code, t);
      if (!ok) fail(t);
    };

    // Rowwise copy.
    if (has_rowwise(cfg.direction)) {
      for (int64_t lr = 0; lr < m; ++lr)
        for (int64_t c = 0; c < ncols; ++c) {
          const int64_t k0 = c * rb;
          const int64_t r0 = two_d ? lr / bs2 * bs2 : lr,
                        r1 = two_d ? std::min(r0 + bs2, m) : lr + 1;
          // 2D: the block of this row and these columns (fp8 128x128 spans the row's 128 columns).
          const BlockScale b = block(r0, r1, k0, k0 + rb);
          for (int64_t k = k0; k < k0 + rb; ++k) {
            const int64_t e = (start + lr) * K + k;
            const uint8_t q = code(X(lr, k), b);
            o.row_mul[size_t(e)] = b.mul;
            o.row_dq[size_t(e)] = dq(b);
            const uint64_t t = tag(Part::data, g, lr, k);
            if (!(fp4 ? o.data.set_nibble(e, q, t) : o.data.set(e, q, t))) fail(t);
          }
          if (R == QuantRecipe::fp8_current) continue;
          if (fp8_2d && lr % 128 != 0) continue;  // one scale per 128x128 block
          const uint64_t t = tag(Part::scale, g, lr, c);
          int64_t i;
          if (fp8_2d) {
            const int64_t t = tile_start + lr / 128;
            i = mn ? c * rs_ld_2d + t : t * ncols + c;
          } else if (mn) {
            i = c * Mp + start + lr;
          } else if (swz) {
            i = swizzle(tile_start * 128 + lr, c, Kp);
          } else {
            i = (start + lr) * ncols + c;
          }
          put_scale(o.scale_inv, i, b, t);
        }
      if (swz && m > 0)  // the expert's 128-row padded block: padding entries are 0
        for (int64_t lr = 0; lr < (m + 127) / 128 * 128; ++lr)
          for (int64_t c = 0; c < Kp; ++c)
            if (lr >= m || c >= ncols) {
              const uint64_t t = tag(Part::scale_pad, g, lr, c);
              if (!o.scale_inv.set(swizzle(tile_start * 128 + lr, c, Kp), 0, t)) fail(t);
            }
    }

    // Columnwise copy: the transposed [K, m] block at element K * start.
    const int64_t nb = (m + cb - 1) / cb, Jp = (nb + 3) / 4 * 4;
    if (has_columnwise(cfg.direction)) {
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < nb; ++j) {
          const int64_t r0 = j * cb, r1 = std::min(r0 + cb, m);
          const int64_t k0 = two_d ? k / bs2 * bs2 : k, k1 = two_d ? k0 + bs2 : k + 1;
          const BlockScale b = block(r0, r1, k0, k1);
          for (int64_t lr = r0; lr < r1; ++lr) {
            const int64_t e = K * start + k * m + lr;
            const uint8_t q = code(X(lr, k), b);
            o.col_mul[size_t((start + lr) * K + k)] = b.mul;
            o.col_dq[size_t((start + lr) * K + k)] = dq(b);
            const uint64_t t = tag(Part::col_data, g, lr, k);
            if (!(fp4 ? o.columnwise_data.set_nibble(e, q, t) : o.columnwise_data.set(e, q, t)))
              fail(t);
          }
          if (R == QuantRecipe::fp8_current) continue;
          if (fp8_2d && k % 128 != 0) continue;
          const uint64_t t = tag(Part::col_scale, g, j, k);
          const int64_t kk = fp8_2d ? k / 128 : k, rows = fp8_2d ? K / 128 : K;
          int64_t i;
          if (mn) {
            i = rows * (cb_start + j) + kk;
          } else if (swz) {
            i = (K + 127) / 128 * 128 * cs4_start + swizzle(k, j, Jp);
          } else {
            i = rows * cb_start + kk * nb + j;
          }
          put_scale(o.columnwise_scale_inv, i, b, t);
        }
      if (swz && m > 0)
        for (int64_t k = 0; k < (K + 127) / 128 * 128; ++k)
          for (int64_t j = 0; j < Jp; ++j)
            if (k >= K || j >= nb) {
              const uint64_t t = tag(Part::col_scale_pad, g, j, k);
              if (!o.columnwise_scale_inv.set((K + 127) / 128 * 128 * cs4_start + swizzle(k, j, Jp),
                                              0, t))
                fail(t);
            }
    }
    start += m;
    tile_start += (m + 127) / 128;
    cb_start += nb;
    cs4_start += Jp;
  }
  // The scale buffers' slack, written 0 (quantize.hpp "Layouts"): bytes [from, to) of each buffer.
  auto slack = [&](Expected& E, int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i)
      if (!E.set(i, 0, tag(Part::slack, 0, 0, i))) fail(tag(Part::slack, 0, 0, i));
  };
  const int64_t es = R == QuantRecipe::fp8_block ? 4 : 1;  // scale bytes
  const auto row_bytes = static_cast<int64_t>(o.scale_inv.bytes.size());
  const auto col_bytes = static_cast<int64_t>(o.columnwise_scale_inv.bytes.size());
  if (R != QuantRecipe::fp8_current && has_rowwise(cfg.direction)) {
    if (mn) {  // per scale column c: its entries past the last expert's rows (128-row blocks)
      const int64_t ld = fp8_2d ? rs_ld_2d : Mp, used = fp8_2d ? tile_start : start;
      for (int64_t c = 0; c < ncols; ++c)
        slack(o.scale_inv, es * (c * ld + used), es * (c + 1) * ld);
    } else if (fp8_2d) {
      slack(o.scale_inv, es * tile_start * ncols, row_bytes);
    } else if (swz) {
      slack(o.scale_inv, tile_start * 128 * Kp, row_bytes);
    }
  }
  if (R != QuantRecipe::fp8_current && has_columnwise(cfg.direction)) {
    if (swz)
      slack(o.columnwise_scale_inv, (K + 127) / 128 * 128 * cs4_start, col_bytes);
    else
      slack(o.columnwise_scale_inv, es * (fp8_2d ? K / 128 : K) * cb_start, col_bytes);
  }
  return o;
}

// db[g, k] in the documented order of bgrad_group_quantize (quantize.hpp): fp32; per 128-row tile
// of the expert, per 16-row segment a sequential sum from +0, the tile sums its 8 segments in
// order, the expert sums its tiles in order.
inline std::vector<float> bgrad_dbias(const Problem& p) {
  const int64_t K = p.K, G = static_cast<int64_t>(p.splits.size());
  std::vector<float> db(static_cast<size_t>(G * K), 0.0f);
  int64_t start = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t m = p.splits[size_t(g)];
    for (int64_t k = 0; k < K; ++k) {
      float d = 0.0f;
      for (int64_t t = 0; t < m; t += 128) {
        float tile = 0.0f;
        for (int64_t s = t; s < t + 128; s += 16) {
          float seg = 0.0f;
          for (int64_t r = s; r < std::min(s + 16, m); ++r) seg += p.x[size_t((start + r) * K + k)];
          tile += seg;
        }
        d += tile;
      }
      db[size_t(g * K + k)] = d;
    }
    start += m;
  }
  return db;
}

}  // namespace groupmm::test::oracle
