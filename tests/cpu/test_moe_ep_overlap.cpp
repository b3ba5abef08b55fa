// nn::MoE's chunked expert-parallel step (ep.chunks, the exchanges beside the experts' compute) on
// the CPU backend: R = 1, 2 and 4 ranks as threads over the in-process transport, throughput and
// capacity mode, fp32, bf16 (fp32 main grads, delayed wgrad) and the mxfp8 recipe, 2 and 3 chunks
// (uneven ones too). Bit for bit against the same ranks with chunks = 1 (every output and grad,
// the replicated ones included: each rank computes them the same way) and against the one-rank
// block on the global tokens (y, dx, router weights, every local expert grad). Also: capacity
// overflow with chunks, the chunk count's checks, and the EP ops' chunked step against the
// unchunked one with weights in the combine.
#include <algorithm>
#include <cmath>

#include "common/moe_ep_harness.hpp"

namespace groupmm::test {
namespace {

using namespace moe_ep;

MoEConfig block(DType t) {
  return MoEConfig{.hidden = 16,
                   .ffn_hidden = 8,
                   .experts = 8,
                   .topk = 3,
                   .max_tokens = 1,
                   .renormalize = true,
                   .scaling_factor = 1.25f,
                   .shared_ffn_hidden = 6,
                   .bias = true,
                   .dtype = t,
                   .seed = 23};
}

// The mxfp8 block: bf16, features multiples of 32 (the recipe's block), experts unpadded.
MoEConfig mxfp8_block() {
  MoEConfig c = block(DType::bf16);
  c.hidden = 64;
  c.ffn_hidden = 32;
  c.shared_ffn_hidden = 32;
  c.bias = false;
  c.recipe = nn::quantized_recipe(QuantRecipe::mxfp8);
  return c;
}

// y, dx, router weights and the local experts' grads of every rank against the one-rank block.
void expect_one_rank(const Case& c, const Result& res) {
  const int64_t H = c.cfg.hidden, F = c.cfg.ffn_hidden, El = c.cfg.experts / c.ranks;
  int64_t first = 0;
  for (int r = 0; r < c.ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const StepOut& o = res.rank[size_t(r)];
    const int64_t T = c.tokens[size_t(r)];
    EXPECT_EQ(o.status, 0u);
    EXPECT_TRUE(ep_harness::same_bits(o.y, rows_of(res.one.y, first, T, H))) << "y";
    EXPECT_TRUE(ep_harness::same_bits(o.dx, rows_of(res.one.dx, first, T, H))) << "dx";
    EXPECT_TRUE(ep_harness::same_bits(o.weights, rows_of(res.one.weights, first, T, c.cfg.topk)));
    EXPECT_TRUE(ep_harness::same_bits(o.gu_w, rows_of(res.one.gu_w, r * El, El, 2 * F * H)))
        << "gate_up dW";
    EXPECT_TRUE(ep_harness::same_bits(o.down_w, rows_of(res.one.down_w, r * El, El, H * F)))
        << "down dW";
    if (c.cfg.bias) {
      EXPECT_TRUE(ep_harness::same_bits(o.gu_b, rows_of(res.one.gu_b, r * El, El, 2 * F)))
          << "gate_up db";
      EXPECT_TRUE(ep_harness::same_bits(o.down_b, rows_of(res.one.down_b, r * El, El, H)))
          << "down db";
    }
    first += T;
  }
}

// Every chunk count the case allows (2 and 3, at most E / R) against chunks = 1 and one rank.
void check_chunks(const MoEConfig& cfg, int R, ep::EpMode mode, uint64_t seed) {
  Case c{cfg, R, mode, ep::EpCapacity{}, {}};
  for (int r = 0; r < R; ++r) c.tokens.push_back(r == 1 ? 0 : 5 + 3 * r);  // an empty rank (R>1)
  int64_t tmax = 1;
  for (int64_t t : c.tokens) tmax = std::max(tmax, t);
  c.cap = ep::EpCapacity{tmax, 0};  // no chunk overflows
  const Result base = run_case(c, Device::CPU, seed);
  for (int64_t n : {2, 3}) {
    if (n > cfg.experts / R) continue;
    SCOPED_TRACE(cfg.to_string() + " R=" + std::to_string(R) + " " + ep::ep_mode_name(mode) +
                 " chunks=" + std::to_string(n));
    Case cc = c;
    cc.chunks = n;
    const Result res = run_case(cc, Device::CPU, seed);
    for (int r = 0; r < R; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " against chunks=1");
      expect_same_step(res.rank[size_t(r)], base.rank[size_t(r)]);
    }
    expect_one_rank(cc, res);
  }
}

TEST(MoeEpOverlapCpu, Fp32ChunksMatchUnchunkedAndOneRank) {
  for (int R : {1, 2, 4})
    for (ep::EpMode mode : {ep::EpMode::throughput, ep::EpMode::capacity})
      check_chunks(block(DType::fp32), R, mode,
                   seed_for("moe_ep_overlap") + uint64_t(R * 3 + int(mode)));
}

TEST(MoeEpOverlapCpu, Bf16MainGradDelayedWgradChunksMatch) {
  MoEConfig cfg = block(DType::bf16);
  cfg.delay_wgrad = true;
  cfg.accumulate_into_main_grad = true;
  cfg.score = RouterScore::sigmoid;
  for (int R : {1, 2, 4})
    for (ep::EpMode mode : {ep::EpMode::throughput, ep::EpMode::capacity})
      check_chunks(cfg, R, mode, seed_for("moe_ep_overlap_bf16") + uint64_t(R * 3 + int(mode)));
}

TEST(MoeEpOverlapCpu, Mxfp8ChunksMatch) {
  for (int R : {1, 2, 4})
    for (ep::EpMode mode : {ep::EpMode::throughput, ep::EpMode::capacity})
      check_chunks(mxfp8_block(), R, mode,
                   seed_for("moe_ep_overlap_mxfp8") + uint64_t(R * 3 + int(mode)));
}

TEST(MoeEpOverlapCpu, CapacityOverflowWithChunksIsReportedAndFinite) {
  // One row a peer and chunk: every rank with tokens overflows in some chunk; the step completes
  // (dropped slots contribute nothing) and reports kFaultEpCapacity.
  for (int R : {1, 2}) {
    Case c{block(DType::fp32), R, ep::EpMode::capacity, ep::EpCapacity{1, 0}, {}};
    c.chunks = 2;
    for (int r = 0; r < R; ++r) c.tokens.push_back(6);
    const Result res = run_case(c, Device::CPU, seed_for("moe_ep_overlap_over") + uint64_t(R));
    for (int r = 0; r < R; ++r) {
      SCOPED_TRACE("R=" + std::to_string(R) + " rank " + std::to_string(r));
      EXPECT_EQ(res.rank[size_t(r)].status, uint32_t(kFaultEpCapacity));
      for (const auto* v : {&res.rank[size_t(r)].y, &res.rank[size_t(r)].dx})
        EXPECT_TRUE(std::all_of(v->begin(), v->end(), [](float f) { return std::isfinite(f); }));
    }
  }
}

TEST(MoeEpOverlapCpu, ChunkCountChecks) {
  run_ranks(4, [&](int, ep::InProcessTransport& tr) {
    Context ctx(Device::CPU);
    MoEConfig c = block(DType::fp32);
    c.max_tokens = 4;
    c.ep.transport = &tr;
    MoEConfig bad = c;
    bad.ep.chunks = 3;  // E / R = 2 local experts
    EXPECT_THROW_MSG(MoE(ctx, bad), "MoE: ep.chunks=3 must be in [1, E / R=2]");
    bad.ep.chunks = 0;
    EXPECT_THROW_MSG(MoE(ctx, bad), "MoE: ep.chunks=0 must be in [1, E / R=2]");
    bad = c;
    bad.ep.exchange_sms = 8;  // one chunk: nothing runs beside the GEMMs
    EXPECT_THROW_MSG(MoE(ctx, bad), "MoE: ep.exchange_sms=8 needs ep.chunks > 1");
    bad.ep.chunks = 2;
    bad.ep.exchange_sms = -1;
    EXPECT_THROW_MSG(MoE(ctx, bad), "MoE: ep.exchange_sms=-1 must be in [0, ");
    MoE m(ctx, [&] {
      MoEConfig ok = c;
      ok.ep.chunks = 2;
      ok.ep.exchange_sms = 16;  // the CPU backend ignores it
      return ok;
    }());
    EXPECT_EQ(m.gate_up().weight().dim(0), 2);
    EXPECT_NE(m.config().ep.to_string().find("exchange_sms=16"), std::string::npos);
  });
  Context ctx(Device::CPU);
  MoEConfig c = block(DType::fp32);
  c.max_tokens = 4;
  c.ep.chunks = 2;
  EXPECT_THROW_MSG(MoE(ctx, c), "MoE: ep.chunks=2 needs expert parallelism");
  EXPECT_THROW_MSG(ctx.set_gemm_sm_limit(-3), "Context::set_gemm_sm_limit: sms=-3 must be >= 0");
}

// ---- the EP ops' chunked step, weights in the combine (not nn::MoE's convention) --------------

struct OpsOut {
  std::vector<float> y, dx, d_weights;
};

// A step of the EP ops on one rank, unchunked (n = 0) or in n chunks: dispatch, the toy expert
// (row * s_e on the host), combine with weights, combine backward (unweighted) and dispatch
// backward with d_probs (the toy expert's: 0.5 per row), in fp32.
OpsOut ops_step(Context& ctx, ep::Transport& tr, const ep::EpConfig& cfg, ep::EpMode mode,
                const ep_harness::RankData& rd, int64_t n) {
  using ep_harness::upload;
  const int64_t H = cfg.hidden, k = cfg.topk, El = cfg.experts / cfg.ranks, T = rd.T;
  const DType f = DType::fp32;
  Tensor ids = ep_harness::upload_ids(rd.ids, {T, k}, Device::CPU, nullptr);
  Tensor x = upload(rd.x, f, {T, H}, Device::CPU, nullptr);
  Tensor w = upload(rd.w, f, {T, k}, Device::CPU, nullptr);
  Tensor dy = upload(rd.dy, f, {T, H}, Device::CPU, nullptr);
  Tensor y = Tensor::empty({T, H}, f, Device::CPU), dx = Tensor::empty({T, H}, f, Device::CPU);
  Tensor dw = Tensor::empty({T, k}, f, Device::CPU);
  const ep::EpCapacity cap{32, 0};  // every rank the same; more than any rank's tokens
  // The toy expert over a grouped buffer whose local expert i is `first + i`.
  const auto expert = [&](const TensorView& in, const TensorView& splits, int64_t first) {
    Tensor out = Tensor::empty({in.dim(0), H}, f, Device::CPU);
    fill_bytes(out, 0, nullptr);
    int64_t g = 0;
    for (int64_t i = 0; i < splits.numel(); ++i)
      for (int32_t r = 0; r < splits.ptr<int32_t>()[i]; ++r, ++g)
        for (int64_t h = 0; h < H; ++h)
          out.ptr<float>()[g * H + h] =
              in.ptr<float>()[g * H + h] * ep_harness::expert_scale(tr.rank() * El + first + i);
    return out;
  };
  const auto halves = [&](int64_t rows) {
    Tensor v = Tensor::empty({rows}, f, Device::CPU);
    std::fill(v.ptr<float>(), v.ptr<float>() + rows, 0.5f);
    return v;
  };
  if (n == 0) {
    ep::EpPlan p = mode == ep::EpMode::throughput
                       ? ep::ep_dispatch_plan(ctx, tr, cfg, ids)
                       : ep::ep_capacity_plan_create(ctx, tr, cfg, cap, T, f);
    if (mode == ep::EpMode::capacity) ep::ep_capacity_plan(ctx, tr, ids, p);
    Tensor xg = Tensor::empty({p.rows, H}, f, Device::CPU);
    ep::ep_dispatch(ctx, tr, p, x, xg);
    Tensor yg = expert(xg, p.entry_splits(), 0);
    ep::ep_combine(ctx, tr, p, yg, w, y);
    Tensor dyg = Tensor::empty({p.rows, H}, f, Device::CPU);
    ep::ep_combine_backward(ctx, tr, p, dy, TensorView(), TensorView(), dyg, TensorView());
    Tensor dxg = expert(dyg, p.entry_splits(), 0);
    ep::ep_dispatch_backward(ctx, tr, p, dxg, dx, halves(p.rows), dw);
  } else {
    ep::EpChunkedPlan cp = mode == ep::EpMode::throughput
                               ? ep::ep_dispatch_plan_chunked(ctx, tr, cfg, ids, n, f)
                               : ep::ep_capacity_plan_chunked_create(ctx, tr, cfg, cap, n, T, f);
    if (mode == ep::EpMode::capacity) ep::ep_capacity_plan_chunked(ctx, tr, ids, cp);
    std::vector<Tensor> keep;
    for (int64_t c = 0; c < n; ++c) {
      Tensor xg = Tensor::empty({cp.rows_of(c), H}, f, Device::CPU);
      ep::ep_dispatch(ctx, tr, cp.plans[size_t(c)], x, xg);
      keep.push_back(expert(xg, cp.entry_splits(c), cp.first_local[size_t(c)]));
      ep::ep_combine_chunk(ctx, tr, cp, c, keep.back());
    }
    ep::ep_combine_finish(ctx, cp, w, y);
    for (int64_t c = 0; c < n; ++c) {
      Tensor dyg = Tensor::empty({cp.rows_of(c), H}, f, Device::CPU);
      ep::ep_combine_backward(ctx, tr, cp.plans[size_t(c)], dy, TensorView(), TensorView(), dyg,
                              TensorView());
      Tensor dxg = expert(dyg, cp.entry_splits(c), cp.first_local[size_t(c)]);
      ep::ep_dispatch_backward_chunk(ctx, tr, cp, c, dxg, halves(cp.rows_of(c)));
    }
    ep::ep_dispatch_backward_finish(ctx, cp, dx, dw);
  }
  return {floats_of(y), floats_of(dx), floats_of(dw)};
}

TEST(MoeEpOverlapCpu, EpOpsChunkedStepMatchesUnchunked) {
  for (int R : {1, 2, 4})
    for (ep::EpMode mode : {ep::EpMode::throughput, ep::EpMode::capacity})
      for (int64_t n : {2, 3}) {
        const ep::EpConfig cfg{12, R, 8, 4};
        if (n > cfg.experts / R) continue;
        SCOPED_TRACE(cfg.to_string() + " " + ep::ep_mode_name(mode) +
                     " chunks=" + std::to_string(n));
        std::mt19937_64 g(seed_for("ep_ops_chunks") + uint64_t(R * 7 + n));
        const auto d = ep_harness::make_case(cfg, DType::fp32, ep_harness::Routing::mixed, g);
        std::vector<OpsOut> base(static_cast<size_t>(R)), got(static_cast<size_t>(R));
        run_ranks(R, [&](int r, ep::InProcessTransport& tr) {
          Context ctx(Device::CPU);
          base[size_t(r)] = ops_step(ctx, tr, cfg, mode, d[size_t(r)], 0);
          got[size_t(r)] = ops_step(ctx, tr, cfg, mode, d[size_t(r)], n);
          EXPECT_EQ(ctx.take_status().bits, 0u);
        });
        for (int r = 0; r < R; ++r) {
          SCOPED_TRACE("rank " + std::to_string(r));
          EXPECT_TRUE(ep_harness::same_bits(got[size_t(r)].y, base[size_t(r)].y)) << "y";
          EXPECT_TRUE(ep_harness::same_bits(got[size_t(r)].dx, base[size_t(r)].dx)) << "dx";
          EXPECT_TRUE(ep_harness::same_bits(got[size_t(r)].d_weights, base[size_t(r)].d_weights))
              << "d_weights";
        }
      }
}

TEST(MoeEpOverlapCpu, EpOpsChunkChecks) {
  run_ranks(2, [&](int, ep::InProcessTransport& tr) {
    Context ctx(Device::CPU);
    const ep::EpConfig cfg{8, 2, 8, 2};
    Tensor ids = Tensor::empty({3, 2}, DType::int32, Device::CPU);
    std::fill(ids.ptr<int32_t>(), ids.ptr<int32_t>() + 6, 1);
    EXPECT_THROW_MSG(ep::ep_dispatch_plan_chunked(ctx, tr, cfg, ids, 5, DType::fp32),
                     "ep_dispatch_plan_chunked: chunks=5 must be in [1, E / R=4]");
    EXPECT_THROW_MSG(ep::ep_capacity_plan_chunked_create(ctx, tr, cfg, {2, 0}, 0, 3, DType::fp32),
                     "ep_capacity_plan_chunked_create: chunks=0 must be in [1, E / R=4]");
    ep::EpChunkedPlan cp = ep::ep_dispatch_plan_chunked(ctx, tr, cfg, ids, 2, DType::fp32);
    Tensor yg = Tensor::empty({cp.rows_of(0), 8}, DType::fp32, Device::CPU);
    EXPECT_THROW_MSG(ep::ep_combine_chunk(ctx, tr, cp, 2, yg),
                     "ep_combine_chunk: chunk=2 must be in [0, chunks=2)");
  });
}

}  // namespace
}  // namespace groupmm::test
