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

#include "bench/harness.hpp"
#include "groupmm/convert.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm::tool {
namespace {

struct QuantizeCase {
  int64_t M, K, G;
  QuantRecipe recipe;
  QuantDirection dir;
  AmaxSchedule amax = AmaxSchedule::automatic;  // --amax (fp8_current, nvfp4)
  int amax_lag = 0;
  bool plain_scales = false;  // --scales plain instead of the layout GEMMs read
};

QuantizeConfig quantize_config_of(const QuantizeCase& c) {
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

Tensor random_bf16_input(int64_t M, int64_t K, Device d) {
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
Tensor even_pattern_splits(const std::string& pattern, int64_t M, int64_t G, Device d) {
  const std::vector<int64_t> p = bench_splits(pattern, G, M);
  std::vector<int32_t> s(p.begin(), p.end());
  for (int64_t g = 0; g + 1 < G; ++g)
    if (s[size_t(g)] % 2 != 0) --s[size_t(g)], ++s[size_t(g) + 1];
  return clone_to(TensorView(s.data(), DType::int32, Device::CPU, {G}), d);
}

struct QuantizeOutputs {
  QuantizedBuffers buf;
  GroupedTensor view;
  int64_t bytes = 0;
};

QuantizeOutputs alloc_quantize_outputs(int64_t M, int64_t K, int64_t G, const QuantizeConfig& cfg,
                                       Device d, const TensorView& splits) {
  QuantizeOutputs o;
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

std::vector<uint8_t> quantize_bytes_of(const TensorView& v) {
  std::vector<uint8_t> h(static_cast<size_t>(v.nbytes()));
  if (!h.empty()) copy(TensorView(h.data(), DType::e8m0, Device::CPU, {v.nbytes()}), v);
  return h;
}

// Bit-exact check of the GPU kernels against the CPU reference on [rows, K] with g experts.
bool validate_quantize(const QuantizeCase& c) {
  const int64_t rows = 2124, G = 4;  // even splits: NVFP4 columnwise
  const QuantizeConfig cfg = quantize_config_of(c);
  Tensor hx = random_bf16_input(rows, c.K, Device::CPU);
  Tensor dx = clone_to(hx, Device::CUDA);
  std::vector<int32_t> s = {600, 0, 1100, 424};
  TensorView hs(s.data(), DType::int32, Device::CPU, {G});
  Tensor ds = clone_to(hs, Device::CUDA);
  Context cctx(Device::CPU), gctx(Device::CUDA);
  QuantizeOutputs oc = alloc_quantize_outputs(rows, c.K, G, cfg, Device::CPU, hs);
  QuantizeOutputs og = alloc_quantize_outputs(rows, c.K, G, cfg, Device::CUDA, ds);
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
    if (p[0]->present() && quantize_bytes_of(*p[0]) != quantize_bytes_of(*p[1])) return false;
  return true;
}

struct QuantRow {
  std::string recipe, dir, shape;
  bool valid;
  double us;  // graph replay (device time per call)
  double gbps, frac, target;
  double us_eager;  // one synchronized eager call (includes the host's launch work)
  double frac_eager, gbps_eager;
};

double quantize_target_of(QuantRecipe r, QuantDirection d) {
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

constexpr int kGraphReps = 10;  // calls per captured graph (graph_per_call_ms)

struct BenchQuantizeOptions {
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

// The copy ceiling of one input: a D2D memcpy (read + write bytes), graph-replayed and eager.
QuantRow copy_row(cudaStream_t stream, const Tensor& x, const std::string& shape, int iters) {
  Tensor dst = Tensor::empty({x.view().dim(0), x.view().dim(1)}, DType::bf16, Device::CUDA);
  const size_t in_bytes = static_cast<size_t>(x.nbytes());
  const auto memcpy_fn = [&] {
    GROUPMM_CHECK_CUDA(
        cudaMemcpyAsync(dst.data(), x.data(), in_bytes, cudaMemcpyDeviceToDevice, stream));
  };
  const double ms = synced_median_ms(stream, iters, memcpy_fn);
  const double ms_graph = graph_per_call_ms(stream, iters, kGraphReps, memcpy_fn);
  const double gbps = 2.0 * double(in_bytes) / (ms_graph * 1e-3) / 1e9;
  const double gbps_eager = 2.0 * double(in_bytes) / (ms * 1e-3) / 1e9;
  return {"copy (D2D)", "-", shape,     true, ms_graph * 1000, gbps,
          1.0,          0,   ms * 1000, 1.0,  gbps_eager};
}

// One recipe x direction x amax schedule on input x: validated (bit-exact on a reduced problem),
// then timed graph-replayed and eager, against the copy row of the same input.
QuantRow quantize_row(Context& ctx, const QuantizeCase& c, const std::string& dir, const Tensor& x,
                      const Tensor& splits, const QuantRow& copy, int iters) {
  const bool ok = validate_quantize(c);
  const QuantizeConfig cfg = quantize_config_of(c);
  QuantizeOutputs out = alloc_quantize_outputs(c.M, c.K, c.G, cfg, Device::CUDA, splits);
  GroupQuantizeArgs a;
  a.input = x;
  a.splits = splits;
  a.config = cfg;
  a.out = out.view;
  ctx.reserve_workspace(group_quantize_workspace_size(ctx, a));
  const double ms_eager = synced_median_ms(ctx.stream(), iters, [&] { group_quantize(ctx, a); });
  const double ms =
      graph_per_call_ms(ctx.stream(), iters, kGraphReps, [&] { group_quantize(ctx, a); });
  ctx.check();
  const double bytes = double(x.nbytes()) + double(out.bytes);
  const double gbps = bytes / (ms * 1e-3) / 1e9, gbps_eager = bytes / (ms_eager * 1e-3) / 1e9;
  return {recipe_name(c.recipe),
          dir,
          copy.shape,
          ok,
          ms * 1000,
          gbps,
          gbps / copy.gbps,
          quantize_target_of(c.recipe, c.dir),
          ms_eager * 1000,
          gbps_eager / copy.gbps_eager,
          gbps_eager};
}

// The cases of one input shape (filtered by the options), after its copy row.
void run_quantize_shape(Context& ctx, const BenchQuantizeOptions& o, int64_t M, int64_t K,
                        const std::vector<std::pair<AmaxSchedule, int>>& amax_list,
                        std::vector<QuantRow>& rows) {
  const int64_t G = 32;
  Tensor x = random_bf16_input(M, K, Device::CUDA);
  Tensor splits = even_pattern_splits(o.pattern, M, G, Device::CUDA);
  const std::string shape = "[" + std::to_string(M) + ", " + std::to_string(K) + "] G=32" +
                            (o.pattern == "balanced" ? "" : " " + o.pattern);
  const QuantRow copy = copy_row(ctx.stream(), x, shape, o.iters);
  rows.push_back(copy);
  const bool amax_default = amax_list.size() == 1 && amax_list[0].first == AmaxSchedule::automatic;
  for (QuantRecipe r :
       {QuantRecipe::fp8_current, QuantRecipe::fp8_block, QuantRecipe::mxfp8, QuantRecipe::nvfp4})
    for (QuantDirection d :
         {QuantDirection::rowwise, QuantDirection::columnwise, QuantDirection::both}) {
      // columnwise alone only when asked for (profiling); the table has rowwise and both
      if ((!o.recipe.empty() && o.recipe != recipe_name(r)) ||
          (!o.direction.empty() && o.direction != quant_direction_name(d)) ||
          (o.direction.empty() && d == QuantDirection::columnwise))
        continue;
      const bool has_amax = r == QuantRecipe::fp8_current || r == QuantRecipe::nvfp4;
      for (const auto& [amax, lag] : amax_list) {
        if (!has_amax && (amax != amax_list[0].first || lag != amax_list[0].second)) continue;
        std::string dir = quant_direction_name(d);
        if (has_amax && !amax_default)
          dir += std::string("/") + amax_schedule_name(amax) +
                 (lag > 0 ? ":" + std::to_string(lag) : "");
        const QuantizeCase c{M, K, G, r, d, amax, lag, o.scales == "plain"};
        rows.push_back(quantize_row(ctx, c, dir, x, splits, copy, o.iters));
      }
    }
}

void print_quantize_rows(const std::vector<QuantRow>& rows, int iters) {
  const Table t({text_col("recipe", 12), text_col("direction", 18), text_col("shape", 22),
                 text_col("valid", 6), num_col("us", 10, 1), num_col("GB/s", 9, 1),
                 num_col("of copy", 8, 1, 'f', "%"), Column{"target", 6, 's', 0, false, "", " "},
                 num_col("eager us", 10, 1), num_col("of copy", 8, 1, 'f', "%")});
  t.print_header();
  for (const QuantRow& r : rows)
    t.print_row({r.recipe, r.dir, r.shape, r.valid ? "ok" : "FAIL", r.us, r.gbps, 100.0 * r.frac,
                 r.target > 0 ? std::to_string(int(r.target * 100)) + "%" : "-", r.us_eager,
                 100.0 * r.frac_eager});
  std::printf(
      "bytes = input read once + all outputs written; copy = cudaMemcpy D2D (read+write)\n"
      "us: device time per call, %d calls captured in a CUDA graph and replayed (median of %d)\n"
      "eager us: one call at a time, synchronized (includes the host's launch work); its\n"
      "fraction is of the copy timed the same way\n",
      kGraphReps, iters);
}

int run_bench_quantize(const BenchQuantizeOptions& o) {
  const std::vector<std::pair<AmaxSchedule, int>> amax_list = parse_amax(o.amax);
  require_gpu("bench quantize");
  JsonFile json(o.json_path);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{65536, 7168}, {32768, 2048}};
  std::vector<QuantRow> rows;
  {
    const GpuStream stream;
    Context ctx(Device::CUDA, stream);
    for (const auto& [M, K] : shapes)
      if (o.shape.empty() || o.shape == std::to_string(M) + "x" + std::to_string(K))
        run_quantize_shape(ctx, o, M, K, amax_list, rows);
  }
  double copy_gbps_max = 0;
  for (const QuantRow& r : rows) {
    if (r.dir == "-") copy_gbps_max = std::max(copy_gbps_max, r.gbps);
    json.add(JsonRecord()
                 .add("recipe", r.recipe)
                 .add("direction", r.dir)
                 .add("shape", r.shape)
                 .add("valid", r.valid)
                 .add("us", r.us)
                 .add("gbps", r.gbps)
                 .add("fraction_of_copy", r.frac)
                 .add("target", r.target)
                 .add("us_eager", r.us_eager)
                 .add("fraction_of_copy_eager", r.frac_eager));
  }
  json.write(JsonRecord().add("suite", "quantize").add("copy_gbps", copy_gbps_max));
  print_quantize_rows(rows, o.iters);
  return 0;
}

void add_bench_quantize_options(CLI::App& app, BenchQuantizeOptions& o) {
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

Register reg_bench_quantize(command<BenchQuantizeOptions>(
    "bench", "quantize",
    "grouped quantization bandwidth per recipe (fp8_current, fp8_block, mxfp8, nvfp4) "
    "vs a device-to-device copy (GPU)",
    add_bench_quantize_options, run_bench_quantize));

}  // namespace
}  // namespace groupmm::tool
