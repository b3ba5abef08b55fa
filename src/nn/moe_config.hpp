// nn::MoE's configuration check (moe_config.cpp), shared by the layer's constructor.
#pragma once

#include "groupmm/nn/moe.hpp"

namespace groupmm::nn {

// Throws groupmm::Error naming the field and its value when c cannot make an MoE on ctx's device.
void check_moe_config(const Context& ctx, const MoEConfig& c);

}  // namespace groupmm::nn
