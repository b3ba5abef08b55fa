// The options of the `groupmm bench` suites whose variants live in files of their own, and those
// variants' entry points (each file registers or implements one suite or variant):
//   gemm.cpp            bench gemm: the options, the bf16 suite     gemm_quantized.cpp  --recipe
//   gemm_w4.cpp         --weights                                   layer.cpp           bench layer
//   layer_quantized.cpp bench layer --recipe                        moe.cpp             bench moe
//   moe_ep.cpp          bench moe --ep                              ep.cpp              bench ep
//   quantize.cpp        bench quantize
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "groupmm/nn/moe.hpp"

namespace groupmm::tool {

// ---- bench gemm --------------------------------------------------------------------------------
struct BenchGemmOptions {
  std::string case_filter, pass, pattern, json_path, config;
  std::string recipe = "bf16";  // bf16: the 16-bit engine; else quantized operands
  std::string weights;          // nvfp4 | mxfp4: the 4-bit weight suite (gemm_w4.cpp)
  std::string suite;            // moe | ragged | fine | all; empty: all (bf16), moe (quantized)
  std::string out = "bf16";     // output dtype of every pass (bf16 | fp32; FP8: wgrad only)
  int iters = 10;
  bool list_configs = false;
  bool fast_accum = false;
  bool quick = false;  // tuning sweeps: no validation, no cuBLAS loop
};
// The cases of --suite (moe, ragged, fine, all).
std::vector<SuiteShape> gemm_suite_shapes(const std::string& suite);
// "auto" = the heuristic's choice (an empty config), "auto@along_n" its kernel in that tile order.
std::string gemm_config_arg(const std::string& config);
// --recipe fp8_current|fp8_block|mxfp8 on the chosen cases (gemm_quantized.cpp).
int run_gemm_quantized(const BenchGemmOptions& o, cudaStream_t stream);
// --weights nvfp4|mxfp4: the 4-bit weight cases (gemm_w4.cpp), and their names for --case.
int run_gemm_w4(const BenchGemmOptions& o, cudaStream_t stream);
std::vector<std::string> gemm_w4_case_names();

// ---- bench layer --recipe ----------------------------------------------------------------------
// Times one GroupedLinear training step of `recipe` against the bf16 layer on the suite's expert
// shapes (those whose name contains case_filter), splits of `pattern`. Needs a GPU.
int run_layer_quantized(QuantRecipe recipe, const std::string& case_filter,
                        const std::string& pattern, int iters);

// ---- bench moe ---------------------------------------------------------------------------------
struct BenchMoeOptions {
  // Cases to run: qwen3 (Qwen3-30B-A3B, T=16384 H=2048 F=768 E=128 k=8), dsv3 (DeepSeek-V3-like,
  // 32 local experts: T=8192 H=7168 F=2048 E=32 k=8, sigmoid group-limited routing, a shared
  // expert of width 2048), mixtral (Mixtral-8x7B: T=8192 H=4096 F=14336 E=8 k=2). Empty = all.
  std::vector<std::string> cases;
  int64_t tokens = 0;  // overrides every case's T when > 0
  int iters = 20;      // timed runs per measurement (median)
  // The expert linears' recipe: bf16, or a quantized training recipe (experts padded to its
  // split_multiple, recipe_traits); one GPU only.
  std::string recipe = "bf16";
  bool cpu = false;              // smoke run on the CPU reference backend (tiny shapes, wall clock)
  bool fused_gate_up = false;    // MoEConfig::fused_gate_up for every case
  bool permuted_copies = false;  // MoEConfig::gathered_quantize off for every case
  // QuantizedRecipeOptions::high_precision_wgrad for a quantized recipe (wgrad in bf16)
  bool high_precision_wgrad = false;
  std::string json;  // write the results here (bench/peers_torch_moe.py reads them)
  // Expert parallelism (nn::MoE over ranks, moe_ep.cpp): ep "capacity" or "throughput" runs
  // every case as one rank of a group with E / R local experts and T tokens a rank; "" = one GPU,
  // no EP. The group as in `bench ep` (common/ep_group.hpp); with cpu, `ranks` (default 2)
  // threads on the CPU reference backend.
  std::string ep;
  int ranks = 0, rank = -1;
  std::string id_file;
  double capacity_factor = 2.0;  // capacity mode's budgets over the uniform routing's expectation
  // MoEExpertParallel::chunks: the local experts in this many chunks whose exchanges run beside
  // the other chunks' compute (1: one exchange each way). At most E / R of every chosen case.
  int64_t ep_chunks = 1;
  // MoEExpertParallel::exchange_sms: with ep_chunks > 1, the SMs the chunked step's GEMMs leave to
  // the exchanges (0: none).
  int64_t ep_exchange_sms = 0;
};
// The suite's cases: qwen3, dsv3, mixtral (cpu: shapes small enough for the reference backend),
// those of o.cases, with o.tokens applied.
struct MoeBenchCase {
  const char* name;
  nn::MoEConfig cfg;
};
std::vector<MoeBenchCase> moe_bench_cases(const BenchMoeOptions& o);
// The block over ranks (o.ep set): per case, this rank's forward and forward + backward time
// (capacity mode: one CUDA graph each; throughput mode: eager, its plan synchronizes) and whether
// capacity overflowed, then every rank's overlap breakdown (eager steps: the exchange and the
// experts' time from the stage hook of an unchunked block, and the exchange time left exposed by
// o.ep_chunks chunks); rank 0 prints and writes the JSON. Returns 0 when every case ran.
int run_moe_ep(const BenchMoeOptions& o);

}  // namespace groupmm::tool
