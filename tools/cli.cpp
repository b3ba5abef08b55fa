// Option helpers and limits of the `groupmm` tool (see cli.hpp).
#include "cli.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <charconv>
#include <cstring>
#include <sys/resource.h>
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

// A multiple of `m` (after int_range: the text is a decimal integer).
CLI::Validator multiple_of(int64_t m) {
  return CLI::Validator(
      [m](std::string& s) -> std::string {
        return std::stoll(s) % m == 0 ? std::string()
                                      : s + " is not a multiple of " + std::to_string(m);
      },
      "");
}

// Finite decimal number in [lo, hi]: CLI11's Range passes NaN (no comparison fails) and reads a
// word as out of range.
CLI::Validator real_range(double lo, double hi) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "[%g, %g]", lo, hi);
  const std::string range = buf;
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        double v = 0;
        const char* end = s.data() + s.size();
        const auto [p, ec] = std::from_chars(s.data(), end, v);
        if (s.empty() || p != end || ec == std::errc::invalid_argument)
          return "'" + s + "' is not a number (accepted: " + range + ")";
        if (!std::isfinite(v))
          return "'" + s + "' is not a finite number (accepted: " + range + ")";
        if (ec == std::errc::result_out_of_range || v < lo || v > hi)
          return s + " is out of range (accepted: " + range + ")";
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

CLI::Option* add_int_multiple(CLI::App& app, const std::string& name, int64_t& value, int64_t lo,
                              int64_t hi, int64_t multiple, const std::string& help) {
  return add_int_impl(app, name, value, lo, hi, help)
      ->check(multiple_of(multiple))
      ->type_name("INT in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                  "], a multiple of " + std::to_string(multiple));
}

CLI::Option* add_real(CLI::App& app, const std::string& name, double& value, double lo, double hi,
                      const std::string& help) {
  char range[96];
  std::snprintf(range, sizeof range, "NUMBER in [%g, %g]", lo, hi);
  return app.add_option(name, value, help)->check(real_range(lo, hi))->type_name(range);
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
      ->check(CLI::Validator(
          [](std::string& s) { return s.empty() ? std::string("an empty PATH") : std::string(); },
          ""))
      ->type_name("PATH");
}

void reject_option(bool given, const std::string& name, const std::string& why) {
  if (given) throw UsageError(name + " does not apply " + why);
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

std::string format_bytes(double bytes) {
  char s[32];
  if (bytes >= 1073741824.0)
    std::snprintf(s, sizeof s, "%.1f GiB", bytes / 1073741824.0);
  else
    std::snprintf(s, sizeof s, "%.1f MiB", bytes / 1048576.0);
  return s;
}

std::string format_us(double us) {
  char s[32];
  if (us >= 1e6)
    std::snprintf(s, sizeof s, "%.2f s", us * 1e-6);
  else if (us >= 1e4)
    std::snprintf(s, sizeof s, "%.1f ms", us * 1e-3);
  else
    std::snprintf(s, sizeof s, "%.1f us", us);
  return s;
}

double available_bytes(Device d) {
  if (d == Device::CUDA) {
    // What groupmm's device pools keep from earlier cases is this process's to reuse: give it back
    // first, so that the driver counts it free.
    GROUPMM_CHECK_CUDA(cudaDeviceSynchronize());
    release_cached_device_memory();
    size_t free_b = 0, total_b = 0;
    GROUPMM_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    return double(free_b);
  }
  // MemAvailable counts reclaimable caches; without /proc, the physical memory. An address-space
  // limit (ulimit -v) below it is what the process can really get.
  double avail = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kb = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    std::fclose(f);
    if (kb >= 0) avail = double(kb) * 1024.0;
  }
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    avail = std::min(avail, double(as.rlim_cur));
  return avail;
}

void check_fits_memory(const std::string& what, double bytes, Device d, const std::string& knobs) {
  const double avail = available_bytes(d);
  if (bytes <= 0.9 * avail) return;  // leave room for the process itself and the driver
  throw UsageError(what + " needs about " + format_bytes(bytes) + " of " +
                   (d == Device::CUDA ? "GPU" : "host") + " memory, more than the " +
                   format_bytes(avail) + " available; reduce " + knobs);
}

}  // namespace groupmm::tool
