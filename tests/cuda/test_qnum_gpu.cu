// The device instructions behind qnum's fast twins and the kernels' element traits, against the
// host rules (convert.hpp, quantize_numerics.hpp) the CPU reference runs:
//  - fp8x2_encode (cvt.rn.satfinite e4m3x2 / e5m2x2) on every fp8 code, its midpoints and
//    neighbours, random values over many binades and the specials;
//  - e4m3_decode (cvt through f16) and Fp16::to_float (the hardware conversion) on every code;
//  - mxfp8's branch-free block scales on every canonical amax (both fp8 formats);
//  - the nvfp4 codes of 16-bit rows and columns, whose sign bits come from byte permutes.
#include <limits>

#include "common/test_util.hpp"
#include "numerics/quantize_layout.hpp"
#include "quantize/cuda/tile_convert.cuh"

namespace groupmm::test {
namespace {

bool same_float(float a, float b) {
  return float_bits(a) == float_bits(b) || (std::isnan(a) && std::isnan(b));
}

template <class T>
std::vector<T> to_host(const Tensor& t, size_t n) {
  std::vector<T> h(n);
  copy(TensorView(h.data(), t.view().dtype, Device::CPU, {t.numel()}), t);
  return h;
}

__global__ void fp8x2_kernel(const float* x, int n, uint32_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i + 1 >= n) return;
  out[i] =
      qnum::fp8x2_encode<false>(x[i], x[i + 1]) | (qnum::fp8x2_encode<true>(x[i], x[i + 1]) << 16);
}

TEST(QnumGpu, Fp8PairEncodeEqualsHostRule) {
  GROUPMM_REQUIRE_GPU();
  std::vector<float> xs = rand_wide(100000);
  for (int c = 0; c < 256; ++c) {
    for (const bool e5m2 : {false, true}) {
      const float v = qnum::fp8_to_float(static_cast<uint8_t>(c), e5m2);
      if (std::isnan(v)) continue;
      xs.push_back(v);
      xs.push_back(std::nextafter(v, 1e30f));
      xs.push_back(std::nextafter(v, -1e30f));
      if (c < 255) {
        const float w = qnum::fp8_to_float(static_cast<uint8_t>(c + 1), e5m2);
        if (!std::isnan(w)) xs.push_back(0.5f * (v + w));
      }
    }
  }
  for (float v : {0.0f, -0.0f, 1e-45f, -1e-45f, 3.4e38f, -3.4e38f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  bits_float(0x7FC00000u)})  // GPU products are never negative NaNs
    xs.push_back(v);
  const int n = static_cast<int>(xs.size());
  Tensor dx = clone_to(host_view(xs, DType::fp32, {n}), Device::CUDA);
  Tensor dout = Tensor::empty({n}, DType::int32, Device::CUDA);
  fp8x2_kernel<<<(n + 255) / 256, 256>>>(dx.ptr<float>(), n, dout.ptr<uint32_t>());
  GROUPMM_CHECK_LAUNCH();
  const std::vector<uint32_t> got = to_host<uint32_t>(dout, static_cast<size_t>(n));
  for (int i = 0; i + 1 < n; ++i) {
    const uint32_t want = qnum::fp8_encode(xs[i], false) |
                          (uint32_t(qnum::fp8_encode(xs[i + 1], false)) << 8) |
                          (uint32_t(qnum::fp8_encode(xs[i], true)) << 16) |
                          (uint32_t(qnum::fp8_encode(xs[i + 1], true)) << 24);
    ASSERT_EQ(got[static_cast<size_t>(i)], want)
        << std::hexfloat << "x = " << xs[i] << ", " << xs[i + 1];
  }
}

__global__ void decode_kernel(float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;  // 65536 codes
  out[2 * c] = cuda::Fp16::to_float(static_cast<uint16_t>(c));
  out[2 * c + 1] = qnum::e4m3_decode(static_cast<uint8_t>(c & 0xFF));
}

TEST(QnumGpu, HardwareDecodesEqualHostRules) {
  GROUPMM_REQUIRE_GPU();
  Tensor d = Tensor::empty({2 * 65536}, DType::fp32, Device::CUDA);
  decode_kernel<<<256, 256>>>(d.ptr<float>());
  GROUPMM_CHECK_LAUNCH();
  const std::vector<float> h = to_host<float>(d, 2 * 65536);
  for (int c = 0; c < 65536; ++c) {
    ASSERT_TRUE(same_float(h[2 * c], fp16_bits_to_float(static_cast<uint16_t>(c)))) << c;
    ASSERT_TRUE(same_float(h[2 * c + 1], e4m3_to_float(static_cast<uint8_t>(c & 0xFF)))) << c;
  }
}

struct Mismatch {  // 16 bytes
  unsigned long long count;
  uint32_t first, pad;
};

__global__ void mxfp8_sweep(bool e5m2, Mismatch* m) {
  const qnum::ExpertQuant e;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t u = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; u <= 0x7F800001ull;
       u += stride) {
    const uint32_t am = u == 0x7F800001ull ? 0x7FC00000u : static_cast<uint32_t>(u);
    const qnum::BlockQuant q = qnum::block_quant_fast<QuantRecipe::mxfp8>(am, e, e5m2, false);
    const qnum::BlockQuant r = qnum::make_block_quant(QuantRecipe::mxfp8, e5m2, false, am, 0.0f);
    const bool mul_ok =
        __float_as_uint(q.mul) == __float_as_uint(r.mul) || (q.mul != q.mul && r.mul != r.mul);
    if (q.code != r.code || !mul_ok) {
      if (atomicAdd(&m->count, 1ull) == 0) m->first = am;
    }
  }
}

TEST(QnumGpu, Mxfp8BlockScalesEqualTheRulesForEveryAmax) {
  GROUPMM_REQUIRE_GPU();
  for (const bool e5m2 : {false, true}) {
    Tensor t = Tensor::empty({2}, DType::int64, Device::CUDA);
    fill_bytes(t, 0);
    mxfp8_sweep<<<4096, 256>>>(e5m2, reinterpret_cast<Mismatch*>(t.data()));
    GROUPMM_CHECK_LAUNCH();
    const std::vector<uint64_t> h = to_host<uint64_t>(t, 2);
    EXPECT_EQ(h[0], 0ull) << "e5m2=" << e5m2 << " first amax bits 0x" << std::hex
                          << (h[1] & 0xFFFFFFFFu);
  }
}

// Per block of 8: the row form (pairs of one row) and the column form (pairs of 8 rows of a
// column pair) of 16-bit inputs; both encode with the sign bits permuted out of the input words.
__global__ void nvfp4_signs_kernel(const uint32_t* pairs, const float* mul, const uint8_t* s_b,
                                   int blocks, uint32_t* out) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const uint32_t* u = pairs + 8 * b;  // 8 pair words: row form uses u[0..3], column form u[0..7]
  out[3 * b] = cuda::tile::fp4_row_word<cuda::Bf16, QuantRecipe::nvfp4>(u, mul[b], s_b[b]);
  uint32_t lo, hi;
  cuda::tile::column_signs8(u, lo, hi);
  float e0[8], e1[8];
  for (int j = 0; j < 8; ++j) {
    const float2 f = cuda::Bf16::pair_to_float2(u[j]);
    e0[j] = f.x;
    e1[j] = f.y;
  }
  out[3 * b + 1] = qnum::nvfp4_encode8_signed(e0, mul[b], s_b[b], lo);
  out[3 * b + 2] = qnum::nvfp4_encode8_signed(e1, mul[b], s_b[b], hi);
}

TEST(QnumGpu, Nvfp4SixteenBitSignsEqualTheElementRule) {
  GROUPMM_REQUIRE_GPU();
  const int blocks = 20000;
  std::vector<uint32_t> pairs(static_cast<size_t>(blocks) * 8);
  std::vector<float> mul(static_cast<size_t>(blocks));
  std::vector<uint8_t> s_b(static_cast<size_t>(blocks));
  const std::vector<float> v = rand_wide(pairs.size() * 2);
  for (size_t i = 0; i < pairs.size(); ++i)
    pairs[i] = float_to_bf16_bits(v[2 * i]) | (uint32_t(float_to_bf16_bits(v[2 * i + 1])) << 16);
  for (int b = 0; b < blocks; ++b) {
    if (b % 17 == 0) pairs[static_cast<size_t>(8 * b + b % 8)] = 0x80008000u;  // -0, -0
    uint32_t am = 0;
    for (int j = 0; j < 8; ++j) {
      const uint32_t w = pairs[static_cast<size_t>(8 * b + j)];
      am = qnum::amax_merge(am, qnum::abs_bits(bf16_bits_to_float(static_cast<uint16_t>(w))));
      am = qnum::amax_merge(am, qnum::abs_bits(bf16_bits_to_float(static_cast<uint16_t>(w >> 16))));
    }
    const qnum::BlockQuant q =
        qnum::make_block_quant(QuantRecipe::nvfp4, false, false, am, b % 3 ? 2688.0f : 1e-20f);
    mul[static_cast<size_t>(b)] = q.mul;
    s_b[static_cast<size_t>(b)] = q.code;
  }
  Tensor dp = clone_to(host_view(pairs, DType::int32, {blocks * 8}), Device::CUDA);
  Tensor dm = clone_to(host_view(mul, DType::fp32, {blocks}), Device::CUDA);
  Tensor ds = clone_to(host_view(s_b, DType::e8m0, {blocks}), Device::CUDA);
  Tensor dout = Tensor::empty({blocks * 3}, DType::int32, Device::CUDA);
  nvfp4_signs_kernel<<<(blocks + 127) / 128, 128>>>(
      dp.ptr<uint32_t>(), dm.ptr<float>(), ds.ptr<uint8_t>(), blocks, dout.ptr<uint32_t>());
  GROUPMM_CHECK_LAUNCH();
  const std::vector<uint32_t> got = to_host<uint32_t>(dout, static_cast<size_t>(blocks) * 3);
  for (int b = 0; b < blocks; ++b) {
    const uint32_t* u = &pairs[static_cast<size_t>(8 * b)];
    const float m = mul[static_cast<size_t>(b)];
    const uint8_t s = s_b[static_cast<size_t>(b)];
    auto elem = [&](int j, bool high) {
      return bf16_bits_to_float(static_cast<uint16_t>(high ? u[j] >> 16 : u[j]));
    };
    uint32_t row = 0, col_lo = 0, col_hi = 0;
    for (int j = 0; j < 8; ++j) {
      row |= uint32_t(qnum::nvfp4_code(elem(j / 2, j & 1), s, m)) << (4 * j);
      col_lo |= uint32_t(qnum::nvfp4_code(elem(j, false), s, m)) << (4 * j);
      col_hi |= uint32_t(qnum::nvfp4_code(elem(j, true), s, m)) << (4 * j);
    }
    ASSERT_EQ(got[static_cast<size_t>(3 * b)], row) << "block " << b;
    ASSERT_EQ(got[static_cast<size_t>(3 * b + 1)], col_lo) << "block " << b;
    ASSERT_EQ(got[static_cast<size_t>(3 * b + 2)], col_hi) << "block " << b;
  }
}

}  // namespace
}  // namespace groupmm::test
