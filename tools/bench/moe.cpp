// `groupmm bench moe`: the MoE block forward and forward + backward on Qwen3-30B-A3B, a
// DeepSeek-V3-like layer (32 local experts + a shared expert) and Mixtral-8x7B, in bf16 or a
// quantized --recipe, against the dense-GEMM bound measured in the same run (dense_bound_us);
// per-stage breakdown; the kernel layer's fused projections alone (moe_kernels.cpp); the four row
// movers (permute, unpermute and their backwards) in GB/s against a device-to-device copy of the
// same size timed in the same run. --json is read by bench/peers_torch_moe.py (a plain PyTorch
// block on the same shapes). --ep: the block over ranks, one process per GPU (moe_ep.cpp).
#include <algorithm>
#include <cstdio>
#include <tuple>

#include "bench/suites.hpp"
#include "common/ep_group.hpp"
#include "bench/moe_kernels.hpp"
#include "common/moe_block.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/moe.hpp"
#include "groupmm/nn/grouped_linear.hpp"
#include "groupmm/quantize.hpp"
#include "groupmm/random.hpp"

namespace groupmm::tool {
namespace {

using nn::MoE;
using nn::MoEConfig;
using nn::MoEStage;

MoEConfig base(int64_t H, int64_t F, int64_t E, int64_t k, int64_t T) {
  MoEConfig c;
  c.hidden = H;
  c.ffn_hidden = F;
  c.experts = E;
  c.topk = k;
  c.max_tokens = T;
  c.renormalize = true;
  c.seed = 5;
  return c;
}

}  // namespace

std::vector<MoeBenchCase> moe_bench_cases(const BenchMoeOptions& o) {
  const bool cpu = o.cpu;
  MoEConfig q = base(2048, 768, 128, 8, 16384), d = base(7168, 2048, 32, 8, 8192),
            m = base(4096, 14336, 8, 2, 8192);
  d.score = RouterScore::sigmoid;  // DeepSeek-V3 routing, scaled to 32 local experts
  d.n_group = 8;
  d.topk_group = 4;
  d.scaling_factor = 2.5f;
  d.expert_bias = true;
  d.shared_ffn_hidden = 2048;
  if (cpu) {  // smoke shapes: every code path, small enough for the reference backend
    q = base(64, 32, 16, 4, 96);
    d.hidden = 64, d.ffn_hidden = 32, d.experts = 16, d.n_group = 4, d.topk_group = 2,
    d.shared_ffn_hidden = 32, d.max_tokens = 64;
    m = base(64, 96, 4, 2, 64);
  }
  std::vector<MoeBenchCase> out;
  for (const MoeBenchCase& c : {MoeBenchCase{"qwen3", q}, {"dsv3", d}, {"mixtral", m}}) {
    if (!o.cases.empty() && std::find(o.cases.begin(), o.cases.end(), c.name) == o.cases.end())
      continue;
    out.push_back(c);
    if (o.tokens > 0) out.back().cfg.max_tokens = o.tokens;
    out.back().cfg.fused_gate_up = o.fused_gate_up;
    out.back().cfg.gathered_quantize = !o.permuted_copies;
    if (o.recipe != "bf16") {  // the expert linears quantized, experts padded as the recipe needs
      const QuantRecipe r = training_recipe_of(o.recipe);
      if (cpu) {  // the smoke shapes widened to the recipe's feature multiple (128: fp8_block)
        MoEConfig& s = out.back().cfg;
        const int64_t w = recipe_traits(r).in_features_multiple;
        s.hidden = std::max(s.hidden, w), s.ffn_hidden = std::max(s.ffn_hidden, w);
        if (s.shared_ffn_hidden > 0) s.shared_ffn_hidden = std::max(s.shared_ffn_hidden, w);
      }
      nn::QuantizedRecipeOptions ro;
      ro.high_precision_wgrad = o.high_precision_wgrad;
      out.back().cfg.recipe = nn::quantized_recipe(r, ro);
      out.back().cfg.pad_align = recipe_traits(r).split_multiple;
    }
  }
  return out;
}

namespace {

struct MoeMover {
  const char* name;
  double us, bytes;
};

// The row movers on the layer's current map (from its last forward), each alone, and a D2D copy
// of the permuted buffer's size: bytes are what each moves (rows read + rows written).
std::vector<MoeMover> time_moe_movers(Context& ctx, MoE& moe, const TensorView& x, int iters,
                                      double* copy_gbs) {
  const PermuteMap& m = moe.permute_map();
  const int64_t T = m.tokens, R = m.rows, H = moe.config().hidden, k = m.topk;
  const Device d = ctx.device();
  cudaStream_t s = ctx.stream();
  Tensor a = Tensor::empty({R, H}, DType::bf16, d, s), b = Tensor::empty({R, H}, DType::bf16, d, s);
  Tensor y = Tensor::empty({T, H}, DType::bf16, d, s), pr = Tensor::empty({R}, DType::fp32, d, s);
  Tensor dw = Tensor::empty({T, k}, DType::fp32, d, s);
  fill_uniform(ctx, a, -1.0f, 1.0f, 3);
  fill_uniform(ctx, pr, -1.0f, 1.0f, 4);
  const TensorView w = moe.router_weights();
  const double row = double(H) * 2;
  std::vector<MoeMover> out;
  out.push_back({"permute (scatter)",
                 time_us(ctx, 2, iters, [&](int) { moe_permute(ctx, x, m, b, w, pr); }),
                 (T + R) * row});
  out.push_back({"unpermute (k-way sum)",
                 time_us(ctx, 2, iters, [&](int) { moe_unpermute(ctx, a, m, y); }), (T + R) * row});
  out.push_back({"unpermute backward",
                 time_us(ctx, 2, iters, [&](int) { moe_unpermute_backward(ctx, x, m, b); }),
                 (T + R) * row});
  out.push_back({"permute backward",
                 time_us(ctx, 2, iters, [&](int) { moe_permute_backward(ctx, a, m, y, pr, dw); }),
                 (T + R) * row});
  const double copy_us = time_us(ctx, 2, iters, [&](int) {
    if (d == Device::CUDA)
      GROUPMM_CHECK_CUDA(
          cudaMemcpyAsync(b.data(), a.data(), size_t(a.nbytes()), cudaMemcpyDeviceToDevice, s));
    else
      copy(b, a);
  });
  *copy_gbs = 2.0 * double(a.nbytes()) / (copy_us * 1e3);
  return out;
}

// The dense-GEMM bound of a case: its expert GEMMs (and the shared expert's) as dense cuBLAS bf16
// GEMMs over all T k routed rows, the time a pipeline with free routing, no padding and no data
// movement between its stages would take. {forward, forward + backward} in us.
std::pair<double, double> dense_bound_us(Context& ctx, const MoEConfig& c, int iters) {
  const int64_t T = c.max_tokens, H = c.hidden;
  double fwd = 0, bwd = 0;
  const auto mlp = [&](int64_t rows, int64_t F) {
    fwd += dense_gemm_ms(ctx, GemmPass::forward, rows, 2 * F, H, iters) +
           dense_gemm_ms(ctx, GemmPass::forward, rows, H, F, iters);
    bwd += dense_gemm_ms(ctx, GemmPass::dgrad, rows, H, F, iters) +
           dense_gemm_ms(ctx, GemmPass::wgrad, rows, H, F, iters) +
           dense_gemm_ms(ctx, GemmPass::dgrad, rows, 2 * F, H, iters) +
           dense_gemm_ms(ctx, GemmPass::wgrad, rows, 2 * F, H, iters);
  };
  mlp(T * c.topk, c.ffn_hidden);
  if (c.shared_ffn_hidden > 0) mlp(T, c.shared_ffn_hidden);
  return {1e3 * fwd, 1e3 * (fwd + bwd)};
}

// One case: validated first (sampled tokens against the CPU reference), then the whole block as
// CUDA graphs (GPU), the stages, the row movers. Returns false when the check failed.
bool run_moe_case(Context& ctx, const MoeBenchCase& bc, int iters, JsonFile& json) {
  const MoEConfig& c = bc.cfg;
  const bool gpu = ctx.device() == Device::CUDA;
  const int64_t T = c.max_tokens, H = c.hidden;
  MoE moe(ctx, c);
  const BlockInputs in = block_inputs(ctx, T, H, 31);
  const Tensor &x = in.x, &dy = in.dy;
  std::printf(
      "\n== %s: T=%lld H=%lld F=%lld E=%lld k=%lld%s, permuted rows %lld, bf16, experts %s%s\n",
      bc.name, (long long)T, (long long)H, (long long)c.ffn_hidden, (long long)c.experts,
      (long long)c.topk,
      c.shared_ffn_hidden > 0 ? detail::cat(" + shared expert F=", c.shared_ffn_hidden).c_str()
                              : "",
      (long long)moe_permuted_rows(T, c.topk, c.experts),
      c.recipe ? c.recipe->name().c_str() : "bf16",
      c.fused_gate_up  ? ", gate_up fused (moe_gate_up_swiglu)"
      : moe.gathered() ? ", quantized from x and dy (gathered_quantize)"
                       : "");
  const TensorView y = moe.forward(ctx, x);
  ctx.check();
  // activation memory: what this forward leaves for backward, in T*H 16-bit rows
  const double kept_rows = double(moe.saved_bytes()) / double(T * H * 2);
  int mism = 0;
  const double err = check_sampled_tokens(ctx, moe, x, y, 2, false, &mism);
  // The reference runs the unquantized ops on the layer's bf16 weights: a quantized recipe is off
  // by its quantization of x, W and the activation (a few % per token); bit-exactness against
  // the same recipe on the CPU is what the tests check.
  const bool ok = err <= (c.recipe ? 0.15 : 1e-2);
  std::printf(
      "  check: 2 sampled tokens vs the CPU reference: y rel err %.2e %s (routing "
      "differs on %d)\n",
      err, ok ? "ok" : "FAILED", mism);
  std::printf("  kept for backward: %.1f x T*H*2 bytes (the layer's buffers; x not counted)\n",
              kept_rows);
  double fwd_us = 0, step_us = 0, bound_fwd = 0, bound_step = 0;
  if (gpu) {
    fwd_us = graph_replay_us(ctx, 3, iters, [&] { moe.forward(ctx, x); });
    step_us = graph_replay_us(ctx, 3, iters, [&] {
      moe.forward(ctx, x);
      moe.backward(ctx, dy);
    });
    std::tie(bound_fwd, bound_step) = dense_bound_us(ctx, c, iters);
    std::printf(
        "  forward            %10.1f us  (one CUDA graph); dense-GEMM bound %.1f us: %.0f%%\n",
        fwd_us, bound_fwd, 100 * bound_fwd / fwd_us);
    std::printf(
        "  forward+backward   %10.1f us  (one CUDA graph); dense-GEMM bound %.1f us: %.0f%%\n",
        step_us, bound_step, 100 * bound_step / step_us);
  }
  const StageTimes st = time_stages(ctx, moe, x, dy, gpu ? 2 : 0, iters);
  const double non_gemm = print_moe_stages(st, gpu, iters);
  const MoeKernelRecords kernels = time_moe_kernels(ctx, moe, x, dy, iters);
  double copy_gbs = 0;
  const auto movers = time_moe_movers(ctx, moe, x, iters, &copy_gbs);
  std::printf(
      "  row movers (bytes = rows read + rows written; copy = D2D memcpy of the permuted "
      "buffer, same run: %.0f GB/s):\n",
      copy_gbs);
  JsonRecord mv;
  for (const MoeMover& m : movers) {
    const double gbs = m.bytes / (m.us * 1e3);
    std::printf("    %-22s %9.1f us %8.0f GB/s %6.1f%% of copy\n", m.name, m.us, gbs,
                100 * gbs / copy_gbs);
    mv.add(m.name, gbs);
  }
  json.add(JsonRecord()
               .add("case", bc.name)
               .add("T", T)
               .add("H", H)
               .add("F", c.ffn_hidden)
               .add("E", c.experts)
               .add("k", c.topk)
               .add("shared_F", c.shared_ffn_hidden)
               .add("score", router_score_name(c.score))
               .add("recipe", c.recipe ? c.recipe->name() : std::string("bf16"))
               .add("fused_gate_up", c.fused_gate_up)
               .add("gathered_quantize", moe.gathered())
               .add("kept_th_rows", kept_rows)
               .add("fwd_us", fwd_us)
               .add("fwd_bwd_us", step_us)
               .add("bound_fwd_us", bound_fwd)
               .add("bound_fwd_bwd_us", bound_step)
               .add("eager_step_us", st.total_us)
               .add("non_gemm_pct", non_gemm)
               .add("copy_gbs", copy_gbs)
               .add("movers", mv)
               .add("gate_up", kernels.gate_up)
               .add("down_dgrad", kernels.down_dgrad));
  ctx.check();
  return ok;
}

// The options that apply to --ep only, and those of --ep that a CPU run (ranks as threads) has
// no use for, as usage errors.
void check_moe_options(const BenchMoeOptions& o, const CLI::App& app) {
  const auto given = [&](const char* name) { return app.get_option(name)->count() > 0; };
  if (o.ep.empty() &&
      (given("--ranks") || given("--rank") || given("--id-file") || given("--capacity-factor")))
    throw UsageError(
        "--ranks, --rank, --id-file and --capacity-factor need --ep capacity|throughput");
  if (o.high_precision_wgrad && o.recipe == "bf16")
    throw UsageError(
        "--high-precision-wgrad needs a quantized --recipe (the bf16 recipe's wgrad "
        "is already 16-bit)");
  if (!o.ep.empty() && o.recipe != "bf16")
    throw UsageError("--recipe " + o.recipe +
                     " does not apply to --ep (the EP block runs unpadded "
                     "experts: bf16 only)");
  if (o.ep.empty() && given("--ep-chunks"))
    throw UsageError("--ep-chunks " + std::to_string(o.ep_chunks) +
                     " needs --ep capacity|throughput (it splits the expert-parallel step)");
  if (o.ep_chunks == 1 && given("--ep-exchange-sms"))
    throw UsageError("--ep-exchange-sms " + std::to_string(o.ep_exchange_sms) +
                     " needs --ep-chunks > 1 (the SMs left to the exchanges of the next chunk)");
  if (o.ep == "throughput" && given("--capacity-factor"))
    throw UsageError("--capacity-factor applies to --ep capacity (got --ep throughput)");
  for (const char* name : {"--rank", "--id-file"})
    reject_option(o.cpu && given(name), name, "to --cpu (its ranks are threads of one process)");
}

struct BenchMoeCommand {
  BenchMoeOptions o;
  const CLI::App* app = nullptr;
};

int run_bench_moe(const BenchMoeCommand& cmd) {
  BenchMoeOptions o = cmd.o;
  check_moe_options(o, *cmd.app);
  // --iters on the CPU: 1 unless given (the reference backend is slow)
  if (o.cpu && cmd.app->get_option("--iters")->count() == 0) o.iters = 1;
  if (!o.cpu)
    require_gpu("bench moe", o.ep.empty() ? "; the cpu option runs a smoke version on the CPU"
                                          : "; --cpu runs a smoke version with ranks as threads "
                                            "on the CPU");
  // What each case allocates (every rank of a CPU run is in this process), from its own shapes.
  const Device dev = o.cpu ? Device::CPU : Device::CUDA;
  const int ranks_here = o.ep.empty() || !o.cpu ? 1 : (o.ranks > 0 ? o.ranks : 2);
  const int ranks = o.ranks > 0 ? o.ranks : (o.cpu ? 2 : env_int("WORLD_SIZE", 1));
  for (const MoeBenchCase& bc : moe_bench_cases(o)) {
    if (!o.ep.empty() && bc.cfg.experts % ranks != 0)  // before any rank starts
      throw UsageError(detail::cat("bench moe: --ranks ", ranks,
                                   " must divide the experts of "
                                   "every chosen case (case ",
                                   bc.name, " has E=", bc.cfg.experts, ")"));
    if (!o.ep.empty() && o.ep_chunks > bc.cfg.experts / ranks)  // a chunk holds an expert
      throw UsageError(detail::cat("bench moe: --ep-chunks ", o.ep_chunks,
                                   " must be at most the local experts E / R of every chosen "
                                   "case (case ",
                                   bc.name, ": E=", bc.cfg.experts, " over ", ranks,
                                   " ranks = ", bc.cfg.experts / ranks, ")"));
    check_fits_memory("bench moe: case " + std::string(bc.name),
                      ranks_here * moe_block_bytes(bc.cfg), dev, "--tokens");
  }
  if (!o.ep.empty()) return run_moe_ep(o);
  JsonFile json(o.json);
  const GpuStream stream(!o.cpu);
  bool ok = true;
  for (const MoeBenchCase& bc : moe_bench_cases(o)) {
    Context ctx(dev, stream);
    ok = run_moe_case(ctx, bc, o.iters, json) && ok;
  }
  if (json.on()) std::printf("\n");
  json.write(JsonRecord().add("device", o.cpu ? "cpu" : "cuda"), {}, true);
  return ok ? 0 : 1;
}

void add_bench_moe_options(CLI::App& app, BenchMoeCommand& cmd) {
  BenchMoeOptions& o = cmd.o;
  cmd.app = &app;
  add_choice_list(app, "--case", o.cases, {"qwen3", "dsv3", "mixtral"},
                  "cases to run (comma separated; default all): qwen3 = Qwen3-30B-A3B, dsv3 = "
                  "DeepSeek-V3-like with 32 local experts and a shared expert, mixtral = "
                  "Mixtral-8x7B");
  add_int(app, "--tokens", o.tokens, 1, int64_t(1) << 24,
          "tokens T of every case (default: the case's own, 8192-16384)");
  add_iters(app, o.iters, "timed runs per measurement, median (default 20; --cpu: 1)");
  add_choice(app, "--recipe", o.recipe, {"bf16", "fp8_current", "fp8_block", "mxfp8"},
             "the expert linears' recipe (quantized: experts padded to its split multiple)");
  app.add_flag("--high-precision-wgrad", o.high_precision_wgrad,
               "with a quantized --recipe: wgrad as the bf16 GEMM, forward and dgrad in FP8 "
               "(QuantizedRecipeOptions::high_precision_wgrad)");
  app.add_flag("--cpu", o.cpu, "smoke run on the CPU reference backend (tiny shapes)");
  app.add_flag("--permuted-copies", o.permuted_copies,
               "with fp8_current / fp8_block: the layers quantize permuted copies of x and dy "
               "(MoEConfig::gathered_quantize off) instead of gathering their rows");
  app.add_flag("--fused-gate-up", o.fused_gate_up,
               "the block's gate_up projection and weighted SwiGLU as one kernel-layer op "
               "(MoEConfig::fused_gate_up; bf16, no EP)");
  add_json(app, o.json);
  add_choice(app, "--ep", o.ep, {"capacity", "throughput"},
             "expert parallelism: every case as one rank of a group (E / R experts and T tokens a "
             "rank; one process per GPU over NCCL, e.g. torchrun --no-python --nproc-per-node R "
             "groupmm bench moe --ep capacity --id-file F; --cpu: ranks as threads). capacity: "
             "fixed per-peer budgets, one CUDA graph; throughput: exact exchange, eager");
  add_rank_group_options(app, o.ranks, o.rank, o.id_file, "with --ep: ");
  add_real(app, "--capacity-factor", o.capacity_factor, 1.0, 64.0,
           "with --ep capacity: the per-peer budgets over the uniform routing's expected rows "
           "and entries (default 2)");
  add_int(app, "--ep-chunks", o.ep_chunks, 1, 1024,
          "with --ep: the local experts in N chunks whose exchanges run beside the other chunks' "
          "expert compute (MoEExpertParallel::chunks; at most E / R; default 1). Capacity mode "
          "applies the budgets to each chunk. Reports per rank the exchange and expert time and "
          "the exchange time left exposed");
  add_int(app, "--ep-exchange-sms", o.ep_exchange_sms, 0, 1024,
          "with --ep-chunks > 1: the SMs the chunked step's grouped GEMMs leave to the "
          "exchanges (MoEExpertParallel::exchange_sms; below the GPU's SMs; default 0)");
}

Register reg_bench_moe(command<BenchMoeCommand>(
    "bench", "moe",
    "MoE block (router, permute, grouped SwiGLU experts, unpermute, shared expert) forward and "
    "forward + backward, per-stage breakdown, row movers vs copy (GPU; --cpu: a smoke run)",
    add_bench_moe_options, run_bench_moe));

}  // namespace
}  // namespace groupmm::tool
