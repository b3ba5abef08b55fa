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

namespace {

// The checks and the encoding shared by the 2-D and 3-D maps: dims[0] contiguous, strides[i]
// the bytes between steps of dims[i + 1].
CUtensorMap encode_map(const char* op, const void* base, int elem_bytes, int rank,
                       const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                       bool swizzle128) {
  GROUPMM_CHECK(elem_bytes == 1 || elem_bytes == 2, op, ": tensor map element of ", elem_bytes,
                " bytes (1 or 2)");
  GROUPMM_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0, op, ": tensor map base ", base,
                " must be 16-byte aligned");
  for (int i = 0; i + 1 < rank; ++i)
    GROUPMM_CHECK(strides[i] % 16 == 0 && strides[i] > 0 && strides[i] < (cuuint64_t(1) << 40), op,
                  ": tensor map stride of ", strides[i], " bytes must be a multiple of 16");
  for (int i = 0; i < rank; ++i)
    GROUPMM_CHECK(dims[i] > 0 && dims[i] <= (cuuint64_t(1) << 32), op, ": tensor map dimension ", i,
                  " of ", dims[i], " elements");
  GROUPMM_CHECK(box[0] * elem_bytes % 16 == 0 && box[0] <= 256 && box[1] >= 1 && box[1] <= 256, op,
                ": tensor map box of ", box[1], " x ", box[0], " elements");
  GROUPMM_CHECK(!swizzle128 || box[0] * elem_bytes == 128, op,
                ": a 128-byte swizzled tensor map needs 128-byte box rows, not ",
                box[0] * elem_bytes);
  CUtensorMap map;
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16,
      static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides, box, elem_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  GROUPMM_CHECK(r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed (CUresult ",
                static_cast<int>(r), ") for a rank-", rank, " tensor of ", dims[rank - 1], " x ",
                dims[0], " elements (outer x inner), box ", box[1], " x ", box[0]);
  return map;
}

}  // namespace

CUtensorMap make_tensor_map_2d(const char* op, const void* base, int elem_bytes, int64_t cols,
                               int64_t rows, int64_t row_bytes, int box_cols, int box_rows,
                               bool swizzle128) {
  GROUPMM_CHECK(cols > 0 && rows > 0, op, ": tensor map of ", rows, " x ", cols, " elements");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  GROUPMM_CHECK(row_bytes > 0, op, ": tensor map row stride of ", row_bytes, " bytes");
  return encode_map(op, base, elem_bytes, 2, dims, strides, box, swizzle128);
}

CUtensorMap make_tensor_map_3d(const char* op, const void* base, int elem_bytes, int64_t d0,
                               int64_t d1, int64_t d2, int64_t stride1_bytes, int64_t stride2_bytes,
                               int box0, int box1, bool swizzle128) {
  GROUPMM_CHECK(d0 > 0 && d1 > 0 && d2 > 0 && stride1_bytes > 0 && stride2_bytes > 0, op,
                ": tensor map of ", d2, " x ", d1, " x ", d0, " elements");
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d0), static_cast<cuuint64_t>(d1),
                              static_cast<cuuint64_t>(d2)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(stride1_bytes),
                                 static_cast<cuuint64_t>(stride2_bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box0), static_cast<cuuint32_t>(box1), 1};
  return encode_map(op, base, elem_bytes, 3, dims, strides, box, swizzle128);
}

}  // namespace groupmm::cuda
