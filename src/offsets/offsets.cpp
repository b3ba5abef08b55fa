// group_offsets: validation and backend dispatch.
#include "offsets/backends.hpp"

namespace groupmm {

std::string OffsetsArgs::to_string() const {
  std::ostringstream os;
  os << "OffsetsArgs(splits=" << splits.to_string() << ", expected_total=" << expected_total
     << ", start=" << start.to_string() << ", end=" << end.to_string()
     << ", element_start=" << element_start.to_string()
     << ", scale_row_start=" << scale_row_start.to_string() << ", pad_rows=" << pad_rows
     << ", total=" << total.to_string() << ")";
  return os.str();
}

static void check_index_out(const char* arg, const TensorView& v, int64_t n, Device dev) {
  if (!v.present()) return;
  GROUPMM_CHECK(v.dtype == DType::int32 || v.dtype == DType::int64, "group_offsets: ", arg,
                ".dtype=", dtype_name(v.dtype), " must be int32 or int64");
  GROUPMM_CHECK(v.rank == 1 && v.dim(0) == n, "group_offsets: ", arg, ".shape=", v.shape_string(),
                " must be [", n, "]");
  GROUPMM_CHECK(v.device == dev, "group_offsets: ", arg, " is on ", device_name(v.device),
                " but the context is ", device_name(dev));
  GROUPMM_CHECK(v.data != nullptr, "group_offsets: ", arg, ".data is null");
  GROUPMM_CHECK(reinterpret_cast<uintptr_t>(v.data) % (dtype_bits(v.dtype) / 8) == 0,
                "group_offsets: ", arg, ".data=", v.data, " must be aligned to its elements");
}

void validate_offsets_args(const Context& ctx, const OffsetsArgs& a) {
  check_splits("group_offsets", a.splits, -1, ctx.device());
  const int64_t G = a.splits.dim(0);
  GROUPMM_CHECK(G >= 1, "group_offsets: splits.shape[0]=", G, " must be >= 1");
  check_index_out("start", a.start, G, ctx.device());
  check_index_out("end", a.end, G, ctx.device());
  check_index_out("scale_row_start", a.scale_row_start, G, ctx.device());
  check_index_out("total", a.total, 1, ctx.device());
  if (a.element_start.present()) {
    const TensorView& e = a.element_start;
    GROUPMM_CHECK(e.dtype == DType::int64,
                  "group_offsets: element_start.dtype=", dtype_name(e.dtype), " must be int64");
    GROUPMM_CHECK(e.rank == 2 && e.dim(1) == G && e.dim(0) >= 1 && e.dim(0) <= 4,
                  "group_offsets: element_start.shape=", e.shape_string(), " must be [S, ", G,
                  "] with 1 <= S <= 4");
    GROUPMM_CHECK(e.device == ctx.device(), "group_offsets: element_start is on ",
                  device_name(e.device), " but the context is ", device_name(ctx.device()));
    GROUPMM_CHECK(e.data != nullptr, "group_offsets: element_start.data is null");
    GROUPMM_CHECK(reinterpret_cast<uintptr_t>(e.data) % 8 == 0,
                  "group_offsets: element_start.data=", e.data, " must be 8-byte aligned");
    for (int64_t s = 0; s < e.dim(0); ++s)
      GROUPMM_CHECK(a.row_strides[static_cast<size_t>(s)] >= 0, "group_offsets: row_strides[", s,
                    "]=", a.row_strides[static_cast<size_t>(s)], " must be >= 0");
  }
  GROUPMM_CHECK(a.pad_rows >= 1, "group_offsets: pad_rows=", a.pad_rows, " must be >= 1");
}

void group_offsets(Context& ctx, const OffsetsArgs& args) {
  validate_offsets_args(ctx, args);
  if (ctx.device() == Device::CPU) {
    cpu::group_offsets(ctx, args);
  } else {
    cuda::group_offsets(ctx, args);
  }
  ctx.after_op();
}

}  // namespace groupmm
