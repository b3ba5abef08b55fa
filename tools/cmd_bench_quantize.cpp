// `groupmm bench quantize`: bandwidth of grouped quantization per recipe on MoE activation shapes,
// rowwise and rowwise+columnwise, against a device-to-device copy measured in the same run.
//
// Bytes counted: the input read once plus every output written (data, scales, amax). fp8_current
// and nvfp4 need each expert's amax first and read the input twice (the second read hits L2 under
// the fused amax schedule; see QuantizeConfig::amax_schedule, swept with --amax). Scales are in
// the layout block-scaled GEMMs read (swizzled 128x4 for mxfp8 / nvfp4, mn_major for fp8_block)
// unless --scales plain. Splits: balanced (the targets' case), or --pattern zipf / empty25 (the
// split patterns of docs/testing.md, each split rounded to an even row count: NVFP4's columnwise
// copy packs two rows per byte).
// Times: device time per call from CUDA-graph replays (the primary number), and one synchronized
// eager call at a time (adds the host launch work); each against the copy timed the same way.
// Each case is first validated bit for bit against the CPU reference on a reduced problem (the
// first rows, fewer experts) so a broken kernel never reports a bandwidth.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "cli.hpp"
#include "groupmm/convert.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm::tool {
namespace {

struct BenchCase {
  int64_t M, K, G;
  QuantRecipe recipe;
  QuantDirection dir;
  AmaxSchedule amax = AmaxSchedule::automatic;  // --amax (fp8_current, nvfp4)
  int amax_lag = 0;
  bool plain_scales = false;  // --scales plain instead of the layout GEMMs read
};

QuantizeConfig config_of(const BenchCase& c) {
  QuantizeConfig q;
  q.recipe = c.recipe;
  q.direction = c.dir;
  q.amax_schedule = c.amax;
  q.amax_lag = c.amax_lag;
  // The scale layout block-scaled GEMMs read: swizzled 128x4 (mxfp8, nvfp4), tokens contiguous
  // (fp8_block, as DeepGEMM / cuBLAS / TransformerEngine's GEMM-ready format).
  q.scale_layout = ScaleLayout::plain;
  if (!c.plain_scales && (c.recipe == QuantRecipe::mxfp8 || c.recipe == QuantRecipe::nvfp4))
    q.scale_layout = ScaleLayout::swizzled;
  if (!c.plain_scales && c.recipe == QuantRecipe::fp8_block) q.scale_layout = ScaleLayout::mn_major;
  return q;
}

Tensor random_bf16(int64_t M, int64_t K, Device d) {
  Tensor h = Tensor::empty({M, K}, DType::bf16, Device::CPU);
  std::mt19937_64 g(1234);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> e(-8.0f, 8.0f);
  uint16_t* p = h.ptr<uint16_t>();
  for (int64_t i = 0; i < M * K; ++i) p[i] = float_to_bf16_bits(n(g) * std::exp2(e(g)));
  return d == Device::CPU ? std::move(h) : clone_to(h, d);
}

// The bench's splits: a docs/testing.md pattern (bench_splits) with every split made even (an
// odd one gives a row to the next expert; M is even, so the last one ends even).
Tensor pattern_splits(const std::string& pattern, int64_t M, int64_t G, Device d) {
  const std::vector<int64_t> p = bench_splits(pattern, G, M);
  std::vector<int32_t> s(p.begin(), p.end());
  for (int64_t g = 0; g + 1 < G; ++g)
    if (s[size_t(g)] % 2 != 0) --s[size_t(g)], ++s[size_t(g) + 1];
  return clone_to(TensorView(s.data(), DType::int32, Device::CPU, {G}), d);
}

struct Outputs {
  QuantizedBuffers buf;
  GroupedTensor view;
  int64_t bytes = 0;
};

Outputs alloc_outputs(int64_t M, int64_t K, int64_t G, const QuantizeConfig& cfg, Device d,
                      const TensorView& splits) {
  Outputs o;
  o.buf = allocate_quantized(group_quantize_shapes(M, K, G, cfg), d);
  o.view = o.buf.view(G, splits, cfg);
  for (const Tensor* t : {&o.buf.data, &o.buf.scale_inv, &o.buf.columnwise_data,
                          &o.buf.columnwise_scale_inv, &o.buf.amax, &o.buf.global_scale})
    if (t->view().present()) {
      fill_bytes(*t, 0xFF);
      o.bytes += t->nbytes();
    }
  return o;
}

std::vector<uint8_t> host_bytes(const TensorView& v) {
  std::vector<uint8_t> h(static_cast<size_t>(v.nbytes()));
  if (!h.empty()) copy(TensorView(h.data(), DType::e8m0, Device::CPU, {v.nbytes()}), v);
  return h;
}

// Bit-exact check of the GPU kernels against the CPU reference on [rows, K] with g experts.
bool validate(const BenchCase& c) {
  const int64_t rows = 2124, G = 4;  // even splits: NVFP4 columnwise
  const QuantizeConfig cfg = config_of(c);
  Tensor hx = random_bf16(rows, c.K, Device::CPU);
  Tensor dx = clone_to(hx, Device::CUDA);
  std::vector<int32_t> s = {600, 0, 1100, 424};
  TensorView hs(s.data(), DType::int32, Device::CPU, {G});
  Tensor ds = clone_to(hs, Device::CUDA);
  Context cctx(Device::CPU), gctx(Device::CUDA);
  Outputs oc = alloc_outputs(rows, c.K, G, cfg, Device::CPU, hs);
  Outputs og = alloc_outputs(rows, c.K, G, cfg, Device::CUDA, ds);
  GroupQuantizeArgs a;
  a.config = cfg;
  a.input = hx;
  a.splits = hs;
  a.out = oc.view;
  group_quantize(cctx, a);
  a.input = dx;
  a.splits = ds;
  a.out = og.view;
  group_quantize(gctx, a);
  gctx.check();
  const TensorView* pairs[][2] = {{&oc.view.data, &og.view.data},
                                  {&oc.view.scale_inv, &og.view.scale_inv},
                                  {&oc.view.columnwise_data, &og.view.columnwise_data},
                                  {&oc.view.columnwise_scale_inv, &og.view.columnwise_scale_inv},
                                  {&oc.view.amax, &og.view.amax},
                                  {&oc.view.global_scale, &og.view.global_scale}};
  for (auto& p : pairs)
    if (p[0]->present() && host_bytes(*p[0]) != host_bytes(*p[1])) return false;
  return true;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of `fn` over `iters` runs after 3 warm-ups, timed with CUDA events.
template <class Fn>
float time_ms(cudaStream_t stream, int iters, Fn fn) {
  cudaEvent_t a, b;
  GROUPMM_CHECK_CUDA(cudaEventCreate(&a));
  GROUPMM_CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    GROUPMM_CHECK_CUDA(cudaEventRecord(a, stream));
    fn();
    GROUPMM_CHECK_CUDA(cudaEventRecord(b, stream));
    GROUPMM_CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    GROUPMM_CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

// Device time per call: `reps` calls captured into one CUDA graph, the median over `iters`
// replays (after 2 warm-up replays) divided by reps. The GPU runs the calls back to back, as in
// a captured training step, so the host's per-call launch work (validation, two or three kernel
// launches) is not in the number; time_ms above includes it (one synchronized call at a time).
template <class Fn>
float time_ms_graph(cudaStream_t stream, int iters, int reps, Fn fn) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) fn();
  GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const float ms =
      time_ms(stream, iters, [&] { GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms / static_cast<float>(reps);
}

struct Row {
  std::string recipe, dir, shape;
  bool valid;
  float us;  // graph replay (device time per call)
  double gbps, frac, target;
  float us_eager;  // one synchronized eager call (includes the host's launch work)
  double frac_eager;
};

double target_of(QuantRecipe r, QuantDirection d) {
  if (d != QuantDirection::both && r != QuantRecipe::fp8_current) return 0;  // targets: both
  switch (r) {
    case QuantRecipe::mxfp8:
    case QuantRecipe::fp8_block:
      return 0.75;
    case QuantRecipe::nvfp4:
      return 0.70;
    default:
      return 0.60;
  }
}

struct QuantOptions {
  int iters = 20;
  std::string json_path, recipe, direction, shape, pattern = "balanced", scales = "gemm";
  std::vector<std::string> amax{"automatic"};
};

// --amax items: automatic, separate, fused or fused:LAG (LAG > 0).
std::vector<std::pair<AmaxSchedule, int>> parse_amax(const std::vector<std::string>& items) {
  std::vector<std::pair<AmaxSchedule, int>> list;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon);
    int lag = 0;
    const bool ok = colon == std::string::npos ||
                    (name == "fused" && (lag = std::atoi(item.c_str() + colon + 1)) > 0 &&
                     std::to_string(lag) == item.substr(colon + 1));
    bool known = false;
    AmaxSchedule sched = AmaxSchedule::automatic;
    for (AmaxSchedule s : {AmaxSchedule::automatic, AmaxSchedule::separate, AmaxSchedule::fused})
      if (name == amax_schedule_name(s)) sched = s, known = true;
    if (!ok || !known)
      throw UsageError("--amax: '" + item +
                       "' is not one of automatic, separate, fused, fused:LAG (LAG > 0)");
    list.push_back({sched, lag});
  }
  return list;
}

int run_bench_quantize(const QuantOptions& o) {
  const std::vector<std::pair<AmaxSchedule, int>> amax_list = parse_amax(o.amax);
  GROUPMM_CHECK(cuda_available(), "bench quantize: needs an sm_90 GPU (none visible)");
  std::ofstream json;
  if (!o.json_path.empty()) json = open_json(o.json_path);  // a wrong path fails before any work
  const int iters = o.iters;
  constexpr int kGraphReps = 10;  // calls per captured graph (time_ms_graph)
  // Filters (profiling one case): --recipe NAME, --direction rowwise|columnwise|both, --shape MxK.
  const std::string& only_recipe = o.recipe;
  const std::string& only_dir = o.direction;
  const std::string& only_shape = o.shape;
  const std::string& pattern = o.pattern;
  const std::string& scales_opt = o.scales;
  const bool amax_default = amax_list.size() == 1 && amax_list[0].first == AmaxSchedule::automatic;
  const int64_t G = 32;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{65536, 7168}, {32768, 2048}};
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<Row> rows;
  double copy_gbps_max = 0;
  {
    Context ctx(Device::CUDA, stream);
    for (const auto& [M, K] : shapes) {
      if (!only_shape.empty() && only_shape != std::to_string(M) + "x" + std::to_string(K))
        continue;
      Tensor x = random_bf16(M, K, Device::CUDA);
      Tensor splits = pattern_splits(pattern, M, G, Device::CUDA);
      // The copy ceiling: a D2D memcpy of the input (read + write bytes).
      Tensor dst = Tensor::empty({M, K}, DType::bf16, Device::CUDA);
      const size_t in_bytes = static_cast<size_t>(x.nbytes());
      const float copy_ms = time_ms(stream, iters, [&] {
        GROUPMM_CHECK_CUDA(
            cudaMemcpyAsync(dst.data(), x.data(), in_bytes, cudaMemcpyDeviceToDevice, stream));
      });
      const float copy_ms_graph = time_ms_graph(stream, iters, kGraphReps, [&] {
        GROUPMM_CHECK_CUDA(
            cudaMemcpyAsync(dst.data(), x.data(), in_bytes, cudaMemcpyDeviceToDevice, stream));
      });
      const double copy_gbps = 2.0 * double(in_bytes) / (copy_ms_graph * 1e-3) / 1e9;
      const double copy_gbps_eager = 2.0 * double(in_bytes) / (copy_ms * 1e-3) / 1e9;
      copy_gbps_max = std::max(copy_gbps_max, copy_gbps);
      const std::string shape = "[" + std::to_string(M) + ", " + std::to_string(K) + "] G=32" +
                                (pattern == "balanced" ? "" : " " + pattern);
      rows.push_back({"copy (D2D)", "-", shape, true, copy_ms_graph * 1000, copy_gbps, 1.0, 0,
                      copy_ms * 1000, 1.0});
      for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block, QuantRecipe::mxfp8,
                            QuantRecipe::nvfp4})
        for (QuantDirection d :
             {QuantDirection::rowwise, QuantDirection::columnwise, QuantDirection::both}) {
          // columnwise alone only when asked for (profiling); the table has rowwise and both
          if ((!only_recipe.empty() && only_recipe != recipe_name(r)) ||
              (!only_dir.empty() && only_dir != quant_direction_name(d)) ||
              (only_dir.empty() && d == QuantDirection::columnwise))
            continue;
          const bool has_amax = r == QuantRecipe::fp8_current || r == QuantRecipe::nvfp4;
          for (const auto& [amax, amax_lag] : amax_list) {
            if (!has_amax && (amax != amax_list[0].first || amax_lag != amax_list[0].second))
              continue;
            const BenchCase c{M, K, G, r, d, amax, amax_lag, scales_opt == "plain"};
            std::string dir = quant_direction_name(d);
            if (has_amax && !amax_default)
              dir += std::string("/") + amax_schedule_name(amax) +
                     (amax_lag > 0 ? ":" + std::to_string(amax_lag) : "");
            const bool ok = validate(c);
            const QuantizeConfig cfg = config_of(c);
            Outputs o = alloc_outputs(M, K, G, cfg, Device::CUDA, splits);
            GroupQuantizeArgs a;
            a.input = x;
            a.splits = splits;
            a.config = cfg;
            a.out = o.view;
            ctx.reserve_workspace(group_quantize_workspace_size(ctx, a));
            const float ms_eager = time_ms(stream, iters, [&] { group_quantize(ctx, a); });
            const float ms =
                time_ms_graph(stream, iters, kGraphReps, [&] { group_quantize(ctx, a); });
            ctx.check();
            const double bytes = double(in_bytes) + double(o.bytes);
            const double gbps = bytes / (ms * 1e-3) / 1e9;
            const double gbps_eager = bytes / (ms_eager * 1e-3) / 1e9;
            rows.push_back({recipe_name(r), dir, shape, ok, ms * 1000, gbps, gbps / copy_gbps,
                            target_of(r, d), ms_eager * 1000, gbps_eager / copy_gbps_eager});
          }
        }
    }
  }
  cudaStreamDestroy(stream);
  if (json.is_open()) {
    char line[512];
    std::snprintf(line, sizeof line,
                  "{\"suite\": \"quantize\", \"copy_gbps\": %.1f, \"cases\": [\n", copy_gbps_max);
    json << line;
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::snprintf(
          line, sizeof line,
          "  {\"recipe\": \"%s\", \"direction\": \"%s\", \"shape\": \"%s\", \"valid\": %s, "
          "\"us\": %.2f, \"gbps\": %.1f, \"fraction_of_copy\": %.3f, \"target\": %.2f, "
          "\"us_eager\": %.2f, \"fraction_of_copy_eager\": %.3f}%s\n",
          r.recipe.c_str(), r.dir.c_str(), r.shape.c_str(), r.valid ? "true" : "false", r.us,
          r.gbps, r.frac, r.target, r.us_eager, r.frac_eager, i + 1 < rows.size() ? "," : "");
      json << line;
    }
    json << "]}\n";
    close_json(json, o.json_path);
  }
  std::printf("%-12s %-18s %-22s %-6s %10s %9s %8s %7s %10s %8s\n", "recipe", "direction", "shape",
              "valid", "us", "GB/s", "of copy", "target", "eager us", "of copy");
  for (const Row& r : rows)
    std::printf("%-12s %-18s %-22s %-6s %10.1f %9.1f %7.1f%% %6s %10.1f %7.1f%%\n",
                r.recipe.c_str(), r.dir.c_str(), r.shape.c_str(), r.valid ? "ok" : "FAIL", r.us,
                r.gbps, 100.0 * r.frac,
                r.target > 0 ? (std::to_string(int(r.target * 100)) + "%").c_str() : "-",
                r.us_eager, 100.0 * r.frac_eager);
  std::printf(
      "bytes = input read once + all outputs written; copy = cudaMemcpy D2D (read+write)\n"
      "us: device time per call, %d calls captured in a CUDA graph and replayed (median of %d)\n"
      "eager us: one call at a time, synchronized (includes the host's launch work); its\n"
      "fraction is of the copy timed the same way\n",
      kGraphReps, iters);
  return 0;
}

void add_quantize_options(CLI::App& app, QuantOptions& o) {
  add_iters(app, o.iters, "timed runs per case (median)")->capture_default_str();
  add_json(app, o.json_path);
  add_choice(app, "--recipe", o.recipe, {"fp8_current", "fp8_block", "mxfp8", "nvfp4"},
             "only this recipe");
  add_choice(app, "--direction", o.direction, {"rowwise", "columnwise", "both"},
             "only this direction (columnwise alone runs only when asked for)");
  add_choice(app, "--shape", o.shape, {"65536x7168", "32768x2048"}, "only this input shape MxK");
  add_choice(app, "--pattern", o.pattern, kSplitPatterns, "split pattern of the 32 experts")
      ->capture_default_str();
  add_choice(app, "--scales", o.scales, {"gemm", "plain"},
             "scale layout: the one GEMMs read (swizzled / mn_major) or plain")
      ->capture_default_str();
  app.add_option("--amax", o.amax,
                 "amax schedules of fp8_current / nvfp4 to sweep: automatic, "
                 "separate, fused, fused:LAG (comma separated)")
      ->delimiter(',')
      ->type_name("LIST")
      ->capture_default_str();
}

Register reg_cmd_bench_quantize(command<QuantOptions>(
    "bench", "quantize",
    "grouped quantization bandwidth per recipe (fp8_current, fp8_block, mxfp8, nvfp4) "
    "vs a device-to-device copy (GPU)",
    add_quantize_options, run_bench_quantize));

}  // namespace
}  // namespace groupmm::tool
