// CUDA moe_router_forward: one CTA per chunk of kRouterChunkTokens tokens, one warp per token (its
// scores in registers), then one CTA per expert reduces the chunks' partial counts and aux-loss
// sums in a fixed order; the CTA that finishes last adds up the losses. Integer tickets only: no
// floating-point atomics, deterministic.
#include <cub/block/block_reduce.cuh>

#include "moe/backends.hpp"
#include "moe/cuda/router_common.cuh"

namespace groupmm::cuda {
namespace {

using namespace moe;
using Cfg = RouterKernelConfig;

struct FinalizeConfig {
  static constexpr int kThreads = 256;
  static_assert(kThreads % 32 == 0, "whole warps");
};

// Workspace: partial counts [E][NC] int32, partial prob sums [E][NC] fp32, partial z [NC] fp32,
// per-expert prob sums [E] fp32, the ticket.
struct RouterWorkspace {
  int32_t* part_counts = nullptr;
  float* part_psum = nullptr;
  float* part_z = nullptr;
  float* psum = nullptr;
  unsigned* ticket = nullptr;
  size_t bytes = 0;
};
RouterWorkspace carve(void* base, int64_t E, int64_t NC) {
  RouterWorkspace w;
  char* p = static_cast<char*>(base);
  auto take = [&](size_t n) {
    char* r = p;
    p += (n + 255) / 256 * 256;
    return r;
  };
  w.part_counts = reinterpret_cast<int32_t*>(take(size_t(E * NC) * 4));
  w.part_psum = reinterpret_cast<float*>(take(size_t(E * NC) * 4));
  w.part_z = reinterpret_cast<float*>(take(size_t(NC) * 4));
  w.psum = reinterpret_cast<float*>(take(size_t(E) * 4));
  w.ticket = reinterpret_cast<unsigned*>(take(4));
  w.bytes = size_t(p - static_cast<char*>(base));
  return w;
}

struct RouterFwdParams {
  const float* logits;
  const float* bias;  // [E] or null
  int32_t* ids;
  float* weights;
  RouterWorkspace ws;
  int64_t T, NC;
  int E, k, n_group, topk_group;
  bool softmax_score, renorm, aux, z;
  float scale;
  // One chunk (T <= kRouterChunkTokens): the CTA writes what the finalize would (its sums over one
  // chunk are the partials themselves; the aux sum in its thread order and tree), no second launch.
  bool single = false;
  int32_t* counts = nullptr;
  float* aux_loss = nullptr;  // null when not given (written 0 when given with the loss off)
  float* z_loss = nullptr;    // likewise
  float aux_scale = 0.0f, z_scale = 0.0f;
};

// Group-limited selection (n_group > 1): returns the bit mask of the kept groups. sel holds the
// token's selection keys in shared memory ([E], this warp's slice).
__device__ unsigned keep_groups(const RouterFwdParams& p, const float* sel, int lane) {
  const int Eg = p.E / p.n_group, m = p.k / p.topk_group;
  Cand g = no_cand();
  if (lane < p.n_group) {  // this lane scores group `lane`: sum of its top m, best first
    float sum = 0.0f;
    Cand prev = no_cand();
    for (int i = 0; i < m; ++i) {
      Cand best = no_cand();
      for (int e = lane * Eg; e < (lane + 1) * Eg; ++e)
        if (after(prev, sel[e], e) && beats(sel[e], e, best)) best = {sel[e], 0.0f, e};
      sum = rn::add(sum, best.v);
      prev = best;
    }
    g = {sum, 0.0f, lane};
  }
  unsigned keep = 0;
  Cand prev = no_cand();
  for (int i = 0; i < p.topk_group; ++i) {
    Cand c = lane < p.n_group && after(prev, g.v, g.id) ? g : no_cand();
    c = warp_best(c);
    keep |= 1u << c.id;
    prev = c;
  }
  return keep;
}

// One CTA per chunk of kRouterChunkTokens tokens, one warp per token (enough warps in flight to
// hide the shuffle chains of the top-k rounds). Shared memory: per warp [E] floats (the selection
// keys of group-limited routing, then the token's aux-loss terms) and [E] count bytes. The
// chunk's partials are then summed over the warps in token order: the same order, and so the
// same bits, as one warp adding its tokens in turn.
template <int kPer>
__global__ void __launch_bounds__(Cfg::kThreads) router_fwd_kernel(RouterFwdParams p) {
  extern __shared__ float router_smem[];
  __shared__ float z_terms[Cfg::kWarps];
  float* terms = router_smem;                                                   // [kWarps][E]
  uint8_t* hits = reinterpret_cast<uint8_t*>(router_smem + Cfg::kWarps * p.E);  // [kWarps][E]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t c = blockIdx.x, t0 = c * kRouterChunkTokens, t = t0 + warp;
  float* mine = terms + warp * p.E;
  const int Eg = p.E / p.n_group;
  if (t < p.T) {
    TokenScores<kPer> ts;
    ts.load(p.logits + t * p.E, lane, p.E);
    ts.scores(p.softmax_score, p.z, lane, p.E);
    float sel[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      const float b = p.bias != nullptr && e < p.E ? p.bias[e] : 0.0f;
      sel[i] = p.bias != nullptr ? rn::add(ts.s[i], b) : ts.s[i];
    }
    unsigned keep = ~0u;
    if (p.n_group > 1) {
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        if (lane + 32 * i < p.E) mine[lane + 32 * i] = sel[i];
      __syncwarp();
      keep = keep_groups(p, mine, lane);
      __syncwarp();  // `mine` is rewritten with the aux-loss terms below
    }
    // top-k rounds over 64-bit rank keys (rank_key: one integer max per comparison instead of
    // router::better's NaN and tie branches); a round's winner is cleared from its lane. The same
    // selection as rounds of "the best item ranking after the previous winner" (a strict total
    // order), with far fewer instructions (the kernel is bound by instruction issue).
    uint64_t key[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      key[i] = e < p.E && ((keep >> (e / Eg)) & 1u) ? rank_key(sel[i], e) : 0;
    }
    float wsum = 0.0f, my_w = 0.0f;
    int my_id = -1;
    uint8_t hit[kPer] = {};
    for (int j = 0; j < p.k; ++j) {
      uint64_t best = 0;
#pragma unroll
      for (int i = 0; i < kPer; ++i) best = key[i] > best ? key[i] : best;
#pragma unroll
      for (int step = 16; step >= 1; step /= 2) {
        const uint64_t o = __shfl_xor_sync(kFullMask, best, step);
        best = o > best ? o : best;
      }
      int id = INT_MAX;  // no candidate left (as router::better's search would give)
      float s = 0.0f;
      if (best != 0) {  // warp-uniform
        id = static_cast<int>(~static_cast<uint32_t>(best));
        s = warp_item<kPer>(ts.s, id);
#pragma unroll
        for (int i = 0; i < kPer; ++i)
          if (key[i] == best) key[i] = 0, hit[i] = 1;
      }
      if (lane == j) my_id = id, my_w = s;
      wsum = rn::add(wsum, s);
    }
    wsum = rn::add(wsum, rn::kRenormEps);
    if (lane < p.k) {
      const float w = p.renorm ? rn::div(my_w, wsum) : my_w;
      p.ids[t * p.k + lane] = my_id;
      p.weights[t * p.k + lane] = rn::mul(w, p.scale);
    }
    // P = softmax, or the sigmoid scores over their sum
    const float z = p.aux && !p.softmax_score
                        ? rn::add(warp_lane_sum<kPer>(ts.s, lane, p.E), rn::kRenormEps)
                        : 1.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      if (e >= p.E) continue;
      hits[warp * p.E + e] = hit[i];
      if (p.aux) mine[e] = rn::div(ts.s[i], z);
    }
    if (p.z && lane == 0) {
      const float lse = ts.lse();
      z_terms[warp] = lse * lse;
    }
  }
  __syncthreads();
  // The chunk's partials, in token order.
  const int nt = p.T - t0 < Cfg::kWarps ? int(p.T - t0) : Cfg::kWarps;
  float aux_acc = 0.0f;  // single: sum_e psum_e * counts_e, as the finalize's last CTA adds it
  for (int e = threadIdx.x; e < p.E; e += Cfg::kThreads) {
    int cnt = 0;
    float psum = 0.0f;
    for (int w = 0; w < nt; ++w) {
      cnt += hits[w * p.E + e];
      if (p.aux) psum += terms[w * p.E + e];
    }
    if (p.single) {
      p.counts[e] = cnt;
      aux_acc = fmaf(psum, float(cnt), aux_acc);
    } else {
      p.ws.part_counts[e * p.NC + c] = cnt;
      if (p.aux) p.ws.part_psum[e * p.NC + c] = psum;
    }
  }
  float zacc = 0.0f;
  if (p.z && threadIdx.x == 0) {
    for (int w = 0; w < nt; ++w) zacc += z_terms[w];
    if (!p.single) p.ws.part_z[c] = zacc;
  }
  if (!p.single) return;
  static_assert(Cfg::kThreads == FinalizeConfig::kThreads, "the finalize's reduction tree");
  if (p.aux) {
    __shared__ typename cub::BlockReduce<float, Cfg::kThreads>::TempStorage tmp;
    const float sum = cub::BlockReduce<float, Cfg::kThreads>(tmp).Sum(aux_acc);
    if (threadIdx.x == 0 && p.aux_loss != nullptr) *p.aux_loss = sum * p.aux_scale;
  } else if (threadIdx.x == 0 && p.aux_loss != nullptr) {
    *p.aux_loss = 0.0f;
  }
  if (threadIdx.x == 0 && p.z_loss != nullptr) *p.z_loss = p.z ? zacc * p.z_scale : 0.0f;
}

struct FinalizeParams {
  RouterWorkspace ws;
  int32_t* counts;
  float* aux_loss;  // null when not given (written 0 when given with the loss off)
  float* z_loss;    // likewise
  bool aux_on, z_on;
  int64_t NC;
  int E;
  float aux_scale, z_scale;  // coeff E / (k T^2), coeff / T
};

template <class T>
__device__ T block_sum_strided(const T* v, int64_t n, int64_t stride, void* tmp_raw) {
  using Reduce = cub::BlockReduce<T, FinalizeConfig::kThreads>;
  auto& tmp = *static_cast<typename Reduce::TempStorage*>(tmp_raw);
  T acc = T(0);
  for (int64_t i = threadIdx.x; i < n; i += FinalizeConfig::kThreads) acc += __ldcg(v + i * stride);
  const T r = Reduce(tmp).Sum(acc);  // fixed tree for a fixed block size: deterministic
  __syncthreads();                   // tmp is reused by the next call
  return r;
}

// CTA e: counts[e] and the prob sum of expert e over the chunks; the last CTA: the losses.
__global__ void __launch_bounds__(FinalizeConfig::kThreads)
    router_finalize_kernel(FinalizeParams p) {
  __shared__ union {
    cub::BlockReduce<int, FinalizeConfig::kThreads>::TempStorage i;
    cub::BlockReduce<float, FinalizeConfig::kThreads>::TempStorage f;
  } tmp;
  __shared__ bool last;
  const int e = blockIdx.x;
  const int cnt = block_sum_strided<int>(p.ws.part_counts + e * p.NC, p.NC, 1, &tmp);
  const float ps =
      p.aux_on ? block_sum_strided<float>(p.ws.part_psum + e * p.NC, p.NC, 1, &tmp) : 0.0f;
  if (threadIdx.x == 0) {
    p.counts[e] = cnt;
    p.ws.psum[e] = ps;
    __threadfence();
    last = atomicAdd(p.ws.ticket, 1u) == unsigned(p.E - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (p.aux_loss != nullptr && !p.aux_on && threadIdx.x == 0) *p.aux_loss = 0.0f;
  if (p.z_loss != nullptr && !p.z_on && threadIdx.x == 0) *p.z_loss = 0.0f;
  if (p.aux_on) {
    float acc = 0.0f;  // sum_e psum_e * counts_e, thread-strided then a fixed tree
    for (int i = threadIdx.x; i < p.E; i += FinalizeConfig::kThreads)
      acc = fmaf(__ldcg(p.ws.psum + i), float(__ldcg(p.counts + i)), acc);
    using Reduce = cub::BlockReduce<float, FinalizeConfig::kThreads>;
    const float s = Reduce(tmp.f).Sum(acc);
    __syncthreads();
    if (threadIdx.x == 0) *p.aux_loss = s * p.aux_scale;
  }
  if (p.z_on) {
    const float s = block_sum_strided<float>(p.ws.part_z, p.NC, 1, &tmp);
    if (threadIdx.x == 0) *p.z_loss = s * p.z_scale;
  }
  if (threadIdx.x == 0) *p.ws.ticket = 0;
}

}  // namespace

size_t moe_router_workspace_size(const RouterConfig& cfg, int64_t tokens) {
  return carve(nullptr, cfg.experts, qnum::ceil_div(tokens, kRouterChunkTokens)).bytes;
}

void moe_router_forward(Context& ctx, const RouterConfig& cfg, const RouterArgs& a,
                        void* workspace) {
  const int64_t T = a.logits.dim(0), E = cfg.experts, NC = qnum::ceil_div(T, kRouterChunkTokens);
  RouterFwdParams p{};
  p.logits = a.logits.ptr<float>();
  p.bias = a.expert_bias.present() ? a.expert_bias.ptr<float>() : nullptr;
  p.ids = a.expert_ids.ptr<int32_t>();
  p.weights = a.weights.ptr<float>();
  p.ws = carve(workspace, E, NC);
  p.T = T;
  p.NC = NC;
  p.E = int(E);
  p.k = int(cfg.topk);
  p.n_group = int(cfg.n_group);
  p.topk_group = int(cfg.topk_group);
  p.softmax_score = cfg.score == RouterScore::softmax;
  p.renorm = cfg.renormalize;
  p.aux = cfg.aux_loss_coeff != 0;
  p.z = cfg.z_loss_coeff != 0;
  p.scale = cfg.scaling_factor;
  const double Td = double(T);
  const float aux_scale =
      T == 0 ? 0.0f : float(double(cfg.aux_loss_coeff) * double(E) / (double(cfg.topk) * Td * Td));
  const float z_scale = T == 0 ? 0.0f : float(double(cfg.z_loss_coeff) / Td);
  int32_t* counts = a.counts.ptr<int32_t>();
  float* aux_loss = a.aux_loss.present() ? a.aux_loss.ptr<float>() : nullptr;
  float* z_loss = a.z_loss.present() ? a.z_loss.ptr<float>() : nullptr;
  if (NC == 1) {
    p.single = true;
    p.counts = counts;
    p.aux_loss = aux_loss;
    p.z_loss = z_loss;
    p.aux_scale = aux_scale;
    p.z_scale = z_scale;
  }
  if (NC > 0) {
    static_assert(Cfg::kWarps == kRouterChunkTokens, "one warp per token of a chunk");
    const size_t smem = size_t(Cfg::kWarps * E) * (sizeof(float) + 1);  // <= 40 KiB (E <= 1024)
    dispatch_per_lane(E, [&](auto per) {
      router_fwd_kernel<decltype(per)::value>
          <<<grid_size(NC), Cfg::kThreads, smem, ctx.stream()>>>(p);
    });
    GROUPMM_CHECK_LAUNCH();
  }
  if (p.single) return;
  GROUPMM_CHECK_CUDA(cudaMemsetAsync(p.ws.ticket, 0, sizeof(unsigned), ctx.stream()));
  FinalizeParams f{};
  f.ws = p.ws;
  f.counts = counts;
  f.aux_loss = aux_loss;
  f.z_loss = z_loss;
  f.aux_on = p.aux;
  f.z_on = p.z;
  f.NC = NC;
  f.E = int(E);
  f.aux_scale = aux_scale;
  f.z_scale = z_scale;
  router_finalize_kernel<<<unsigned(E), FinalizeConfig::kThreads, 0, ctx.stream()>>>(f);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
