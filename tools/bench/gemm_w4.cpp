// `groupmm bench gemm --weights nvfp4|mxfp4`: the 4-bit weight grouped GEMM (decode and prefill
// shapes) against our bf16 grouped GEMM on the same shapes, splits and (bf16) weights, in one run.
// Per case: the path automatic picks and the time of every path (decode, prefill, fused on its
// default RS kernel with scale warps, on the RS kernel without them (rs_256x128) and on the kernel
// layer's coop_128x256; up to 64 rows an expert, decode with 8, 16 and 32 tokens a pass), the
// bf16 engine, the automatic path's ratio
// to it, TFLOP/s, and GB/s of the bytes the GEMM reads (the weights and scales of the experts
// with rows, plus the activations) as a fraction of the device-to-device copy bandwidth measured
// in the same run. Each path is validated first against the bf16 GEMM of the dequantized weights
// (DeepGEMM's diff < 1e-3).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "bench/suites.hpp"
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

const W4Shape kW4Cases[] = {
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
    // gpt-oss at 16, 128 and 256 tokens (about 0.5, 4 and 8 rows an expert, top-4): the spread of
    // the routing, not its mean, sets how many passes the busiest experts take.
    {"decode_gptoss_gate_up_16tok", 128, 5760, 2880, "top4", 16, true, false},
    {"decode_gptoss_gate_up_128tok", 128, 5760, 2880, "top4", 128, true, false},
    {"decode_gptoss_gate_up_256tok", 128, 5760, 2880, "top4", 256, true, false},
    {"decode_gptoss_down_256tok", 128, 2880, 2880, "top4", 256, true, false},
    {"prefill_qwen3_2048rows", 128, 1536, 2048, "balanced", 128 * 2048, false, true},
    {"prefill_dsv3_2048rows", 32, 4096, 7168, "balanced", 32 * 2048, false, true},
    // gpt-oss-120b's experts at 8192 tokens (the serving issue's prefill row), 1024, 4096 and
    // 2048, 4096 and 16384 (about 32, 64, 128 and 512 rows an expert: where the paths cross).
    {"prefill_gptoss_gate_up_8192tok", 128, 5760, 2880, "top4", 8192, false, false},
    {"prefill_gptoss_down_8192tok", 128, 2880, 2880, "top4", 8192, false, false},
    {"mid_gptoss_gate_up_1024tok", 128, 5760, 2880, "top4", 1024, false, false},
    {"mid_gptoss_gate_up_2048tok", 128, 5760, 2880, "top4", 2048, false, false},
    {"mid_gptoss_gate_up_4096tok", 128, 5760, 2880, "top4", 4096, false, false},
    {"prefill_gptoss_gate_up_16384tok", 128, 5760, 2880, "top4", 16384, false, false},
    {"mid_gptoss_gate_up_1536tok", 128, 5760, 2880, "top4", 1536, false, false},
    {"prefill_gptoss_gate_up_32768tok", 128, 5760, 2880, "top4", 32768, false, false},
    // Qwen3's experts at 48, 64, 256 and 512 rows an expert: the crossings on a narrower shape.
    {"mid_qwen3_48rows", 128, 1536, 2048, "balanced", 128 * 48, false, false},
    {"mid_qwen3_64rows", 128, 1536, 2048, "balanced", 128 * 64, false, false},
    {"mid_qwen3_256rows", 128, 1536, 2048, "balanced", 128 * 256, false, false},
    {"mid_qwen3_512rows", 128, 1536, 2048, "balanced", 128 * 512, false, false},
};

std::vector<int64_t> w4_routing(const W4Shape& s) {
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

// One case's tensors: x, the bf16 weights, their 4-bit form and its dequantized copy (the
// validation's reference weights), outputs and splits.
struct W4Case {
  int64_t G, M = 0, N, K, active = 0;
  std::vector<int64_t> splits;
  Tensor x, w, wd, y, yr, ds;
  QuantizedBuffers qb;
  GroupedTensor wq;

  W4Case(Context& ctx, const W4Shape& s, QuantRecipe recipe, uint64_t& seed)
      : G(s.G), N(s.N), K(s.K), splits(w4_routing(s)) {
    cudaStream_t st = ctx.stream();
    for (auto v : splits) M += v, active += v > 0;
    x = Tensor::empty({M, K}, DType::bf16, Device::CUDA, st);
    w = Tensor::empty({G, N, K}, DType::bf16, Device::CUDA, st);
    wd = Tensor::empty({G, N, K}, DType::bf16, Device::CUDA, st);
    y = Tensor::empty({M, N}, DType::bf16, Device::CUDA, st);
    yr = Tensor::empty({M, N}, DType::bf16, Device::CUDA, st);
    ds = Tensor::empty({G}, DType::int64, Device::CUDA, st);
    fill_uniform(ctx, x, -1.0f, 1.0f, seed++);
    fill_uniform(ctx, w, -0.05f, 0.05f, seed++);
    copy(ds, TensorView(splits.data(), DType::int64, Device::CPU, {G}), st);
    QuantizeConfig qc;
    qc.recipe = recipe;
    qc.direction = QuantDirection::rowwise;
    qb = allocate_quantized(group_quantize_shapes(G * N, K, G, qc), Device::CUDA, st);
    GroupQuantizeArgs q;
    q.input = w;
    q.config = qc;
    q.out = qb.view(G, TensorView(), qc);
    wq = group_quantize(ctx, q);
    GroupDequantizeArgs dq;
    dq.in = wq;
    dq.config = qc;
    dq.out = wd;
    group_dequantize(ctx, dq);
  }
};

// Every path's time (ms): decode, prefill, fused (its default, the RS kernel with scale warps),
// fused on the RS kernel without them (config rs_256x128) and on the kernel layer's variant
// (config coop_128x256), decode with passes of 8, 16 and 32 tokens forced (cases of at most
// kPassRows rows an expert; 0 elsewhere), and the bf16 engine on bf16 weights.
constexpr int kW4Paths = 8;
constexpr int64_t kPassRows = 64;
struct W4Times {
  double decode = 0, prefill = 0, fused = 0, rs = 0, coop = 0, bf16 = 0;
  double pass[3] = {0, 0, 0};  // decode with 8, 16, 32 tokens a pass
  double of(W4Path p) const {
    return p == W4Path::decode ? decode : p == W4Path::prefill ? prefill : fused;
  }
};

// The 4-bit GEMM on the first `n` of `paths` (decode, prefill, fused, fused rs, fused coop, then
// decode with passes of 8, 16, 32 tokens) and the bf16 engine.
W4Times time_w4_case(Context& ctx, const W4GemmArgs (&paths)[kW4Paths], int n,
                     const GroupedGemmArgs& h, int iters) {
  size_t ws = grouped_gemm_workspace_size(ctx, h);
  for (int i = 0; i < n; ++i) ws = std::max(ws, grouped_gemm_workspace_size(ctx, paths[i]));
  ctx.reserve_workspace(ws);
  cudaStream_t st = ctx.stream();
  double ms[kW4Paths] = {};
  for (int i = 0; i < n; ++i)
    ms[i] = median_ms(st, 3, iters, [&](int) { grouped_gemm(ctx, paths[i]); });
  W4Times t;
  t.decode = ms[0], t.prefill = ms[1], t.fused = ms[2], t.rs = ms[3], t.coop = ms[4];
  for (int i = 0; i < 3; ++i) t.pass[i] = ms[5 + i];
  t.bf16 = median_ms(st, 3, iters, [&](int) { grouped_gemm(ctx, h); });
  return t;
}

// The targets: decode >= 2.8x the bf16 engine and >= 75% of copy bandwidth; prefill >= 85%
// of the bf16 engine's TFLOP/s (at >= 2048 rows per expert).
std::string w4_targets(const W4Shape& s, double ratio, double frac) {
  if (!s.targets) return "";
  if (!s.decode) return ratio >= 0.85 ? "tflops ok" : "tflops MISS";
  return std::string(ratio >= 2.8 ? "ratio ok" : "ratio MISS") +
         (frac >= 0.75 ? ", bw ok" : ", bw MISS");
}

const Table kW4Table({text_col("case", 24),
                      int_col("G", 4),
                      int_col("M", 6),
                      int_col("N", 5),
                      int_col("K", 5),
                      text_col("path", 7),
                      num_col("w4_us", 9, 1),
                      num_col("decode_us", 9, 1),
                      num_col("prefill_us", 10, 1),
                      num_col("fused_us", 9, 1),
                      num_col("rs_us", 9, 1),
                      num_col("coop_us", 9, 1),
                      text_col("pass8/16/32", 17),
                      num_col("bf16_us", 9, 1),
                      num_col("xbf16", 6, 2),
                      num_col("TFLOP/s", 7, 1),
                      num_col("GB/s", 6, 0),
                      num_col("of_copy", 7, 2),
                      num_col("diff", 9, 2, 'e'),
                      Column{"targets", 0, 's', 0, true, "", "  "}});

// One case: validated, timed, printed and recorded; the host time per call after the first
// decode case (`host_timed`).
void run_w4_case(Context& ctx, const BenchGemmOptions& o, const W4Shape& s, QuantRecipe recipe,
                 double copy_gbs, uint64_t& seed, bool& host_timed, Failures& failures,
                 JsonFile& json) {
  const W4Case c(ctx, s, recipe, seed);
  W4GemmArgs a;
  a.x = c.x;
  a.w = c.wq;
  a.out = c.y;
  a.splits = c.ds;
  const W4Path path = w4_gemm_path(ctx, a);
  struct PathRun {
    W4Path path;
    const char* config;
  };
  const PathRun runs[kW4Paths] = {
      {W4Path::decode, ""},          {W4Path::prefill, ""},           {W4Path::fused, ""},
      {W4Path::fused, "rs_256x128"}, {W4Path::fused, "coop_128x256"}, {W4Path::decode, "pass8"},
      {W4Path::decode, "pass16"},    {W4Path::decode, "pass32"}};
  W4GemmArgs paths[kW4Paths];
  for (int i = 0; i < kW4Paths; ++i) {
    paths[i] = a;
    paths[i].path = runs[i].path;
    paths[i].config = runs[i].config;
  }
  const int n_paths = c.M <= kPassRows * c.G ? kW4Paths : 5;
  GroupedGemmArgs h;
  h.a = c.x;
  h.b = c.w;
  h.out = c.yr;
  h.splits = c.ds;
  GroupedGemmArgs hd = h;  // the bf16 GEMM of the dequantized weights: the reference
  hd.b = c.wd;
  grouped_gemm(ctx, hd);
  ctx.check();
  // every path computes the same products: each validated against the reference
  double diff = 0;
  bool ok = true;
  for (int i = 0; i < n_paths; ++i) {
    fill_bytes(c.y, 0xFF, ctx.stream());
    grouped_gemm(ctx, paths[i]);
    ctx.check();
    const double d = calc_diff(c.y, c.yr);
    ok = failures.check(d < 1e-3) && ok;
    diff = std::max(diff, d);
  }
  const W4Times t =
      time_w4_case(ctx, paths, n_paths, h, s.decode ? o.iters : std::max(3, o.iters / 4));
  const std::string passes = n_paths == kW4Paths ? detail::cat(std::lround(t.pass[0] * 1e3), "/",
                                                               std::lround(t.pass[1] * 1e3), "/",
                                                               std::lround(t.pass[2] * 1e3))
                                                 : std::string("-");
  const double w4 = t.of(path);
  const double scale_bytes = double(c.N * c.K) / (recipe == QuantRecipe::nvfp4 ? 16 : 32);
  const double bytes =
      double(c.active) * (double(c.N * c.K) / 2 + scale_bytes) + double(c.M * c.K) * 2;
  const double gbs = bytes / (w4 * 1e-3) / 1e9, frac = gbs / copy_gbs;
  const double flops = 2.0 * double(c.M) * double(c.N) * double(c.K);
  const double ratio = t.bf16 / w4;
  kW4Table.print_row({s.name,
                      c.G,
                      c.M,
                      c.N,
                      c.K,
                      w4_path_name(path),
                      w4 * 1e3,
                      t.decode * 1e3,
                      t.prefill * 1e3,
                      t.fused * 1e3,
                      t.rs * 1e3,
                      t.coop * 1e3,
                      passes,
                      t.bf16 * 1e3,
                      ratio,
                      flops / (w4 * 1e-3) / 1e12,
                      gbs,
                      frac,
                      diff,
                      w4_targets(s, ratio, frac)},
                     ok ? "" : "  FAILED");
  std::printf("    %s | decode: %s | prefill: %s | fused: %s | rs: %s | coop: %s | bf16: %s\n",
              gemm_config_name(ctx, a).c_str(), gemm_config_name(ctx, paths[0]).c_str(),
              gemm_config_name(ctx, paths[1]).c_str(), gemm_config_name(ctx, paths[2]).c_str(),
              gemm_config_name(ctx, paths[3]).c_str(), gemm_config_name(ctx, paths[4]).c_str(),
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
  json.add(JsonRecord()
               .add("case", s.name)
               .add("G", c.G)
               .add("M", c.M)
               .add("N", c.N)
               .add("K", c.K)
               .add("path", w4_path_name(path))
               .add("us", w4 * 1e3)
               .add("decode_us", t.decode * 1e3)
               .add("prefill_us", t.prefill * 1e3)
               .add("fused_us", t.fused * 1e3)
               .add("fused_rs_us", t.rs * 1e3)
               .add("fused_coop_us", t.coop * 1e3)
               .add("decode_pass8_us", t.pass[0] * 1e3)
               .add("decode_pass16_us", t.pass[1] * 1e3)
               .add("decode_pass32_us", t.pass[2] * 1e3)
               .add("bf16_us", t.bf16 * 1e3)
               .add("bytes", bytes)
               .add("flops", flops)
               .add("diff", diff)
               .add("config", gemm_config_name(ctx, a)));
}

}  // namespace

std::vector<std::string> gemm_w4_case_names() {
  std::vector<std::string> v;
  for (const W4Shape& s : kW4Cases) v.push_back(s.name);
  return v;
}

int run_gemm_w4(const BenchGemmOptions& o, cudaStream_t stream) {
  const QuantRecipe recipe = o.weights == "nvfp4" ? QuantRecipe::nvfp4 : QuantRecipe::mxfp4;
  JsonFile json(o.json_path);
  Context ctx(Device::CUDA, stream);
  const GpuInfo gpu = gpu_info(ctx);
  const double copy_gbs = copy_bandwidth_gbs(stream);
  std::printf("groupmm bench gemm --weights %s on %s (%d SMs); copy bandwidth %.0f GB/s\n",
              recipe_name(recipe), gpu.name.c_str(), gpu.sms, copy_gbs);
  kW4Table.print_header();
  Failures failures;
  bool host_timed = false;
  uint64_t seed = 21;
  for (const W4Shape& s : kW4Cases)
    if (case_matches(o.case_filter, s.name))
      run_w4_case(ctx, o, s, recipe, copy_gbs, seed, host_timed, failures, json);
  json.write(JsonRecord()
                 .add("device", gpu.name)
                 .add("weights", recipe_name(recipe))
                 .add("copy_gbs", copy_gbs));
  return failures.summary();
}

}  // namespace groupmm::tool
