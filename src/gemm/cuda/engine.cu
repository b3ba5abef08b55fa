// cutlass_sm90 engine: picks an instantiated configuration for (pass, operand dtypes, scaling,
// dims) and runs it.
//
// Heuristic (host-known inputs only, so the choice is the same for every routing a graph sees):
//  - 16-bit forward with few rows per expert (avg M/G <= 32, the decode case): operands swapped so
//    the weight rows fill the 128-wide M tile and the handful of tokens sit in a 32-wide N tile;
//    the problem is bound by streaming the weights. At 64 rows the swapped tile runs twice per
//    expert and is 1.5x slower than the regular one (fine-grained experts, bench/RESULTS.md).
//    A decode-sized forward into fp32 runs the cooperative kernel (the swapped kernel is
//    instantiated for a 16-bit D only).
//  - otherwise a 128x256 cooperative tile (K 64 for 16-bit, 128 for FP8). The cluster pairs CTAs
//    along the dimension that is an even number of tiles for MoE shapes, so multicast never leaves
//    a CTA idle: forward pairs along N (1x2, sharing the activation tile), wgrad along M' = N
//    (2x1, sharing the x tile), dgrad runs without a cluster (its N' is the hidden size K, and
//    K/256 is odd for common sizes such as 768).
//  - FP8: K 128. Promotion to fp32 every 128 K keeps a second accumulator set in registers: a
//    128x256 tile spilled, 128x192 fits (96 + 96 accumulators per thread, no stack) and is 8-18%
//    faster than 128x128 for per-expert forward, dgrad and wgrad into bf16 (bench/RESULTS.md,
//    "FP8 tiles"). The blockwise forward and dgrad run 128x192 too, on groupmm's own consumer
//    mainloop and scale loader (sm90_blockwise_wide_mainloop.cuh: 128 does not divide 192, so a
//    tile spans two 128x128 weight blocks, which CUTLASS's collective cannot scale); 0-13%
//    faster than their 128x128 tile across the suite (bench/RESULTS.md, "The blockwise forward
//    and dgrad on a 128x192 tile"). The blockwise wgrad keeps 128x128 (its weight-side scales
//    are per output column). The per-expert wgrad into an fp32 main_grad runs 128x192 too
//    (1-10% faster than 128x128 in 7 of 8 cases, 1% slower on DSv3 gate_up balanced). Clusters as
//    measured on the DeepSeek-V3 shapes: forward 2x1 (1x2 is 2-7% slower at 128x192), dgrad 1x1
//    (the blockwise 128x192 dgrad 0.5-9% slower with 1x2), blockwise wgrad 1x2, per-expert wgrad
//    2x1 (a 2x2 cluster was slower for every blockwise pass). Fast accumulation (inference) has no
//    second accumulator set and runs the 128x256 tile. Epilogue subtiles: blockwise kernels into
//    bf16 128x64 (faster than CUTLASS's 128x32; 128x128 takes a mainloop stage and is slower; at
//    the 128x192 tile 128x96 measured even, 128x192 slower, plain stores with no shared memory
//    much slower: bench/RESULTS.md, "The blockwise epilogue, the power cap ..."), the
//    per-expert wgrad into bf16 128x96; the per-expert forward and dgrad and every fp32 main_grad
//    wgrad keep 128x32 (wider was slower).
//  - bf16 forward with a short reduction (K <= 1536, from 33 rows per expert): a 128x128
//    ping-pong tile (1x2 cluster), which overlaps one warpgroup's epilogue with the other's
//    mainloop.
//  - bf16 forward with an odd number of 256-wide N tiles (ragged widths such as 2816 or 5184) or
//    experts' weights far larger than L2 (N*K >= 64M): the cluster pairs along M (2x1) instead.
//  - wgrad reduces over each expert's tokens (K' = m_g); fp32 or 16-bit output. bf16: a 128x128
//    ping-pong tile (2x1 cluster), whose two warpgroups overlap one's epilogue (the dW write) with
//    the other's mainloop, for the experts with 129-1024 rows (129-768 into bf16, where the
//    cooperative tile's wider epilogue subtile makes it faster from 1024) and the 128x256
//    cooperative tile for the rest: two launches, the experts sorted into them on the device
//    (kSplits), used when the average is 65-1024 rows. An output width K that is not a multiple of
//    256 runs the ping-pong tile for every expert (from an average of 129 rows), or into bf16 where
//    192 divides K (1920 wide experts) a 128x192 cooperative tile (no waste along K, 5-7% faster).
//    fp16 keeps the base tiles (one kernel less each to compile; fp16 MoE training is rare).
//  - forward/dgrad with an fp32 out: the tiles and clusters of their 16-bit-out kernels, not tuned
//    separately (the fp32 epilogue's larger shared memory is carved out of the mainloop stages).
//  - tile order (sm90_setup.cuh, LaunchPart::along_n): down M' (CUTLASS's default for grouped
//    problems), except a wgrad whose output grid is much taller than wide: there across N', so a
//    wave of CTAs covers a few whole rows of the grid and reads fewer distinct operand blocks
//    (heuristic_along_n; bench/RESULTS.md, "wgrad tile order"). Forward and dgrad measured slower
//    across N' (their weight tiles lose the sharing between an expert's M tiles). A config name
//    may end in "@along_m" or "@along_n" to force the order (tuning and tests).
#include <algorithm>

#include "gemm/cuda/kernels.hpp"
#include "gemm/cuda/sm90_grouped.cuh"

namespace groupmm::cuda {
namespace {

struct TableEntry {
  const char* name;
  GemmPass pass;
  DType a, b, out;
  QuantRecipe recipe;
  bool fast_accum;
  sm90::KernelEntry (*make)();
};

const TableEntry kTable[] = {
#define GROUPMM_TABLE_ROW(name, pass, in, out) \
  {#name, GemmPass::pass, DType::in, DType::in, DType::out, QuantRecipe::none, false, &sm90::name},
    GROUPMM_FOR_EACH_SM90_KERNEL(GROUPMM_TABLE_ROW)
#undef GROUPMM_TABLE_ROW
#define GROUPMM_TABLE_ROW(name, pass, a, b, out, recipe, fast) \
  {#name, GemmPass::pass, DType::a, DType::b, DType::out, QuantRecipe::recipe, fast, &sm90::name},
        GROUPMM_FOR_EACH_SM90_FP8_KERNEL(GROUPMM_TABLE_ROW)
#undef GROUPMM_TABLE_ROW
};

// Split configurations: two launches of instantiated kernels over complementary classes of
// experts by row count (sm90::RowClass), decided on the device from the splits. wgrad tiles differ
// by the reduction length m_g: the 128x128 ping-pong tile overlaps the dW write of short
// reductions with the next tile's mainloop, the 128x256 cooperative tile is faster on long ones
// and on very short ones (one k-block: tile count is the cost). Under skewed routing one GEMM has
// experts of both kinds, which no host-side choice can serve.
struct SplitEntry {
  const char* name;
  const char* inside;   // experts with lo <= m_g <= hi
  const char* outside;  // every other expert (empty ones included)
  int64_t lo, hi;
};

// Into bf16 the cooperative tile writes dW through a 128x128 epilogue subtile (its kernel file says
// why), which makes it the faster tile from 1024 rows: ping-pong keeps the experts of 129-768
// rows (measured: ping-pong faster at 512, cooperative at 1024; 768 lies between).
const SplitEntry kSplits[] = {
    {"wgrad_bf16_bf16_split_pp128x128_coop128x256", "wgrad_bf16_bf16_128x128_pp_c21",
     "wgrad_bf16_bf16_128x256_coop_c21", 129, 768},
    {"wgrad_bf16_f32_split_pp128x128_coop128x256", "wgrad_bf16_f32_128x128_pp_c21",
     "wgrad_bf16_f32_128x256_coop_c21", 129, 1024},
};

const TableEntry* find(const std::string& name) {
  for (const auto& e : kTable)
    if (name == e.name) return &e;
  return nullptr;
}

const SplitEntry* find_split(const std::string& name) {
  for (const auto& e : kSplits)
    if (name == e.name) return &e;
  return nullptr;
}

const TableEntry& by_name(const std::string& name) {
  const TableEntry* e = find(name);
  GROUPMM_CHECK(e != nullptr, "grouped_gemm: config '", name, "' is not an instantiated kernel");
  return *e;
}

bool serves(const TableEntry& e, const GemmLaunch& l) {
  return e.pass == l.pass && e.a == l.a_dtype && e.b == l.b_dtype && e.out == l.out_dtype &&
         e.recipe == l.recipe && e.fast_accum == l.fast_accum;
}

// "bf16->fp32" for 16-bit operands, "fp8e5m2 x fp8e4m3->bf16 (fp8_current)" for quantized ones.
std::string describe(GemmPass pass, DType a, DType b, DType out, QuantRecipe r) {
  return detail::cat(gemm_pass_name(pass), " ", dtype_name(a),
                     a == b ? "" : detail::cat(" x ", dtype_name(b)), "->", dtype_name(out),
                     r == QuantRecipe::none ? "" : detail::cat(" (", recipe_name(r), ")"));
}

// Tiles along a dimension of `n` for a tile `t` wide.
constexpr int64_t tiles(int64_t n, int64_t t) {
  return (n + t - 1) / t;
}

std::string heuristic_16bit(const GemmLaunch& l) {
  const bool bf = l.a_dtype == DType::bf16;
  const bool f32 = l.out_dtype == DType::fp32;
  const GemmDims& d = l.dims;
  // Average rows per expert: host-known (M and G are shapes), unlike the split values.
  const int64_t rows = d.G > 0 ? d.M / d.G : 0;
  switch (l.pass) {
    case GemmPass::forward:
      if (f32) return bf ? "fwd_bf16_f32_128x256_coop_c12" : "fwd_fp16_f32_128x256_coop_c12";
      if (rows <= 32) return bf ? "fwdswap_bf16_128x32_pp_c11" : "fwdswap_fp16_128x32_pp_c11";
      // A short reduction (K <= 1536, 24 steps of 64: down projections of fine-grained experts)
      // makes the epilogue a large share of each tile; ping-pong overlaps one warpgroup's
      // epilogue with the other's mainloop: 2-9% faster at K 768 and 1408, even to 40% slower
      // from K 1920 up (bench/RESULTS.md).
      if (bf && d.K <= 1536) return "fwd_bf16_128x128_pp_c12";
      // 2x1 cluster (the pair shares the weight tile) instead of 1x2 (sharing the activation
      // tile): when the N tiles are odd in number (a 1x2 pair would idle a CTA), and when an
      // expert's weight (>= 64M elements, Mixtral and Llama 4 gate_up) is far larger than L2, so
      // each weight tile read for one pair of M tiles is read half as often.
      if (bf && (tiles(d.N, 256) % 2 == 1 || d.N * d.K >= (int64_t(64) << 20)))
        return "fwd_bf16_128x256_coop_c21";
      return bf ? "fwd_bf16_128x256_coop_c12" : "fwd_fp16_128x256_coop_c12";
    case GemmPass::dgrad:
      if (f32) return bf ? "dgrad_bf16_f32_128x256_coop_c11" : "dgrad_fp16_f32_128x256_coop_c11";
      return bf ? "dgrad_bf16_128x256_coop_c11" : "dgrad_fp16_128x256_coop_c11";
    case GemmPass::wgrad: {
      // Ping-pong overlaps one warpgroup's epilogue with the other's mainloop: it wins where the
      // reduction per expert is short (the output write is a large share of each tile) and where
      // 128-wide tiles cover an output width K that 256-wide ones do not.
      if (!bf) return f32 ? "wgrad_fp16_f32_128x256_coop_c21" : "wgrad_fp16_fp16_128x256_coop_c21";
      // 128-wide tiles cover the output width; 256-wide ones waste a share. Not below 129 rows
      // per expert, where the ping-pong tile's count is the cost (fine_g512: 1.33x the time).
      // A 16-bit-out width that 192 divides (1920) runs a 128x192 cooperative tile: 5-7% faster
      // than ping-pong there; into fp32 it measured even or slower, so fp32 stays ping-pong.
      if (d.K % 256 != 0 && rows > 128) {
        if (f32) return "wgrad_bf16_f32_128x128_pp_c21";
        return d.K % 192 == 0 ? "wgrad_bf16_bf16_128x192_coop_c21"
                              : "wgrad_bf16_bf16_128x128_pp_c21";
      }
      // Per-expert tiles (kSplits) where experts of both kinds are likely: an average of 65 to
      // 1024 rows (at 2048, Mixtral, the split measured even with the cooperative tile alone, and
      // 10% slower on a Zipf routing of 16 experts: few experts land in the ping-pong class).
      if (rows > 64 && rows <= 1024)
        return f32 ? "wgrad_bf16_f32_split_pp128x128_coop128x256"
                   : "wgrad_bf16_bf16_split_pp128x128_coop128x256";
      return f32 ? "wgrad_bf16_f32_128x256_coop_c21" : "wgrad_bf16_bf16_128x256_coop_c21";
    }
  }
  return "";
}

// wgrad's tile order. Every expert's output dW is the same grid of tm = N/128 by tn = K/256 tiles;
// only the reduction (its tokens) differs, and a tile reads a dy block (128 columns) and an x
// block (256 columns) of the expert's tokens. A wave of W CTAs down M' reads min(W, tm) dy blocks
// and about W/tm x blocks; across N' about W/tn dy blocks and tn x blocks. So a grid taller than
// wide reads fewer blocks per wave across N' (Mixtral and Llama 4 gate_up, DeepSeek-V3 down), a
// wide one fewer down M' (Mixtral down); grids within 1.5x of square measured even either way.
bool heuristic_along_n(const GemmLaunch& l) {
  if (l.pass != GemmPass::wgrad) return false;
  const int64_t tm = tiles(l.dims.N, 128), tn = tiles(l.dims.K, 256);
  return 2 * tm >= 3 * tn;
}

std::string heuristic(const GemmLaunch& l) {
  if (l.recipe == QuantRecipe::none) return heuristic_16bit(l);
  // FP8: one kernel per (pass, dtypes, recipe), plus the swapped forward for decode (few rows per
  // expert, as for 16-bit operands); the first that serves the launch. The swap stays up to 64
  // rows per expert: at 64 the two tiles measure even (each wins on some routings), below it the
  // swapped one is 1.4-1.8x faster (bench/RESULTS.md, "FP8 decode threshold").
  const bool decode = l.pass == GemmPass::forward && l.dims.M <= 64 * l.dims.G;
  for (const auto& e : kTable)
    if (serves(e, l) && (std::string(e.name).rfind("fwdswap", 0) == 0) == decode) return e.name;
  for (const auto& e : kTable)
    if (serves(e, l)) return e.name;
  GROUPMM_CHECK(false, "grouped_gemm: no scaled kernel computes ",
                describe(l.pass, l.a_dtype, l.b_dtype, l.out_dtype, l.recipe),
                l.fast_accum ? " with fast accumulation" : "");
  return "";
}

// What one grouped GEMM runs: one kernel over every expert, or two over complementary classes,
// in one tile order.
struct Plan {
  sm90::KernelEntry first, second;
  sm90::RowClass first_class;
  bool split = false;
  bool along_n = false;
};

// ---- configuration names ------------------------------------------------------------------------
// "<kernel or split>[@along_m|@along_n]": the suffix forces the tile order; without it the
// heuristic's order for the launch's shapes. A bare "@along_m|n" is the heuristic's kernel.
constexpr const char kAlongM[] = "@along_m";
constexpr const char kAlongN[] = "@along_n";

struct Choice {
  std::string name;
  bool along_n = false;
};

Choice choose(const GemmLaunch& l) {
  if (l.config.empty()) return {heuristic(l), heuristic_along_n(l)};
  const size_t at = l.config.find('@');
  if (at == std::string::npos) return {l.config, heuristic_along_n(l)};
  const std::string order = l.config.substr(at);
  GROUPMM_CHECK(order == kAlongM || order == kAlongN, "grouped_gemm: config '", l.config,
                "' ends in '", order, "', not ", kAlongM, " or ", kAlongN);
  const std::string name = l.config.substr(0, at);  // empty: the heuristic's kernel
  return {name.empty() ? heuristic(l) : name, order == kAlongN};
}

sm90::KernelEntry checked(const std::string& name, const GemmLaunch& l) {
  const TableEntry& e = by_name(name);
  GROUPMM_CHECK(serves(e, l), "grouped_gemm: config '", name, "' computes ",
                describe(e.pass, e.a, e.b, e.out, e.recipe), ", not ",
                describe(l.pass, l.a_dtype, l.b_dtype, l.out_dtype, l.recipe));
  return e.make();
}

Plan pick(const GemmLaunch& l) {
  const Choice c = choose(l);
  const std::string& name = c.name;
  Plan p;
  p.along_n = c.along_n;
  if (const SplitEntry* s = find_split(name)) {
    p.first = checked(s->inside, l);
    p.second = checked(s->outside, l);
    GROUPMM_CHECK(p.first.layout_id() == p.second.layout_id(), "grouped_gemm: split config '", name,
                  "' pairs kernels whose argument arrays differ");
    p.first_class = {s->lo, s->hi, false};
    p.split = true;
  } else {
    p.first = checked(name, l);
  }
  return p;
}

size_t aligned(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// A plan's workspace: the first launch's part (256-aligned when a second launch follows), then
// the second's.
struct PlanWorkspace {
  size_t first = 0, total = 0;
};
PlanWorkspace workspace_of(const Plan& p, const GemmDims& d, int sms) {
  const size_t one = p.first.workspace_size(d, sms);
  if (!p.split) return {one, one};
  return {aligned(one), aligned(one) + p.second.workspace_size(d, sms)};
}

}  // namespace

size_t cutlass_gemm_workspace_size(const GemmLaunch& l, int sms) {
  return workspace_of(pick(l), l.dims, sms).total;
}

void cutlass_grouped_gemm(Context& ctx, const GemmLaunch& l, void* workspace,
                          size_t workspace_bytes) {
  // One pick per call (a repeated call's host time is the budget: the kernel parameters are
  // cached per configuration, sm90_grouped.cuh).
  const Plan p = pick(l);
  const PlanWorkspace need = workspace_of(p, l.dims, ctx.sm_count());
  if (workspace == nullptr) {
    workspace = ctx.workspace(need.total);
    workspace_bytes = ctx.workspace_size();
  }
  GROUPMM_CHECK(workspace_bytes >= need.total, "grouped_gemm: workspace_bytes=", workspace_bytes,
                " must be >= ", need.total, " (grouped_gemm_workspace_size)");
  if (!p.split) {
    sm90::LaunchPart whole;
    whole.along_n = p.along_n;
    p.first.run(ctx, l, workspace, workspace_bytes, whole);
    return;
  }
  // Two launches in stream order, each over its class of experts; one setup kernel (the first
  // launch's) writes the arrays of both, and each has its own CUTLASS workspace.
  sm90::LaunchPart one;
  one.row_class = p.first_class;
  one.write_other = true;
  one.along_n = p.along_n;
  sm90::LaunchPart two;
  two.row_class = p.first_class;
  two.row_class.outside = !two.row_class.outside;
  two.shared = reinterpret_cast<void*>(sm90::align_up(reinterpret_cast<uintptr_t>(workspace), 256));
  two.along_n = p.along_n;
  p.first.run(ctx, l, workspace, need.first, one);
  p.second.run(ctx, l, static_cast<char*>(workspace) + need.first, workspace_bytes - need.first,
               two);
}

std::string cutlass_config_name(const GemmLaunch& l) {
  const Choice c = choose(l);
  return c.along_n ? c.name + kAlongN : c.name;
}

std::vector<std::string> cutlass_config_names() {
  std::vector<std::string> v;
  for (const auto& e : kTable) v.push_back(e.name);
  for (const auto& e : kSplits) v.push_back(e.name);
  return v;
}

}  // namespace groupmm::cuda
