// groupmm/moe.hpp: MoE building blocks around the grouped GEMMs (activations; router and
// permute/unpermute arrive in later issues).
#pragma once

#include "groupmm/core.hpp"

namespace groupmm {

// ---- SwiGLU on a fused gate_up projection -------------------------------------------------------
//
// gate_up [M, 2I] holds gate = columns [0, I) and up = columns [I, 2I) of each row (the layout of a
// fused gate_up GroupedLinear with out features 2I).
//
//   forward:  out[m][i]      = silu(gate) * up,  silu(g) = g * sigmoid(g)
//   backward: dgate_up[m][i]   = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g)))   (d gate)
//             dgate_up[m][I+i] = dout * silu(g)                                        (d up)
//
// dtypes: gate_up, out, dout and dgate_up all bf16, fp16 or fp32 (one dtype); math in fp32, one
// rounding per output. sigmoid(g) = 1 / (1 + exp(-g)); the CUDA kernel's expf may differ from the
// host's by an ulp, so CUDA and CPU agree to within one ulp of the output format (not bit for bit).
// Layout: row-major, contiguous. Rows are independent: expert boundaries do not matter, so no
// splits are needed. Each direction is one memory-bound pass: 16-byte vectorized loads/stores when
// I is a multiple of 16/sizeof(dtype) and the pointers are 16-byte aligned, scalar otherwise.
// Graph safe (one launch, no workspace, no sync). Minimum SM: sm_90 (CUDA); CPU anywhere.
// dgate_up may not alias gate_up or dout; out may not alias gate_up.
void swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& out);
void swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                     const TensorView& dgate_up);

}  // namespace groupmm
