// Device conversions equal host conversions for every code and for random/edge fp32 inputs, and
// agree with the CUDA intrinsics (an implementation we did not write).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include "common/test_util.hpp"

namespace groupmm::test {
namespace {

struct Encoded {
  uint16_t bf16, fp16;
  uint8_t e4m3, e5m2, e2m1, e8m0;
  uint16_t bf16_ref, fp16_ref;
  uint8_t e4m3_ref, e5m2_ref, e2m1_ref;
};

__global__ void encode_kernel(const float* x, Encoded* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  Encoded e;
  e.bf16 = float_to_bf16_bits(v);
  e.fp16 = float_to_fp16_bits(v);
  e.e4m3 = float_to_e4m3(v);
  e.e5m2 = float_to_e5m2(v);
  e.e2m1 = float_to_e2m1(v);
  e.e8m0 = float_to_e8m0_roundup(v);
  e.bf16_ref = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  e.fp16_ref = __half_as_ushort(__float2half_rn(v));
  e.e4m3_ref = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  e.e5m2_ref = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
  e.e2m1_ref = __nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundNearest);
  out[i] = e;
}

__global__ void decode_kernel(float* out) {
  const int c = threadIdx.x;  // 256 codes
  out[c * 4 + 0] = e4m3_to_float(static_cast<uint8_t>(c));
  out[c * 4 + 1] = e5m2_to_float(static_cast<uint8_t>(c));
  out[c * 4 + 2] = e8m0_to_float(static_cast<uint8_t>(c));
  out[c * 4 + 3] = e2m1_to_float(static_cast<uint8_t>(c & 0xF));
}

bool same_bits(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b);
}

TEST(ConvertGpu, DecodeEveryCodeMatchesHost) {
  GROUPMM_REQUIRE_GPU();
  Tensor d = Tensor::empty({1024}, DType::fp32, Device::CUDA);
  decode_kernel<<<1, 256>>>(d.ptr<float>());
  GROUPMM_CHECK_LAUNCH();
  std::vector<float> h(1024);
  copy(host_view(h, DType::fp32, {1024}), d);
  for (int c = 0; c < 256; ++c) {
    EXPECT_TRUE(same_bits(h[c * 4 + 0], e4m3_to_float(static_cast<uint8_t>(c)))) << c;
    EXPECT_TRUE(same_bits(h[c * 4 + 1], e5m2_to_float(static_cast<uint8_t>(c)))) << c;
    EXPECT_TRUE(same_bits(h[c * 4 + 2], e8m0_to_float(static_cast<uint8_t>(c)))) << c;
    EXPECT_TRUE(same_bits(h[c * 4 + 3], e2m1_to_float(static_cast<uint8_t>(c & 0xF)))) << c;
  }
}

TEST(ConvertGpu, EncodeMatchesHostAndIntrinsics) {
  GROUPMM_REQUIRE_GPU();
  std::vector<float> xs = rand_wide(100000);
  for (int c = 0; c < 256; ++c) {  // every fp8 code, the midpoints, and the fp16 codes
    xs.push_back(e4m3_to_float(static_cast<uint8_t>(c)));
    xs.push_back(e5m2_to_float(static_cast<uint8_t>(c)));
    if (c < 255) {
      xs.push_back(0.5f * (e4m3_to_float(static_cast<uint8_t>(c)) +
                           e4m3_to_float(static_cast<uint8_t>(c + 1))));
      xs.push_back(0.5f * (e5m2_to_float(static_cast<uint8_t>(c)) +
                           e5m2_to_float(static_cast<uint8_t>(c + 1))));
    }
  }
  for (int c = 0; c < 16; ++c) xs.push_back(e2m1_to_float(static_cast<uint8_t>(c)) * 1.25f);
  for (uint32_t h = 0; h < 0x10000; h += 3)
    xs.push_back(fp16_bits_to_float(static_cast<uint16_t>(h)));
  for (float v : {0.0f, -0.0f, INFINITY, -INFINITY, 448.0f, 464.0f, 480.0f, 1e30f, 57344.0f,
                  61440.0f, 6.0f, 7.0f, 5.0f, 0.25f, 0.75f, 1e-40f, -1e-45f})
    xs.push_back(v);
  const int n = static_cast<int>(xs.size());
  Tensor dx = clone_to(host_view(xs, DType::fp32, {n}), Device::CUDA);
  Tensor dout = Tensor::empty({n * int64_t(sizeof(Encoded))}, DType::e8m0, Device::CUDA);
  encode_kernel<<<(n + 255) / 256, 256>>>(dx.ptr<float>(), dout.ptr<Encoded>(), n);
  GROUPMM_CHECK_LAUNCH();
  std::vector<Encoded> out(static_cast<size_t>(n));
  copy(TensorView(out.data(), DType::e8m0, Device::CPU, {n * int64_t(sizeof(Encoded))}), dout);
  for (int i = 0; i < n; ++i) {
    const float v = xs[static_cast<size_t>(i)];
    const Encoded& e = out[static_cast<size_t>(i)];
    SCOPED_TRACE(::testing::Message() << "x=" << std::hexfloat << v);
    ASSERT_EQ(e.bf16, float_to_bf16_bits(v));
    ASSERT_EQ(e.fp16, float_to_fp16_bits(v));
    ASSERT_EQ(e.e4m3, float_to_e4m3(v));
    ASSERT_EQ(e.e5m2, float_to_e5m2(v));
    ASSERT_EQ(e.e2m1, float_to_e2m1(v));
    ASSERT_EQ(e.e8m0, float_to_e8m0_roundup(v));
    // CUDA intrinsics: the same bits, except that NaN inputs only need to give a NaN code
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(e4m3_to_float(e.e4m3_ref)) && std::isnan(e5m2_to_float(e.e5m2_ref)));
      EXPECT_EQ(e.bf16, e.bf16_ref);
      EXPECT_EQ(e.fp16, e.fp16_ref);
      continue;
    }
    ASSERT_EQ(e.bf16, e.bf16_ref);
    ASSERT_EQ(e.fp16, e.fp16_ref);
    ASSERT_EQ(e.e4m3, e.e4m3_ref);
    ASSERT_EQ(e.e5m2, e.e5m2_ref);
    ASSERT_EQ(e.e2m1, e.e2m1_ref & 0xF);
  }
}

}  // namespace
}  // namespace groupmm::test
