// The one harness of the `groupmm bench` suites. A suite driver picks its cases, then for each:
// validates it against a reference (rel_err, calc_diff; Failures counts and reports), times it
// and its peers (common/timing.hpp: CUDA events, graph replay, host time; rotation past L2, the
// copy bandwidth), prints one Table row, and adds one JsonRecord to its JsonFile (--json). Option
// ranges come from cli.hpp's typed options and the library's limits (common/limits.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "cli.hpp"
#include "common/timing.hpp"
#include "groupmm/core.hpp"
#include "groupmm/gemm.hpp"

namespace groupmm::tool {

// ---- cases -------------------------------------------------------------------------------------
// The public GEMM suite (docs/testing.md): MoE expert shapes from the models' published
// configurations, M = rows routed to all G experts. `bench gemm` runs them all; `bench layer
// --recipe` the training layers among them.
struct SuiteShape {
  const char* name;
  int64_t G, M, N, K;
};
inline constexpr SuiteShape kGemmSuite[] = {
    {"dsv3_gate_up", 32, 32768, 4096, 7168},         {"dsv3_down", 32, 32768, 7168, 2048},
    {"contiguous_4x8192", 4, 32768, 4096, 7168},     {"mixtral_gate_up", 8, 16384, 28672, 4096},
    {"mixtral_down", 8, 16384, 4096, 14336},         {"qwen3_gate_up", 128, 65536, 1536, 2048},
    {"qwen3_down", 128, 65536, 2048, 768},           {"qwen3_decode", 128, 1024, 1536, 2048},
    {"llama4_scout_gate_up", 16, 8192, 16384, 5120}, {"dsv3_decode", 32, 256, 4096, 7168},
};

// The harder cases of the 16-bit engine (`bench gemm --suite ragged|fine`), bf16 only.
// Ragged widths: expert and hidden sizes that are not multiples of the 128x256 tile (DeepSeek-V2-
// Lite / Qwen1.5-MoE experts 1408 wide, experts 1920 wide on a 5120 + 64 hidden size), 2048 rows
// per expert so the width, not the reduction, is what is measured.
inline constexpr SuiteShape kRaggedSuite[] = {
    {"ragged_1408_gate_up", 16, 32768, 2816, 2048},
    {"ragged_1408_down", 16, 32768, 2048, 1408},
    {"ragged_1920_down", 16, 32768, 5184, 1920},
};
// Fine-grained experts: many small groups (torch._grouped_mm refuses 1024 groups or more).
inline constexpr SuiteShape kFineSuite[] = {
    {"fine_g512_r64", 512, 32768, 1024, 2048},
    {"fine_g2048_r16", 2048, 32768, 1024, 2048},
};

// True when `filter` (a --case substring) is empty or in `name`.
inline bool case_matches(const std::string& filter, const std::string& name) {
  return filter.empty() || name.find(filter) != std::string::npos;
}
// Throws UsageError "--case 'F' matches no WHAT (cases: a, b, ...)" when no name matches.
void check_case_filter(const std::string& filter, const std::vector<std::string>& names,
                       const std::string& what = "case");

// The benchmark split patterns (docs/testing.md): balanced, Zipf (exponent 1.1, shuffled), 25% of
// experts empty.
inline const std::vector<std::string> kSplitPatterns = {"balanced", "zipf", "empty25"};
std::vector<int64_t> bench_splits(const std::string& pattern, int64_t G, int64_t total,
                                  uint64_t seed = 7);
// The FP8 wgrad rule (gemm.hpp): every split a multiple of 16, the remainders moved to the first
// non-empty split (the total is a multiple of 16 here).
std::vector<int64_t> align_splits16(std::vector<int64_t> s);

// A training recipe's name (fp8_current, fp8_block, mxfp8; the options' choices) as the core's.
QuantRecipe training_recipe_of(const std::string& name);

// ---- validation --------------------------------------------------------------------------------
// ||a - b|| / ||b|| of two bf16 or fp32 views (any device); infinite when a has a non-finite value.
double rel_err(const TensorView& a, const TensorView& b);
// DeepGEMM's difference 1 - 2 sum(xy) / sum(x^2 + y^2) of two bf16 or fp32 views (any device).
double calc_diff(const TensorView& x, const TensorView& y);

// Counts the cases that failed validation; summary() prints "ok: 0 case(s) failed validation"
// (or FAIL: ...) and returns the exit status.
struct Failures {
  int count = 0;
  bool check(bool ok) {
    count += ok ? 0 : 1;
    return ok;
  }
  int summary() const;
};

// ---- memory ceiling and L2 ---------------------------------------------------------------------
// Copies of the inputs needed so that rotating through them touches more than 3x L2.
int rotation_copies(int64_t input_bytes);
// Device-to-device copy bandwidth (bytes read + written per second), the memory ceiling.
double copy_bandwidth_gbs(cudaStream_t stream);
// The compute ceiling: one dense cuBLAS bf16 GEMM (fp32 accumulation) in a grouped pass's layout
// over all M rows: forward y[M, N] = a[M, K] b[N, K]^T, dgrad y[M, K] = a[M, N] b[N, K], wgrad
// y[N, K] = a[M, N]^T b[M, K]; out bf16 or fp32. Launch i reads operands(i) = {a, b} (a rotation
// past L2, or the same pair). Median ms over iters launches.
using DenseOperands = std::function<std::pair<const void*, const void*>(int)>;
double dense_gemm_ms(Context& ctx, GemmPass pass, int64_t M, int64_t N, int64_t K,
                     const DenseOperands& operands, void* out, DType out_t, int iters);
// The same on operands of its own (uniform random bf16), into bf16.
double dense_gemm_ms(Context& ctx, GemmPass pass, int64_t M, int64_t N, int64_t K, int iters);

// ---- the table ---------------------------------------------------------------------------------
// One column: text is left-aligned when `left`, else right-aligned like numbers; a number prints
// with `kind` ('d' integer, 'f' fixed, 'e' exponent, 'g' general) and `precision`, then `unit`
// ("%", "x"), the whole `width` wide. `sep` goes before the column (none before the first).
struct Column {
  std::string head;
  int width = 0;
  char kind = 's';
  int precision = 1;
  bool left = false;
  std::string unit;
  std::string sep = " ";
};
inline Column text_col(std::string head, int width) {
  return {std::move(head), width, 's', 0, true, "", " "};
}
inline Column int_col(std::string head, int width) {
  return {std::move(head), width, 'd', 0, false, "", " "};
}
inline Column num_col(std::string head, int width, int precision, char kind = 'f',
                      std::string unit = "") {
  return {std::move(head), width, kind, precision, false, std::move(unit), " "};
}

using Cell = std::variant<std::string, int64_t, double>;

class Table {
 public:
  explicit Table(std::vector<Column> cols, std::string indent = "")
      : cols_(std::move(cols)), indent_(std::move(indent)) {}
  void print_header() const;
  // The row's text (cells in column order) followed by `tail`, without a newline.
  std::string row(const std::vector<Cell>& cells, const std::string& tail = "") const;
  // Prints row(...) and a newline, and flushes (a long suite shows its progress).
  void print_row(const std::vector<Cell>& cells, const std::string& tail = "") const;

 private:
  std::vector<Column> cols_;
  std::string indent_;
};

// ---- --json ------------------------------------------------------------------------------------
// One JSON object, its keys in the order added.
class JsonRecord {
 public:
  JsonRecord& add(const std::string& key, const std::string& v);
  JsonRecord& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  JsonRecord& add(const std::string& key, double v);
  JsonRecord& add(const std::string& key, int64_t v);
  JsonRecord& add(const std::string& key, int v) { return add(key, int64_t(v)); }
  JsonRecord& add(const std::string& key, bool v);
  JsonRecord& add(const std::string& key, const std::vector<int64_t>& v);
  JsonRecord& add(const std::string& key, const JsonRecord& v);  // a nested object
  std::string str() const { return "{" + body_ + "}"; }
  bool empty() const { return body_.empty(); }

 private:
  JsonRecord& raw(const std::string& key, const std::string& json);
  std::string body_;
};

// A suite's --json file: {head's keys, "cases": [the records], tail's keys}. Opened when
// constructed (a path that cannot be written fails at once, exit 2, before any work); written by
// write(). An empty path: no file, and write() does nothing.
class JsonFile {
 public:
  explicit JsonFile(std::string path);
  bool on() const { return !path_.empty(); }
  void add(const JsonRecord& r) { cases_.push_back(r.str()); }
  // Writes the file; `announce` prints "wrote PATH".
  void write(const JsonRecord& head, const JsonRecord& tail = {}, bool announce = false);

 private:
  std::string path_;
  std::ofstream f_;
  std::vector<std::string> cases_;
};

}  // namespace groupmm::tool
