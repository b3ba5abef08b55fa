// The `groupmm` tool's command registry and option helpers (CLI11).
//
// Adding a command: one file (tools/bench/<suite>.cpp, tools/demo/<name>.cpp) with an options
// struct, a function that declares the options, the function that runs, and a static Register:
//
//   struct BenchMoeOptions { int iters = 20; std::string json_path; };
//   void add_bench_moe_options(CLI::App& app, BenchMoeOptions& o) {
//     add_iters(app, o.iters, "timed runs per case");
//     add_json(app, o.json_path);
//   }
//   int run_bench_moe(const BenchMoeOptions& o);  // after a successful parse: the exit status
//   Register reg_bench_moe(command<BenchMoeOptions>("bench", "moe", "MoE block suite",
//                                                   add_bench_moe_options, run_bench_moe));
//
// A bench suite measures through tools/bench/harness.hpp (cases, validation, timing, the table
// and the --json records); sizes the library bounds take their ranges from common/limits.hpp.
// main.cpp builds the command tree from the registry (groups such as "bench" are listed there), so
// `--help` of every command works without a GPU and parse errors never reach the command.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "groupmm/core.hpp"

namespace groupmm::tool {

using Runner = std::function<int()>;

struct CommandDef {
  std::string group;  // "" (top level) or a group of main.cpp's kGroups ("bench")
  std::string name;   // "demo", "gemm", ...
  std::string help;
  // Adds the command's options to `app` and returns what runs when the command is chosen.
  std::function<Runner(CLI::App& app)> setup;
};

std::vector<CommandDef>& registry();

struct Register {
  explicit Register(CommandDef def) { registry().push_back(std::move(def)); }
};

// A command whose options live in an `Options` struct: `add` declares them on the command's
// CLI::App, `run` runs with the parsed values.
template <class Options>
CommandDef command(std::string group, std::string name, std::string help,
                   void (*add)(CLI::App&, Options&), int (*run)(const Options&)) {
  return {std::move(group), std::move(name), std::move(help), [add, run](CLI::App& app) -> Runner {
            auto o = std::make_shared<Options>();
            add(app, *o);
            return [o, run] { return run(*o); };
          }};
}

// A mistake in the command line or in the values given (exit status 2, no source location).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- typed, range-checked options ------------------------------------------------------------
// Integers are decimal only ("2.5", "3x", "abc", "010" are rejected, not truncated or read as
// octal); the error names the option and the accepted range.
CLI::Option* add_int(CLI::App& app, const std::string& name, int64_t& value, int64_t lo, int64_t hi,
                     const std::string& help);
CLI::Option* add_int(CLI::App& app, const std::string& name, int& value, int lo, int hi,
                     const std::string& help);
// An integer in [lo, hi] that must also be a multiple of `multiple` ("--hidden: 100 is not a
// multiple of 8").
CLI::Option* add_int_multiple(CLI::App& app, const std::string& name, int64_t& value, int64_t lo,
                              int64_t hi, int64_t multiple, const std::string& help);
// A finite decimal number in [lo, hi] ("abc" is not a number, "nan" and "inf" are not finite).
CLI::Option* add_real(CLI::App& app, const std::string& name, double& value, double lo, double hi,
                      const std::string& help);
// --iters N: timed runs (the median is reported), 1 to 100000.
CLI::Option* add_iters(CLI::App& app, int& value, const std::string& help);
// One of `choices`; the error lists them.
CLI::Option* add_choice(CLI::App& app, const std::string& name, std::string& value,
                        const std::vector<std::string>& choices, const std::string& help);
// A comma-separated list (or repeated option) of `choices`.
CLI::Option* add_choice_list(CLI::App& app, const std::string& name,
                             std::vector<std::string>& values,
                             const std::vector<std::string>& choices, const std::string& help);
// --json PATH: where a suite writes its records for bench/plot.py (an empty PATH is refused).
CLI::Option* add_json(CLI::App& app, std::string& path);
// Throws UsageError "NAME does not apply WHY" when `given` (an option given where it has no
// effect: an option is never silently ignored).
void reject_option(bool given, const std::string& name, const std::string& why);

// Opens a --json output before any work, so that a wrong path fails at once (exit 2).
std::ofstream open_json(const std::string& path);
// Throws groupmm::Error when a file written with open_json() failed (disk full, ...).
void close_json(std::ofstream& f, const std::string& path);

// ---- limits ------------------------------------------------------------------------------------
// Bytes the system can still give (host: MemAvailable; CUDA: free device memory).
double available_bytes(Device d);
// Throws UsageError when `bytes` (what the command will allocate on `d`) would not fit, naming
// `what` and the options that size it: "... needs about 400.0 GiB of host memory, more than the
// 21.3 GiB available; reduce --tokens".
void check_fits_memory(const std::string& what, double bytes, Device d, const std::string& knobs);

std::string format_bytes(double bytes);  // "1.5 GiB"
// A time given in microseconds, in a unit that reads: "812.4 us", "907.3 ms", "5.74 s".
std::string format_us(double us);

}  // namespace groupmm::tool
