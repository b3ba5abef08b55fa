// Naive double-precision recomputation of the demo MLP's stages (see mlp_check.hpp).
#include "demo/mlp_check.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "groupmm/convert.hpp"

namespace groupmm::tool {
namespace {

// Rows [start, start + rows) of a bf16 tensor as floats, a row being its last dim ([G, N, K]
// weights: row g * N + n); any device.
std::vector<float> rows_of(const TensorView& t, int64_t start, int64_t rows) {
  const int64_t cols = t.dim(t.rank - 1);
  std::vector<uint16_t> h(size_t(rows * cols));
  std::vector<float> f(h.size());
  if (h.empty()) return f;
  const TensorView src(static_cast<uint16_t*>(t.data) + start * cols, t.dtype, t.device,
                       {rows * cols});
  copy(TensorView(h.data(), t.dtype, Device::CPU, {rows * cols}), src);
  for (size_t i = 0; i < h.size(); ++i) f[i] = bf16_bits_to_float(h[i]);
  return f;
}

// A row-major matrix on the host.
struct Mat {
  std::vector<float> v;
  int64_t cols;
  float at(int64_t r, int64_t c) const { return v[size_t(r * cols + c)]; }
};

// Accumulates ||out - ref||^2 and ||ref||^2.
struct Err {
  double num = 0, den = 0;
  void add(double out, double ref) {
    num += std::isfinite(out) ? (out - ref) * (out - ref) : INFINITY;
    den += ref * ref;
  }
  double rel() const { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
};

double sigmoid(double g) {
  return 1.0 / (1.0 + std::exp(-g));
}

// Up to `n` row indices of [0, rows), evenly spaced, first and last included.
std::vector<int64_t> sample_rows(int64_t rows, int64_t n) {
  std::vector<int64_t> r;
  for (int64_t i = 0; i < std::min(rows, n); ++i)
    r.push_back(rows <= n ? i : i * (rows - 1) / (n - 1));
  return r;
}

// out[r] = a[r] . b^T (b [N, K]) on the sampled rows: forward (TN).
double check_tn(const Mat& a, const Mat& b, const Mat& out, const std::vector<int64_t>& rows) {
  Err e;
  const int64_t N = int64_t(b.v.size()) / b.cols, K = b.cols;
  for (int64_t r : rows)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(a.at(r, k)) * b.at(n, k);
      e.add(out.at(r, n), s);
    }
  return e.rel();
}

// out[r] = a[r] . b (b [N, K]) on the sampled rows: dgrad (NN).
double check_nn(const Mat& a, const Mat& b, const Mat& out, const std::vector<int64_t>& rows) {
  Err e;
  const int64_t N = int64_t(b.v.size()) / b.cols, K = b.cols;
  std::vector<double> acc(static_cast<size_t>(K));
  for (int64_t r : rows) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) acc[size_t(k)] += double(a.at(r, n)) * b.at(n, k);
    for (int64_t k = 0; k < K; ++k) e.add(out.at(r, k), acc[size_t(k)]);
  }
  return e.rel();
}

// dw[n][k] = sum over all rows of dy[r][n] * x[r][k] at `entries` sampled (n, k): wgrad (NT).
double check_nt(const Mat& dy, const Mat& x, const Mat& dw, int64_t rows, int64_t entries) {
  Err e;
  const int64_t N = int64_t(dw.v.size()) / dw.cols, K = dw.cols;
  std::mt19937_64 rng(uint64_t(N * 131 + K));
  for (int64_t i = 0; i < entries; ++i) {
    const int64_t n = i == 0 ? 0 : i == 1 ? N - 1 : int64_t(rng() % uint64_t(N));
    const int64_t k = i == 0 ? 0 : i == 1 ? K - 1 : int64_t(rng() % uint64_t(K));
    double s = 0;
    for (int64_t r = 0; r < rows; ++r) s += double(dy.at(r, n)) * x.at(r, k);
    e.add(dw.at(n, k), s);
  }
  return e.rel();
}

}  // namespace

ExpertCheck check_expert_naive(const MlpViews& m, int64_t g, int64_t start, int64_t rows) {
  const int64_t H = m.H, I = m.I;
  ExpertCheck c;
  const Mat dw1{rows_of(m.dw1, g * 2 * I, 2 * I), H}, dw2{rows_of(m.dw2, g * H, H), I};
  if (rows == 0) {  // a zero-row expert must get dW = 0
    double mx = 0;
    for (float v : dw1.v) mx = std::max(mx, double(std::fabs(v)));
    for (float v : dw2.v) mx = std::max(mx, double(std::fabs(v)));
    c.worst = mx == 0 ? 0.0 : INFINITY;
    c.worst_stage = "dW of a zero-row expert";
    return c;
  }
  const Mat x{rows_of(m.x, start, rows), H}, gu{rows_of(m.gu, start, rows), 2 * I},
      h{rows_of(m.h, start, rows), I}, y{rows_of(m.y, start, rows), H};
  const Mat dy{rows_of(m.dy, start, rows), H}, da{rows_of(m.da, start, rows), I},
      dh{rows_of(m.dh, start, rows), 2 * I}, dx{rows_of(m.dx, start, rows), H};
  const Mat w1{rows_of(m.w1, g * 2 * I, 2 * I), H}, w2{rows_of(m.w2, g * H, H), I};
  const std::vector<int64_t> sample = sample_rows(rows, 16);
  c.rows_checked = int64_t(sample.size());
  c.grad_entries = 256;

  Err swiglu_fwd, swiglu_bwd;
  for (int64_t r : sample)
    for (int64_t i = 0; i < I; ++i) {
      const double gate = gu.at(r, i), up = gu.at(r, I + i), s = sigmoid(gate);
      swiglu_fwd.add(h.at(r, i), gate * s * up);
      swiglu_bwd.add(dh.at(r, i), da.at(r, i) * up * s * (1 + gate * (1 - s)));
      swiglu_bwd.add(dh.at(r, I + i), da.at(r, i) * gate * s);
    }
  const std::pair<const char*, double> errs[] = {
      {"gate_up forward", check_tn(x, w1, gu, sample)},
      {"swiglu forward", swiglu_fwd.rel()},
      {"down forward", check_tn(h, w2, y, sample)},
      {"down dgrad", check_nn(dy, w2, da, sample)},
      {"down wgrad", check_nt(dy, h, dw2, rows, c.grad_entries)},
      {"swiglu backward", swiglu_bwd.rel()},
      {"gate_up dgrad", check_nn(dh, w1, dx, sample)},
      {"gate_up wgrad", check_nt(dh, x, dw1, rows, c.grad_entries)}};
  c.worst_stage = errs[0].first;
  for (const auto& [stage, err] : errs) {
    if (std::isnan(c.worst)) break;  // a NaN stays the worst
    if (std::isnan(err) || err > c.worst) c.worst = err, c.worst_stage = stage;
  }
  return c;
}

}  // namespace groupmm::tool
