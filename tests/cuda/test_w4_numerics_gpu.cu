// The GEMM form of 4-bit weights (numerics/w4.hpp) on the device, where it runs bf16x2
// multiplies (mul.rn.bf16x2: bf16 subnormal raw codes must survive) and cvt.rn.bf16x2.f32:
// every (code, scale byte) pair of both formats, both mxfp4 multiplier forms and the two-byte
// nvfp4 form, against the host rule; the bit placement against the host's direct one.
#include <random>
#include <vector>

#include "common/test_util.hpp"
#include "numerics/w4.hpp"

namespace groupmm::test {
namespace {

// out[s][i] for scale byte s: the 4 weight words of codes 0..7 (i < 4) and 8..15 (i >= 4);
// kind 0: nvfp4, 1: mxfp4 one factor, 2: mxfp4 two factors, 3: nvfp4 with s as the low (half 0)
// or high (half 1) byte of a w4_nvfp4_multipliers pair.
__global__ void w4_weights_kernel(int kind, uint32_t* out) {
  const int s = blockIdx.x, half = threadIdx.x;  // 256 x 2
  const uint32_t q = half ? 0xFEDCBA98u : 0x76543210u;
  uint32_t w[4];
  const uint8_t b = static_cast<uint8_t>(s);
  if (kind == 0) qnum::w4_weights8(q, qnum::w4_nvfp4_multiplier(b), w);
  if (kind == 1) qnum::w4_weights8(q, qnum::w4_mxfp4_multiplier1(b), w);
  if (kind == 2)
    qnum::w4_weights8(q, qnum::w4_mxfp4_multiplier1(b), qnum::w4_mxfp4_multiplier2(b), w);
  if (kind == 3) {
    const uint32_t other = 255u - b;  // the pair's other byte: every value, both positions
    uint32_t m[2];
    qnum::w4_nvfp4_multipliers(half ? (uint32_t(b) << 8) | other : b | (other << 8), m);
    qnum::w4_weights8(q, m[half], w);
  }
  for (int i = 0; i < 4; ++i) out[s * 8 + half * 4 + i] = w[i];
}

TEST(W4NumericsGpu, WeightsEqualTheRuleForEveryCodeAndScale) {
  GROUPMM_REQUIRE_GPU();
  Tensor d = Tensor::empty({256 * 8}, DType::int32, Device::CUDA);
  for (int kind = 0; kind < 4; ++kind) {
    w4_weights_kernel<<<256, 2>>>(kind, d.ptr<uint32_t>());
    GROUPMM_CHECK_LAUNCH();
    std::vector<uint32_t> got(256 * 8);
    copy(TensorView(got.data(), DType::int32, Device::CPU, {256 * 8}), d);
    const QuantRecipe r = kind == 0 || kind == 3 ? QuantRecipe::nvfp4 : QuantRecipe::mxfp4;
    for (int s = 0; s < 256; ++s) {
      if (kind == 1 && qnum::w4_mxfp4_needs_two(uint8_t(s))) continue;  // one factor: e <= 128
      for (int half = 0; half < 2; ++half)
        for (int i = 0; i < 4; ++i)
          for (int h = 0; h < 2; ++h) {
            const uint8_t c = uint8_t(8 * half + (h ? 7 : 3) - i);
            const uint32_t w = got[size_t(s * 8 + half * 4 + i)];
            const uint16_t g = uint16_t(h ? w >> 16 : w & 0xFFFF);
            const uint16_t want = float_to_bf16_bits(qnum::w4_weight_value(r, c, uint8_t(s)));
            ASSERT_EQ(g, want) << "kind " << kind << " code " << int(c) << " scale " << s;
          }
    }
  }
}

// The device's bit placement (masks, IMAD and IMAD.HI) against the host's direct placement
// e2m1_raw_pair(q << 4i): every code at every nibble over varied neighbours, and random words.
__global__ void w4_raw_kernel(const uint32_t* q, uint32_t* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  uint32_t r[4];
  qnum::e2m1x8_raw(q[i], r);
  for (int k = 0; k < 4; ++k) out[4 * i + k] = r[k];
}

TEST(W4NumericsGpu, RawPairsEqualTheDirectPlacement) {
  GROUPMM_REQUIRE_GPU();
  std::vector<uint32_t> words;
  std::mt19937 gen(7);
  for (int nibble = 0; nibble < 8; ++nibble)
    for (uint32_t c = 0; c < 16; ++c)
      for (uint32_t bg :
           {0u, 0xFFFFFFFFu, 0x77777777u, 0x88888888u, uint32_t(gen()), uint32_t(gen())})
        words.push_back((bg & ~(0xFu << (4 * nibble))) | (c << (4 * nibble)));
  while (words.size() < (size_t(1) << 18)) words.push_back(uint32_t(gen()));
  const int n = static_cast<int>(words.size());
  Tensor dq = Tensor::empty({n}, DType::int32, Device::CUDA);
  Tensor dr = Tensor::empty({4 * int64_t(n)}, DType::int32, Device::CUDA);
  copy(dq, TensorView(words.data(), DType::int32, Device::CPU, {n}));
  w4_raw_kernel<<<(n + 255) / 256, 256>>>(dq.ptr<uint32_t>(), dr.ptr<uint32_t>(), n);
  GROUPMM_CHECK_LAUNCH();
  std::vector<uint32_t> got(size_t(4) * size_t(n));
  copy(TensorView(got.data(), DType::int32, Device::CPU, {4 * int64_t(n)}), dr);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 4; ++k)
      ASSERT_EQ(got[size_t(4 * i + k)], qnum::e2m1_raw_pair(words[size_t(i)] << (4 * k)))
          << std::hex << words[size_t(i)] << " pair " << k;
}

}  // namespace
}  // namespace groupmm::test
