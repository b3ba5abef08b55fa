// The decode GEMM's mxfp4 variants (8, 16 and 32 tokens per pass).
#include "gemm/cuda/w4/decode_kernel.cuh"

template groupmm::cuda::w4::DecodeLaunch
groupmm::cuda::w4::decode_launch<groupmm::QuantRecipe::mxfp4>(int token_tiles);
