// CPU reference of the router: the logits GEMMs as plain loops, and top-k routing / its backward
// one token at a time with the shared router numerics (src/numerics/router.hpp), so the
// CUDA kernels must reproduce these bits (the GPU tests compare them exactly).
#include <cmath>
#include <vector>

#include "moe/backends.hpp"
#include "numerics/router.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::cpu {

namespace rn = groupmm::router;

// Below this many multiply-adds a parallel region costs more to start than it saves.
constexpr int64_t kParallelWork = int64_t(1) << 16;

// ---- logits GEMMs -------------------------------------------------------------------------------
namespace {

// out[r][c] = (accumulate ? out[r][c] : 0) + sum_i a(r, i) * b(i, c): an fp32 sum in i order,
// rounded once to out's dtype.
template <class A, class B>
void matmul(const TensorView& out, int64_t rows, int64_t cols, int64_t inner, A&& a, B&& b,
            bool accumulate) {
#pragma omp parallel for if (rows * cols * inner > kParallelWork)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float s = 0;
      for (int64_t i = 0; i < inner; ++i) s += a(r, i) * b(i, c);
      store_f(out, r * cols + c, accumulate ? load_f(out, r * cols + c) + s : s);
    }
}

}  // namespace

void moe_router_logits(Context&, const TensorView& x, const TensorView& w, const TensorView& bias,
                       const TensorView& logits) {
  const int64_t T = x.dim(0), H = x.dim(1), E = w.dim(0);
  const std::vector<float> X = to_floats(x), W = to_floats(w);
  matmul(
      logits, T, E, H, [&](int64_t t, int64_t h) { return X[size_t(t * H + h)]; },
      [&](int64_t h, int64_t e) { return W[size_t(e * H + h)]; }, false);
  if (!bias.present()) return;
  const std::vector<float> B = to_floats(bias);  // each fp32 sum + the promoted bias
  float* l = logits.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) l[t * E + e] += B[size_t(e)];
}

void moe_router_logits_backward(Context&, const TensorView& d_logits, const TensorView& x,
                                const TensorView& w, const TensorView& dx, const TensorView& dw,
                                bool accumulate_dx, bool accumulate_dw) {
  const int64_t T = x.dim(0), H = x.dim(1), E = w.dim(0);
  // g = d_logits rounded to x's dtype (what the GEMMs consume on CUDA)
  std::vector<float> g(size_t(T * E));
  std::vector<float> tmp(1);
  const TensorView one(tmp.data(), x.dtype, Device::CPU, {1});
  for (int64_t i = 0; i < T * E; ++i) {
    store_f(one, 0, d_logits.ptr<float>()[i]);
    g[size_t(i)] = load_f(one, 0);
  }
  const std::vector<float> X = to_floats(x), W = to_floats(w);
  auto G = [&](int64_t t, int64_t e) { return g[size_t(t * E + e)]; };
  if (dx.present())  // dx [T, H] (+)= g W
    matmul(
        dx, T, H, E, G, [&](int64_t e, int64_t h) { return W[size_t(e * H + h)]; }, accumulate_dx);
  if (dw.present())  // dw [E, H] (+)= g^T x
    matmul(
        dw, E, H, T, [&](int64_t e, int64_t t) { return G(t, e); },
        [&](int64_t t, int64_t h) { return X[size_t(t * H + h)]; }, accumulate_dw);
}

// ---- one token ----------------------------------------------------------------------------------
namespace {

struct Softmax {
  float max = 0, sum = 0;  // of the token's logits
};

// Softmax statistics and probabilities p[e] = exp(l_e - max) / sum in the router's order.
Softmax softmax(const float* l, int64_t E, std::vector<float>& p) {
  Softmax s;
  s.max = l[0];
  for (int64_t e = 1; e < E; ++e) s.max = std::fmax(s.max, l[e]);
  for (int64_t e = 0; e < E; ++e) p[size_t(e)] = rn::exp(rn::sub(l[e], s.max));
  s.sum = rn::lane_order_sum(int(E), [&](int e) { return p[size_t(e)]; });
  for (int64_t e = 0; e < E; ++e) p[size_t(e)] = rn::div(p[size_t(e)], s.sum);
  return s;
}

// Scores s[e] of one token; returns its softmax statistics (computed for either score function:
// the z-loss needs them).
Softmax scores(const RouterConfig& c, const float* l, std::vector<float>& s,
               std::vector<float>& p) {
  const Softmax st = softmax(l, c.experts, p);
  for (int64_t e = 0; e < c.experts; ++e)
    s[size_t(e)] = c.score == RouterScore::softmax ? p[size_t(e)] : rn::sigmoid(l[e]);
  return st;
}

// The best not-yet-taken allowed expert by sel (ties: lower id), or -1.
int64_t best_of(const std::vector<float>& sel, const std::vector<char>& ok, int64_t lo,
                int64_t hi) {
  int64_t b = -1;
  for (int64_t e = lo; e < hi; ++e)
    if (ok[size_t(e)] && (b < 0 || rn::better(sel[size_t(e)], int(e), sel[size_t(b)], int(b))))
      b = e;
  return b;
}

// Top-k selection of one token into ids[0..k).
void select(const RouterConfig& c, const std::vector<float>& sel, int32_t* ids) {
  const int64_t E = c.experts, k = c.topk;
  std::vector<char> ok(size_t(E), 1);
  if (c.n_group > 1) {
    const int64_t Eg = E / c.n_group, m = k / c.topk_group;
    std::vector<float> gscore(size_t(c.n_group));
    for (int64_t g = 0; g < c.n_group; ++g) {  // sum of the group's top m, best first
      std::vector<char> avail(size_t(E), 1);
      float sum = 0.0f;
      for (int64_t i = 0; i < m; ++i) {
        const int64_t b = best_of(sel, avail, g * Eg, (g + 1) * Eg);
        sum = rn::add(sum, sel[size_t(b)]);
        avail[size_t(b)] = 0;
      }
      gscore[size_t(g)] = sum;
    }
    std::vector<char> gok(size_t(c.n_group), 1), keep(size_t(c.n_group), 0);
    for (int64_t i = 0; i < c.topk_group; ++i) {
      const int64_t b = best_of(gscore, gok, 0, c.n_group);
      keep[size_t(b)] = 1;
      gok[size_t(b)] = 0;
    }
    for (int64_t e = 0; e < E; ++e) ok[size_t(e)] = keep[size_t(e / Eg)];
  }
  for (int64_t j = 0; j < k; ++j) {
    const int64_t b = best_of(sel, ok, 0, E);
    ids[j] = int32_t(b);
    ok[size_t(b)] = 0;
  }
}

}  // namespace

// ---- forward ------------------------------------------------------------------------------------

void moe_router_forward(Context&, const RouterConfig& c, const RouterArgs& a) {
  const int64_t T = a.logits.dim(0), E = c.experts, k = c.topk;
  const float* L = a.logits.ptr<float>();
  int32_t* counts = a.counts.ptr<int32_t>();
  for (int64_t e = 0; e < E; ++e) counts[e] = 0;
  std::vector<float> s(static_cast<size_t>(E)), p(static_cast<size_t>(E)),
      sel(static_cast<size_t>(E));
  std::vector<double> psum(size_t(E), 0.0);  // sum_t P_te for the aux loss
  double zsum = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* l = L + t * E;
    const Softmax st = scores(c, l, s, p);
    for (int64_t e = 0; e < E; ++e)
      sel[size_t(e)] = a.expert_bias.present()
                           ? rn::add(s[size_t(e)], a.expert_bias.ptr<float>()[e])
                           : s[size_t(e)];
    int32_t* ids = a.expert_ids.ptr<int32_t>() + t * k;
    float* w = a.weights.ptr<float>() + t * k;
    select(c, sel, ids);
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      w[j] = s[size_t(ids[j])];
      sum = rn::add(sum, w[j]);
      ++counts[ids[j]];
    }
    sum = rn::add(sum, rn::kRenormEps);
    for (int64_t j = 0; j < k; ++j) {
      if (c.renormalize) w[j] = rn::div(w[j], sum);
      w[j] = rn::mul(w[j], c.scaling_factor);
    }
    if (c.aux_loss_coeff != 0) {
      float z = 1.0f;  // P = s / (sum s + eps) for sigmoid scores
      if (c.score == RouterScore::sigmoid)
        z = rn::add(rn::lane_order_sum(int(E), [&](int e) { return s[size_t(e)]; }),
                    rn::kRenormEps);
      for (int64_t e = 0; e < E; ++e) psum[size_t(e)] += double(rn::div(s[size_t(e)], z));
    }
    if (c.z_loss_coeff != 0) {
      const double lse = double(st.max) + std::log(double(st.sum));
      zsum += lse * lse;
    }
  }
  if (c.aux_loss_coeff != 0) {
    double acc = 0;
    for (int64_t e = 0; e < E; ++e) acc += psum[size_t(e)] * counts[e];
    a.aux_loss.ptr<float>()[0] =
        T == 0 ? 0.0f : float(acc * c.aux_loss_coeff * double(E) / (double(k) * T * T));
  } else if (a.aux_loss.present()) {
    a.aux_loss.ptr<float>()[0] = 0.0f;  // a disabled loss given anyway reads 0
  }
  if (c.z_loss_coeff != 0)
    a.z_loss.ptr<float>()[0] = T == 0 ? 0.0f : float(zsum * c.z_loss_coeff / double(T));
  else if (a.z_loss.present())
    a.z_loss.ptr<float>()[0] = 0.0f;
}

// ---- backward -----------------------------------------------------------------------------------

void moe_router_backward(Context& ctx, const RouterConfig& c, const RouterBackwardArgs& a) {
  const int64_t T = a.logits.dim(0), E = c.experts, k = c.topk;
  // Per-expert aux gradient a_e = coeff E / (k T^2) * counts_e, and the z-loss factor 2 coeff / T
  // (host constants: the CUDA launcher computes the same floats).
  const float ca =
      T == 0 ? 0.0f : float(double(c.aux_loss_coeff) * double(E) / (double(k) * T * T));
  const float cz = T == 0 ? 0.0f : float(2.0 * double(c.z_loss_coeff) / double(T));
  std::vector<float> s(static_cast<size_t>(E)), p(static_cast<size_t>(E)),
      ds(static_cast<size_t>(E)), wr(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = a.logits.ptr<float>() + t * E;
    const int32_t* ids = a.expert_ids.ptr<int32_t>() + t * k;
    const float* dw = a.d_weights.ptr<float>() + t * k;
    float* dl = a.d_logits.ptr<float>() + t * E;
    const Softmax st = scores(c, l, s, p);
    std::fill(ds.begin(), ds.end(), 0.0f);
    // d s from d weights (through the optional renormalization)
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const bool valid = ids[j] >= 0 && ids[j] < E;
      if (!valid)
        report_fault_host(ctx.status(), kFaultBadIndex, OpId::moe_router, int32_t(t), ids[j]);
      wr[size_t(j)] = valid ? s[size_t(ids[j])] : 0.0f;
      sum = rn::add(sum, wr[size_t(j)]);
    }
    sum = rn::add(sum, rn::kRenormEps);
    float dot = 0.0f;
    if (c.renormalize)
      for (int64_t j = 0; j < k; ++j)
        dot = rn::add(dot, rn::mul(rn::mul(dw[j], c.scaling_factor), rn::div(wr[size_t(j)], sum)));
    for (int64_t j = 0; j < k; ++j) {
      if (ids[j] < 0 || ids[j] >= E) continue;
      const float g = rn::mul(dw[j], c.scaling_factor);
      const float d = c.renormalize ? rn::div(rn::sub(g, dot), sum) : g;
      ds[size_t(ids[j])] = rn::add(ds[size_t(ids[j])], d);
    }
    // d s from the aux loss (counts are constants)
    if (c.aux_loss_coeff != 0) {
      auto ae = [&](int e) { return rn::mul(ca, float(a.counts.ptr<int32_t>()[e])); };
      if (c.score == RouterScore::softmax) {
        for (int64_t e = 0; e < E; ++e) ds[size_t(e)] = rn::add(ds[size_t(e)], ae(int(e)));
      } else {
        const float z = rn::add(rn::lane_order_sum(int(E), [&](int e) { return s[size_t(e)]; }),
                                rn::kRenormEps);
        const float ap = rn::lane_order_sum(
            int(E), [&](int e) { return rn::mul(ae(e), rn::div(s[size_t(e)], z)); });
        for (int64_t e = 0; e < E; ++e)
          ds[size_t(e)] = rn::add(ds[size_t(e)], rn::div(rn::sub(ae(int(e)), ap), z));
      }
    }
    // d logits through the score function
    if (c.score == RouterScore::softmax) {
      const float d2 =
          rn::lane_order_sum(int(E), [&](int e) { return rn::mul(ds[size_t(e)], s[size_t(e)]); });
      for (int64_t e = 0; e < E; ++e) dl[e] = rn::mul(s[size_t(e)], rn::sub(ds[size_t(e)], d2));
    } else {
      for (int64_t e = 0; e < E; ++e)
        dl[e] = rn::mul(ds[size_t(e)], rn::mul(s[size_t(e)], rn::sub(1.0f, s[size_t(e)])));
    }
    if (c.z_loss_coeff != 0) {
      const float lse = st.max + std::log(st.sum);
      for (int64_t e = 0; e < E; ++e)
        dl[e] = rn::add(dl[e], rn::mul(rn::mul(cz, lse), p[size_t(e)]));
    }
  }
}

}  // namespace groupmm::cpu
