// The cutlass_sm90 engine: the registry of configs.def's kernels, the plan of a launch (one
// kernel over every expert, or a split's two over complementary classes of experts) and its
// workspace, and the launches. The heuristic that picks a configuration is heuristic.cpp.
#include "gemm/cuda/configs.hpp"
#include "gemm/cuda/heuristic.hpp"
#include "gemm/cuda/sm90_grouped.cuh"

namespace groupmm::cuda {

// Each kernel row's KernelEntry, defined in its generated translation unit.
namespace sm90 {
#define GROUPMM_GEMM_KERNEL(name, ...) KernelEntry name();
#include "gemm/cuda/configs.def"
}  // namespace sm90

namespace {

using MakeEntry = sm90::KernelEntry (*)();
const MakeEntry kMakeEntry[] = {
#define GROUPMM_GEMM_KERNEL(name, ...) &sm90::name,
#include "gemm/cuda/configs.def"
};
static_assert(sizeof(kMakeEntry) / sizeof(kMakeEntry[0]) == size_t(kKernelCount));

// What one grouped GEMM runs: one kernel over every expert, or two over complementary classes,
// in one tile order.
struct Plan {
  sm90::KernelEntry first, second;
  sm90::RowClass first_class;
  bool split = false;
  bool along_n = false;
};

// ---- configuration names ------------------------------------------------------------------------
// "<kernel or split>[@along_m|@along_n]": the suffix forces the tile order; without it the
// heuristic's order for the launch's shapes. A bare "@along_m|n" is the heuristic's kernel.
constexpr const char kAlongM[] = "@along_m";
constexpr const char kAlongN[] = "@along_n";

struct Choice {
  GemmConfig config;
  bool along_n = false;
};

GemmConfig by_name(const std::string& name) {
  const std::optional<GemmConfig> c = find_config(name);
  GROUPMM_CHECK(c.has_value(), "grouped_gemm: config '", name, "' is not an instantiated kernel");
  return *c;
}

Choice choose(const GemmLaunch& l) {
  if (l.config.empty()) return {heuristic_config(l), heuristic_along_n(l)};
  const size_t at = l.config.find('@');
  if (at == std::string::npos) return {by_name(l.config), heuristic_along_n(l)};
  const std::string order = l.config.substr(at);
  GROUPMM_CHECK(order == kAlongM || order == kAlongN, "grouped_gemm: config '", l.config,
                "' ends in '", order, "', not ", kAlongM, " or ", kAlongN);
  const std::string name = l.config.substr(0, at);  // empty: the heuristic's kernel
  return {name.empty() ? heuristic_config(l) : by_name(name), order == kAlongN};
}

// The kernel of a row, after checking that it computes the launch.
sm90::KernelEntry checked(GemmConfig c, const GemmLaunch& l) {
  const sm90::KernelRow& r = kernel_row(c);
  GROUPMM_CHECK(serves(r, l), "grouped_gemm: config '", r.name, "' computes ",
                describe_kind(sm90::pass_of(r.role), r.a, r.b, r.out, r.recipe), ", not ",
                describe_kind(l.pass, l.a_dtype, l.b_dtype, l.out_dtype, l.recipe));
  return kMakeEntry[int(c)]();
}

Plan pick(const GemmLaunch& l) {
  const Choice c = choose(l);
  Plan p;
  p.along_n = c.along_n;
  if (is_split(c.config)) {
    const SplitRow& s = split_row(c.config);
    p.first = checked(s.inside, l);
    p.second = checked(s.outside, l);
    GROUPMM_CHECK(p.first.layout_id() == p.second.layout_id(), "grouped_gemm: split config '",
                  s.name, "' pairs kernels whose argument arrays differ");
    const SplitRows rows = split_rows(c.config);
    p.first_class = {rows.lo, rows.hi, false};
    p.split = true;
  } else {
    p.first = checked(c.config, l);
  }
  return p;
}

size_t aligned(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// A plan's workspace: the first launch's part (256-aligned when a second launch follows), then
// the second's.
struct PlanWorkspace {
  size_t first = 0, total = 0;
};
PlanWorkspace workspace_of(const Plan& p, const GemmDims& d, int sms) {
  const size_t one = p.first.workspace_size(d, sms);
  if (!p.split) return {one, one};
  return {aligned(one), aligned(one) + p.second.workspace_size(d, sms)};
}

}  // namespace

size_t cutlass_gemm_workspace_size(const GemmLaunch& l, int sms) {
  return workspace_of(pick(l), l.dims, sms).total;
}

void cutlass_grouped_gemm(Context& ctx, const GemmLaunch& l, void* workspace,
                          size_t workspace_bytes) {
  // One pick per call (a repeated call's host time is the budget: the kernel parameters are
  // cached per configuration, sm90_grouped.cuh).
  const Plan p = pick(l);
  const PlanWorkspace need = workspace_of(p, l.dims, ctx.gemm_sm_count());
  if (workspace == nullptr) {
    workspace = ctx.workspace(need.total);
    workspace_bytes = ctx.workspace_size();
  }
  GROUPMM_CHECK(workspace_bytes >= need.total, "grouped_gemm: workspace_bytes=", workspace_bytes,
                " must be >= ", need.total, " (grouped_gemm_workspace_size)");
  if (!p.split) {
    sm90::LaunchPart whole;
    whole.along_n = p.along_n;
    p.first.run(ctx, l, workspace, workspace_bytes, whole);
    return;
  }
  // Two launches in stream order, each over its class of experts; one setup kernel (the first
  // launch's) writes the arrays of both, and each has its own CUTLASS workspace.
  sm90::LaunchPart one;
  one.row_class = p.first_class;
  one.write_other = true;
  one.along_n = p.along_n;
  sm90::LaunchPart two;
  two.row_class = p.first_class;
  two.row_class.outside = !two.row_class.outside;
  two.shared = reinterpret_cast<void*>(sm90::align_up(reinterpret_cast<uintptr_t>(workspace), 256));
  two.along_n = p.along_n;
  p.first.run(ctx, l, workspace, need.first, one);
  p.second.run(ctx, l, static_cast<char*>(workspace) + need.first, workspace_bytes - need.first,
               two);
}

std::string cutlass_config_name(const GemmLaunch& l) {
  const Choice c = choose(l);
  return detail::cat(config_name(c.config), c.along_n ? kAlongN : "");
}

}  // namespace groupmm::cuda
