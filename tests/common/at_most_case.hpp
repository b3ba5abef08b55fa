// The at-most splits mode (SplitsTotal::at_most, weighted_swiglu's splits) of every op the
// expert-parallel capacity block runs over its padded expert buffer, on either backend: each op
// runs once with exact splits over a buffer of S = sum(splits) rows (the reference) and once with
// at-most splits over a buffer of M > S rows whose tail is poisoned (inputs NaN, outputs 0xFF
// bytes). The experts' rows must equal the reference bit for bit (an input tail row that was read
// would spread NaN into them), the output tail must still hold the poison, and no fault is
// reported; a sum above M is reported. Used by tests/cpu/test_at_most.cpp and
// tests/cuda/test_at_most_gpu.cpp with the same cases.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "common/ep_harness.hpp"
#include "common/gemm_case.hpp"
#include "common/test_util.hpp"
#include "groupmm/dbias.hpp"
#include "groupmm/ep.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/moe.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm::test::at_most {

constexpr uint8_t kPoison = 0xFF;  // output bytes past the sum (a NaN in every float format)

// A row-major [rows, cols] buffer on `d` whose first `valid` rows are `v` (16-bit or fp32 by `t`)
// and whose other rows are NaN.
inline Tensor rows_with_nan_tail(const std::vector<float>& v, int64_t valid, int64_t rows,
                                 int64_t cols, DType t, Device d) {
  std::vector<float> all(size_t(rows * cols), std::numeric_limits<float>::quiet_NaN());
  std::copy(v.begin(), v.begin() + valid * cols, all.begin());
  if (t == DType::fp32) return clone_to(TensorView(all.data(), t, Device::CPU, {rows, cols}), d);
  std::vector<uint16_t> h = encode16(all, t);
  return clone_to(TensorView(h.data(), t, Device::CPU, {rows, cols}), d);
}

inline Tensor poisoned(std::initializer_list<int64_t> shape, DType t, Device d) {
  Tensor x = Tensor::empty(shape, t, d);
  fill_bytes(x, kPoison);
  return x;
}

inline Tensor splits_on(const std::vector<int64_t>& s, DType t, Device d) {
  if (t == DType::int64) {
    std::vector<int64_t> h = s;
    return clone_to(TensorView(h.data(), t, Device::CPU, {int64_t(h.size())}), d);
  }
  std::vector<int32_t> h = to_i32(s);
  return clone_to(TensorView(h.data(), t, Device::CPU, {int64_t(h.size())}), d);
}

inline int64_t sum_of(const std::vector<int64_t>& s) {
  int64_t n = 0;
  for (int64_t v : s) n += v;
  return n;
}

// Bytes [from, to) of a view's bytes.
inline std::vector<uint8_t> byte_range(const std::vector<uint8_t>& b, int64_t from, int64_t to) {
  return std::vector<uint8_t>(b.begin() + from, b.begin() + to);
}

inline bool all_poison(const std::vector<uint8_t>& b, int64_t from, int64_t to) {
  for (int64_t i = from; i < to; ++i)
    if (b[size_t(i)] != kPoison) return false;
  return true;
}

inline int64_t row_bytes(const TensorView& v) {
  return v.dim(0) == 0 ? 0 : v.nbytes() / v.dim(0);
}

// Checks the first `valid` rows of `got` equal `want`'s rows bit for bit and the rest of `got`
// still holds the poison.
inline void expect_rows(const TensorView& got, const TensorView& want, int64_t valid,
                        const std::string& what) {
  const std::vector<uint8_t> g = bytes_of(got), w = bytes_of(want);
  const int64_t rb = row_bytes(got), cut = valid * rb;
  EXPECT_TRUE(byte_range(g, 0, cut) == byte_range(w, 0, cut)) << what << ": the experts' rows";
  EXPECT_TRUE(all_poison(g, cut, int64_t(g.size()))) << what << ": a row past the sum was written";
}

// ---- the cases ----------------------------------------------------------------------------------

struct Shape {
  std::vector<int64_t> splits;  // sum S
  int64_t tail;                 // M = S + tail
};
inline std::vector<Shape> shapes() {
  return {{{130, 0, 257, 3, 0, 64}, 300}, {{0, 0, 0, 0, 0, 200}, 77}, {{0, 0, 0}, 50}, {{5}, 1}};
}

// weighted_swiglu forward + backward: rows [0, S) equal the call without splits over S rows.
inline void check_weighted_swiglu(Device d, DType t, DType split_t, const Shape& sh) {
  const int64_t S = sum_of(sh.splits), M = S + sh.tail, I = 48;
  const std::string what = detail::cat(dtype_name(t), " ", dtype_name(split_t), " S=", S, " M=", M);
  Context ctx(d);
  const auto gu_h = randn(size_t(S * 2 * I)), dout_h = randn(size_t(S * I)), p_h = randn(size_t(S));
  Tensor gu = rows_with_nan_tail(gu_h, S, M, 2 * I, t, d);
  Tensor dout = rows_with_nan_tail(dout_h, S, M, I, t, d);
  Tensor prob = rows_with_nan_tail(p_h, S, M, 1, DType::fp32, d);
  const TensorView probv(prob.data(), DType::fp32, d, {M});
  Tensor splits = splits_on(sh.splits, split_t, d);
  Tensor out = poisoned({M, I}, t, d), dgu = poisoned({M, 2 * I}, t, d),
         dprob = poisoned({M}, DType::fp32, d);
  weighted_swiglu_forward(ctx, gu, probv, out, SwigluForm{}, splits);
  weighted_swiglu_backward(ctx, dout, gu, probv, dgu, dprob, SwigluForm{}, splits);
  EXPECT_EQ(ctx.take_status().bits, 0u) << what;
  // The reference: the same op over the first S rows (views of the same buffers' heads).
  Tensor ref_out = poisoned({M, I}, t, d), ref_dgu = poisoned({M, 2 * I}, t, d),
         ref_dprob = poisoned({M}, DType::fp32, d);
  if (S > 0) {
    const TensorView gus(gu.data(), t, d, {S, 2 * I}), ps(prob.data(), DType::fp32, d, {S});
    weighted_swiglu_forward(ctx, gus, ps, TensorView(ref_out.data(), t, d, {S, I}));
    weighted_swiglu_backward(ctx, TensorView(dout.data(), t, d, {S, I}), gus, ps,
                             TensorView(ref_dgu.data(), t, d, {S, 2 * I}),
                             TensorView(ref_dprob.data(), DType::fp32, d, {S}));
  }
  expect_rows(out, ref_out, S, what + " out");
  expect_rows(dgu, ref_dgu, S, what + " dgate_up");
  expect_rows(TensorView(dprob.data(), DType::fp32, d, {M, 1}),
              TensorView(ref_dprob.data(), DType::fp32, d, {M, 1}), S, what + " dprob");
}

// A sum above the rows: every row computed, both bits reported against weighted_swiglu; a
// negative split names its group.
inline void check_weighted_swiglu_faults(Device d) {
  const int64_t M = 40, I = 16;
  Context ctx(d);
  Tensor gu = rows_with_nan_tail(randn(size_t(M * 2 * I)), M, M, 2 * I, DType::bf16, d);
  Tensor prob = rows_with_nan_tail(randn(size_t(M)), M, M, 1, DType::fp32, d);
  const TensorView probv(prob.data(), DType::fp32, d, {M});
  Tensor out = poisoned({M, I}, DType::bf16, d);
  Tensor over = splits_on({30, 30}, DType::int32, d);
  weighted_swiglu_forward(ctx, gu, probv, out, SwigluForm{}, over);
  StatusBlock st = ctx.take_status();
  EXPECT_EQ(st.bits, uint32_t(kFaultSplitsOverflow | kFaultSplitsTotalMismatch));
  EXPECT_EQ(st.op, uint32_t(OpId::weighted_swiglu));
  EXPECT_EQ(st.group, 1);
  EXPECT_EQ(st.value, 30);
  for (float v : floats_of(out)) ASSERT_TRUE(std::isfinite(v)) << "every row computed";
  Tensor neg = splits_on({10, -2, 5}, DType::int64, d);
  weighted_swiglu_forward(ctx, gu, probv, out, SwigluForm{}, neg);
  st = ctx.take_status();
  EXPECT_EQ(st.bits, uint32_t(kFaultNegativeSplit));
  EXPECT_EQ(st.group, 1);
  EXPECT_EQ(st.value, -2);
}

// group_dbias: the experts' sums equal exact mode's over S rows bit for bit.
inline void check_dbias(Device d, const Shape& sh) {
  const int64_t S = sum_of(sh.splits), M = S + sh.tail, N = 40, G = int64_t(sh.splits.size());
  Context ctx(d);
  Tensor dy = rows_with_nan_tail(randn(size_t(S * N)), S, M, N, DType::bf16, d);
  Tensor splits = splits_on(sh.splits, DType::int64, d);
  Tensor db = poisoned({G, N}, DType::fp32, d), ref = poisoned({G, N}, DType::fp32, d);
  group_dbias(ctx, dy, splits, db, false, SplitsTotal::at_most);
  EXPECT_EQ(ctx.take_status().bits, 0u);
  group_dbias(ctx, TensorView(dy.data(), DType::bf16, d, {S, N}), splits, ref);
  EXPECT_EQ(ctx.take_status().bits, 0u);
  EXPECT_TRUE(bytes_of(db) == bytes_of(ref)) << "S=" << S << " M=" << M;
  // A sum past the rows is still a fault.
  Tensor over = splits_on({M, 1}, DType::int32, d);
  Tensor db2 = poisoned({2, N}, DType::fp32, d);
  group_dbias(ctx, dy, over, db2, false, SplitsTotal::at_most);
  const StatusBlock st = ctx.take_status();
  EXPECT_EQ(st.bits, uint32_t(kFaultSplitsOverflow | kFaultSplitsTotalMismatch));
  EXPECT_EQ(st.op, uint32_t(OpId::group_dbias));
}

// ---- quantize
// ------------------------------------------------------------------------------------

// The activation config the quantized GroupedLinear recipes use (both copies, default layout).
inline QuantizeConfig act_config(QuantRecipe r) {
  QuantizeConfig c;
  c.recipe = r;
  c.direction = QuantDirection::both;
  return c;
}

struct Quantized {
  QuantizedBuffers buf;
  GroupedTensor t;
};

// Buffers for `rows` rows, every byte poisoned.
inline Quantized quant_buffers(const QuantizeConfig& c, int64_t rows, int64_t K, int64_t G,
                               Device d) {
  Quantized q;
  q.buf = allocate_quantized(group_quantize_shapes(rows, K, G, c), d);
  for (Tensor* t : {&q.buf.data, &q.buf.scale_inv, &q.buf.columnwise_data,
                    &q.buf.columnwise_scale_inv, &q.buf.amax, &q.buf.global_scale})
    if (t->view().present()) fill_bytes(*t, kPoison);
  return q;
}

inline GroupedTensor quantize_rows(Context& ctx, const Tensor& x, int64_t rows, int64_t K,
                                   const Tensor& splits, const QuantizeConfig& c, Quantized& q,
                                   SplitsTotal total, const TensorView& dbias = TensorView()) {
  GroupQuantizeArgs a;
  a.input = TensorView(x.data(), x.view().dtype, x.view().device, {rows, K});
  a.splits = splits;
  a.splits_total = total;
  a.config = c;
  a.out = q.buf.view(splits.view().dim(0), splits, c);
  return dbias.present() ? bgrad_group_quantize(ctx, a, dbias) : group_quantize(ctx, a);
}

// Every output of group_quantize (and bgrad_group_quantize's dbias): the data rows (rowwise) and
// the columnwise data's first K * S bytes equal exact mode's over S rows, their tails keep the
// poison; the scale buffers equal exact mode's over the bytes both have (their layouts place the
// experts' blocks from the experts' starts; past them both hold zero slack), amax equal.
inline void check_quantize(Device d, QuantRecipe r, const Shape& sh, bool with_dbias) {
  const int64_t S = sum_of(sh.splits), M = S + sh.tail, K = 256, G = int64_t(sh.splits.size());
  const std::string what =
      detail::cat(recipe_name(r), " S=", S, " M=", M, with_dbias ? " (with dbias)" : "");
  const QuantizeConfig c = act_config(r);
  Context ctx(d);
  Tensor x = rows_with_nan_tail(randn(size_t(S * K)), S, M, K, DType::bf16, d);
  Tensor splits = splits_on(sh.splits, DType::int32, d);
  Quantized got = quant_buffers(c, M, K, G, d);
  Tensor db = poisoned({G, K}, DType::fp32, d), ref_db = poisoned({G, K}, DType::fp32, d);
  quantize_rows(ctx, x, M, K, splits, c, got, SplitsTotal::at_most,
                with_dbias ? db.view() : TensorView());
  EXPECT_EQ(ctx.take_status().bits, 0u) << what;
  if (S == 0) {  // no expert row: no data byte written, every expert's dbias 0
    EXPECT_TRUE(all_poison(bytes_of(got.buf.data), 0, got.buf.data.nbytes())) << what;
    EXPECT_TRUE(all_poison(bytes_of(got.buf.columnwise_data), 0, got.buf.columnwise_data.nbytes()))
        << what;
    if (with_dbias)
      for (float v : floats_of(db)) EXPECT_EQ(v, 0.0f) << what;
    return;
  }
  Quantized ref = quant_buffers(c, S, K, G, d);
  quantize_rows(ctx, x, S, K, splits, c, ref, SplitsTotal::exact,
                with_dbias ? ref_db.view() : TensorView());
  EXPECT_EQ(ctx.take_status().bits, 0u) << what;
  const std::vector<uint8_t> gd = bytes_of(got.buf.data), rd = bytes_of(ref.buf.data);
  const int64_t data_row = int64_t(gd.size()) / M;  // bytes of one row of data
  EXPECT_TRUE(byte_range(gd, 0, S * data_row) == byte_range(rd, 0, S * data_row)) << what;
  EXPECT_TRUE(all_poison(gd, S * data_row, int64_t(gd.size()))) << what << ": data tail written";
  const std::vector<uint8_t> gc = bytes_of(got.buf.columnwise_data),
                             rc = bytes_of(ref.buf.columnwise_data);
  EXPECT_TRUE(byte_range(gc, 0, int64_t(rc.size())) == rc) << what << ": columnwise data";
  EXPECT_TRUE(all_poison(gc, int64_t(rc.size()), int64_t(gc.size())))
      << what << ": columnwise tail written";
  for (const auto& [g, rf, name] :
       {std::tuple{&got.buf.scale_inv, &ref.buf.scale_inv, "scale_inv"},
        std::tuple{&got.buf.columnwise_scale_inv, &ref.buf.columnwise_scale_inv,
                   "columnwise_scale_inv"},
        std::tuple{&got.buf.amax, &ref.buf.amax, "amax"}}) {
    if (!g->view().present()) continue;
    const std::vector<uint8_t> gb = bytes_of(*g), rb = bytes_of(*rf);
    const bool plain_rows = r != QuantRecipe::fp8_current && std::string(name) == "scale_inv" &&
                            c.scale_layout == ScaleLayout::plain;
    const int64_t n = std::min(gb.size(), rb.size());
    EXPECT_TRUE(byte_range(gb, 0, n) == byte_range(rb, 0, n)) << what << ": " << name;
    if (plain_rows)  // plain 1xB rowwise scales: rows past the sum unwritten, as the data
      EXPECT_TRUE(all_poison(gb, int64_t(rb.size()), int64_t(gb.size()))) << what << ": " << name;
  }
  if (with_dbias) EXPECT_TRUE(bytes_of(db) == bytes_of(ref_db)) << what << ": dbias";
}

inline void check_quantize_fault(Device d) {
  const int64_t M = 64, K = 128;
  const QuantizeConfig c = act_config(QuantRecipe::fp8_block);
  Context ctx(d);
  Tensor x = rows_with_nan_tail(randn(size_t(M * K)), M, M, K, DType::bf16, d);
  Tensor splits = splits_on({40, 40}, DType::int64, d);
  Quantized q = quant_buffers(c, M, K, 2, d);
  quantize_rows(ctx, x, M, K, splits, c, q, SplitsTotal::at_most);
  const StatusBlock st = ctx.take_status();
  EXPECT_EQ(st.bits, uint32_t(kFaultSplitsOverflow | kFaultSplitsTotalMismatch));
  EXPECT_EQ(st.op, uint32_t(OpId::group_quantize));
}

// ---- quantized grouped GEMM
// ----------------------------------------------------------------------

// The three passes of a quantized GroupedLinear step over at-most operands against exact mode's
// over S rows: forward and dgrad rows and wgrad's dW equal (bit for bit on the CPU; `tol` > 0:
// within that relative error, for kernels whose configuration may depend on M), output tails keep
// the poison.
inline void check_quantized_gemm(Device d, QuantRecipe r, const Shape& sh, double tol) {
  const int64_t S = sum_of(sh.splits), M = S + sh.tail, G = int64_t(sh.splits.size());
  const int64_t N = 256, K = 128;
  const std::string what = detail::cat(recipe_name(r), " S=", S, " M=", M);
  Context ctx(d);
  const QuantizeConfig ca = act_config(r);
  QuantizeConfig cw = ca;
  cw.block_2d = r == QuantRecipe::fp8_block;
  Tensor x = rows_with_nan_tail(randn(size_t(S * K)), S, M, K, DType::bf16, d);
  Tensor dy = rows_with_nan_tail(randn(size_t(S * N)), S, M, N, DType::bf16, d);
  std::vector<uint16_t> wh = encode16(randn(size_t(G * N * K), 0.05f), DType::bf16);
  Tensor w = clone_to(TensorView(wh.data(), DType::bf16, Device::CPU, {G, N, K}), d);
  Tensor splits = splits_on(sh.splits, DType::int32, d);
  Quantized wq = quant_buffers(cw, G * N, K, G, d);
  GroupQuantizeArgs qa;
  qa.input = w;
  qa.config = cw;
  qa.out = wq.buf.view(G, TensorView(), cw);
  const GroupedTensor W = group_quantize(ctx, qa);
  auto run = [&](int64_t rows, SplitsTotal total, Tensor& y, Tensor& dx, Tensor& dw) {
    Quantized xq = quant_buffers(ca, rows, K, G, d), gq = quant_buffers(ca, rows, N, G, d);
    const GroupedTensor X = quantize_rows(ctx, x, rows, K, splits, ca, xq, total);
    const GroupedTensor DY = quantize_rows(ctx, dy, rows, N, splits, ca, gq, total);
    QuantizedGemmArgs a;
    a.splits = splits;
    a.splits_total = total;
    a.pass = GemmPass::forward;
    a.a = X;
    a.b = W;
    a.out = TensorView(y.data(), DType::bf16, d, {rows, N});
    grouped_gemm(ctx, a);
    a.pass = GemmPass::dgrad;
    a.a = DY;
    a.out = TensorView(dx.data(), DType::bf16, d, {rows, K});
    grouped_gemm(ctx, a);
    a.pass = GemmPass::wgrad;
    a.b = X;
    a.out = dw;
    grouped_gemm(ctx, a);
  };
  Tensor y = poisoned({M, N}, DType::bf16, d), dx = poisoned({M, K}, DType::bf16, d),
         dw = poisoned({G, N, K}, DType::fp32, d);
  run(M, SplitsTotal::at_most, y, dx, dw);
  EXPECT_EQ(ctx.take_status().bits, 0u) << what;
  if (S == 0) {  // no expert row: y and dx untouched, every dW_g = 0
    EXPECT_TRUE(all_poison(bytes_of(y), 0, y.nbytes())) << what;
    EXPECT_TRUE(all_poison(bytes_of(dx), 0, dx.nbytes())) << what;
    for (float v : floats_of(dw)) ASSERT_EQ(v, 0.0f) << what;
    return;
  }
  Tensor ry = poisoned({M, N}, DType::bf16, d), rdx = poisoned({M, K}, DType::bf16, d),
         rdw = poisoned({G, N, K}, DType::fp32, d);
  run(S, SplitsTotal::exact, ry, rdx, rdw);
  EXPECT_EQ(ctx.take_status().bits, 0u) << what;
  if (tol == 0) {
    expect_rows(y, ry, S, what + " forward");
    expect_rows(dx, rdx, S, what + " dgrad");
    EXPECT_TRUE(bytes_of(dw) == bytes_of(rdw)) << what << " wgrad";
    return;
  }
  const auto head = [&](const Tensor& t, int64_t cols) {
    std::vector<float> f = floats_of(t);
    f.resize(size_t(S * cols));
    return f;
  };
  EXPECT_LE(rel_error(head(y, N), head(ry, N)), tol) << what << " forward";
  EXPECT_LE(rel_error(head(dx, K), head(rdx, K)), tol) << what << " dgrad";
  EXPECT_LE(rel_error(floats_of(dw), floats_of(rdw)), tol) << what << " wgrad";
  const std::vector<uint8_t> yb = bytes_of(y), xb = bytes_of(dx);
  EXPECT_TRUE(all_poison(yb, S * N * 2, int64_t(yb.size()))) << what << " forward tail written";
  EXPECT_TRUE(all_poison(xb, S * K * 2, int64_t(xb.size()))) << what << " dgrad tail written";
}

// The split shapes of the quantized GEMM cases: FP8 wgrad needs multiples of 16.
inline std::vector<Shape> gemm_shapes() {
  return {{{128, 0, 256, 16, 0, 64}, 300}, {{0, 0, 0, 0, 0, 208}, 77}, {{0, 0, 0}, 48}};
}

// ---- the capacity plan
// ---------------------------------------------------------------------------

// The capacity plan's splits_at_most (R = 2 ranks as threads): the experts' entries, equal to
// splits but in the last expert, which also counts the zero tail; entry_splits() picks them, and
// throughput mode's entry_splits() are its splits.
inline void check_capacity_plan_splits(Device d) {
  const int R = 2;
  cudaStream_t s = nullptr;
  if (d == Device::CUDA) GROUPMM_CHECK_CUDA(cudaStreamCreate(&s));
  ep_harness::run_ranks(
      R,
      [&](int rank, ep::InProcessTransport& tr) {
        Context ctx(d, s);
        const ep::EpConfig cfg{8, R, 16, 2};
        const int64_t T = 6;
        std::vector<int32_t> ids(size_t(T * 2));  // fits the budget: no drop
        for (int64_t i = 0; i < T * 2; ++i) ids[size_t(i)] = int32_t((i * 5 + rank) % 8);
        Tensor idv = clone_to(host_view(ids, DType::int32, {T, 2}), d, s);
        ep::EpPlan p = ep::ep_capacity_plan_create(ctx, tr, cfg, ep::EpCapacity{T, 0}, T,
                                                   DType::bf16);  // rows = R * C_e = 24
        ep::ep_capacity_plan(ctx, tr, idv, p);
        EXPECT_EQ(p.entry_splits().data, p.splits_at_most.data());
        const std::vector<uint8_t> sb = bytes_of(p.splits), ab = bytes_of(p.splits_at_most);
        std::vector<int32_t> sp(size_t(p.local_experts)), at(size_t(p.local_experts));
        std::memcpy(sp.data(), sb.data(), sb.size());
        std::memcpy(at.data(), ab.data(), ab.size());
        int64_t sum = 0;
        for (int64_t e = 0; e < p.local_experts; ++e) {
          sum += at[size_t(e)];
          if (e + 1 < p.local_experts) EXPECT_EQ(at[size_t(e)], sp[size_t(e)]);
        }
        int64_t want = 0;  // the entries of every rank naming this rank's experts
        for (int q = 0; q < R; ++q)
          for (int64_t i = 0; i < T * 2; ++i) want += (i * 5 + q) % 8 / 4 == rank;
        EXPECT_EQ(sum, want);
        EXPECT_LT(sum, p.rows);
        EXPECT_EQ(sp.back(), at.back() + (p.rows - sum));
        ep::EpPlan t = ep::ep_dispatch_plan(ctx, tr, cfg, idv);
        EXPECT_EQ(t.entry_splits().data, t.splits.data());
        EXPECT_EQ(ctx.take_status().bits, 0u);
      },
      d, s);
  if (s != nullptr) cudaStreamDestroy(s);
}

}  // namespace groupmm::test::at_most
