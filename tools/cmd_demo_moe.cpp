// `groupmm demo moe`: the whole MoE block forward + backward with a per-stage table, checked on
// sampled tokens against the CPU reference ops (tools/moe_demo.cpp).
#include "cli.hpp"
#include "moe_tools.hpp"

namespace groupmm::tool {
namespace {

struct DemoMoeOptions {
  MoeDemoOptions o;
  CLI::Option* iters_opt = nullptr;
};

int run(const DemoMoeOptions& d) {
  MoeDemoOptions o = d.o;
  if (!d.iters_opt->count()) o.iters = 0;  // the device's default
  const int64_t experts = o.experts > 0 ? o.experts : (o.cpu ? 16 : 128);
  const int64_t topk = o.topk > 0 ? o.topk : (o.cpu ? 4 : 8);
  if (topk > experts)
    throw UsageError("--topk " + std::to_string(topk) + " must be at most --experts " +
                     std::to_string(experts));
  if (o.tokens > 0) {  // the routed rows' activations and gradients dominate at large T
    const double H = double(o.hidden > 0 ? o.hidden : 2048),
                 F = double(o.ffn_hidden > 0 ? o.ffn_hidden : 768);
    const double bytes = double(o.tokens) * double(topk) * (2 * H + 6 * F) * 4 * 1.2;
    check_fits_memory("demo moe", bytes, o.cpu ? Device::CPU : default_device(), "--tokens");
  }
  return run_demo_moe(o);
}

void add_options(CLI::App& app, DemoMoeOptions& d) {
  MoeDemoOptions& o = d.o;
  app.add_flag("--cpu", o.cpu, "run on the CPU reference backend even with a GPU");
  add_int(app, "--experts", o.experts, 1, 4096, "experts E (default: GPU 128, CPU 16)");
  add_int(app, "--hidden", o.hidden, 8, 65536,
          "hidden size H, a multiple of 8 (default: GPU 2048, CPU 128)");
  add_int(app, "--width", o.ffn_hidden, 8, 65536,
          "expert width F, a multiple of 8 (default: GPU 768, CPU 64)");
  add_int(app, "--tokens", o.tokens, 1, int64_t(1) << 24, "tokens T (default: GPU 16384, CPU 256)");
  add_int(app, "--topk", o.topk, 1, 64, "experts per token, <= --experts (default: GPU 8, CPU 4)");
  add_int(app, "--shared", o.shared_ffn_hidden, 0, 65536,
          "width of a shared expert (default 0: none)");
  add_int(app, "--samples", o.samples, 1, 4096,
          "tokens checked against the CPU reference (default 8)");
  d.iters_opt = add_iters(app, o.iters, "timed steps (default: GPU 10, CPU 1)");
}

Register reg_cmd_demo_moe(command<DemoMoeOptions>(
    "demo", "moe",
    "the MoE block (router, permute, grouped SwiGLU experts, unpermute, optional shared expert) "
    "forward + backward, per-stage table, sampled tokens checked against the CPU reference",
    add_options, run));

}  // namespace
}  // namespace groupmm::tool
