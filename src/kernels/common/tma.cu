// Host side of tma.cuh: the 2-D tensor map encoder.
#include <cudaTypedefs.h>

#include "kernels/common/tma.cuh"
#include "groupmm/core.hpp"

namespace groupmm::cuda {
namespace {

// The driver's cuTensorMapEncodeTiled through the runtime's entry-point query (the library links
// the static runtime, not libcuda). Looked up once: a query costs microseconds of host time.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* pfn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    GROUPMM_CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &pfn, 12000,
                                                        cudaEnableDefault, &q));
    GROUPMM_CHECK(q == cudaDriverEntryPointSuccess && pfn != nullptr,
                  "tensor map: the driver has no cuTensorMapEncodeTiled (query result ",
                  static_cast<int>(q), ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(pfn);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_tensor_map_2d(const char* op, const void* base, int elem_bytes, int64_t cols,
                               int64_t rows, int64_t row_bytes, int box_cols, int box_rows,
                               bool swizzle128) {
  GROUPMM_CHECK(elem_bytes == 1 || elem_bytes == 2, op, ": tensor map element of ", elem_bytes,
                " bytes (1 or 2)");
  GROUPMM_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0, op, ": tensor map base ", base,
                " must be 16-byte aligned");
  GROUPMM_CHECK(row_bytes % 16 == 0 && row_bytes > 0 && row_bytes < (int64_t(1) << 40), op,
                ": tensor map row stride of ", row_bytes, " bytes must be a multiple of 16");
  GROUPMM_CHECK(cols > 0 && rows > 0 && cols <= (int64_t(1) << 32) && rows <= (int64_t(1) << 32),
                op, ": tensor map of ", rows, " x ", cols, " elements");
  GROUPMM_CHECK(
      box_cols * elem_bytes % 16 == 0 && box_cols <= 256 && box_rows >= 1 && box_rows <= 256, op,
      ": tensor map box of ", box_rows, " x ", box_cols, " elements");
  GROUPMM_CHECK(!swizzle128 || box_cols * elem_bytes == 128, op,
                ": a 128-byte swizzled tensor map needs 128-byte box rows, not ",
                box_cols * elem_bytes);
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 2,
      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  GROUPMM_CHECK(r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed (CUresult ",
                static_cast<int>(r), ") for ", rows, " x ", cols, " elements, box ", box_rows,
                " x ", box_cols);
  return map;
}

}  // namespace groupmm::cuda
