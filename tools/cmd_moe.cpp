// Temporary wiring of `groupmm bench moe` and `groupmm demo moe` into the current command
// registry (so scripts/moe_gpu_check.sh runs them today). The CLI11 rewrite replaces this file:
// the commands are run_bench_moe / run_demo_moe of tools/moe_tools.hpp.
#include <sstream>

#include "commands.hpp"
#include "moe_tools.hpp"

namespace groupmm::tool {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty() && item != "all") out.push_back(item);
  return out;
}

int bench_moe(const Args& a) {
  MoeBenchOptions o;
  o.cases = split_list(get_opt(a, "--case", "all"));
  o.tokens = std::stoll(get_opt(a, "--tokens", "0"));
  o.iters = std::stoi(get_opt(a, "--iters", "20"));
  o.cpu = has_flag(a, "--cpu");
  o.json = get_opt(a, "--json", "");
  return run_bench_moe(o);
}

int demo_moe(const Args& a) {
  MoeDemoOptions o;
  o.cpu = has_flag(a, "--cpu");
  o.experts = std::stoll(get_opt(a, "--experts", "0"));
  o.hidden = std::stoll(get_opt(a, "--hidden", "0"));
  o.ffn_hidden = std::stoll(get_opt(a, "--width", "0"));
  o.tokens = std::stoll(get_opt(a, "--tokens", "0"));
  o.topk = std::stoll(get_opt(a, "--topk", "0"));
  o.shared_ffn_hidden = std::stoll(get_opt(a, "--shared", "0"));
  o.iters = std::stoi(get_opt(a, "--iters", "0"));
  o.samples = std::stoi(get_opt(a, "--samples", "8"));
  return run_demo_moe(o);
}

Register reg_bench("bench moe",
                   "MoE block fwd / fwd+bwd, per-stage breakdown, row movers vs copy; "
                   "[--case qwen3,dsv3,mixtral] [--tokens T] [--iters n] [--json f] [--cpu]",
                   bench_moe);
Register reg_demo("demo moe",
                  "the whole MoE block with a per-stage table and a CPU-reference check; [--cpu] "
                  "[--experts E] [--hidden H] [--width F] [--tokens T] [--topk k] [--shared Fs]",
                  demo_moe);

}  // namespace
}  // namespace groupmm::tool
