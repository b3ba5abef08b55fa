// Command registry of the `groupmm` tool: each tools/cmd_*.cpp registers its commands statically.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace groupmm::tool {

using Args = std::vector<std::string>;
using CommandFn = std::function<int(const Args&)>;

struct Command {
  std::string name;  // "info", "bench gemm", ...
  std::string help;
  CommandFn fn;
};

std::vector<Command>& registry();

struct Register {
  Register(std::string name, std::string help, CommandFn fn) {
    registry().push_back({std::move(name), std::move(help), std::move(fn)});
  }
};

// Small argument helpers: --key value / --flag.
bool has_flag(const Args& a, const std::string& flag);
std::string get_opt(const Args& a, const std::string& key, const std::string& def);

}  // namespace groupmm::tool
