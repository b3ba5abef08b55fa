// `groupmm demo`: a routed expert MLP (gate_up GroupedLinear -> SwiGLU -> down GroupedLinear),
// forward and backward, on synthetic tokens routed top-k with a skewed (Zipf) distribution.
// On an sm_90 GPU: a Qwen3-30B-A3B-sized layer (128 experts, hidden 2048, expert width 768, 4096
// tokens x top-8); per-stage times, TFLOP/s, one-CUDA-graph step time, a per-expert histogram, and
// a check of every stage against the CPU reference on a sample of experts. Without a GPU: a
// scaled-down layer on the CPU reference backend, same report.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>

#include "bench_common.hpp"
#include "commands.hpp"
#include "cpu/cpu_util.hpp"
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
std::vector<int64_t> route(const DemoShape& s, uint64_t seed) {
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

// ---- the MLP
// --------------------------------------------------------------------------------------
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

// ---- check against the CPU reference on a few experts
// --------------------------------------------
std::vector<float> rows_of(const TensorView& t, int64_t start, int64_t rows) {
  const int64_t cols = t.dim(t.rank - 1);
  std::vector<uint16_t> h(size_t(rows * cols));
  const TensorView src(static_cast<uint16_t*>(t.data) + start * cols, t.dtype, t.device,
                       {rows * cols});
  copy(TensorView(h.data(), t.dtype, Device::CPU, {rows * cols}), src);
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = bf16_bits_to_float(h[i]);
  return f;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Recomputes every stage of expert g with G = 1 CPU ops from the run's own stage inputs and
// returns the worst relative error (each stage checked in isolation).
double check_expert(Mlp& m, int64_t g, int64_t start, int64_t rows, std::string* worst) {
  Context cpu(Device::CPU);
  const int64_t H = m.s.H, I = m.s.I;
  auto host = [](std::vector<float>& v, std::initializer_list<int64_t> dims) {
    return TensorView(v.data(), DType::fp32, Device::CPU, dims);
  };
  // bf16 host copies of the inputs (the ops need bf16 operands)
  auto bf = [](const std::vector<float>& v, std::vector<uint16_t>& store,
               std::initializer_list<int64_t> dims) {
    store.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) store[i] = float_to_bf16_bits(v[i]);
    return TensorView(store.data(), DType::bf16, Device::CPU, dims);
  };
  auto x = rows_of(m.x, start, rows), gu = rows_of(m.gu, start, rows),
       h = rows_of(m.h, start, rows);
  auto y = rows_of(m.y, start, rows), dy = rows_of(m.dy, start, rows),
       da = rows_of(m.da, start, rows);
  auto dh = rows_of(m.dh, start, rows), dx = rows_of(m.dx, start, rows);
  auto w1 = rows_of(m.up.weight(), g * 2 * I, 2 * I), w2 = rows_of(m.down.weight(), g * H, H);
  auto dw1 = rows_of(m.up.weight_grad(), g * 2 * I, 2 * I),
       dw2 = rows_of(m.down.weight_grad(), g * H, H);
  std::vector<uint16_t> sx, sgu, sh, sdy, sda, sdh, sw1, sw2;
  std::vector<int32_t> split = {int32_t(rows)};
  const TensorView sp(split.data(), DType::int32, Device::CPU, {1});
  const TensorView X = bf(x, sx, {rows, H}), GU = bf(gu, sgu, {rows, 2 * I}),
                   Hh = bf(h, sh, {rows, I});
  const TensorView DY = bf(dy, sdy, {rows, H}), DA = bf(da, sda, {rows, I}),
                   DH = bf(dh, sdh, {rows, 2 * I});
  const TensorView W1 = bf(w1, sw1, {1, 2 * I, H}), W2 = bf(w2, sw2, {1, H, I});
  std::vector<uint16_t> o1(size_t(rows * 2 * I)), o2(size_t(rows * I)), o3(size_t(rows * H)),
      o4(size_t(rows * I));
  std::vector<uint16_t> o5(size_t(rows * 2 * I)), o6(size_t(rows * H));
  std::vector<float> r7(size_t(H * I)), r8(size_t(2 * I * H));
  const TensorView O1(o1.data(), DType::bf16, Device::CPU, {rows, 2 * I}),
      O2(o2.data(), DType::bf16, Device::CPU, {rows, I});
  const TensorView O3(o3.data(), DType::bf16, Device::CPU, {rows, H}),
      O4(o4.data(), DType::bf16, Device::CPU, {rows, I});
  const TensorView O5(o5.data(), DType::bf16, Device::CPU, {rows, 2 * I}),
      O6(o6.data(), DType::bf16, Device::CPU, {rows, H});
  gemm_forward(cpu, X, W1, sp, O1);                            // gate_up forward
  swiglu_forward(cpu, GU, O2);                                 // swiglu forward
  gemm_forward(cpu, Hh, W2, sp, O3);                           // down forward
  gemm_dgrad(cpu, DY, W2, sp, O4);                             // down dgrad
  gemm_wgrad(cpu, DY, Hh, sp, host(r7, {1, H, I}), false);     // down wgrad
  swiglu_backward(cpu, DA, GU, O5);                            // swiglu backward
  gemm_dgrad(cpu, DH, W1, sp, O6);                             // gate_up dgrad
  gemm_wgrad(cpu, DH, X, sp, host(r8, {1, 2 * I, H}), false);  // gate_up wgrad
  auto f = [](const TensorView& v) { return cpu::to_floats(v); };
  auto round_bf = [](std::vector<float> v) {  // the GPU wrote bf16 grads: compare like with like
    for (auto& e : v) e = bf16_bits_to_float(float_to_bf16_bits(e));
    return v;
  };
  const std::pair<const char*, double> errs[] = {
      {"gate_up y", rel(gu, f(O1))},       {"swiglu out", rel(h, f(O2))},
      {"down y", rel(y, f(O3))},           {"down dx", rel(da, f(O4))},
      {"down dW", rel(dw2, round_bf(r7))}, {"swiglu dgrad", rel(dh, f(O5))},
      {"gate_up dx", rel(dx, f(O6))},      {"gate_up dW", rel(dw1, round_bf(r8))}};
  double w = 0;
  for (const auto& e : errs)
    if (e.second >= w) w = e.second, *worst = e.first;
  if (rows == 0) {  // a zero-row expert must get dW = 0
    double mx = 0;
    for (float v : dw1) mx = std::max(mx, double(std::fabs(v)));
    for (float v : dw2) mx = std::max(mx, double(std::fabs(v)));
    *worst = "dW of a zero-row expert";
    return mx == 0 ? 0.0 : INFINITY;
  }
  return w;
}

// ---- the command
// -----------------------------------------------------------------------------------
int run_demo(const Args& args) {
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  const Device dev = has_flag(args, "--cpu") ? Device::CPU : default_device();
  const bool gpu = dev == Device::CUDA;
  DemoShape s = gpu ? DemoShape{128, 2048, 768, 4096, 8} : DemoShape{32, 512, 256, 1024, 4};
  s.G = std::stoll(get_opt(args, "--experts", std::to_string(s.G)));
  s.H = std::stoll(get_opt(args, "--hidden", std::to_string(s.H)));
  s.I = std::stoll(get_opt(args, "--width", std::to_string(s.I)));
  s.tokens = std::stoll(get_opt(args, "--tokens", std::to_string(s.tokens)));
  s.topk = std::stoll(get_opt(args, "--topk", std::to_string(s.topk)));
  const int iters = std::stoi(get_opt(args, "--iters", gpu ? "20" : "1"));
  GROUPMM_CHECK(s.topk >= 1 && s.topk <= s.G, "demo: --topk=", s.topk,
                " must be in [1, experts=", s.G, "]");

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
                has_flag(args, "--cpu") ? "--cpu given" : "no sm_90 GPU visible");
  }
  std::printf(
      "  layer: %lld experts, hidden %lld, expert width %lld (gate_up N=%lld), bf16, no bias\n",
      (long long)s.G, (long long)s.H, (long long)s.I, (long long)(2 * s.I));
  std::printf("  tokens: %lld x top-%lld = %lld routed rows, Zipf(1.1) expert popularity\n",
              (long long)s.tokens, (long long)s.topk, (long long)s.rows());

  cudaStream_t stream = nullptr;
  if (gpu) GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int rc = 0;
  {
    Context ctx(dev, stream);
    const std::vector<int64_t> counts = route(s, 2024);
    Mlp m(ctx, s);
    std::vector<int32_t> hs(counts.begin(), counts.end());
    copy(m.splits, TensorView(hs.data(), DType::int32, Device::CPU, {s.G}), stream);
    print_histogram(counts);

    // ---- per-stage times ----
    std::vector<std::vector<double>> times(6);
    if (gpu) {
      std::vector<cudaEvent_t> ev(7);
      for (auto& e : ev) GROUPMM_CHECK_CUDA(cudaEventCreate(&e));
      for (int it = 0; it < iters + 3; ++it) {
        GROUPMM_CHECK_CUDA(cudaEventRecord(ev[0], stream));
        m.step(ctx, [&](int i) { GROUPMM_CHECK_CUDA(cudaEventRecord(ev[size_t(i) + 1], stream)); });
        GROUPMM_CHECK_CUDA(cudaEventSynchronize(ev[6]));
        for (int i = 0; it >= 3 && i < 6; ++i) {
          float ms = 0;
          GROUPMM_CHECK_CUDA(cudaEventElapsedTime(&ms, ev[size_t(i)], ev[size_t(i) + 1]));
          times[size_t(i)].push_back(ms * 1e3);
        }
      }
      for (auto& e : ev) cudaEventDestroy(e);
    } else {
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
    std::printf("\nper-stage times (%s, median of %d):\n",
                gpu ? "CUDA events, eager" : "wall clock", iters);
    double total_us = 0, total_flops = 0;
    const double unit = gpu ? 1e12 : 1e9;  // the CPU reference is reported in GFLOP/s
    const char* unit_name = gpu ? "TFLOP/s" : "GFLOP/s";
    for (int i = 0; i < 6; ++i) {
      auto& t = times[size_t(i)];
      std::sort(t.begin(), t.end());
      const double us = t[t.size() / 2];
      bool flops = false;
      const double work = stage_work(s, i, &flops);
      total_us += us;
      if (flops) total_flops += work;
      std::printf("  %-32s %10.1f us  %9.2f %s\n", kStage[i], us,
                  work / (us * 1e-6) / (flops ? unit : 1e9), flops ? unit_name : "GB/s");
    }
    std::printf("  %-32s %10.1f us  %9.2f %s (GEMM FLOPs over the whole step)\n",
                "total (sum of stages)", total_us, total_flops / (total_us * 1e-6) / unit,
                unit_name);

    if (gpu) {  // the same step as one CUDA graph (graph safety of the whole layer, and its speed)
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      m.step(ctx, [](int) {});
      GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
      GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      const double ms = median_ms(stream, 3, iters,
                                  [&](int) { GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream)); });
      std::printf("  %-32s %10.1f us  %9.2f TFLOP/s\n", "whole step as one CUDA graph", ms * 1e3,
                  total_flops / (ms * 1e-3) / 1e12);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      ctx.check();
    }

    // ---- check against the CPU reference on a sample of experts ----
    std::vector<int64_t> order(counts.size()), start(counts.size(), 0);
    for (size_t g = 1; g < counts.size(); ++g) start[g] = start[g - 1] + counts[g - 1];
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return counts[size_t(a)] < counts[size_t(b)]; });
    std::vector<int64_t> sample;
    auto add = [&](int64_t g) {
      if (g >= 0 && std::find(sample.begin(), sample.end(), g) == sample.end()) sample.push_back(g);
    };
    const int64_t cap = gpu ? 512 : 1 << 30;  // keep the CPU reference under a few seconds
    int64_t smallest = -1, largest = -1;
    for (int64_t g : order) {
      if (counts[size_t(g)] > 0 && smallest < 0) smallest = g;
      if (counts[size_t(g)] > 0 && counts[size_t(g)] <= cap) largest = g;
    }
    if (counts[size_t(order[0])] == 0) add(order[0]);  // a zero-row expert
    add(smallest);
    add(order[order.size() / 2]);
    add(largest);
    const auto t_check = clock::now();
    std::printf(
        "\ncheck against the CPU reference (every stage of %zu sampled experts, inputs from this "
        "run):\n",
        sample.size());
    double worst_all = 0;
    for (int64_t g : sample) {
      std::string worst;
      const double e = check_expert(m, g, start[size_t(g)], counts[size_t(g)], &worst);
      worst_all = std::max(worst_all, e);
      std::printf("  expert %3lld  %5lld rows  worst rel err %.2e (%s)\n", (long long)g,
                  (long long)counts[size_t(g)], e, worst.c_str());
    }
    const bool ok = worst_all <= 1e-2;
    std::printf("  tolerance 1e-2 (bf16, fp32 accumulation): %s  [%.1f s]\n", ok ? "PASS" : "FAIL",
                std::chrono::duration<double>(clock::now() - t_check).count());
    rc = ok ? 0 : 1;
  }
  if (stream) cudaStreamDestroy(stream);
  std::printf("\ndemo %s on the %s in %.1f s\n", rc == 0 ? "passed" : "FAILED",
              gpu ? "GPU" : "CPU reference backend",
              std::chrono::duration<double>(clock::now() - t_start).count());
  return rc;
}

Register reg("demo",
             "routed expert MLP forward+backward (GPU: Qwen3-30B-A3B-sized; CPU: scaled down); "
             "[--cpu] [--experts G] [--hidden H] [--width I] [--tokens T] [--topk k] [--iters n]",
             run_demo);

}  // namespace
}  // namespace groupmm::tool
