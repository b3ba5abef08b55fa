// Expert-parallel test harness shared by the CPU and GPU suites: R simulated ranks as threads over
// an in-process group (host or device buffers), routing cases with the corner cases, and one EP
// layer step forward and backward with a toy expert (row * s_e) computed on the host between ops.
#pragma once

#include "common/test_util.hpp"
#include "ep/backends.hpp"  // ep::detail::ep_dispatch_plan_host
#include "groupmm/ep.hpp"

namespace groupmm::test::ep_harness {

using ep::EpCapacity;
using ep::EpConfig;
using ep::EpMode;

// Bit-for-bit equality of two float vectors (memcmp is not called on empty ones: their data()
// may be null).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Runs fn(rank, transport) on R threads (ep::run_in_process_group: a rank that throws releases
// the others, and its error is rethrown naming it). A device group runs on `stream`.
template <class Fn>
void run_ranks(int R, Fn fn, Device dev = Device::CPU, cudaStream_t stream = nullptr) {
  ep::run_in_process_group("run_ranks", R, dev, stream,
                           [&](ep::InProcessTransport& tr) { fn(tr.rank(), tr); });
}

// Rounds to dt and back.
inline float round_to(DType dt, float v) {
  switch (dt) {
    case DType::bf16:
      return bf16_bits_to_float(float_to_bf16_bits(v));
    case DType::fp16:
      return fp16_bits_to_float(float_to_fp16_bits(v));
    default:
      return v;
  }
}

// One rank's inputs (x and dy already representable in the row dtype).
struct RankData {
  int64_t T = 0;
  std::vector<float> x, dy, w;
  std::vector<int32_t> ids;
};

enum class Routing {
  mixed,       // random; tokens whose k experts all live on one rank; rank 0 has no tokens and
               // (R >= 2) the last rank's experts are never chosen (it receives nothing); the last
               // expert is never chosen; some tokens name one expert twice
  one_expert,  // every token's every slot names expert E - 1 (one rank receives everything)
};

inline std::vector<RankData> make_case(const EpConfig& cfg, DType dt, Routing routing,
                                       std::mt19937_64& g, int64_t max_tokens = 9) {
  const int64_t R = cfg.ranks, E = cfg.experts, k = cfg.topk, H = cfg.hidden, El = E / R;
  const int64_t usable = R >= 2 ? E - El : std::max<int64_t>(E - 1, 1);
  std::vector<RankData> d(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    RankData& rd = d[size_t(r)];
    rd.T = r == 0 && R > 1 ? 0 : int64_t(g() % uint64_t(max_tokens)) + 1 + 3 * r;
    rd.x = randn(size_t(rd.T * H), 1.0f, g);
    rd.dy = randn(size_t(rd.T * H), 1.0f, g);
    for (float& v : rd.x) v = round_to(dt, v);
    for (float& v : rd.dy) v = round_to(dt, v);
    rd.w = randn(size_t(rd.T * k), 1.0f, g);
    for (int64_t t = 0; t < rd.T; ++t) {
      const bool one_rank = t % 3 == 0 && El >= k;
      const bool twice = t % 4 == 1 && k >= 2;
      const int64_t base = int64_t(g() % uint64_t(std::max<int64_t>(usable / El, 1))) * El;
      for (int64_t j = 0; j < k; ++j) {
        int64_t e = one_rank ? base + (j + int64_t(g() % 2)) % El : int64_t(g() % uint64_t(usable));
        if (twice && j == 1) e = rd.ids[size_t(t * k)];
        if (routing == Routing::one_expert) e = E - 1;
        rd.ids.push_back(int32_t(routing == Routing::one_expert ? e : std::min(e, usable - 1)));
      }
    }
  }
  return d;
}

inline float expert_scale(int64_t e) {
  return 0.5f + 0.25f * float(e);
}

// What one rank's step produced, as fp32 values.
struct RankOut {
  std::vector<float> x_grouped, out, d_y_grouped, d_weights, dx;
  std::vector<float> probs;  // RunOpts::probs only
  std::vector<int32_t> splits;
  std::vector<int64_t> sent_bytes;  // of the dispatch's exchange
  int64_t stage_bytes = 0;          // capacity mode: the plan's row staging, each side
  int64_t rows = 0;
  int64_t entries = 0;  // the grouped rows holding entries (sum of plan.entry_splits())
  uint32_t status = 0;
};

struct RunOpts {
  DType dt = DType::fp32;
  EpMode mode = EpMode::throughput;
  EpCapacity cap;
  bool identity = false;  // the expert is the identity (yg = xg, d_xg = d_yg): no host step
  // The one-rank block's convention: the router weights travel with the dispatch (probs) and
  // enter the expert (y = x s_e p), the combine and its backward are unweighted, d_probs go home
  // through the dispatch backward.
  bool probs = false;
  // Throughput mode: the plan built by the host code (ep::detail::ep_dispatch_plan_host, the CPU
  // backend's) whatever the device; a CUDA Context otherwise builds it with kernels.
  bool host_plan = false;
};

inline Tensor upload(const std::vector<float>& v, DType dt, std::initializer_list<int64_t> dims,
                     Device dev, cudaStream_t s) {
  Tensor t = Tensor::empty(dims, dt, dev, s);
  Tensor h = Tensor::empty(dims, dt, Device::CPU);
  for (size_t i = 0; i < v.size(); ++i) cpu::store_f(h, int64_t(i), v[i]);
  copy(t, h, s);
  if (dev == Device::CUDA) GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
  return t;
}

inline Tensor upload_ids(std::vector<int32_t> v, std::initializer_list<int64_t> dims, Device dev,
                         cudaStream_t s) {
  Tensor t = Tensor::empty(dims, DType::int32, dev, s);
  if (!v.empty()) copy(t, TensorView(v.data(), DType::int32, Device::CPU, dims), s);
  if (dev == Device::CUDA) GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
  return t;
}

inline std::vector<int32_t> ints_of(const TensorView& v) {
  std::vector<int32_t> h(static_cast<size_t>(v.numel()));
  if (!h.empty()) copy(TensorView(h.data(), DType::int32, Device::CPU, {v.numel()}), v);
  return h;
}

// The toy expert on the host: row g of local expert le (by splits) times s_(first + le), rounded
// to dt. Tail rows (counted in the last split) are zero and stay zero.
inline std::vector<float> apply_experts(const std::vector<float>& rows,
                                        const std::vector<int32_t>& splits, int64_t first,
                                        int64_t H, DType dt,
                                        const std::vector<float>* probs = nullptr) {
  std::vector<float> out(rows.size());
  int64_t g = 0;
  for (size_t le = 0; le < splits.size(); ++le)
    for (int32_t i = 0; i < splits[le]; ++i, ++g) {
      const float s = expert_scale(first + int64_t(le));
      for (int64_t h = 0; h < H; ++h) {
        const float v = rows[size_t(g * H + h)] * s;
        out[size_t(g * H + h)] = round_to(dt, probs ? v * (*probs)[size_t(g)] : v);
      }
    }
  return out;
}

// d prob of the toy expert y = x s_e p: sum_h dy[g, h] * x[g, h] * s_e in fp32, h order.
inline std::vector<float> expert_d_probs(const std::vector<float>& dy, const std::vector<float>& x,
                                         const std::vector<int32_t>& splits, int64_t first,
                                         int64_t H) {
  std::vector<float> out;
  int64_t g = 0;
  for (size_t le = 0; le < splits.size(); ++le)
    for (int32_t i = 0; i < splits[le]; ++i, ++g) {
      float acc = 0.0f;
      for (int64_t h = 0; h < H; ++h) {
        const float v =
            dy[size_t(g * H + h)] * x[size_t(g * H + h)] * expert_scale(first + int64_t(le));
        acc += v;
      }
      out.push_back(acc);
    }
  return out;
}

// One rank's EP layer step: plan, dispatch, expert, combine, combine backward, expert backward,
// dispatch backward, on ctx's device and stream. Outputs are poisoned (NaN) before each op.
inline RankOut run_rank(Context& ctx, ep::Transport& tr, const EpConfig& cfg, const RankData& rd,
                        const RunOpts& o) {
  const int64_t H = cfg.hidden, k = cfg.topk, El = cfg.experts / cfg.ranks;
  const Device dev = ctx.device();
  cudaStream_t stream = ctx.stream();
  RankOut out;
  Tensor ids = upload_ids(rd.ids, {rd.T, k}, dev, stream);
  Tensor x = upload(rd.x, o.dt, {rd.T, H}, dev, stream);
  Tensor w = upload(rd.w, DType::fp32, {rd.T, k}, dev, stream);
  Tensor dy = upload(rd.dy, o.dt, {rd.T, H}, dev, stream);
  ep::EpPlan plan;
  if (o.mode == EpMode::throughput) {
    plan = o.host_plan ? ep::detail::ep_dispatch_plan_host(ctx, tr, cfg, ids)
                       : ep::ep_dispatch_plan(ctx, tr, cfg, ids);
  } else {
    plan = ep::ep_capacity_plan_create(ctx, tr, cfg, o.cap, rd.T, o.dt);
    ep::ep_capacity_plan(ctx, tr, ids, plan);
  }
  const auto fresh = [&](std::initializer_list<int64_t> dims, DType t) {
    Tensor v = Tensor::empty(dims, t, dev, stream);
    fill_bytes(v, 0xFF, stream);
    return v;
  };
  Tensor xg = fresh({plan.rows, H}, o.dt), probs = fresh({plan.rows}, DType::fp32);
  const TensorView none;
  ep::ep_dispatch(ctx, tr, plan, x, xg, o.probs ? w.view() : none, o.probs ? probs.view() : none);
  if (auto* in = dynamic_cast<ep::InProcessTransport*>(&tr)) out.sent_bytes = in->last_sent_bytes();
  out.stage_bytes = plan.stage_send.view().present() ? plan.stage_send.nbytes() : 0;
  out.rows = plan.rows;
  out.splits = ints_of(plan.splits);
  for (int32_t v : ints_of(plan.entry_splits())) out.entries += v;
  out.x_grouped = floats_of(xg);
  if (o.probs) out.probs = floats_of(probs);
  const std::vector<float>* p = o.probs ? &out.probs : nullptr;
  const int64_t first = int64_t(tr.rank()) * El;
  Tensor yg = o.identity ? std::move(xg)
                         : upload(apply_experts(out.x_grouped, out.splits, first, H, o.dt, p), o.dt,
                                  {plan.rows, H}, dev, stream);
  Tensor y = fresh({rd.T, H}, o.dt);
  ep::ep_combine(ctx, tr, plan, yg, o.probs ? none : w.view(), y);
  out.out = floats_of(y);
  Tensor dyg = fresh({plan.rows, H}, o.dt), dw = fresh({rd.T, k}, DType::fp32);
  if (o.probs)
    ep::ep_combine_backward(ctx, tr, plan, dy, none, none, dyg, none);
  else
    ep::ep_combine_backward(ctx, tr, plan, dy, w, yg, dyg, dw);
  out.d_y_grouped = floats_of(dyg);
  Tensor dxg = o.identity ? std::move(dyg)
                          : upload(apply_experts(out.d_y_grouped, out.splits, first, H, o.dt, p),
                                   o.dt, {plan.rows, H}, dev, stream);
  Tensor dx = fresh({rd.T, H}, o.dt);
  if (o.probs) {
    std::vector<float> dp = expert_d_probs(out.d_y_grouped, out.x_grouped, out.splits, first, H);
    dp.resize(size_t(plan.rows), 0.0f);  // capacity mode's tail rows
    Tensor d_probs = upload(dp, DType::fp32, {plan.rows}, dev, stream);
    ep::ep_dispatch_backward(ctx, tr, plan, dxg, dx, d_probs, dw);
  } else {
    ep::ep_dispatch_backward(ctx, tr, plan, dxg, dx);
  }
  out.d_weights = floats_of(dw);
  out.dx = floats_of(dx);
  out.status = ctx.take_status().bits;
  return out;
}

// The blocking stream a device group shares (none on the CPU), destroyed when the call returns or
// throws.
struct GroupStream {
  cudaStream_t s = nullptr;
  explicit GroupStream(Device dev) {
    if (dev == Device::CUDA) GROUPMM_CHECK_CUDA(cudaStreamCreate(&s));
  }
  ~GroupStream() {
    if (s != nullptr) cudaStreamDestroy(s);
  }
  GroupStream(const GroupStream&) = delete;
  GroupStream& operator=(const GroupStream&) = delete;
};

// Every rank's step over an in-process group (a device group shares one blocking stream: the
// helpers' copies on the legacy default stream wait for its work).
inline std::vector<RankOut> run_layer(const EpConfig& cfg, const std::vector<RankData>& d,
                                      const RunOpts& o, Device dev = Device::CPU) {
  const int R = int(cfg.ranks);
  std::vector<RankOut> res(static_cast<size_t>(R));
  const GroupStream group_stream(dev);
  const cudaStream_t stream = group_stream.s;
  run_ranks(
      R,
      [&](int r, ep::InProcessTransport& tr) {
        Context ctx(dev, stream);
        res[size_t(r)] = run_rank(ctx, tr, cfg, d[size_t(r)], o);
      },
      dev, stream);
  return res;
}

// Every output of the ranks' steps bit for bit; the bytes each rank sent only where both sides
// counted them (the in-process transport does, NCCL and a captured step do not).
inline void expect_same_steps(const std::vector<RankOut>& got, const std::vector<RankOut>& want,
                              bool sent_bytes) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(got[r].rows, want[r].rows);
    EXPECT_EQ(got[r].splits, want[r].splits);
    EXPECT_TRUE(same_bits(got[r].x_grouped, want[r].x_grouped)) << "x_grouped";
    EXPECT_TRUE(same_bits(got[r].out, want[r].out)) << "out";
    EXPECT_TRUE(same_bits(got[r].d_y_grouped, want[r].d_y_grouped)) << "d_y_grouped";
    EXPECT_TRUE(same_bits(got[r].d_weights, want[r].d_weights)) << "d_weights";
    EXPECT_TRUE(same_bits(got[r].dx, want[r].dx)) << "dx";
    EXPECT_TRUE(same_bits(got[r].probs, want[r].probs)) << "probs";
    EXPECT_EQ(got[r].status, want[r].status);
    if (sent_bytes) {
      EXPECT_EQ(got[r].sent_bytes, want[r].sent_bytes);
    }
  }
}

}  // namespace groupmm::test::ep_harness
