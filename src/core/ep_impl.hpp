// Backend entry points of the expert-parallel ops in groupmm/ep.hpp. Arguments arrive validated by
// src/core/ep.cpp (shapes, dtypes, expert ids in range, cfg.ranks == transport size).
#pragma once

#include "groupmm/ep.hpp"

namespace groupmm::cpu {
ep::EpPlan ep_dispatch_plan(Context& ctx, ep::Transport& tr, const ep::EpConfig& cfg,
                            const TensorView& expert_ids);
void ep_dispatch(Context& ctx, ep::Transport& tr, const ep::EpPlan& plan, const TensorView& x,
                 const TensorView& x_grouped);
void ep_combine(Context& ctx, ep::Transport& tr, const ep::EpPlan& plan,
                const TensorView& y_grouped, const TensorView& weights, const TensorView& out);
}  // namespace groupmm::cpu
