// One row of the GEMM configuration table (configs.def) as constexpr data, and the naming scheme
// that spells a row's name from its parameters. Plain C++17 (host and nvcc), no CUTLASS: the
// per-configuration translation units check their own row with it, and configs.hpp checks every
// row of the table.
#pragma once

#include <cstdint>

#include "groupmm/gemm.hpp"

namespace groupmm::cuda::sm90 {

// The CUTLASS problem a kernel computes (the mapping is in sm90_config.cuh).
enum class Role : uint8_t { forward, forward_swap, dgrad, wgrad };
enum class Schedule : uint8_t { cooperative, pingpong };
// How quantized operands are scaled back:
//  - none:       16-bit operands, scalar alpha;
//  - per_expert: FP8 with one fp32 scale per expert and operand, alpha_g = alpha * sa_g * sb_g
//                applied in the epilogue (per-group alpha pointers); also 16-bit forward operands
//                with a per-expert factor sb_g (the dequantized NVFP4 weights, gemm/w4.cpp);
//  - blockwise:  FP8 with fp32 block scales applied in the mainloop at every 128-deep K block
//                (1x128 activations, 128x128 weights; 1x1x128 for wgrad), scalar alpha.
enum class Scaling : uint8_t { none, per_expert, blockwise };

struct KernelRow {
  const char* name;
  Role role;
  DType a, b, out;
  QuantRecipe recipe;  // none, fp8_current, fp8_block, or nvfp4 (bf16 operands, per-expert alpha)
  bool fast_accum;     // per-expert FP8 without the periodic fp32 promotion (inference)
  int tile_m, tile_n, tile_k;
  int cluster_m, cluster_n;
  Schedule schedule;
  int epilogue_n;       // epilogue subtile width (tile_m by epilogue_n); 0: CUTLASS's choice
  bool wide_blockwise;  // a 128x192 blockwise forward/dgrad on sm90_blockwise_wide_mainloop.cuh
};

// A row of configs.def, in the order of its columns, as a KernelRow.
// clang-format off
#define GROUPMM_SM90_KERNEL_ROW(NAME, ROLE, A, B, OUT, RECIPE, FAST, TM, TN, TK, CM, CN, SCHED, \
                                EPI_N, WIDE)                                                    \
  ::groupmm::cuda::sm90::KernelRow{                                                             \
      #NAME, ::groupmm::cuda::sm90::Role::ROLE, ::groupmm::DType::A, ::groupmm::DType::B,       \
      ::groupmm::DType::OUT, ::groupmm::QuantRecipe::RECIPE, FAST, TM, TN, TK, CM, CN,          \
      ::groupmm::cuda::sm90::Schedule::SCHED, EPI_N, WIDE}
// clang-format on

constexpr Scaling scaling_of(QuantRecipe r) {
  return r == QuantRecipe::fp8_block                                ? Scaling::blockwise
         : r == QuantRecipe::fp8_current || r == QuantRecipe::nvfp4 ? Scaling::per_expert
                                                                    : Scaling::none;
}

constexpr GemmPass pass_of(Role r) {
  return r == Role::dgrad   ? GemmPass::dgrad
         : r == Role::wgrad ? GemmPass::wgrad
                            : GemmPass::forward;
}

// Whether two rows compute the same launches (pass, element types, recipe, accumulation): the
// kernels a split pairs, and the rows the heuristic chooses among.
constexpr bool same_kind(const KernelRow& x, const KernelRow& y) {
  return pass_of(x.role) == pass_of(y.role) && x.a == y.a && x.b == y.b && x.out == y.out &&
         x.recipe == y.recipe && x.fast_accum == y.fast_accum;
}

// ---- the naming scheme (configs.def states it for readers) -------------------------------------
// A name built at compile time, compared with the row's.
struct ConfigName {
  char text[96] = {};
  int size = 0;
  constexpr void add(const char* s) {
    while (*s != '\0' && size + 1 < int(sizeof(text))) text[size++] = *s++;
  }
  constexpr void add(int v) {
    char digits[12] = {};
    int n = 0;
    do {
      digits[n++] = char('0' + v % 10);
      v /= 10;
    } while (v > 0 && n < 11);
    while (n > 0 && size + 1 < int(sizeof(text))) text[size++] = digits[--n];
  }
  constexpr bool equals(const char* s) const {
    int i = 0;
    for (; i < size; ++i)
      if (s[i] != text[i]) return false;
    return s[i] == '\0';
  }
};

constexpr const char* name_token(Role r) {
  return r == Role::forward        ? "fwd"
         : r == Role::forward_swap ? "fwdswap"
         : r == Role::dgrad        ? "dgrad"
                                   : "wgrad";
}

constexpr const char* name_token(DType t) {
  return t == DType::bf16      ? "bf16"
         : t == DType::fp16    ? "fp16"
         : t == DType::fp32    ? "f32"
         : t == DType::fp8e4m3 ? "e4m3"
         : t == DType::fp8e5m2 ? "e5m2"
                               : "?";
}

constexpr const char* name_token(Schedule s) {
  return s == Schedule::cooperative ? "coop" : "pp";
}

// "<pass>_<a>[x<b>][_<out>][_alpha|_block][_fast]": what a row computes.
constexpr ConfigName kind_name(const KernelRow& r) {
  ConfigName n;
  n.add(name_token(r.role));
  n.add("_");
  n.add(name_token(r.a));
  if (r.b != r.a) {
    n.add("x");
    n.add(name_token(r.b));
  }
  if (r.role == Role::wgrad || r.out != r.a) {
    n.add("_");
    n.add(name_token(r.out));
  }
  if (r.recipe == QuantRecipe::nvfp4) n.add("_alpha");
  if (r.recipe == QuantRecipe::fp8_block) n.add("_block");
  if (r.fast_accum) n.add("_fast");
  return n;
}

// "<kind>_<tile M>x<tile N>_<schedule>_c<cluster M><cluster N>".
constexpr ConfigName kernel_name(const KernelRow& r) {
  ConfigName n = kind_name(r);
  n.add("_");
  n.add(r.tile_m);
  n.add("x");
  n.add(r.tile_n);
  n.add("_");
  n.add(name_token(r.schedule));
  n.add("_c");
  n.add(r.cluster_m);
  n.add(r.cluster_n);
  return n;
}

constexpr void add_schedule_tile(ConfigName& n, const KernelRow& r) {
  n.add("_");
  n.add(name_token(r.schedule));
  n.add(r.tile_m);
  n.add("x");
  n.add(r.tile_n);
}

// "<kind>_split_<schedule><tile M>x<tile N>_<schedule><tile M>x<tile N>": the experts' inside and
// outside kernels.
constexpr ConfigName split_name(const KernelRow& inside, const KernelRow& outside) {
  ConfigName n = kind_name(inside);
  n.add("_split");
  add_schedule_tile(n, inside);
  add_schedule_tile(n, outside);
  return n;
}

constexpr bool name_matches(const KernelRow& r) {
  return kernel_name(r).equals(r.name);
}

}  // namespace groupmm::cuda::sm90
