// Host-side pieces of the decode GEMM shared by its translation units.
#pragma once

#include "gemm/w4_backends.hpp"
#include "gemm/cuda/w4/decode_config.cuh"

namespace groupmm::cuda::w4 {

// A launcher of the decode kernel: one variant, on ctx's stream, `grid` persistent CTAs.
using DecodeLaunch = void (*)(Context&, const DecodeTmaParams&, int grid);
// The launcher of weight format kRecipe's variant with 1, 2 or 4 token tiles (defined in
// decode_kernel.cuh, instantiated by decode_<format>.cu).
template <QuantRecipe kRecipe>
DecodeLaunch decode_launch(int token_tiles);

// The launch geometry from host-known values (decode.cu).
DecodeGeometry decode_geometry(const W4Launch& l, int sm_count);
// The setup kernel (decode_plan.cu): plan arrays from the device splits; wide_item_start
// ([G + 1]) is written when geo.wide_tiles > 0; xp: x in fragment order (DecodeWorkspace::xp).
void launch_decode_plan(Context& ctx, const W4Launch& l, const DecodeGeometry& geo,
                        const DecodePlan& plan, int64_t* wide_item_start, uint16_t* xp);

}  // namespace groupmm::cuda::w4
