// The MoE block's shared pieces (moe_block.hpp).
#include "common/moe_block.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "groupmm/gemm.hpp"
#include "groupmm/random.hpp"

namespace groupmm::tool {

using nn::MoE;
using nn::MoEStage;

namespace {

// Marks on the stream (CUDA events) or the host clock, one after each stage.
class Marks {
 public:
  Marks(const Context& ctx, size_t n) : ctx_(ctx), ev_(n), host_(n) {
    if (gpu())
      for (auto& e : ev_) GROUPMM_CHECK_CUDA(cudaEventCreate(&e));
  }
  ~Marks() {
    for (auto& e : ev_)
      if (e) cudaEventDestroy(e);
  }
  void mark(size_t i) {
    if (gpu())
      GROUPMM_CHECK_CUDA(cudaEventRecord(ev_[i], ctx_.stream()));
    else
      host_[i] = std::chrono::steady_clock::now();
  }
  double us(size_t a, size_t b) {  // between marks a and b (after the last mark: synchronized)
    if (!gpu()) return std::chrono::duration<double, std::micro>(host_[b] - host_[a]).count();
    GROUPMM_CHECK_CUDA(cudaEventSynchronize(ev_[b]));
    float ms = 0;
    GROUPMM_CHECK_CUDA(cudaEventElapsedTime(&ms, ev_[a], ev_[b]));
    return 1e3 * ms;
  }

 private:
  bool gpu() const { return ctx_.device() == Device::CUDA; }
  const Context& ctx_;
  std::vector<cudaEvent_t> ev_;
  std::vector<std::chrono::steady_clock::time_point> host_;
};

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::vector<uint8_t> fetch_bytes(const TensorView& v, int64_t first, int64_t n) {
  const int64_t esz = dtype_bits(v.dtype) / 8;
  std::vector<uint8_t> h(size_t(n * esz));
  copy(TensorView(h.data(), DType::e8m0, Device::CPU, {n * esz}),
       TensorView(static_cast<char*>(v.data) + first * esz, DType::e8m0, v.device, {n * esz}));
  return h;
}

namespace {

TensorView host(std::vector<uint8_t>& b, DType t, std::initializer_list<int64_t> dims) {
  return TensorView(b.data(), t, Device::CPU, dims);
}

}  // namespace

std::vector<float> as_floats(std::vector<uint8_t>& b, DType t, int64_t n) {
  std::vector<float> f(static_cast<size_t>(n));
  const TensorView v = host(b, t, {n});
  for (int64_t i = 0; i < n; ++i) {
    if (t == DType::fp32)
      f[size_t(i)] = v.ptr<float>()[i];
    else if (t == DType::bf16)
      f[size_t(i)] = bf16_bits_to_float(v.ptr<uint16_t>()[i]);
    else
      f[size_t(i)] = fp16_bits_to_float(v.ptr<uint16_t>()[i]);
  }
  return f;
}

namespace {

// One dense SwiGLU MLP row on the CPU: x [1, H] -> gate_up (+ b) -> (weighted) swiglu -> down
// (+ b), from layer `up` / `down` expert g. Returns the [1, H] output in dtype bytes.
std::vector<uint8_t> mlp_row(Context& cpu, nn::GroupedLinear& up, nn::GroupedLinear& down,
                             int64_t g, std::vector<uint8_t>& xt, float prob, bool weighted) {
  const auto& uc = up.config();
  const int64_t H = uc.in_features, F2 = uc.out_features, F = F2 / 2;
  const DType t = uc.dtype;
  const int64_t esz = dtype_bits(t) / 8;
  auto w1 = fetch_bytes(up.weight(), g * F2 * H, F2 * H),
       w2 = fetch_bytes(down.weight(), g * H * F, H * F);
  std::vector<uint8_t> b1, b2, gu(size_t(F2 * esz)), h(size_t(F * esz)), y(size_t(H * esz));
  TensorView B1, B2;
  if (uc.bias) {
    b1 = fetch_bytes(up.bias(), g * F2, F2);
    b2 = fetch_bytes(down.bias(), g * H, H);
    B1 = host(b1, t, {1, F2});
    B2 = host(b2, t, {1, H});
  }
  int32_t one = 1;
  const TensorView sp(&one, DType::int32, Device::CPU, {1});
  gemm_forward(cpu, host(xt, t, {1, H}), host(w1, t, {1, F2, H}), sp, host(gu, t, {1, F2}), B1);
  if (weighted)
    weighted_swiglu_forward(cpu, host(gu, t, {1, F2}),
                            TensorView(&prob, DType::fp32, Device::CPU, {1}), host(h, t, {1, F}));
  else
    swiglu_forward(cpu, host(gu, t, {1, F2}), host(h, t, {1, F}));
  gemm_forward(cpu, host(h, t, {1, F}), host(w2, t, {1, H, F}), sp, host(y, t, {1, H}), B2);
  return y;
}

}  // namespace

BlockInputs block_inputs(Context& ctx, int64_t T, int64_t H, uint64_t seed) {
  BlockInputs b{Tensor::empty({T, H}, DType::bf16, ctx.device(), ctx.stream()),
                Tensor::empty({T, H}, DType::bf16, ctx.device(), ctx.stream())};
  fill_uniform(ctx, b.x, -1.0f, 1.0f, seed);
  fill_uniform(ctx, b.dy, -0.01f, 0.01f, seed + 1);
  return b;
}

StageTimes time_stages(Context& ctx, MoE& moe, const TensorView& x, const TensorView& dy,
                       int warmup, int iters) {
  const size_t per = 1 + 2 * kMoeStages;
  Marks marks(ctx, per);
  std::vector<std::pair<int, bool>> order;  // (stage, backward) after mark i + 1
  size_t next = 0;
  moe.set_stage_hook([&](MoEStage s, bool bwd) {
    order.push_back({int(s), bwd});
    marks.mark(++next);
  });
  std::vector<double> fwd[kMoeStages], bwd[kMoeStages], total;
  for (int it = 0; it < warmup + iters; ++it) {
    order.clear();
    next = 0;
    marks.mark(0);
    moe.forward(ctx, x);
    if (dy.present()) moe.backward(ctx, dy);
    if (dy.present()) moe.backward_dw(ctx);
    if (it < warmup) continue;
    for (size_t i = 0; i < order.size(); ++i)
      (order[i].second ? bwd : fwd)[order[i].first].push_back(marks.us(i, i + 1));
    total.push_back(marks.us(0, order.size()));
  }
  moe.set_stage_hook(nullptr);
  StageTimes st;
  for (int s = 0; s < kMoeStages; ++s) {
    st.fwd[s] = median_of(fwd[s]);
    st.bwd[s] = median_of(bwd[s]);
  }
  st.total_us = median_of(total);
  return st;
}

double print_moe_stages(const StageTimes& st, bool gpu, int iters) {
  std::printf("  stages (eager, %s, median of %d):\n", gpu ? "CUDA events" : "wall clock", iters);
  std::printf("    %-14s %10s %10s %7s\n", "stage", "fwd us", "bwd us", "share");
  double gemm = 0;
  for (int s = 0; s < kMoeStages; ++s) {
    const double tot = st.fwd[s] + st.bwd[s];
    if (tot == 0) continue;
    const MoEStage ms = MoEStage(s);
    if (ms == MoEStage::gate_up || ms == MoEStage::down || ms == MoEStage::shared_expert)
      gemm += tot;
    std::printf("    %-14s %10.1f %10.1f %6.1f%%\n", nn::moe_stage_name(ms), st.fwd[s], st.bwd[s],
                100 * tot / st.total_us);
  }
  const double non_gemm = 100 * (st.total_us - gemm) / st.total_us;
  std::printf(
      "    %-14s %21.1f  non-GEMM share %.1f%% (router, permute, activation, "
      "unpermute; target <= 15%% on qwen3)\n",
      "eager step", st.total_us, non_gemm);
  return non_gemm;
}

namespace {

// Token `tok`'s routing from the router on the CPU (the layer's router weight and bias), compared
// with the layer's: the ids equal and the weights within 1e-4 (relative).
bool cpu_routing_matches(Context& cpu, MoE& moe, std::vector<uint8_t>& xt, const int32_t* gid,
                         const float* gw) {
  const auto& c = moe.config();
  const int64_t H = c.hidden, E = c.experts, k = c.topk;
  auto wr = fetch_bytes(moe.router_weight(), 0, E * H);
  std::vector<uint8_t> bias;
  if (c.expert_bias) bias = fetch_bytes(moe.expert_bias(), 0, E);
  RouterConfig rc = c.router_config();
  rc.aux_loss_coeff = rc.z_loss_coeff = 0;  // per-token check: the losses need every token
  std::vector<float> logits(static_cast<size_t>(E)), cw(static_cast<size_t>(k));
  std::vector<int32_t> cids(static_cast<size_t>(k)), counts(static_cast<size_t>(E));
  moe_router_logits(cpu, host(xt, c.dtype, {1, H}), host(wr, c.dtype, {E, H}),
                    TensorView(logits.data(), DType::fp32, Device::CPU, {1, E}));
  RouterArgs ra;
  ra.logits = TensorView(logits.data(), DType::fp32, Device::CPU, {1, E});
  if (c.expert_bias) ra.expert_bias = host(bias, DType::fp32, {E});
  ra.expert_ids = TensorView(cids.data(), DType::int32, Device::CPU, {1, k});
  ra.weights = TensorView(cw.data(), DType::fp32, Device::CPU, {1, k});
  ra.counts = TensorView(counts.data(), DType::int32, Device::CPU, {E});
  moe_router_forward(cpu, rc, ra);
  bool same = std::equal(cids.begin(), cids.end(), gid);
  for (int64_t j = 0; same && j < k; ++j)
    same = std::fabs(cw[size_t(j)] - gw[j]) <= 1e-4f * std::fabs(gw[j]) + 1e-6f;
  return same;
}

// Token `tok`'s output on the CPU: its experts (with the layer's routing, dropped entries
// skipped) and the shared expert, summed like the combine and rounded once to the dtype.
std::vector<float> cpu_token_output(Context& cpu, MoE& moe, std::vector<uint8_t>& xt,
                                    const int32_t* gid, const float* gw, const int32_t* dest) {
  const auto& c = moe.config();
  const int64_t H = c.hidden;
  const DType t = c.dtype;
  std::vector<float> acc(size_t(H), 0.0f);
  const auto add = [&](std::vector<uint8_t> y) {
    const auto f = as_floats(y, t, H);
    for (int64_t i = 0; i < H; ++i) acc[size_t(i)] += f[size_t(i)];
  };
  for (int64_t j = 0; j < c.topk; ++j)
    if (dest[j] >= 0) add(mlp_row(cpu, moe.gate_up(), moe.down(), gid[j], xt, gw[j], true));
  if (moe.has_shared_expert())
    add(mlp_row(cpu, moe.shared_gate_up(), moe.shared_down(), 0, xt, 1.0f, false));
  for (float& v : acc)  // the combine rounds its fp32 sum once to the output dtype
    v = t == DType::bf16 ? bf16_bits_to_float(float_to_bf16_bits(v))
                         : (t == DType::fp16 ? fp16_bits_to_float(float_to_fp16_bits(v)) : v);
  return acc;
}

// ||got - ref|| / ||ref||; a NaN makes it infinite, which fails.
double row_rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff2 += std::pow(double(got[i]) - ref[i], 2);
    ref2 += std::pow(double(ref[i]), 2);
  }
  return std::isfinite(diff2) ? std::sqrt(diff2 / std::max(ref2, 1e-300)) : INFINITY;
}

}  // namespace

double check_sampled_tokens(Context& ctx, MoE& moe, const TensorView& x, const TensorView& y,
                            int samples, bool verbose, int* routing_mismatches) {
  ctx.synchronize();
  Context cpu(Device::CPU);
  const auto& c = moe.config();
  const int64_t T = x.dim(0), H = c.hidden, k = c.topk;
  double worst = 0;
  *routing_mismatches = 0;
  for (int s = 0; s < samples && T > 0; ++s) {
    const int64_t tok = samples > 1 ? s * (T - 1) / (samples - 1) : 0;
    auto xt = fetch_bytes(x, tok * H, H);
    auto ids = fetch_bytes(moe.expert_ids(), tok * k, k);
    auto w = fetch_bytes(moe.router_weights(), tok * k, k);
    auto dest = fetch_bytes(moe.permute_map().dest_row, tok * k, k);
    const int32_t* gid = reinterpret_cast<const int32_t*>(ids.data());
    const float* gw = reinterpret_cast<const float*>(w.data());
    const bool same = cpu_routing_matches(cpu, moe, xt, gid, gw);
    *routing_mismatches += same ? 0 : 1;
    const std::vector<float> ref =
        cpu_token_output(cpu, moe, xt, gid, gw, reinterpret_cast<const int32_t*>(dest.data()));
    auto yrow = fetch_bytes(y, tok * H, H);
    const double e = row_rel_err(as_floats(yrow, c.dtype, H), ref);
    worst = std::max(worst, e);
    if (verbose) {
      std::printf("  token %6lld  experts", (long long)tok);
      for (int64_t j = 0; j < std::min<int64_t>(k, 8); ++j) std::printf(" %3d", gid[j]);
      std::printf("%s  routing %s  y rel err %.2e\n", k > 8 ? " ..." : "",
                  same ? "equal" : "DIFFERS (near-tie)", e);
    }
  }
  return worst;
}

double moe_block_bytes(const nn::MoEConfig& c) {
  const double T = double(c.max_tokens), H = double(c.hidden), F = double(c.ffn_hidden);
  const double E = double(c.experts), k = double(c.topk), Fs = double(c.shared_ffn_hidden);
  const double R = double(moe_permuted_rows(c.max_tokens, c.topk, c.experts, c.pad_align));
  const double el = dtype_bits(c.dtype) / 8.0, grad = c.accumulate_into_main_grad ? 4.0 : el;
  // routed rows: x and dy permuted, gate_up out and its grad, the activation and its grad, the
  // expert outputs and their grads (the layers' buffers): 4 H + 6 F a row
  const double rows = R * (4 * H + 6 * F) * el;
  // tokens: x, dy, y, dx, the shared expert's activations; logits and their grad, routing
  const double tokens = T * ((4 * H + 5 * Fs) * el + 8 * E + 12 * k);
  // parameters with their grads: experts 3 E H F, shared expert 3 H Fs, router E H
  const double params = (3 * E * H * F + 3 * H * Fs + E * H) * (el + grad);
  return (rows + tokens + params) * 1.2;
}

}  // namespace groupmm::tool
