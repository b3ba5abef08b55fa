// Option helpers and limits of the `groupmm` tool (see cli.hpp).
#include "cli.hpp"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <unistd.h>

namespace groupmm::tool {

std::vector<CommandDef>& registry() {
  static std::vector<CommandDef> r;
  return r;
}

namespace {

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

// Decimal integer in [lo, hi]. CLI11 would accept octal/hex (base 0) and its range check reads
// "abc" as out of range; this says what is wrong and rewrites the value in canonical decimal.
CLI::Validator int_range(int64_t lo, int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        int64_t v = 0;
        const char* end = s.data() + s.size();
        const auto [p, ec] = std::from_chars(s.data(), end, v);
        if (s.empty() || p != end || ec == std::errc::invalid_argument)
          return "'" + s + "' is not an integer (accepted: " + range + ")";
        if (ec == std::errc::result_out_of_range || v < lo || v > hi)
          return s + " is out of range (accepted: " + range + ")";
        s = std::to_string(v);
        return std::string();
      },
      "");
}

CLI::Validator one_of(const std::vector<std::string>& choices) {
  return CLI::Validator(
      [choices](std::string& s) -> std::string {
        for (const auto& c : choices)
          if (s == c) return std::string();
        return "'" + s + "' is not one of " + join(choices, ", ");
      },
      "");
}

template <class T>
CLI::Option* add_int_impl(CLI::App& app, const std::string& name, T& value, int64_t lo, int64_t hi,
                          const std::string& help) {
  return app.add_option(name, value, help)
      ->check(int_range(lo, hi))
      ->type_name("INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

}  // namespace

CLI::Option* add_int(CLI::App& app, const std::string& name, int64_t& value, int64_t lo, int64_t hi,
                     const std::string& help) {
  return add_int_impl(app, name, value, lo, hi, help);
}

CLI::Option* add_int(CLI::App& app, const std::string& name, int& value, int lo, int hi,
                     const std::string& help) {
  return add_int_impl(app, name, value, lo, hi, help);
}

CLI::Option* add_iters(CLI::App& app, int& value, const std::string& help) {
  return add_int(app, "--iters", value, 1, 100000, help);
}

CLI::Option* add_choice(CLI::App& app, const std::string& name, std::string& value,
                        const std::vector<std::string>& choices, const std::string& help) {
  return app.add_option(name, value, help)
      ->check(one_of(choices))
      ->type_name("{" + join(choices, ",") + "}");
}

CLI::Option* add_choice_list(CLI::App& app, const std::string& name,
                             std::vector<std::string>& values,
                             const std::vector<std::string>& choices, const std::string& help) {
  return app.add_option(name, values, help)
      ->delimiter(',')
      ->check(one_of(choices))
      ->type_name("{" + join(choices, ",") + "},...");
}

CLI::Option* add_json(CLI::App& app, std::string& path) {
  return app
      .add_option("--json", path, "also write every record to this JSON file (bench/plot.py)")
      ->type_name("PATH");
}

std::ofstream open_json(const std::string& path) {
  std::ofstream f(path);
  if (!f.is_open())
    throw UsageError("--json " + path + ": cannot write the file (" + std::strerror(errno) + ")");
  return f;
}

void close_json(std::ofstream& f, const std::string& path) {
  f.close();
  GROUPMM_CHECK(!f.fail(), "--json ", path, ": writing the file failed");
}

void write_json(const std::string& path, const std::string& text) {
  std::ofstream f = open_json(path);
  f << text << "\n";
  close_json(f, path);
  std::printf("wrote %s\n", path.c_str());
}

std::string format_bytes(double bytes) {
  char s[32];
  if (bytes >= 1073741824.0)
    std::snprintf(s, sizeof s, "%.1f GiB", bytes / 1073741824.0);
  else
    std::snprintf(s, sizeof s, "%.1f MiB", bytes / 1048576.0);
  return s;
}

double available_bytes(Device d) {
  if (d == Device::CUDA) {
    size_t free_b = 0, total_b = 0;
    GROUPMM_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    return double(free_b);
  }
  // MemAvailable counts reclaimable caches; without /proc, the physical memory.
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kb = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    std::fclose(f);
    if (kb >= 0) return double(kb) * 1024.0;
  }
  return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
}

void check_fits_memory(const std::string& what, double bytes, Device d, const std::string& knobs) {
  const double avail = available_bytes(d);
  if (bytes <= 0.9 * avail) return;  // leave room for the process itself and the driver
  throw UsageError(what + " needs about " + format_bytes(bytes) + " of " +
                   (d == Device::CUDA ? "GPU" : "host") + " memory, more than the " +
                   format_bytes(avail) + " available; reduce " + knobs);
}

}  // namespace groupmm::tool
