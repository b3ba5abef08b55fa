// A grouped GEMM problem with host and device copies, shared by the CPU and GPU GEMM tests.
#pragma once

#include <vector>

#include "common/test_util.hpp"
#include "groupmm/gemm.hpp"

namespace groupmm::test {

inline std::vector<uint16_t> encode16(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = t == DType::bf16 ? float_to_bf16_bits(v[i]) : float_to_fp16_bits(v[i]);
  return out;
}

inline std::vector<float> decode(const std::vector<uint8_t>& bytes, DType t) {
  const size_t n = bytes.size() / (t == DType::fp32 ? 4 : 2);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::fp32) {
      std::memcpy(&out[i], &bytes[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &bytes[i * 2], 2);
      out[i] = t == DType::bf16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
    }
  }
  return out;
}

// Host buffers of one grouped GEMM: operands in their storage dtype, splits, initial out.
struct GemmProblem {
  GemmPass pass;
  DType dtype, out_dtype;
  int64_t G, M, N, K;
  bool bias = false;
  float beta = 0;
  std::vector<int64_t> splits;
  std::vector<uint16_t> a, b;
  std::vector<uint8_t> biasv;     // bias bytes [G, N] in out's dtype (forward)
  std::vector<uint8_t> out_init;  // initial out bytes (random for beta=1, NaN poison otherwise)

  int64_t a_rows() const { return M; }
  int64_t a_cols() const { return pass == GemmPass::forward ? K : N; }
  int64_t out_elems() const {
    return pass == GemmPass::wgrad ? G * N * K : M * (pass == GemmPass::forward ? N : K);
  }
  size_t out_bytes() const {
    return static_cast<size_t>(out_elems() * (out_dtype == DType::fp32 ? 4 : 2));
  }

  static GemmProblem make(GemmPass pass, DType t, int64_t G, const std::vector<int64_t>& splits,
                          int64_t N, int64_t K, bool bias, float beta, DType out_t) {
    GemmProblem p{pass, t, out_t, G, 0, N, K, bias, beta, splits, {}, {}, {}, {}};
    for (auto s : splits) p.M += s;
    p.a = encode16(randn(static_cast<size_t>(p.M * p.a_cols())), t);
    const size_t nb = pass == GemmPass::wgrad ? size_t(p.M * K) : size_t(G * N * K);
    p.b = encode16(randn(nb, 0.05f), t);
    if (bias) {  // in out's dtype, as grouped_gemm requires (fp32 bias with an fp32 out)
      const auto v = randn(static_cast<size_t>(G * N));
      if (out_t == DType::fp32) {
        p.biasv.resize(v.size() * 4);
        std::memcpy(p.biasv.data(), v.data(), p.biasv.size());
      } else {
        const auto h = encode16(v, out_t);
        p.biasv.resize(h.size() * 2);
        std::memcpy(p.biasv.data(), h.data(), p.biasv.size());
      }
    }
    p.out_init.assign(p.out_bytes(), 0xFF);
    if (beta != 0) {
      auto init = randn(static_cast<size_t>(p.out_elems()));
      std::memcpy(p.out_init.data(), init.data(), p.out_bytes());  // fp32 main_grad
    }
    return p;
  }

  GroupedGemmArgs args(void* a_ptr, void* b_ptr, void* out_ptr, void* splits_ptr, void* bias_ptr,
                       Device d) const {
    GroupedGemmArgs x;
    x.pass = pass;
    x.a = TensorView(a_ptr, dtype, d, {M, a_cols()});
    x.b = pass == GemmPass::wgrad ? TensorView(b_ptr, dtype, d, {M, K})
                                  : TensorView(b_ptr, dtype, d, {G, N, K});
    x.out = pass == GemmPass::wgrad     ? TensorView(out_ptr, out_dtype, d, {G, N, K})
            : pass == GemmPass::forward ? TensorView(out_ptr, out_dtype, d, {M, N})
                                        : TensorView(out_ptr, out_dtype, d, {M, K});
    x.splits = TensorView(splits_ptr, DType::int64, d, {G});
    if (bias) x.bias = TensorView(bias_ptr, out_dtype, d, {G, N});
    x.beta = beta;
    return x;
  }

  // Runs on the CPU reference backend; returns the out bytes.
  std::vector<uint8_t> run_cpu() {
    Context ctx(Device::CPU);
    std::vector<uint8_t> out = out_init;
    grouped_gemm(ctx,
                 args(a.data(), b.data(), out.data(), splits.data(), biasv.data(), Device::CPU));
    ctx.check();
    return out;
  }

  // Per-expert output element ranges [begin, end) (rows of y/dx, or the dW_g slab).
  std::vector<std::pair<int64_t, int64_t>> expert_ranges() const {
    std::vector<std::pair<int64_t, int64_t>> r;
    int64_t start = 0;
    const int64_t cols = pass == GemmPass::forward ? N : K;
    for (int64_t g = 0; g < G; ++g) {
      if (pass == GemmPass::wgrad) {
        r.push_back({g * N * K, (g + 1) * N * K});
      } else {
        r.push_back({start * cols, (start + splits[size_t(g)]) * cols});
      }
      start += splits[size_t(g)];
    }
    return r;
  }
};

// SplitsTotal::at_most: `problem` (M = sum(splits)) with `tail` more rows in its activation
// buffers (a, and b for wgrad) and its output (forward, dgrad). The tail rows of the operands
// are NaN, so a kernel that read one would show it; the output starts as NaN poison (0xFF).
struct TailProblem {
  GemmProblem p;
  int64_t tail = 0;
  std::vector<uint16_t> a, b;  // the operands with their tail rows

  int64_t rows() const { return p.M + tail; }
  bool out_has_rows() const { return p.pass != GemmPass::wgrad; }
  size_t out_bytes() const {
    const size_t elem = p.out_dtype == DType::fp32 ? 4 : 2;
    return out_has_rows() ? size_t(rows() * (p.pass == GemmPass::forward ? p.N : p.K)) * elem
                          : p.out_bytes();
  }
  static TailProblem make(GemmProblem base, int64_t tail) {
    TailProblem t{std::move(base), tail, {}, {}};
    const uint16_t nan = 0xFFFF;  // NaN in bf16 and fp16
    t.a = t.p.a;
    t.a.resize(size_t(t.rows() * t.p.a_cols()), nan);
    t.b = t.p.b;
    if (t.p.pass == GemmPass::wgrad) t.b.resize(size_t(t.rows() * t.p.K), nan);
    return t;
  }
  GroupedGemmArgs args(void* a_ptr, void* b_ptr, void* out_ptr, void* splits_ptr, void* bias_ptr,
                       Device d, bool zero_tail) const {
    GroupedGemmArgs x = p.args(a_ptr, b_ptr, out_ptr, splits_ptr, bias_ptr, d);
    x.a = TensorView(a_ptr, p.dtype, d, {rows(), p.a_cols()});
    if (p.pass == GemmPass::wgrad) x.b = TensorView(b_ptr, p.dtype, d, {rows(), p.K});
    if (out_has_rows())
      x.out =
          TensorView(out_ptr, p.out_dtype, d, {rows(), p.pass == GemmPass::forward ? p.N : p.K});
    x.splits_total = SplitsTotal::at_most;
    x.zero_tail = zero_tail;
    return x;
  }
  // The output bytes: the problem's own ones (as long as the exact problem's output), then the
  // tail rows' bytes, which must all be `tail_byte` (0xFF: untouched; 0: zero_tail).
  ::testing::AssertionResult tail_is(const std::vector<uint8_t>& out, uint8_t tail_byte) const {
    for (size_t i = p.out_bytes(); i < out.size(); ++i)
      if (out[i] != tail_byte)
        return ::testing::AssertionFailure() << "tail byte " << i - p.out_bytes() << " is "
                                             << int(out[i]) << ", expected " << int(tail_byte);
    return ::testing::AssertionSuccess();
  }
};

}  // namespace groupmm::test
