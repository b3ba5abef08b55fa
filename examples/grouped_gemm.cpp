// A grouped GEMM (the forward pass of an MoE expert layer) through groupmm's public API, on the
// CUDA backend when an sm_90 GPU is visible and on the CPU reference backend otherwise (or with
// --cpu), checked against a plain loop. Then the same call with a bad split, to show how device
// faults surface: the op clamps and reports, Context::check() throws.
#include <groupmm/convert.hpp>
#include <groupmm/gemm.hpp>
#include <groupmm/version.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

using groupmm::Device;
using groupmm::DType;
using groupmm::TensorView;

int main(int argc, char** argv) {
  const bool force_cpu = argc > 1 && std::strcmp(argv[1], "--cpu") == 0;
  const Device dev = force_cpu ? Device::CPU : groupmm::default_device();
  std::printf("groupmm %s, %s backend\n", GROUPMM_VERSION, groupmm::device_name(dev));

  // 4 experts, 40 tokens routed to them (expert 2 gets none), K = 64 inputs, N = 32 outputs.
  const int64_t G = 4, K = 64, N = 32;
  std::vector<int32_t> splits = {16, 8, 0, 16};
  const int64_t M = 40;
  std::vector<uint16_t> x(M * K), w(G * N * K), y(M * N);  // bf16 bits
  for (size_t i = 0; i < x.size(); ++i) x[i] = groupmm::float_to_bf16_bits(float(i % 7) - 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] = groupmm::float_to_bf16_bits(float(i % 5) / 8);

  // Views of the host data, and device copies when running on the GPU.
  const TensorView hx(x.data(), DType::bf16, Device::CPU, {M, K});
  const TensorView hw(w.data(), DType::bf16, Device::CPU, {G, N, K});
  const TensorView hy(y.data(), DType::bf16, Device::CPU, {M, N});
  const TensorView hs(splits.data(), DType::int32, Device::CPU, {G});
  groupmm::Context ctx(dev);  // default stream
  groupmm::Tensor dx, dw, dy, ds;
  TensorView vx = hx, vw = hw, vy = hy, vs = hs;
  if (dev == Device::CUDA) {
    dx = groupmm::clone_to(hx, dev), dw = groupmm::clone_to(hw, dev);
    dy = groupmm::Tensor::empty({M, N}, DType::bf16, dev), ds = groupmm::clone_to(hs, dev);
    vx = dx, vw = dw, vy = dy, vs = ds;
  }

  groupmm::gemm_forward(ctx, vx, vw, vs, vy);  // y_g = x_g W_g^T for every expert g
  ctx.check();                                 // throws groupmm::Error on a device fault
  if (dev == Device::CUDA) groupmm::copy(hy, vy);

  double worst = 0;
  for (int64_t g = 0, row = 0; g < G; row += splits[g], ++g)
    for (int64_t m = row; m < row + splits[g]; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0;
        for (int64_t k = 0; k < K; ++k)
          ref += double(groupmm::bf16_bits_to_float(x[m * K + k])) *
                 groupmm::bf16_bits_to_float(w[(g * N + n) * K + k]);
        const double err = std::fabs(groupmm::bf16_bits_to_float(y[m * N + n]) - ref);
        worst = std::fmax(worst, err / std::fmax(1.0, std::fabs(ref)));
      }
  std::printf("grouped GEMM of %lld experts: worst relative error %.1e against a plain loop\n",
              (long long)G, worst);

  // A split that runs past the 40 rows: nothing is written out of bounds, the fault is reported.
  splits[3] = 1000;
  if (dev == Device::CUDA) groupmm::copy(vs, hs);
  groupmm::gemm_forward(ctx, vx, vw, vs, vy);
  try {
    ctx.check();
    std::printf("bad split not reported\n");
    return 1;
  } catch (const groupmm::Error& e) {
    std::printf("bad split reported by Context::check(): %s\n", e.what());
  }
  return worst <= 1e-2 ? 0 : 1;
}
