// `groupmm demo moe`: the whole MoE block (router, permute, expert MLP, unpermute, optional shared
// expert) forward + backward: routing summary, per-stage table, one-CUDA-graph step time, and
// sampled tokens checked against the CPU reference ops. GPU: Qwen3-30B-A3B sized; CPU: scaled down.
// Also the stage timer and the sampled-token check that `bench moe` shares.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "groupmm/gemm.hpp"
#include "groupmm/random.hpp"
#include "moe_tools.hpp"

namespace groupmm::tool {

using nn::MoE;
using nn::MoEStage;

namespace {

constexpr int kStages = 7;

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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// n elements of v starting at element `first`, as host bytes.
std::vector<uint8_t> fetch(const TensorView& v, int64_t first, int64_t n) {
  const int64_t esz = dtype_bits(v.dtype) / 8;
  std::vector<uint8_t> h(size_t(n * esz));
  copy(TensorView(h.data(), DType::e8m0, Device::CPU, {n * esz}),
       TensorView(static_cast<char*>(v.data) + first * esz, DType::e8m0, v.device, {n * esz}));
  return h;
}

TensorView host(std::vector<uint8_t>& b, DType t, std::initializer_list<int64_t> dims) {
  return TensorView(b.data(), t, Device::CPU, dims);
}

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

// One dense SwiGLU MLP row on the CPU: x [1, H] -> gate_up (+ b) -> (weighted) swiglu -> down
// (+ b), from layer `up` / `down` expert g. Returns the [1, H] output in dtype bytes.
std::vector<uint8_t> mlp_row(Context& cpu, nn::GroupedLinear& up, nn::GroupedLinear& down,
                             int64_t g, std::vector<uint8_t>& xt, float prob, bool weighted) {
  const auto& uc = up.config();
  const int64_t H = uc.in_features, F2 = uc.out_features, F = F2 / 2;
  const DType t = uc.dtype;
  const int64_t esz = dtype_bits(t) / 8;
  auto w1 = fetch(up.weight(), g * F2 * H, F2 * H), w2 = fetch(down.weight(), g * H * F, H * F);
  std::vector<uint8_t> b1, b2, gu(size_t(F2 * esz)), h(size_t(F * esz)), y(size_t(H * esz));
  TensorView B1, B2;
  if (uc.bias) {
    b1 = fetch(up.bias(), g * F2, F2);
    b2 = fetch(down.bias(), g * H, H);
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
  const size_t per = 1 + 2 * kStages;
  Marks marks(ctx, per);
  std::vector<std::pair<int, bool>> order;  // (stage, backward) after mark i + 1
  size_t next = 0;
  moe.set_stage_hook([&](MoEStage s, bool bwd) {
    order.push_back({int(s), bwd});
    marks.mark(++next);
  });
  std::vector<double> fwd[kStages], bwd[kStages], total;
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
  for (int s = 0; s < kStages; ++s) {
    st.fwd[s] = median(fwd[s]);
    st.bwd[s] = median(bwd[s]);
  }
  st.total_us = median(total);
  return st;
}

double check_sampled_tokens(Context& ctx, MoE& moe, const TensorView& x, const TensorView& y,
                            int samples, bool verbose, int* routing_mismatches) {
  ctx.synchronize();
  Context cpu(Device::CPU);
  const auto& c = moe.config();
  const int64_t T = x.dim(0), H = c.hidden, E = c.experts, k = c.topk;
  const DType t = c.dtype;
  auto wr = fetch(moe.router_weight(), 0, E * H);
  std::vector<uint8_t> bias;
  if (c.expert_bias) bias = fetch(moe.expert_bias(), 0, E);
  RouterConfig rc = c.router_config();
  rc.aux_loss_coeff = rc.z_loss_coeff = 0;  // per-token check: the losses need every token
  double worst = 0;
  *routing_mismatches = 0;
  for (int s = 0; s < samples && T > 0; ++s) {
    const int64_t tok = samples > 1 ? s * (T - 1) / (samples - 1) : 0;
    auto xt = fetch(x, tok * H, H);
    auto ids = fetch(moe.expert_ids(), tok * k, k), w = fetch(moe.router_weights(), tok * k, k);
    auto dest = fetch(moe.permute_map().dest_row, tok * k, k);
    // the router on the CPU
    std::vector<float> logits(static_cast<size_t>(E)), cw(static_cast<size_t>(k));
    std::vector<int32_t> cids(static_cast<size_t>(k)), counts(static_cast<size_t>(E));
    moe_router_logits(cpu, host(xt, t, {1, H}), host(wr, t, {E, H}),
                      TensorView(logits.data(), DType::fp32, Device::CPU, {1, E}));
    RouterArgs ra;
    ra.logits = TensorView(logits.data(), DType::fp32, Device::CPU, {1, E});
    if (c.expert_bias) ra.expert_bias = host(bias, DType::fp32, {E});
    ra.expert_ids = TensorView(cids.data(), DType::int32, Device::CPU, {1, k});
    ra.weights = TensorView(cw.data(), DType::fp32, Device::CPU, {1, k});
    ra.counts = TensorView(counts.data(), DType::int32, Device::CPU, {E});
    moe_router_forward(cpu, rc, ra);
    const int32_t* gid = reinterpret_cast<const int32_t*>(ids.data());
    const float* gw = reinterpret_cast<const float*>(w.data());
    bool same = std::equal(cids.begin(), cids.end(), gid);
    for (int64_t j = 0; same && j < k; ++j)
      same = std::fabs(cw[size_t(j)] - gw[j]) <= 1e-4f * std::fabs(gw[j]) + 1e-6f;
    *routing_mismatches += same ? 0 : 1;
    // the experts (with the GPU's routing) and the shared expert, summed like the combine
    std::vector<float> acc(size_t(H), 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      if (reinterpret_cast<const int32_t*>(dest.data())[j] < 0) continue;  // dropped
      auto yp = mlp_row(cpu, moe.gate_up(), moe.down(), gid[j], xt, gw[j], true);
      const auto f = as_floats(yp, t, H);
      for (int64_t i = 0; i < H; ++i) acc[size_t(i)] += f[size_t(i)];
    }
    if (moe.has_shared_expert()) {
      auto sy = mlp_row(cpu, moe.shared_gate_up(), moe.shared_down(), 0, xt, 1.0f, false);
      const auto f = as_floats(sy, t, H);
      for (int64_t i = 0; i < H; ++i) acc[size_t(i)] += f[size_t(i)];
    }
    for (float& v : acc)  // the combine rounds its fp32 sum once to the output dtype
      v = t == DType::bf16 ? bf16_bits_to_float(float_to_bf16_bits(v))
                           : (t == DType::fp16 ? fp16_bits_to_float(float_to_fp16_bits(v)) : v);
    auto yrow = fetch(y, tok * H, H);
    const std::vector<float> got = as_floats(yrow, t, H);
    double diff2 = 0, ref2 = 0;  // ||got - ref|| / ||ref||; a NaN makes it NaN, which fails
    for (int64_t i = 0; i < H; ++i) {
      diff2 += std::pow(double(got[size_t(i)]) - acc[size_t(i)], 2);
      ref2 += std::pow(double(acc[size_t(i)]), 2);
    }
    const double e = std::isfinite(diff2) ? std::sqrt(diff2 / std::max(ref2, 1e-300)) : INFINITY;
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

int run_demo_moe(const MoeDemoOptions& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const Device dev = o.cpu ? Device::CPU : default_device();
  const bool gpu = dev == Device::CUDA;
  nn::MoEConfig c;
  c.experts = o.experts > 0 ? o.experts : (gpu ? 128 : 16);
  c.hidden = o.hidden > 0 ? o.hidden : (gpu ? 2048 : 128);
  c.ffn_hidden = o.ffn_hidden > 0 ? o.ffn_hidden : (gpu ? 768 : 64);
  c.topk = o.topk > 0 ? o.topk : (gpu ? 8 : 4);
  c.max_tokens = o.tokens > 0 ? o.tokens : (gpu ? 16384 : 256);
  c.shared_ffn_hidden = o.shared_ffn_hidden;
  c.renormalize = true;  // Qwen3's norm_topk_prob
  c.aux_loss_coeff = 0.001f;
  c.seed = 1;
  const int iters = o.iters > 0 ? o.iters : (gpu ? 10 : 1);
  const int64_t T = c.max_tokens, H = c.hidden;
  std::printf(
      "groupmm demo moe: the MoE block (router -> permute -> gate_up -> weighted SwiGLU -> "
      "down -> unpermute%s), forward + backward\n",
      c.shared_ffn_hidden > 0 ? " + shared expert" : "");
  std::printf("  ran on: %s\n", gpu ? "GPU (CUDA backend), Qwen3-30B-A3B-sized block"
                                    : "CPU reference backend, scaled-down block");
  std::printf(
      "  block: T=%lld tokens, H=%lld, expert F=%lld, E=%lld experts, top-%lld, softmax "
      "router with renormalized weights, aux loss coeff %.3g, bf16\n",
      (long long)T, (long long)H, (long long)c.ffn_hidden, (long long)c.experts, (long long)c.topk,
      double(c.aux_loss_coeff));
  cudaStream_t stream = nullptr;
  if (gpu) GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int rc = 0;
  {
    Context ctx(dev, stream);
    MoE moe(ctx, c);
    const BlockInputs in = block_inputs(ctx, T, H, 21);
    const Tensor &x = in.x, &dy = in.dy;

    const StageTimes st = time_stages(ctx, moe, x, dy, gpu ? 2 : 0, iters);
    ctx.check();
    std::vector<uint8_t> cb = fetch(moe.counts(), 0, c.experts), aux = fetch(moe.aux_loss(), 0, 1);
    std::vector<int32_t> counts(reinterpret_cast<int32_t*>(cb.data()),
                                reinterpret_cast<int32_t*>(cb.data()) + c.experts);
    std::sort(counts.begin(), counts.end());
    const double mean = double(T * c.topk) / double(c.experts);
    std::printf(
        "\nrouting: rows per expert min %d, median %d, max %d (max/mean %.2f), %lld empty; "
        "aux loss %.5f\n",
        counts.front(), counts[counts.size() / 2], counts.back(), counts.back() / mean,
        (long long)std::count(counts.begin(), counts.end(), 0),
        double(as_floats(aux, DType::fp32, 1)[0]));

    std::printf("\nper-stage times (%s, median of %d steps):\n",
                gpu ? "CUDA events, eager" : "wall clock", iters);
    std::printf("  %-16s %12s %12s %8s\n", "stage", "forward us", "backward us", "share");
    for (int s = 0; s < kStages; ++s) {
      if (st.fwd[s] == 0 && st.bwd[s] == 0) continue;
      std::printf("  %-16s %12.1f %12.1f %7.1f%%\n", nn::moe_stage_name(MoEStage(s)), st.fwd[s],
                  st.bwd[s], 100 * (st.fwd[s] + st.bwd[s]) / st.total_us);
    }
    std::printf("  %-16s %25.1f\n", "whole step", st.total_us);
    if (gpu) {
      const double us = graph_replay_us(ctx, iters, [&] {
        moe.forward(ctx, x);
        moe.backward(ctx, dy);
      });
      std::printf("  %-16s %25.1f  (forward + backward as one CUDA graph)\n", "graph step", us);
      ctx.check();
    }

    const TensorView y = moe.forward(ctx, x);
    std::printf(
        "\ncheck of %d sampled tokens against the CPU reference ops (router, gate_up, "
        "weighted SwiGLU, down, combine):\n",
        o.samples);
    int mism = 0;
    const double worst = check_sampled_tokens(ctx, moe, x, y, o.samples, true, &mism);
    const bool ok = worst <= 1e-2;
    std::printf(
        "  worst y rel err %.2e (tolerance 1e-2, bf16 with fp32 accumulation): %s; "
        "routing differs on %d of %d tokens\n",
        worst, ok ? "PASS" : "FAIL", mism, o.samples);
    rc = ok ? 0 : 1;
  }
  if (stream) cudaStreamDestroy(stream);
  std::printf("\ndemo moe %s on the %s in %.1f s\n", rc == 0 ? "passed" : "FAILED",
              gpu ? "GPU" : "CPU reference backend",
              std::chrono::duration<double>(clock::now() - t0).count());
  return rc;
}

}  // namespace groupmm::tool
