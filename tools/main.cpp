// groupmm: the command line (info, demo, bench <suite>).
#include <algorithm>
#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "groupmm/core.hpp"

namespace groupmm::tool {

std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}

bool has_flag(const Args& a, const std::string& flag) {
  return std::find(a.begin(), a.end(), flag) != a.end();
}

std::string get_opt(const Args& a, const std::string& key, const std::string& def) {
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == key) return a[i + 1];
  return def;
}

}  // namespace groupmm::tool

int main(int argc, char** argv) {
  using namespace groupmm::tool;
  Args args(argv + 1, argv + argc);
  auto& reg = registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.name < b.name; });
  auto usage = [&] {
    std::printf("usage: groupmm <command> [options]\n\ncommands:\n");
    for (auto& c : reg) std::printf("  %-16s %s\n", c.name.c_str(), c.help.c_str());
    return 2;
  };
  if (args.empty() || args[0] == "-h" || args[0] == "--help") return usage();
  try {
    // Two-word commands ("bench gemm") first, then one-word ones.
    for (size_t words : {size_t(2), size_t(1)}) {
      if (args.size() < words) continue;
      std::string name = args[0];
      if (words == 2) name += " " + args[1];
      for (auto& c : reg)
        if (c.name == name) return c.fn(Args(args.begin() + static_cast<long>(words), args.end()));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "groupmm: error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "groupmm: unknown command '%s'\n\n", args[0].c_str());
  return usage();
}
