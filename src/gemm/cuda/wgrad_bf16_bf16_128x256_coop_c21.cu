// SM90 grouped GEMM instantiation: wgrad_bf16_bf16_128x256_coop_c21
// Epilogue subtile 128x128 (CUTLASS would pick 128x32): a wgrad's reduction per expert is short,
// so the dW write is a large share of each tile; the wider subtile measured faster on the MoE
// shapes (bench/RESULTS.md, "wgrad epilogue subtile"). The fp32 main_grad kernel keeps CUTLASS's
// choice: its C source stages make a wider fp32 subtile take the mainloop's shared memory.
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_EPI(wgrad_bf16_bf16_128x256_coop_c21, cutlass::bfloat16_t, cutlass::bfloat16_t,
                        wgrad, 128, 256, 64, 2, 1, cooperative, 128)
