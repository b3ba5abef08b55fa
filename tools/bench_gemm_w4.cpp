// `groupmm bench gemm --weights nvfp4|mxfp4`: the 4-bit weight grouped GEMM (decode and prefill
// shapes) against our bf16 grouped GEMM on the same shapes, splits and (bf16) weights, in one run.
// Per case: the 4-bit GEMM on its automatic path and on the other path, the bf16 engine, the
// ratio, TFLOP/s, and GB/s of the bytes the GEMM reads (the weights and scales of the experts
// with rows, plus the activations) as a fraction of the device-to-device copy bandwidth measured
// in the same run. Each case is validated first against the bf16 GEMM of the dequantized weights
// (DeepGEMM's diff < 1e-3).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "bench_common.hpp"
#include "bench_gemm_quantized.hpp"
#include "bench_gemm_w4.hpp"
#include "cli.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/quantize.hpp"
#include "groupmm/random.hpp"

namespace groupmm::tool {
namespace {

struct W4Shape {
  const char* name;
  int64_t G, N, K;
  const char* routing;  // balanced, zipf, topK (K = 2, 4, ...: K distinct experts per token)
  int64_t rows;         // balanced / zipf: M; topK: tokens (M = K * tokens)
  bool decode;          // a decode case (else prefill: fewer timed runs)
  bool targets;         // the targets apply (its own cases)
};

const W4Shape kCases[] = {
    {"decode_qwen3_8rows", 128, 1536, 2048, "balanced", 1024, true, true},
    {"decode_top2_128tok", 64, 4096, 7168, "top2", 128, true, true},
    {"decode_qwen3_zipf", 128, 1536, 2048, "zipf", 1024, true, false},
    // Larger decode batches: the 16- and 32-token passes of the decode kernel.
    {"decode_qwen3_16rows", 128, 1536, 2048, "balanced", 2048, true, false},
    {"decode_qwen3_32rows", 128, 1536, 2048, "balanced", 4096, true, false},
    // gpt-oss-120b's experts (MXFP4 checkpoints: 128 experts, top-4, hidden and expert width
    // 2880, so K is not a multiple of the kernel's 256-wide steps), 64 tokens.
    {"decode_gptoss_gate_up_64tok", 128, 5760, 2880, "top4", 64, true, false},
    {"decode_gptoss_down_64tok", 128, 2880, 2880, "top4", 64, true, false},
    {"prefill_qwen3_2048rows", 128, 1536, 2048, "balanced", 128 * 2048, false, true},
    {"prefill_dsv3_2048rows", 32, 4096, 7168, "balanced", 32 * 2048, false, true},
};

std::vector<int64_t> routing(const W4Shape& s) {
  const std::string r = s.routing;
  if (r.rfind("top", 0) != 0) return bench_splits(r, s.G, s.rows);
  const int k = std::stoi(r.substr(3));
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int64_t> e(0, s.G - 1);
  std::vector<int64_t> sp(size_t(s.G), 0);
  for (int64_t t = 0; t < s.rows; ++t) {
    std::vector<int64_t> chosen;
    while (static_cast<int>(chosen.size()) < k) {
      const int64_t c = e(rng);
      if (std::find(chosen.begin(), chosen.end(), c) == chosen.end()) chosen.push_back(c);
    }
    for (int64_t c : chosen) ++sp[size_t(c)];
  }
  return sp;
}

}  // namespace

std::vector<std::string> w4_bench_case_names() {
  std::vector<std::string> v;
  for (const W4Shape& s : kCases) v.push_back(s.name);
  return v;
}

int bench_gemm_w4(const W4BenchOptions& o, cudaStream_t stream) {
  GROUPMM_CHECK(o.recipe == QuantRecipe::nvfp4 || o.recipe == QuantRecipe::mxfp4,
                "bench gemm: --weights must be nvfp4 or mxfp4");
  std::ofstream json;
  if (!o.json_path.empty()) json = open_json(o.json_path);  // a wrong path fails before any work
  Context ctx(Device::CUDA, stream);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, ctx.device_index());
  const double copy_gbs = copy_bandwidth_gbs(stream);
  std::printf("groupmm bench gemm --weights %s on %s (%d SMs); copy bandwidth %.0f GB/s\n",
              recipe_name(o.recipe), prop.name, prop.multiProcessorCount, copy_gbs);
  std::printf("%-24s %4s %6s %5s %5s %-7s %9s %9s %9s %6s %7s %6s %7s %9s  %s\n", "case", "G", "M",
              "N", "K", "path", "w4_us", "other_us", "bf16_us", "xbf16", "TFLOP/s", "GB/s",
              "of_copy", "diff", "targets");
  if (json.is_open()) {
    json << "{\"device\": \"" << prop.name << "\", \"weights\": \"" << recipe_name(o.recipe)
         << "\", \"copy_gbs\": " << copy_gbs << ", \"cases\": [\n";
  }
  int failures = 0;
  bool first = true, host_timed = false;
  uint64_t seed = 21;
  for (const W4Shape& s : kCases) {
    if (!o.filter.empty() && std::string(s.name).find(o.filter) == std::string::npos) continue;
    const std::vector<int64_t> splits = routing(s);
    int64_t M = 0, active = 0;
    for (auto v : splits) M += v, active += v > 0;
    const int64_t G = s.G, N = s.N, K = s.K;
    Tensor x = Tensor::empty({M, K}, DType::bf16, Device::CUDA, stream);
    Tensor w = Tensor::empty({G, N, K}, DType::bf16, Device::CUDA, stream);
    Tensor wd = Tensor::empty({G, N, K}, DType::bf16, Device::CUDA, stream);
    Tensor y = Tensor::empty({M, N}, DType::bf16, Device::CUDA, stream);
    Tensor yr = Tensor::empty({M, N}, DType::bf16, Device::CUDA, stream);
    Tensor ds = Tensor::empty({G}, DType::int64, Device::CUDA, stream);
    fill_uniform(ctx, x, -1.0f, 1.0f, seed++);
    fill_uniform(ctx, w, -0.05f, 0.05f, seed++);
    copy(ds, TensorView(const_cast<int64_t*>(splits.data()), DType::int64, Device::CPU, {G}),
         stream);
    QuantizeConfig qc;
    qc.recipe = o.recipe;
    qc.direction = QuantDirection::rowwise;
    const QuantizedBuffers qb =
        allocate_quantized(group_quantize_shapes(G * N, K, G, qc), Device::CUDA, stream);
    GroupQuantizeArgs q;
    q.input = w;
    q.config = qc;
    q.out = qb.view(G, TensorView(), qc);
    const GroupedTensor wq = group_quantize(ctx, q);
    GroupDequantizeArgs dq;  // the validation's reference weights
    dq.in = wq;
    dq.config = qc;
    dq.out = wd;
    group_dequantize(ctx, dq);

    W4GemmArgs a;
    a.x = x;
    a.w = wq;
    a.out = y;
    a.splits = ds;
    const W4Path path = w4_gemm_path(ctx, a);
    W4GemmArgs other = a;
    other.path = path == W4Path::decode ? W4Path::prefill : W4Path::decode;
    GroupedGemmArgs h;
    h.a = x;
    h.b = w;
    h.out = yr;
    h.splits = ds;
    fill_bytes(y, 0xFF, stream);
    grouped_gemm(ctx, a);
    GroupedGemmArgs hd = h;
    hd.b = wd;
    grouped_gemm(ctx, hd);
    ctx.check();
    const double diff = calc_diff_device(y, yr);
    const bool ok = diff < 1e-3;
    failures += ok ? 0 : 1;
    const size_t ws =
        std::max({grouped_gemm_workspace_size(ctx, a), grouped_gemm_workspace_size(ctx, other),
                  grouped_gemm_workspace_size(ctx, h)});
    ctx.reserve_workspace(ws);
    const int iters = s.decode ? o.iters : std::max(3, o.iters / 4);
    const double t_w4 = median_ms(stream, 3, iters, [&](int) { grouped_gemm(ctx, a); });
    const double t_other =
        median_ms(stream, 1, std::max(3, iters / 2), [&](int) { grouped_gemm(ctx, other); });
    const double t_bf16 = median_ms(stream, 3, iters, [&](int) { grouped_gemm(ctx, h); });
    const double scale_bytes = double(N * K) / (o.recipe == QuantRecipe::nvfp4 ? 16 : 32);
    const double bytes = double(active) * (double(N * K) / 2 + scale_bytes) + double(M * K) * 2;
    const double gbs = bytes / (t_w4 * 1e-3) / 1e9, frac = gbs / copy_gbs;
    const double flops = 2.0 * double(M) * double(N) * double(K);
    const double tflops = flops / (t_w4 * 1e-3) / 1e12, ratio = t_bf16 / t_w4;
    // The targets: decode >= 2.8x the bf16 engine and >= 75% of copy bandwidth;
    // prefill >= 85% of the bf16 engine's TFLOP/s (at >= 2048 rows per expert).
    std::string targets;
    if (s.targets && s.decode)
      targets = std::string(ratio >= 2.8 ? "ratio ok" : "ratio MISS") +
                (frac >= 0.75 ? ", bw ok" : ", bw MISS");
    if (s.targets && !s.decode) targets = ratio >= 0.85 ? "tflops ok" : "tflops MISS";
    std::printf(
        "%-24s %4lld %6lld %5lld %5lld %-7s %9.1f %9.1f %9.1f %6.2f %7.1f %6.0f %7.2f %9.2e  "
        "%s%s\n",
        s.name, (long long)G, (long long)M, (long long)N, (long long)K, w4_path_name(path),
        t_w4 * 1e3, t_other * 1e3, t_bf16 * 1e3, ratio, tflops, gbs, frac, diff, targets.c_str(),
        ok ? "" : "  FAILED");
    std::printf("    %s | bf16: %s\n", gemm_config_name(ctx, a).c_str(),
                gemm_config_name(ctx, h).c_str());
    if (s.decode && !host_timed) {  // once: the first decode case
      host_timed = true;
      const double w4_host = host_batch_us(ctx, 5, 20, [&] { grouped_gemm(ctx, a); }).front();
      const double bf16_host = host_batch_us(ctx, 5, 20, [&] { grouped_gemm(ctx, h); }).front();
      std::printf(
          "    host time per call (no sync, best of 5 batches of 20): %.2f us (bf16 engine: "
          "%.2f us)\n",
          w4_host, bf16_host);
    }
    std::fflush(stdout);
    if (json.is_open()) {
      json << (first ? "" : ",\n") << "{\"case\": \"" << s.name << "\", \"G\": " << G
           << ", \"M\": " << M << ", \"N\": " << N << ", \"K\": " << K << ", \"path\": \""
           << w4_path_name(path) << "\", \"us\": " << t_w4 * 1e3
           << ", \"other_path_us\": " << t_other * 1e3 << ", \"bf16_us\": " << t_bf16 * 1e3
           << ", \"bytes\": " << bytes << ", \"flops\": " << flops << ", \"diff\": " << diff
           << ", \"config\": \"" << gemm_config_name(ctx, a) << "\"}";
      first = false;
    }
  }
  if (json.is_open()) {
    json << "\n]}\n";
    close_json(json, o.json_path);
  }
  std::printf("%s: %d case(s) failed validation\n", failures ? "FAIL" : "ok", failures);
  return failures ? 1 : 0;
}

}  // namespace groupmm::tool
