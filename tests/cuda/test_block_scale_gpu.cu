// The quantize kernels compute block scales with fp32 division written without the IEEE slow path
// (qnum's fast twins, div_rn_inrange). These tests compare that arithmetic with the shared qnum
// functions (IEEE division, what the CPU reference runs) over every input it can see:
//  - fp8_block: every fp32 amax bit pattern from 0 to Inf and NaN, e4m3 / e5m2, plain / pow2;
//  - nvfp4: every S_enc the expert amax can produce (every positive fp32 from 2^-117 to FLT_MAX,
//    and 1) times every nonzero finite e4m3 block scale.
#include <functional>
#include <limits>

#include "common/test_util.hpp"
#include "numerics/quantize_layout.hpp"

namespace groupmm::test {
namespace {

using GroupInfo = qnum::ExpertQuant;

struct Mismatch {  // 16 bytes
  unsigned long long count;
  uint32_t first_a, first_b;  // the first mismatching input (smallest a, then its b)
};

__device__ void record(Mismatch* m, uint32_t a, uint32_t b) {
  if (atomicAdd(&m->count, 1ull) == 0) {
    m->first_a = a;
    m->first_b = b;
  }
}

__device__ bool same(float x, float y) {
  return __float_as_uint(x) == __float_as_uint(y) || (x != x && y != y);
}

__global__ void fp8_block_sweep(bool e5m2, bool pow2, Mismatch* m) {
  qnum::Layout L;
  L.recipe = QuantRecipe::fp8_block;
  L.e5m2 = e5m2;
  L.pow2 = pow2;
  const GroupInfo gr;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  // Canonical amax bits: 0 .. 0x7F800000 (Inf) and one NaN.
  for (uint64_t u = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; u <= 0x7F800001ull;
       u += stride) {
    const uint32_t am = u == 0x7F800001ull ? 0x7FC00000u : static_cast<uint32_t>(u);
    const qnum::BlockQuant q =
        qnum::block_quant_fast<QuantRecipe::fp8_block>(am, gr, L.e5m2, L.pow2);
    const qnum::ScalePair r = qnum::fp8_block_scale(__uint_as_float(am), e5m2, pow2);
    if (!same(q.mul, r.scale) || !same(q.scale_inv, r.scale_inv)) record(m, am, 0);
  }
}

// blockIdx.y: the e4m3 code 1..126; x: S_enc over [2^-117, FLT_MAX] and 1.
__global__ void nvfp4_mul_sweep(Mismatch* m) {
  const uint8_t code = static_cast<uint8_t>(blockIdx.y + 1);
  const float d = e4m3_to_float(code);
  const uint32_t lo = 0x05000000u;  // 2^-117
  const uint64_t n = 0x7F800000ull - lo;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    GroupInfo gr;
    const float s_enc = __uint_as_float(lo + static_cast<uint32_t>(i));
    qnum::set_nvfp4_s_enc(gr, s_enc);
    const float got = qnum::nvfp4_block_mul(gr, code);
    const float want = qnum::nvfp4_elem_scale(s_enc, d);
    if (!same(got, want)) record(m, __float_as_uint(s_enc), code);
  }
}

// The expert setup itself (nvfp4_expert's prescale), on the S_enc values of chosen amax.
__global__ void nvfp4_expert_kernel(const float* amax, int n, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  GroupInfo gr;
  qnum::set_expert_quant<QuantRecipe::nvfp4>(gr, amax[i], false, false);
  for (int c = 1; c < 127; ++c)
    out[i * 126 + c - 1] = qnum::nvfp4_block_mul(gr, static_cast<uint8_t>(c));
}

Mismatch run_sweep(const std::function<void(Mismatch*)>& launch) {
  Tensor t = Tensor::empty({4}, DType::int64, Device::CUDA);  // 32 bytes
  fill_bytes(t, 0);
  launch(reinterpret_cast<Mismatch*>(t.data()));
  GROUPMM_CHECK_LAUNCH();
  GROUPMM_CHECK_CUDA(cudaDeviceSynchronize());
  Mismatch h{};
  GROUPMM_CHECK_CUDA(cudaMemcpy(&h, t.data(), sizeof(h), cudaMemcpyDeviceToHost));
  return h;
}

TEST(BlockScaleGpu, Fp8BlockScalesEqualIeeeForEveryAmax) {
  GROUPMM_REQUIRE_GPU();
  for (const bool e5m2 : {false, true}) {
    for (const bool pow2 : {false, true}) {
      const Mismatch m =
          run_sweep([&](Mismatch* d) { fp8_block_sweep<<<4096, 256>>>(e5m2, pow2, d); });
      EXPECT_EQ(m.count, 0ull) << "e5m2=" << e5m2 << " pow2=" << pow2 << " first amax bits 0x"
                               << std::hex << m.first_a;
    }
  }
}

TEST(BlockScaleGpu, Nvfp4MultiplierEqualsIeeeForEverySencAndBlockScale) {
  GROUPMM_REQUIRE_GPU();
  const Mismatch m = run_sweep([](Mismatch* d) { nvfp4_mul_sweep<<<dim3(2048, 126), 256>>>(d); });
  EXPECT_EQ(m.count, 0ull) << "first S_enc bits 0x" << std::hex << m.first_a << " code 0x"
                           << m.first_b;
}

TEST(BlockScaleGpu, Nvfp4ExpertSetupMatchesHost) {
  GROUPMM_REQUIRE_GPU();
  // amax giving S_enc at and around the prescale thresholds, the degenerate ones (S_enc = 1) and
  // the extremes.
  std::vector<float> amax = {0.0f,
                             1.0f,
                             2688.0f,
                             6.0f,
                             1e-30f,
                             1e-38f,
                             1e-40f,
                             3.4e38f,
                             1e30f,
                             2688.0f / 0x1p64f,
                             2688.0f / 0x1p-64f,
                             std::nextafter(2688.0f / 0x1p64f, 0.0f),
                             std::nextafter(2688.0f / 0x1p-64f, 1e38f),
                             1.17549435e-38f,
                             std::numeric_limits<float>::infinity(),
                             std::nanf("")};
  const int n = static_cast<int>(amax.size());
  Tensor a = clone_to(host_view(amax, DType::fp32, {n}), Device::CUDA);
  Tensor o = Tensor::empty({n * 126}, DType::fp32, Device::CUDA);
  nvfp4_expert_kernel<<<1, 64>>>(a.ptr<float>(), n, o.ptr<float>());
  GROUPMM_CHECK_LAUNCH();
  std::vector<float> h(static_cast<size_t>(n) * 126);
  copy(host_view(h, DType::fp32, {n * 126}), o);
  for (int i = 0; i < n; ++i) {
    const float s_enc = qnum::nvfp4_s_enc(amax[i]);
    for (int c = 1; c < 127; ++c) {
      const float want = qnum::nvfp4_elem_scale(s_enc, e4m3_to_float(static_cast<uint8_t>(c)));
      const float got = h[static_cast<size_t>(i) * 126 + c - 1];
      EXPECT_TRUE(float_bits(got) == float_bits(want) || (std::isnan(got) && std::isnan(want)))
          << "amax " << amax[i] << " code " << c << ": " << got << " vs " << want;
    }
  }
}

}  // namespace
}  // namespace groupmm::test
