// `groupmm demo`: a routed expert MLP (gate_up GroupedLinear -> SwiGLU -> down GroupedLinear),
// forward and backward, on synthetic tokens routed top-k with a skewed (Zipf) distribution.
// On an sm_90 GPU: a Qwen3-30B-A3B-sized layer (128 experts, hidden 2048, expert width 768, 4096
// tokens x top-8); per-stage times, TFLOP/s, one-CUDA-graph step time, a per-expert histogram, and
// a check of every stage against naive double-precision loops on a sample of experts
// (demo/mlp_check.cpp). Without a GPU: a scaled-down layer on the CPU reference backend, same
// report.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>

#include "cli.hpp"
#include "common/timing.hpp"
#include "demo/mlp_check.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/moe.hpp"
#include "groupmm/nn/grouped_linear.hpp"
#include "groupmm/random.hpp"

namespace groupmm::tool {
namespace {

using nn::GroupedLinear;
using nn::GroupedLinearConfig;

struct DemoShape {
  int64_t G, H, I, tokens, topk;
  int64_t rows() const { return tokens * topk; }
};

// Top-k routing without replacement under Zipf(1.1) expert popularity (shuffled expert order).
std::vector<int64_t> route_zipf(const DemoShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> w(static_cast<size_t>(s.G));
  for (int64_t i = 0; i < s.G; ++i) w[size_t(i)] = 1.0 / std::pow(double(i + 1), 1.1);
  std::shuffle(w.begin(), w.end(), rng);
  std::vector<int64_t> counts(static_cast<size_t>(s.G), 0);
  std::vector<char> taken(static_cast<size_t>(s.G));
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::vector<double> wt = w;
    for (int64_t k = 0; k < s.topk; ++k) {
      std::discrete_distribution<int64_t> pick(wt.begin(), wt.end());
      const int64_t e = pick(rng);
      ++counts[size_t(e)];
      wt[size_t(e)] = 0.0;  // no expert twice for one token
    }
  }
  return counts;
}

void print_histogram(const std::vector<int64_t>& counts) {
  std::vector<int64_t> order(counts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return counts[size_t(a)] > counts[size_t(b)]; });
  const int64_t mx = std::max<int64_t>(1, counts[size_t(order[0])]);
  const size_t per_line = counts.size() > 32 ? 4 : 1;
  const int64_t zero = std::count(counts.begin(), counts.end(), 0);
  std::printf("\nrouted rows per expert (sorted; min %lld, median %lld, max %lld, %lld empty):\n",
              (long long)counts[size_t(order.back())],
              (long long)counts[size_t(order[order.size() / 2])], (long long)mx, (long long)zero);
  for (size_t i = 0; i < order.size(); i += per_line) {
    std::string line = " ";
    for (size_t j = i; j < std::min(order.size(), i + per_line); ++j) {
      const int64_t c = counts[size_t(order[j])];
      const int bar = int((c * 16 + mx - 1) / mx);
      char cell[64];
      std::snprintf(cell, sizeof cell, " e%03lld %5lld %-16s", (long long)order[j], (long long)c,
                    std::string(size_t(bar), '#').c_str());
      line += cell;
    }
    std::printf("%s\n", line.c_str());
  }
}

// ---- the MLP -----------------------------------------------------------------------------------
struct Mlp {
  DemoShape s;
  GroupedLinear up, down;
  Tensor x, h, dh, dy, splits;
  TensorView gu, y, da, dx;  // results of the last step (layer-owned)
  Mlp(Context& ctx, const DemoShape& shape)
      : s(shape),
        up(ctx, cfg(shape.G, shape.H, 2 * shape.I, shape.rows(), 1)),
        down(ctx, cfg(shape.G, shape.I, shape.H, shape.rows(), 2)) {
    const Device d = ctx.device();
    const int64_t M = s.rows();
    x = Tensor::empty({M, s.H}, DType::bf16, d, ctx.stream());
    dy = Tensor::empty({M, s.H}, DType::bf16, d, ctx.stream());
    h = Tensor::empty({M, s.I}, DType::bf16, d, ctx.stream());
    dh = Tensor::empty({M, 2 * s.I}, DType::bf16, d, ctx.stream());
    splits = Tensor::empty({s.G}, DType::int32, d, ctx.stream());
    fill_uniform(ctx, x, -1.0f, 1.0f, 11);
    fill_uniform(ctx, dy, -0.01f, 0.01f, 12);
  }
  static GroupedLinearConfig cfg(int64_t G, int64_t K, int64_t N, int64_t max_tokens,
                                 uint64_t seed) {
    GroupedLinearConfig c;
    c.experts = G;
    c.in_features = K;
    c.out_features = N;
    c.max_tokens = max_tokens;
    c.seed = seed;
    return c;
  }
  // Runs the six stages; mark(i) is called after stage i (timing hooks).
  template <class Mark>
  void step(Context& ctx, Mark&& mark) {
    gu = up.forward(ctx, x, splits);
    mark(0);
    swiglu_forward(ctx, gu, h);
    mark(1);
    y = down.forward(ctx, h, splits);
    mark(2);
    da = down.backward(ctx, dy);
    mark(3);
    swiglu_backward(ctx, da, gu, dh);
    mark(4);
    dx = up.backward(ctx, dh);
    mark(5);
  }
};

const char* kStage[] = {"gate_up forward", "swiglu forward",
                        "down forward",    "down backward (dgrad+wgrad)",
                        "swiglu backward", "gate_up backward (dgrad+wgrad)"};

// FLOPs (GEMM stages) or bytes moved (SwiGLU stages) of stage i.
double stage_work(const DemoShape& s, int i, bool* is_flops) {
  const double M = double(s.rows()), H = double(s.H), I = double(s.I);
  *is_flops = i != 1 && i != 4;
  switch (i) {
    case 0:
      return 2 * M * H * 2 * I;
    case 1:
      return 2 * M * 3 * I;
    case 2:
      return 2 * M * I * H;
    case 3:
      return 4 * M * I * H;
    case 4:
      return 2 * M * 5 * I;
    default:
      return 4 * M * H * 2 * I;
  }
}

// ---- the command -------------------------------------------------------------------------------
struct DemoOptions {
  bool cpu = false;
  DemoShape s{0, 0, 0, 0, 0};
  int iters = 0;
  // Options not given take the device's default (the GPU and CPU layers differ).
  CLI::Option *experts, *hidden, *width, *tokens, *topk, *iters_opt;
};

// Bytes the demo allocates on the device it runs on: activations and gradients of M routed rows,
// two grouped weights and their grads (bf16); the layers' workspaces are small beside them.
double demo_bytes(const DemoShape& s) {
  const double M = double(s.rows()), G = double(s.G), H = double(s.H), I = double(s.I);
  return 2.0 * (4 * M * H + 6 * M * I + 6 * G * H * I) * 1.1;
}

// The layer of the options, the device's defaults where an option is not given; its sizes checked
// against each other and the memory there (usage errors).
DemoShape demo_shape(const DemoOptions& o, Device dev) {
  DemoShape s =
      dev == Device::CUDA ? DemoShape{128, 2048, 768, 4096, 8} : DemoShape{32, 512, 256, 1024, 4};
  if (o.experts->count()) s.G = o.s.G;
  if (o.hidden->count()) s.H = o.s.H;
  if (o.width->count()) s.I = o.s.I;
  if (o.tokens->count()) s.tokens = o.s.tokens;
  if (o.topk->count()) s.topk = o.s.topk;
  if (s.topk > s.G)
    throw UsageError("--topk " + std::to_string(s.topk) + " is more than --experts " +
                     std::to_string(s.G) + " (each token picks distinct experts)");
  if (s.rows() > INT32_MAX)
    throw UsageError("--tokens x --topk = " + std::to_string(s.rows()) +
                     " routed rows is more than 2^31 - 1 (the demo's int32 splits)");
  check_fits_memory("demo: this layer", demo_bytes(s), dev,
                    "--tokens, --experts, --hidden or --width");
  return s;
}

void print_demo_header(const DemoShape& s, bool gpu, bool cpu_asked) {
  std::printf(
      "groupmm demo: routed expert MLP (gate_up GroupedLinear -> SwiGLU -> down GroupedLinear), "
      "forward + backward\n");
  if (gpu) {
    cudaDeviceProp p{};
    int d = 0;
    GROUPMM_CHECK_CUDA(cudaGetDevice(&d));
    GROUPMM_CHECK_CUDA(cudaGetDeviceProperties(&p, d));
    std::printf(
        "  ran on: GPU %d, %s (sm_%d%d, %d SMs), CUDA backend (Qwen3-30B-A3B-sized layer)\n", d,
        p.name, p.major, p.minor, p.multiProcessorCount);
  } else {
    std::printf("  ran on: CPU reference backend (%s), scaled-down layer\n",
                cpu_asked ? "--cpu given" : "no sm_90 GPU visible");
  }
  std::printf(
      "  layer: %lld experts, hidden %lld, expert width %lld (gate_up N=%lld), bf16, no bias\n",
      (long long)s.G, (long long)s.H, (long long)s.I, (long long)(2 * s.I));
  std::printf("  tokens: %lld x top-%lld = %lld routed rows, Zipf(1.1) expert popularity\n",
              (long long)s.tokens, (long long)s.topk, (long long)s.rows());
  const double step_flops = 18.0 * double(s.rows()) * double(s.H) * double(s.I);
  if (!gpu && step_flops > 1e11)  // the reference loops run at a few GFLOP/s per core
    std::printf("  note: %.0f GFLOP per step on the CPU reference backend: this takes minutes\n",
                step_flops / 1e9);
  std::fflush(stdout);
}

// Each stage's median us over `iters` steps: CUDA events (after 3 warm-up steps) or wall clock.
std::vector<double> time_demo_stages(Context& ctx, Mlp& m, int iters) {
  std::vector<std::vector<double>> times(6);
  if (ctx.device() == Device::CUDA) {
    std::vector<cudaEvent_t> ev(7);
    for (auto& e : ev) GROUPMM_CHECK_CUDA(cudaEventCreate(&e));
    for (int it = 0; it < iters + 3; ++it) {
      GROUPMM_CHECK_CUDA(cudaEventRecord(ev[0], ctx.stream()));
      m.step(ctx,
             [&](int i) { GROUPMM_CHECK_CUDA(cudaEventRecord(ev[size_t(i) + 1], ctx.stream())); });
      GROUPMM_CHECK_CUDA(cudaEventSynchronize(ev[6]));
      for (int i = 0; it >= 3 && i < 6; ++i) {
        float ms = 0;
        GROUPMM_CHECK_CUDA(cudaEventElapsedTime(&ms, ev[size_t(i)], ev[size_t(i) + 1]));
        times[size_t(i)].push_back(ms * 1e3);
      }
    }
    for (auto& e : ev) cudaEventDestroy(e);
  } else {
    using clock = std::chrono::steady_clock;
    for (int it = 0; it < iters; ++it) {
      auto t0 = clock::now();
      m.step(ctx, [&](int i) {
        const auto t1 = clock::now();
        times[size_t(i)].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        t0 = t1;
      });
    }
  }
  ctx.check();  // device faults (none expected)
  std::vector<double> med;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    med.push_back(t[t.size() / 2]);
  }
  return med;
}

// The per-stage table (times in a unit that reads: the CPU's stages take seconds) and, on the
// GPU, the step as one CUDA graph.
void print_demo_stages(Context& ctx, Mlp& m, int iters) {
  const bool gpu = ctx.device() == Device::CUDA;
  const std::vector<double> us = time_demo_stages(ctx, m, iters);
  std::printf("\nper-stage times (%s, median of %d):\n", gpu ? "CUDA events, eager" : "wall clock",
              iters);
  double total_us = 0, total_flops = 0;
  const double unit = gpu ? 1e12 : 1e9;  // the CPU reference is reported in GFLOP/s
  const char* unit_name = gpu ? "TFLOP/s" : "GFLOP/s";
  for (int i = 0; i < 6; ++i) {
    bool flops = false;
    const double work = stage_work(m.s, i, &flops);
    total_us += us[size_t(i)];
    if (flops) total_flops += work;
    std::printf("  %-32s %13s  %9.2f %s\n", kStage[i], format_us(us[size_t(i)]).c_str(),
                work / (us[size_t(i)] * 1e-6) / (flops ? unit : 1e9), flops ? unit_name : "GB/s");
  }
  std::printf("  %-32s %13s  %9.2f %s (GEMM FLOPs over the whole step)\n", "total (sum of stages)",
              format_us(total_us).c_str(), total_flops / (total_us * 1e-6) / unit, unit_name);
  if (!gpu) return;  // the same step as one CUDA graph (graph safety of the whole layer, its speed)
  const double g_us = graph_replay_us(ctx, 3, iters, [&] { m.step(ctx, [](int) {}); });
  std::printf("  %-32s %13s  %9.2f TFLOP/s\n", "whole step as one CUDA graph",
              format_us(g_us).c_str(), total_flops / (g_us * 1e-6) / 1e12);
  ctx.check();
}

// The experts the check samples: a zero-row one (if any), the smallest with rows, the median and
// the largest.
std::vector<int64_t> sample_experts(const std::vector<int64_t>& counts) {
  std::vector<int64_t> order(counts.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return counts[size_t(a)] < counts[size_t(b)]; });
  std::vector<int64_t> sample;
  auto add = [&](int64_t g) {
    if (g >= 0 && std::find(sample.begin(), sample.end(), g) == sample.end()) sample.push_back(g);
  };
  int64_t smallest = -1;
  for (int64_t g : order)
    if (counts[size_t(g)] > 0 && smallest < 0) smallest = g;
  if (counts[size_t(order[0])] == 0) add(order[0]);  // a zero-row expert
  add(smallest);
  add(order[order.size() / 2]);
  add(order.back());  // the largest
  return sample;
}

// Every stage of the sampled experts against naive double-precision loops: true when within 1e-2.
bool check_demo_experts(const Mlp& m, const std::vector<int64_t>& counts) {
  std::vector<int64_t> start(counts.size(), 0);
  for (size_t g = 1; g < counts.size(); ++g) start[g] = start[g - 1] + counts[g - 1];
  const std::vector<int64_t> sample = sample_experts(counts);
  const auto t_check = std::chrono::steady_clock::now();
  const MlpViews views{m.s.H,
                       m.s.I,
                       m.x,
                       m.gu,
                       m.h,
                       m.y,
                       m.dy,
                       m.da,
                       m.dh,
                       m.dx,
                       m.up.weight(),
                       m.down.weight(),
                       m.up.weight_grad(),
                       m.down.weight_grad()};
  std::printf(
      "\ncheck of every stage of %zu sampled experts against naive double-precision loops\n"
      "(tools/demo/mlp_check.cpp, independent of both backends; inputs from this run):\n",
      sample.size());
  double worst_all = 0;
  for (int64_t g : sample) {
    const ExpertCheck c = check_expert_naive(views, g, start[size_t(g)], counts[size_t(g)]);
    if (!(c.worst <= worst_all)) worst_all = c.worst;  // NaN included
    std::printf("  expert %3lld  %5lld rows  worst rel err %.2e (%s)\n", (long long)g,
                (long long)counts[size_t(g)], c.worst, c.worst_stage.c_str());
  }
  const bool ok = worst_all <= 1e-2;
  std::printf(
      "  up to 16 rows per expert for forward, dgrad and SwiGLU, 256 entries of each weight "
      "grad\n"
      "  tolerance 1e-2 (bf16 data, fp32 accumulation): %s  [%.1f s]\n",
      ok ? "PASS" : "FAIL",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_check).count());
  return ok;
}

int run_demo(const DemoOptions& o) {
  const auto t_start = std::chrono::steady_clock::now();
  const Device dev = o.cpu ? Device::CPU : default_device();
  const bool gpu = dev == Device::CUDA;
  const DemoShape s = demo_shape(o, dev);
  const int iters = o.iters_opt->count() ? o.iters : gpu ? 20 : 1;
  print_demo_header(s, gpu, o.cpu);
  bool ok = false;
  {
    const GpuStream stream(gpu);
    Context ctx(dev, stream);
    const std::vector<int64_t> counts = route_zipf(s, 2024);
    Mlp m(ctx, s);
    std::vector<int32_t> hs(counts.begin(), counts.end());
    copy(m.splits, TensorView(hs.data(), DType::int32, Device::CPU, {s.G}), ctx.stream());
    print_histogram(counts);
    print_demo_stages(ctx, m, iters);
    ok = check_demo_experts(m, counts);
  }
  std::printf("\ndemo %s on the %s in %.1f s\n", ok ? "passed" : "FAILED",
              gpu ? "GPU" : "CPU reference backend",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
  return ok ? 0 : 1;
}

void add_demo_options(CLI::App& app, DemoOptions& o) {
  app.add_flag("--cpu", o.cpu, "run on the CPU reference backend even with a GPU");
  o.experts = add_int(app, "--experts", o.s.G, 1, 4096, "experts G (default: GPU 128, CPU 32)");
  o.hidden =
      add_int(app, "--hidden", o.s.H, 1, 65536, "hidden size H (default: GPU 2048, CPU 512)");
  o.width = add_int(app, "--width", o.s.I, 1, 65536,
                    "expert width I; gate_up has 2I outputs (default: GPU 768, "
                    "CPU 256)");
  o.tokens = add_int(app, "--tokens", o.s.tokens, 1, int64_t(1) << 30,
                     "tokens routed (default: GPU 4096, CPU 1024)");
  o.topk = add_int(app, "--topk", o.s.topk, 1, 64,
                   "experts per token, <= --experts (default: GPU 8, CPU 4)");
  o.iters_opt = add_iters(app, o.iters, "timed steps (default: GPU 20, CPU 1)");
}

Register reg_demo(command<DemoOptions>(
    "", "demo",
    "routed expert MLP forward + backward, checked against naive loops (GPU: a "
    "Qwen3-30B-A3B-sized layer; CPU: scaled down)",
    add_demo_options, run_demo));

}  // namespace
}  // namespace groupmm::tool
