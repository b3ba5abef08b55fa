// The GEMM configuration table (configs.def) as constexpr data for host code: identifiers, names,
// what each configuration computes, and the build's checks that every name spells its row. Host
// C++ only (no CUDA, no CUTLASS), so a CPU-only library lists the configurations too.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "gemm/backends.hpp"
#include "gemm/cuda/config_row.hpp"

namespace groupmm::cuda {

// Every configuration: the kernel rows in table order, then the splits.
enum class GemmConfig : uint8_t {
#define GROUPMM_GEMM_KERNEL(name, ...) name,
#include "gemm/cuda/configs.def"
#define GROUPMM_GEMM_SPLIT(name, ...) name,
#include "gemm/cuda/configs.def"
};

inline constexpr sm90::KernelRow kKernelRows[] = {
#define GROUPMM_GEMM_KERNEL(...) GROUPMM_SM90_KERNEL_ROW(__VA_ARGS__),
#include "gemm/cuda/configs.def"
};
inline constexpr int kKernelCount = int(sizeof(kKernelRows) / sizeof(kKernelRows[0]));

struct SplitRow {
  const char* name;
  GemmConfig inside;   // the experts of the row class (heuristic.cpp: split_rows)
  GemmConfig outside;  // every other expert, empty ones included
};

inline constexpr SplitRow kSplitRows[] = {
#define GROUPMM_GEMM_SPLIT(name, inside, outside) \
  SplitRow{#name, GemmConfig::inside, GemmConfig::outside},
#include "gemm/cuda/configs.def"
};
inline constexpr int kConfigCount = kKernelCount + int(sizeof(kSplitRows) / sizeof(kSplitRows[0]));

constexpr bool is_split(GemmConfig c) {
  return int(c) >= kKernelCount;
}
// Preconditions: !is_split(c), resp. is_split(c).
constexpr const sm90::KernelRow& kernel_row(GemmConfig c) {
  return kKernelRows[int(c)];
}
constexpr const SplitRow& split_row(GemmConfig c) {
  return kSplitRows[int(c) - kKernelCount];
}
constexpr const char* config_name(GemmConfig c) {
  return is_split(c) ? split_row(c).name : kernel_row(c).name;
}

inline std::optional<GemmConfig> find_config(std::string_view name) {
  for (int i = 0; i < kConfigCount; ++i)
    if (name == config_name(GemmConfig(i))) return GemmConfig(i);
  return std::nullopt;
}

// Whether a kernel row computes the launch (pass, element types, recipe, accumulation).
inline bool serves(const sm90::KernelRow& r, const GemmLaunch& l) {
  return sm90::pass_of(r.role) == l.pass && r.a == l.a_dtype && r.b == l.b_dtype &&
         r.out == l.out_dtype && r.recipe == l.recipe && r.fast_accum == l.fast_accum;
}

// "forward bf16->fp32" for 16-bit operands, "dgrad fp8e5m2 x fp8e4m3->bf16 (fp8_current)" for
// quantized ones: what a launch or a row computes, for error messages.
inline std::string describe_kind(GemmPass pass, DType a, DType b, DType out, QuantRecipe r) {
  return detail::cat(gemm_pass_name(pass), " ", dtype_name(a),
                     a == b ? "" : detail::cat(" x ", dtype_name(b)), "->", dtype_name(out),
                     r == QuantRecipe::none ? "" : detail::cat(" (", recipe_name(r), ")"));
}

// ---- the build's checks on the table -----------------------------------------------------------
namespace table_check {

// A row the kernel template can take at all (Sm90GroupedConfig checks the rest).
constexpr bool well_formed(const sm90::KernelRow& r) {
  const bool recipe_ok = r.recipe == QuantRecipe::none || r.recipe == QuantRecipe::fp8_current ||
                         r.recipe == QuantRecipe::fp8_block || r.recipe == QuantRecipe::nvfp4;
  return recipe_ok && r.tile_m > 0 && r.tile_n > 0 && r.tile_k > 0 && r.cluster_m > 0 &&
         r.cluster_n > 0 && r.epilogue_n >= 0;
}

// A scaled recipe has at most one kernel per kind and role (the heuristic looks it up by those).
constexpr bool scaled_kinds_unique() {
  for (int i = 0; i < kKernelCount; ++i)
    for (int j = i + 1; j < kKernelCount; ++j)
      if (kKernelRows[i].recipe != QuantRecipe::none &&
          kKernelRows[i].role == kKernelRows[j].role &&
          sm90::same_kind(kKernelRows[i], kKernelRows[j]))
        return false;
  return true;
}

constexpr bool split_ok(const SplitRow& s) {
  return !is_split(s.inside) && !is_split(s.outside) &&
         sm90::same_kind(kernel_row(s.inside), kernel_row(s.outside)) &&
         sm90::split_name(kernel_row(s.inside), kernel_row(s.outside)).equals(s.name);
}

}  // namespace table_check

// One assertion per row, so that a failing build names the row.
#define GROUPMM_GEMM_KERNEL(name, ...)                                  \
  static_assert(sm90::name_matches(kernel_row(GemmConfig::name)),       \
                "configs.def: the name " #name                          \
                " does not spell its row's parameters (the "            \
                "naming scheme is at the top of configs.def)");         \
  static_assert(table_check::well_formed(kernel_row(GemmConfig::name)), \
                "configs.def: row " #name " has a recipe or size the kernels do not take");
#define GROUPMM_GEMM_SPLIT(name, ...)                               \
  static_assert(table_check::split_ok(split_row(GemmConfig::name)), \
                "configs.def: split " #name                         \
                " pairs kernels of different kinds, or its name "   \
                "does not spell them");
#include "gemm/cuda/configs.def"
static_assert(table_check::scaled_kinds_unique(),
              "configs.def: two scaled rows of one pass, dtypes, recipe and role");

}  // namespace groupmm::cuda
