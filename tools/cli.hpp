// The `groupmm` tool's command registry and option helpers (CLI11).
//
// Adding a command: one tools/cmd_<name>.cpp that defines a static Register, e.g.
//
//   Register reg({"bench", "moe", "MoE block suite", [](CLI::App& app) {
//     auto o = std::make_shared<MoeOptions>();
//     add_int(app, "--iters", o->iters, 1, 100000, "timed iterations");
//     return [o] { return run_bench_moe(*o); };  // runs after a successful parse
//   }});
//
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

// A mistake in the command line or in the values given (exit status 2, no source location).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- typed, range-checked options
// ---------------------------------------------------------------- Integers are decimal only
// ("2.5", "3x", "abc", "010" are rejected, not truncated or read as octal); the error names the
// option and the accepted range.
CLI::Option* add_int(CLI::App& app, const std::string& name, int64_t& value, int64_t lo, int64_t hi,
                     const std::string& help);
CLI::Option* add_int(CLI::App& app, const std::string& name, int& value, int lo, int hi,
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
// --json PATH: where a suite writes its records for bench/plot.py.
CLI::Option* add_json(CLI::App& app, std::string& path);

// Opens a --json output before any work, so that a wrong path fails at once (exit 2).
std::ofstream open_json(const std::string& path);
// Throws groupmm::Error when a file written with open_json() failed (disk full, ...).
void close_json(std::ofstream& f, const std::string& path);

// ---- limits
// -------------------------------------------------------------------------------------- Bytes the
// system can still give (host: MemAvailable; CUDA: free device memory).
double available_bytes(Device d);
// Throws UsageError when `bytes` (what the command will allocate on `d`) would not fit, naming
// `what` and the options that size it: "... needs about 400.0 GiB of host memory, more than the
// 21.3 GiB available; reduce --tokens".
void check_fits_memory(const std::string& what, double bytes, Device d, const std::string& knobs);

std::string format_bytes(double bytes);  // "1.5 GiB"

}  // namespace groupmm::tool
