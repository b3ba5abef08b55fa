// groupmm: the command line (info, demo [moe], bench <suite>), built on CLI11 from the command
// registry.
//
// Exit status: 0 success (and --help / --version), 1 a failed run (an error of the library or the
// device, a failed validation), 2 a usage error (unknown command or option, bad value, a size that
// does not fit in memory). Errors print as "groupmm: error: ..." without source locations.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>

#include "cli.hpp"
#include "groupmm/version.hpp"

namespace groupmm::tool {
namespace {

struct Group {
  const char* name;
  const char* help;
};
// Commands that only hold subcommands. `groupmm <group>` alone lists them.
const Group kGroups[] = {
    {"bench", "benchmarks, one suite per subcommand (GPU; `bench layer --cpu` runs anywhere)"},
};

// groupmm::Error messages end in " [file.cpp:123]" (for developers and test logs); a user of the
// tool gets the message alone.
std::string without_location(const std::string& msg) {
  const size_t open = msg.rfind(" [");
  if (open == std::string::npos || msg.back() != ']') return msg;
  const size_t colon = msg.rfind(':');
  if (colon == std::string::npos || colon < open || colon + 2 >= msg.size()) return msg;
  for (size_t i = colon + 1; i + 1 < msg.size(); ++i)
    if (msg[i] < '0' || msg[i] > '9') return msg;
  return msg.substr(0, open);
}

int usage_error(const std::string& msg, const std::string& path) {
  std::fprintf(stderr, "groupmm: error: %s\nrun 'groupmm%s --help' for the accepted options\n",
               msg.c_str(), path.c_str());
  return 2;
}

std::string list_of(const CLI::App* app) {
  std::string s;
  for (const CLI::App* c : app->get_subcommands([](const CLI::App*) { return true; }))
    s += (s.empty() ? "" : ", ") + c->get_name();
  return s;
}

// The leading words of the command line name a path in the command tree ("bench gemm"). A word
// that names no command is reported here: CLI11 would only say "A subcommand is required".
int check_command_words(CLI::App& app, int argc, char** argv, std::string* path) {
  CLI::App* node = &app;
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    if (node->get_subcommands([](const CLI::App*) { return true; }).empty()) break;
    CLI::App* next = nullptr;
    try {
      next = node->get_subcommand(argv[i]);
    } catch (const CLI::OptionNotFound&) {
      const std::string what = node == &app ? "command" : node->get_name() + " suite";
      const std::string kinds = node == &app ? "commands" : "suites";
      return usage_error(
          "unknown " + what + " '" + argv[i] + "' (" + kinds + ": " + list_of(node) + ")", *path);
    }
    *path += " " + next->get_name();
    node = next;
  }
  return 0;
}

int run(int argc, char** argv) {
  CLI::App app(
      "groupmm " GROUPMM_VERSION
      ": grouped GEMM, grouped quantization and MoE expert layers for NVIDIA Hopper (sm_90a), "
      "with a CPU reference backend",
      "groupmm");
  app.set_version_flag("--version", "groupmm " GROUPMM_VERSION);
  app.require_subcommand(0, 1);
  app.footer("Every command has --help. Documentation: README.md and docs/ in the source tree.");

  auto& reg = registry();
  std::stable_sort(reg.begin(), reg.end(), [](const CommandDef& a, const CommandDef& b) {
    return a.group + " " + a.name < b.group + " " + b.name;
  });
  Runner chosen;
  std::vector<CLI::App*> groups;
  for (const Group& g : kGroups) {
    CLI::App* sub = app.add_subcommand(g.name, g.help);
    sub->require_subcommand(0, 1);
    groups.push_back(sub);
  }
  // A group is a kGroups entry or a command registered before (sorted: top level first), so
  // `demo moe` is a command of its own under the `demo` command.
  for (const CommandDef& def : reg) {
    CLI::App* parent = def.group.empty() ? &app : app.get_subcommand(def.group);
    CLI::App* sub = parent->add_subcommand(def.name, def.help);
    Runner runner = def.setup(*sub);
    // The deepest parsed command runs (its parent's callback may fire after it).
    sub->callback([runner, &chosen, sub] {
      for (const CLI::App* c : sub->get_subcommands([](const CLI::App*) { return true; }))
        if (c->parsed()) return;
      chosen = runner;
    });
  }

  std::string path;
  if (const int rc = check_command_words(app, argc, argv, &path)) return rc;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return usage_error(e.what(), path);
  }
  if (!chosen) {  // `groupmm` or `groupmm bench`: say what there is
    for (CLI::App* g : groups)
      if (g->parsed()) {
        std::printf("groupmm %s: %s\n\nsuites:\n", g->get_name().c_str(),
                    g->get_description().c_str());
        for (const CLI::App* c : g->get_subcommands([](const CLI::App*) { return true; }))
          std::printf("  %-10s %s\n", c->get_name().c_str(), c->get_description().c_str());
        std::printf("\nrun 'groupmm %s <suite> --help' for a suite's options\n",
                    g->get_name().c_str());
        return 0;
      }
    std::fprintf(stderr, "%s\n", app.help().c_str());
    return usage_error("no command given (commands: " + list_of(&app) + ")", path);
  }
  try {
    return chosen();
  } catch (const UsageError& e) {
    return usage_error(e.what(), path);
  } catch (const Error& e) {
    std::fprintf(stderr, "groupmm: error: %s\n", without_location(e.what()).c_str());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "groupmm: error: out of host memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "groupmm: error: %s\n", e.what());
  }
  return 1;
}

}  // namespace
}  // namespace groupmm::tool

int main(int argc, char** argv) {
  return groupmm::tool::run(argc, argv);
}
