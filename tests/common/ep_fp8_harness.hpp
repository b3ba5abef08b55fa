// FP8 dispatch test harness shared by the CPU and GPU suites: every rank quantizes its bf16 tokens
// (group_quantize, ep_fp8_dispatch_config, one group), plans (either mode), dispatches them with
// ep_dispatch_fp8 (router weights as probs) and runs the FP8 block GEMM forward on what it
// received, with its local experts' slice of one set of 128x128-quantized weights.
#pragma once

#include "common/ep_harness.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm::test::ep_harness {

// What one rank's FP8 dispatch produced.
struct Fp8RankOut {
  std::vector<uint8_t> data;  // x_grouped.data bytes [rows, H]
  std::vector<float> scales;  // x_grouped.scale_inv [rows, H / 128]
  std::vector<float> probs;   // [rows]
  std::vector<float> gemm;    // [rows, N] bf16 values (empty when N == 0 or rows == 0)
  std::vector<int32_t> splits;
  std::vector<int64_t> sent_bytes;
  int64_t rows = 0;
  uint32_t status = 0;
};

// The weights of every expert, [E, N, H], as fp32 values (quantized per rank from its slice).
struct Fp8Weights {
  int64_t N = 0;
  std::vector<float> w;
};

inline QuantizeConfig fp8_weight_config() {
  QuantizeConfig c = ep::ep_fp8_dispatch_config();
  c.block_2d = true;
  return c;
}

// x [T, H] (T may be 0) quantized with ep_fp8_dispatch_config() as one group, on ctx's device.
inline QuantizedBuffers quantize_tokens(Context& ctx, const Tensor& x, int64_t T, int64_t H) {
  const QuantizeConfig cfg = ep::ep_fp8_dispatch_config();
  QuantizedBuffers b =
      allocate_quantized(group_quantize_shapes(T, H, 1, cfg), ctx.device(), ctx.stream());
  if (T > 0) {
    Tensor splits = upload_ids({int32_t(T)}, {1}, ctx.device(), ctx.stream());
    GroupQuantizeArgs a;
    a.input = x;
    a.splits = splits;
    a.config = cfg;
    a.out = b.view(1, splits, cfg);
    group_quantize(ctx, a);
    ctx.synchronize();  // splits leaves scope
  }
  return b;
}

// Weights [G, N, H] (fp32 values, bf16-representable) quantized in 128x128 blocks on ctx's device.
inline QuantizedBuffers quantize_weights(Context& ctx, const std::vector<float>& w, int64_t G,
                                         int64_t N, int64_t H, Tensor& keep) {
  const QuantizeConfig cfg = fp8_weight_config();
  keep = upload(w, DType::bf16, {G, N, H}, ctx.device(), ctx.stream());
  QuantizedBuffers b =
      allocate_quantized(group_quantize_shapes(G * N, H, G, cfg), ctx.device(), ctx.stream());
  GroupQuantizeArgs a;
  a.input = keep;
  a.config = cfg;
  a.out = b.view(G, TensorView(), cfg);
  group_quantize(ctx, a);
  return b;
}

// The FP8 block GEMM forward y = x_q W_q^T over G groups (out bf16 [rows, N]).
inline std::vector<float> fp8_gemm(Context& ctx, const GroupedTensor& xq, const GroupedTensor& wq,
                                   const TensorView& splits, int64_t rows, int64_t N) {
  Tensor out = Tensor::empty({rows, N}, DType::bf16, ctx.device(), ctx.stream());
  QuantizedGemmArgs g;
  g.pass = GemmPass::forward;
  g.a = xq;
  g.b = wq;
  g.out = out;
  g.splits = splits;
  grouped_gemm(ctx, g);
  return floats_of(out);
}

inline Fp8RankOut run_fp8_rank(Context& ctx, ep::Transport& tr, const EpConfig& cfg,
                               const RankData& rd, const RunOpts& o, const Fp8Weights& wts) {
  const int64_t H = cfg.hidden, k = cfg.topk, El = cfg.experts / cfg.ranks;
  const Device dev = ctx.device();
  cudaStream_t s = ctx.stream();
  Fp8RankOut out;
  Tensor ids = upload_ids(rd.ids, {rd.T, k}, dev, s);
  Tensor x = upload(rd.x, DType::bf16, {rd.T, H}, dev, s);
  Tensor w = upload(rd.w, DType::fp32, {rd.T, k}, dev, s);
  QuantizedBuffers xq = quantize_tokens(ctx, x, rd.T, H);
  const QuantizeConfig qc = ep::ep_fp8_dispatch_config();
  ep::EpPlan plan;
  if (o.mode == EpMode::throughput) {
    plan = ep::ep_dispatch_plan(ctx, tr, cfg, ids);
  } else {
    plan = ep::ep_capacity_plan_create(ctx, tr, cfg, o.cap, rd.T, DType::bf16);
    ep::ep_capacity_plan(ctx, tr, ids, plan);
  }
  QuantizedBuffers xg = allocate_quantized(group_quantize_shapes(plan.rows, H, El, qc), dev, s);
  Tensor probs = Tensor::empty({plan.rows}, DType::fp32, dev, s);
  for (const Tensor* t : {&xg.data, &xg.scale_inv, &probs}) fill_bytes(*t, 0xFF, s);
  GroupedTensor xq_t = xq.view(1, TensorView(), qc);
  xq_t.recipe = QuantRecipe::fp8_block;
  // Without probs first, for the bytes of the rows' exchange (the weights' exchange comes last).
  (void)ep::ep_dispatch_fp8(ctx, tr, plan, xq_t, xg.view(El, TensorView(), qc));
  if (auto* in = dynamic_cast<ep::InProcessTransport*>(&tr)) out.sent_bytes = in->last_sent_bytes();
  for (const Tensor* t : {&xg.data, &xg.scale_inv}) fill_bytes(*t, 0xFF, s);
  const GroupedTensor got =
      ep::ep_dispatch_fp8(ctx, tr, plan, xq_t, xg.view(El, TensorView(), qc), w, probs);
  out.rows = plan.rows;
  out.splits = ints_of(plan.splits);
  out.data = bytes_of(xg.data);
  out.scales = floats_of(xg.scale_inv);
  out.probs = floats_of(probs);
  if (wts.N > 0 && plan.rows > 0) {
    const int64_t N = wts.N, first = int64_t(tr.rank()) * El;
    const std::vector<float> mine(wts.w.begin() + first * N * H,
                                  wts.w.begin() + (first + El) * N * H);
    Tensor keep;
    QuantizedBuffers wq = quantize_weights(ctx, mine, El, N, H, keep);
    out.gemm = fp8_gemm(ctx, got, wq.view(El, TensorView(), fp8_weight_config()), plan.splits,
                        plan.rows, N);
  }
  out.status = ctx.take_status().bits;
  return out;
}

inline std::vector<Fp8RankOut> run_fp8(const EpConfig& cfg, const std::vector<RankData>& d,
                                       const RunOpts& o, const Fp8Weights& wts,
                                       Device dev = Device::CPU) {
  const int R = int(cfg.ranks);
  std::vector<Fp8RankOut> res(static_cast<size_t>(R));
  const GroupStream group_stream(dev);
  const cudaStream_t stream = group_stream.s;
  run_ranks(
      R,
      [&](int r, ep::InProcessTransport& tr) {
        Context ctx(dev, stream);
        res[size_t(r)] = run_fp8_rank(ctx, tr, cfg, d[size_t(r)], o, wts);
      },
      dev, stream);
  return res;
}

}  // namespace groupmm::test::ep_harness
