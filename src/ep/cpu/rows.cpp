// Expert-parallel row movers on the CPU backend (the reference): the byte gather that packs and
// unpacks the exchanges (strided for FP8 dispatch's packed rows), the scatter that unpacks a
// received row into its grouped rows, the inverse of an index map, and the home rank's fixed-order
// sum (groupmm/ep.hpp, ep/backends.hpp).
#include <algorithm>
#include <cstring>

#include "ep/backends.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::ep::cpu {

using groupmm::cpu::load_f;
using groupmm::cpu::store_f;

void ep_gather_rows_strided(Context&, void* dst, int64_t dst_stride, const RecvRows& src,
                            const int32_t* idx, int64_t n, int64_t div, int64_t row_bytes,
                            bool zero_missing) {
  char* d = static_cast<char*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const char* s = idx[i] >= 0 ? src.row(idx[i] / div) : nullptr;
    if (s != nullptr)
      std::memcpy(d + i * dst_stride, s, size_t(row_bytes));
    else if (zero_missing)
      std::memset(d + i * dst_stride, 0, size_t(row_bytes));
  }
}

void ep_gather_rows(Context& ctx, void* dst, const void* src, const int32_t* idx, int64_t n,
                    int64_t div, int64_t row_bytes, bool zero_missing) {
  ep_gather_rows_strided(ctx, dst, row_bytes, RecvRows::plain(src, row_bytes), idx, n, div,
                         row_bytes, zero_missing);
}

void ep_scatter_rows(Context&, void* dst, int64_t dst_stride, const RecvRows& src,
                     const int32_t* map, int64_t n, int64_t k, int64_t row_bytes) {
  char* d = static_cast<char*>(dst);
  for (int64_t r = 0; r < n; ++r) {
    const char* s = src.row(r);
    if (s == nullptr) continue;
    for (int64_t j = 0; j < k; ++j)
      if (map[r * k + j] >= 0)
        std::memcpy(d + int64_t(map[r * k + j]) * dst_stride, s, size_t(row_bytes));
  }
}

void ep_invert_index(Context&, int32_t* out, int64_t n_out, const int32_t* idx, int64_t n_in) {
  std::fill(out, out + n_out, -1);
  for (int64_t j = 0; j < n_in; ++j)
    if (idx[j] >= 0) out[idx[j]] = int32_t(j);
}

void ep_weighted_sum(Context&, const TensorView& out, const RecvRows& rows,
                     const int32_t* slot_entry, const float* w, int64_t k, const void* add) {
  const int64_t T = out.dim(0), H = out.dim(1);
  const TensorView addv =
      add ? TensorView(const_cast<void*>(add), out.dtype, Device::CPU, {T, H}) : TensorView();
  std::vector<float> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = slot_entry[t * k + j];
      const char* row = r >= 0 ? rows.row(r) : nullptr;
      if (row == nullptr) continue;
      const TensorView src(const_cast<char*>(row), out.dtype, Device::CPU, {1, H});
      for (int64_t h = 0; h < H; ++h) {
        const float y = load_f(src, h);
        acc[size_t(h)] = router::add(acc[size_t(h)], w ? router::mul(w[t * k + j], y) : y);
      }
    }
    if (add != nullptr)  // the addend last, like moe_unpermute's
      for (int64_t h = 0; h < H; ++h)
        acc[size_t(h)] = router::add(acc[size_t(h)], load_f(addv, t * H + h));
    for (int64_t h = 0; h < H; ++h) store_f(out, t * H + h, acc[size_t(h)]);
  }
}

}  // namespace groupmm::ep::cpu
