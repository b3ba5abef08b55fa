// Expert parallelism internals shared by src/ep/*.cpp and the backends: the primitives each
// backend implements (plain loops on the CPU, kernels on CUDA; same results bit for bit), and the
// fixed dot-product order of d_weights (host and device).
//
// The four movers of groupmm/ep.hpp are backend-neutral (src/ep/movers.cpp): pack with
// gather_rows, exchange through the transport, unpack with gather_rows or sum with weighted_sum.
// Every index array is int32 with -1 meaning "no row"; a gather from index i reads source row
// i / div (div = k turns a (row, slot) entry into its row).
#pragma once

#include "base/cuda_entry.hpp"
#include "numerics/router.hpp"  // router::add / mul: correctly rounded on host and device
#include "groupmm/ep.hpp"

namespace groupmm::ep::detail {

// ---- the d_weights dot product: 32 lane partials, then a butterfly (groupmm/ep.hpp) -------------
inline constexpr int kDotLanes = 32;

// Lane l's partial over h = l, l + 32, ... < n of a(h) * b(h).
template <class A, class B>
GROUPMM_HD float dot_lane_partial(int lane, int64_t n, A a, B b) {
  float acc = 0.0f;
  for (int64_t h = lane; h < n; h += kDotLanes) acc = router::add(acc, router::mul(a(h), b(h)));
  return acc;
}

}  // namespace groupmm::ep::detail

namespace groupmm::ep {

// The rows a mover's receive side reads. The rank's own block [own_lo, own_lo + own_n) was neither
// packed nor exchanged (movers.hpp, pack_others_and_exchange): receive row own_lo + i is read in
// place as row own_idx[i] of own_src (own_stride bytes a row; own_idx[i] < 0: no row). The other
// receive rows are staged without a hole for it: row r < own_lo at staged + r * stride, row
// r >= own_lo + own_n at staged + (r - own_n) * stride, so the staging holds only the rows other
// ranks sent. own_n = 0: every row staged, row r at staged + r * stride.
struct RecvRows {
  const void* staged = nullptr;
  int64_t stride = 0;
  const void* own_src = nullptr;
  int64_t own_stride = 0;
  const int32_t* own_idx = nullptr;
  int64_t own_lo = 0, own_n = 0;

  static RecvRows plain(const void* rows, int64_t stride) { return {rows, stride}; }
  // Receive row r (null: an own-block row with no source row).
  GROUPMM_HD const char* row(int64_t r) const {
    const int64_t i = r - own_lo;
    if (i >= 0 && i < own_n) {
      const int64_t s = own_idx[i];
      return s >= 0 ? static_cast<const char*>(own_src) + s * own_stride : nullptr;
    }
    return static_cast<const char*>(staged) + (i < 0 ? r : r - own_n) * stride;
  }
};

// Primitives of one backend (declared in namespaces cpu and cuda below). Views carry the device.
#define GROUPMM_EP_PRIMITIVES(ENTRY)                                                               \
  /* dst row i (row_bytes) = src row idx[i] / div for idx[i] >= 0; rows with idx[i] < 0 are        \
     zeroed when zero_missing, else left alone. n rows; dst and src are raw bytes. */              \
  ENTRY void ep_gather_rows(Context& ctx, void* dst, const void* src, const int32_t* idx,          \
                            int64_t n, int64_t div, int64_t row_bytes, bool zero_missing);         \
  /* The same from receive rows, with a dst row stride (bytes) of its own: dst + i * dst_stride    \
     gets row_bytes of src.row(idx[i] / div) (FP8 dispatch packs data and scales into one wire     \
     row; an own-block row without a source row counts as missing). */                             \
  ENTRY void ep_gather_rows_strided(Context& ctx, void* dst, int64_t dst_stride,                   \
                                    const RecvRows& src, const int32_t* idx, int64_t n,            \
                                    int64_t div, int64_t row_bytes, bool zero_missing);            \
  /* dst + g * dst_stride gets row_bytes of src.row(r) for every receive row r < n and slot j < k  \
     with g = map[r k + j] >= 0 (a row without a source row is skipped; dst rows no entry names    \
     are left alone): the unpack of ep_dispatch and of the combine backward's dy as one read of    \
     each receive row for its up to k grouped rows (map: EpPlan::entry_grouped). */                \
  ENTRY void ep_scatter_rows(Context& ctx, void* dst, int64_t dst_stride, const RecvRows& src,     \
                             const int32_t* map, int64_t n, int64_t k, int64_t row_bytes);         \
  /* out[i] = -1 for i < n_out, then out[idx[j]] = j for every j < n_in with idx[j] >= 0 (those    \
     values distinct and < n_out): an index map inverted (EpPlan::entry_grouped). */               \
  ENTRY void ep_invert_index(Context& ctx, int32_t* out, int64_t n_out, const int32_t* idx,        \
                             int64_t n_in);                                                        \
  /* out[t] = sum_j w[t, j] * rows.row(slot_entry[t, j]) (w absent: unweighted) in fp32, j order,  \
     then + add[t] when add is given (out's dtype, [T, H]), rounded once to out's dtype; rows are  \
     H of out's dtype. */                                                                          \
  ENTRY void ep_weighted_sum(Context& ctx, const TensorView& out, const RecvRows& rows,            \
                             const int32_t* slot_entry, const float* w, int64_t k,                 \
                             const void* add);                                                     \
  /* Expert side of ep_combine_backward: for every grouped row g with entry e = grouped_entry[g]:  \
     d_yg[g] = w_recv[e] * dy.row(e / k) (0 when e < 0, or left alone when not zero_tail;          \
     w_recv null: dy.row(e / k)); for every back entry i with g = back_grouped[i] >= 0:            \
     dw_send[i] = dot(dy.row(e / k), yg[g]) in the fixed order (dw_send null: none). */            \
  ENTRY void ep_combine_backward_expert(                                                           \
      Context& ctx, const EpPlan& plan, const RecvRows& dy, const float* w_recv,                   \
      const TensorView& y_grouped, const TensorView& d_y_grouped, float* dw_send, bool zero_tail); \
  /* Capacity mode: the sender side before the metadata exchange (send_token, meta_send,           \
     slot_entry, overflow reports) and the receiver side after it (grouped_entry, splits,          \
     back_grouped). */                                                                             \
  ENTRY void ep_capacity_plan_send(Context& ctx, const TensorView& expert_ids, EpPlan& plan);      \
  ENTRY void ep_capacity_plan_recv(Context& ctx, EpPlan& plan);                                    \
  /* A chunk's ids (EpChunkedPlan): for each of the T k ids e = q E_l + le in [0, E), out =        \
     q E_l + le - lo when lo <= le < hi, else -1 (another chunk's expert); -1 stays -1; any other  \
     id stays out of range (its value, or INT32_MAX past int32) for the plan to report. ids int32  \
     or int64 [T, k]; out int32. */                                                                \
  ENTRY void ep_chunk_ids(Context& ctx, int32_t* out, const TensorView& ids, int64_t E,            \
                          int64_t El, int64_t lo, int64_t hi);                                     \
  /* merged[i] = base + part[i] where part[i] >= 0, for i < n; elsewhere -1 when first, else       \
     left alone (the slots of one chunk's plan into the chunks' concatenated way back). */         \
  ENTRY void ep_merge_slots(Context& ctx, int32_t* merged, const int32_t* part, int64_t n,         \
                            int64_t base, bool first);

namespace cpu {
GROUPMM_EP_PRIMITIVES()
}
namespace cuda {
GROUPMM_EP_PRIMITIVES(GROUPMM_CUDA_ENTRY)
// Bytes of EpPlan::scratch the CUDA capacity plan needs (plan's cfg and cap set).
GROUPMM_CUDA_ENTRY int64_t ep_capacity_scratch_bytes(const EpPlan& plan);

// The throughput plan built by kernels (src/ep/cuda/throughput_plan.cu; src/ep/plan.cpp runs the
// steps around its two exchanges and reads the sizes once). A step's scratch holds two stable
// rankings of `rows` x k slots over `groups` groups (moe_permute_plan's kernels: groups <= 1024).
GROUPMM_CUDA_ENTRY int64_t ep_throughput_scratch_bytes(int64_t rows, int64_t k, int64_t groups);
// Home side, before the count exchange (plan's cfg and tokens set; scratch for (T, k, 2R + 2)):
// counts [2 R W + 2] int64 with W = 1 + E_l gets, in its first R W values, per peer q: the rows
// q gets, then the entries for each of q's local experts (the count exchange's block for q); its
// last two: the first (t k + j) whose id is outside [0, E) and that id (-1 and 0 when none); the
// values between are left for the exchange. expert_ids int32 or int64.
GROUPMM_CUDA_ENTRY void ep_throughput_plan_count(Context& ctx, const TensorView& expert_ids,
                                                 const EpPlan& plan, void* scratch,
                                                 int64_t* counts);
// Home side, after it (the plan's sizes set, its arrays allocated): send_token, slot_entry and
// the metadata rows meta_send [send_total, k] from the count step's scratch.
GROUPMM_CUDA_ENTRY void ep_throughput_plan_pack(Context& ctx, const TensorView& expert_ids,
                                                EpPlan& plan, const void* scratch,
                                                int32_t* meta_send);
// Expert side, after the metadata exchange (scratch for (recv_total, k, E_l + 3)):
// grouped_entry, back_grouped and splits from meta_recv [recv_total, k].
GROUPMM_CUDA_ENTRY void ep_throughput_plan_recv(Context& ctx, EpPlan& plan,
                                                const int32_t* meta_recv, void* scratch);
}  // namespace cuda
#undef GROUPMM_EP_PRIMITIVES

namespace detail {
// A byte buffer on ctx's device (stream-ordered on CUDA), at least `bytes` long, 16-byte aligned.
Tensor byte_buffer(Context& ctx, int64_t bytes);
// Fills plan.entry_grouped [recv_total k] (allocated) from plan.grouped_entry: the receive side's
// map from each received row's slot to its grouped row. Graph safe.
void fill_entry_grouped(Context& ctx, EpPlan& plan);
// The throughput plan built by host code on any device (a CUDA Context: the ids are read on the
// host and the arrays uploaded): the CPU backend's plan, and the reference the device-built plan
// is tested against bit for bit. Same contract as ep_dispatch_plan.
EpPlan ep_dispatch_plan_host(Context& ctx, Transport& tr, const EpConfig& cfg,
                             const TensorView& expert_ids);
}  // namespace detail

}  // namespace groupmm::ep
