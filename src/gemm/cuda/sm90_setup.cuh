// CUTLASS SM90 grouped GEMM: the per-expert argument arrays in the caller's workspace and the
// setup kernel that fills them from the device splits (problem sizes, operand and scale pointers,
// strides, per-expert alpha). One launch of one block, before the GEMM: no host read of splits.
#pragma once

#include "gemm/cuda/sm90_config.cuh"
#include "kernels/common/splits_scan.cuh"

namespace groupmm::cuda::sm90 {

// ---- device-side argument arrays in the workspace ----------------------------------------------
template <class Cfg>
struct DeviceArrays {
  typename Cfg::Problem* problems;
  // Split plans: the problem sizes of the complementary class of experts (RowClass), written by
  // the first launch's setup kernel and read by the second launch, which shares every other array.
  typename Cfg::Problem* problems_other;
  const typename Cfg::ElementA** ptr_a;
  const typename Cfg::ElementB** ptr_b;
  const typename Cfg::ElementC** ptr_c;  // void** when the epilogue has no source
  typename Cfg::ElementD** ptr_d;
  const typename Cfg::ElementBias** ptr_bias;
  typename Cfg::StrideA* stride_a;
  typename Cfg::StrideB* stride_b;
  typename Cfg::StrideC* stride_c;
  typename Cfg::StrideD* stride_d;
  float* alpha;             // per_expert: alpha * sa_g * sb_g
  const float** ptr_alpha;  // per_expert: &alpha[g]
  const float** ptr_sfa;    // blockwise: expert g's scale blocks of a and b
  const float** ptr_sfb;
  typename Cfg::LayoutSFA* layout_sfa;  // blockwise: the compact per-expert layouts
  typename Cfg::LayoutSFB* layout_sfb;
  // Zeros that empty wgrad experts multiply (dW_g = 0): 16 rows of max(N, K) operand elements
  // (the 16-byte leading dimension TMA needs for FP8) and max(N, K) block scales.
  uint8_t* zeros;
  void* cutlass_ws;
  size_t bytes;  // total
};

inline size_t align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

// Rows of zeros an empty wgrad expert reduces over (FP8 needs a 16-byte leading dimension).
template <class Cfg>
constexpr int kEmptyRows = Cfg::kFp8 ? 16 : 1;

template <class Cfg>
__host__ __device__ size_t zeros_bytes(int64_t N, int64_t K) {
  const size_t wide = static_cast<size_t>((N > K ? N : K) + 64);
  constexpr size_t elem = sizeof(typename Cfg::ElementA) > 4 ? sizeof(typename Cfg::ElementA) : 4;
  return wide * kEmptyRows<Cfg> * elem;
}

template <class Cfg>
DeviceArrays<Cfg> carve(void* base, int64_t G, int64_t N, int64_t K) {
  DeviceArrays<Cfg> d{};
  size_t off = 0;
  auto take = [&](auto*& p, size_t bytes) {
    using P = std::remove_reference_t<decltype(p)>;
    p = reinterpret_cast<P>(static_cast<char*>(base) + off);
    off = align_up(off + bytes, 256);
  };
  const size_t g = static_cast<size_t>(G);
  take(d.problems, sizeof(typename Cfg::Problem) * g);
  take(d.problems_other, sizeof(typename Cfg::Problem) * g);
  take(d.ptr_a, sizeof(void*) * g);
  take(d.ptr_b, sizeof(void*) * g);
  take(d.ptr_c, sizeof(void*) * g);
  take(d.ptr_d, sizeof(void*) * g);
  take(d.ptr_bias, sizeof(void*) * g);
  take(d.stride_a, sizeof(typename Cfg::StrideA) * g);
  take(d.stride_b, sizeof(typename Cfg::StrideB) * g);
  take(d.stride_c, sizeof(typename Cfg::StrideC) * g);
  take(d.stride_d, sizeof(typename Cfg::StrideD) * g);
  if constexpr (Cfg::kScaling == Scaling::per_expert) {
    take(d.alpha, sizeof(float) * g);
    take(d.ptr_alpha, sizeof(void*) * g);
  }
  if constexpr (Cfg::kScaling == Scaling::blockwise) {
    take(d.ptr_sfa, sizeof(void*) * g);
    take(d.ptr_sfb, sizeof(void*) * g);
    take(d.layout_sfa, sizeof(typename Cfg::LayoutSFA) * g);
    take(d.layout_sfb, sizeof(typename Cfg::LayoutSFB) * g);
  }
  take(d.zeros, zeros_bytes<Cfg>(N, K));
  d.cutlass_ws = static_cast<char*>(base) + off;
  d.bytes = off;
  return d;
}

// ---- setup kernel: splits -> problems, pointers, strides, scales -------------------------------
// A packed 2-D stride of the grouped kernels (Stride<int64_t,_1,_0> or Stride<_1,int64_t,_0>)
// with leading dimension `ld`.
template <class S>
__device__ __forceinline__ S stride_ld(int64_t ld) {
  S s{};
  if constexpr (std::is_same_v<cute::remove_cvref_t<decltype(get<0>(s))>, int64_t>) {
    get<0>(s) = ld;
  } else {
    get<1>(s) = ld;
  }
  return s;
}

// The experts one launch computes, by their row count (device-side): rows in [lo, hi], or outside
// it when `outside`. Two launches with complementary classes split one grouped GEMM between two
// tile configurations by each expert's size (engine.cu, "split" configurations); an expert of the
// other class gets no tiles (M' = 0). The default class is every expert.
struct RowClass {
  int64_t lo = 0, hi = INT64_MAX;
  bool outside = false;
  __host__ __device__ bool has(int64_t rows) const { return (rows >= lo && rows <= hi) != outside; }
};

// One launch of a plan. A split plan's first launch runs the setup kernel, which also writes the
// complementary class's problem sizes (problems_other); its second launch runs no setup and reads
// the first one's arrays (`shared`, the first launch's aligned workspace base), so the pair costs
// one setup launch. Both configurations of a split have the same operand, output and stride
// types, so their arrays have one layout (engine.cu checks KernelEntry::layout_id).
//
// The tile order (CUTLASS's group scheduler raster) only decides which CTA computes which output
// tile and when, never a tile's arithmetic: the results are bit-identical in either order.
// along_m: consecutive tiles of an expert step down M' (the scheduler's default); along_n: across
// N'. engine.cu picks it from host-known shapes.
struct LaunchPart {
  RowClass row_class;
  bool write_other = false;      // first of a split: also fill problems_other
  const void* shared = nullptr;  // second of a split: the first launch's arrays
  bool along_n = false;          // tile order (above)
};

template <class Cfg>
struct SetupParams {
  const void* splits;
  bool splits64;
  int G;
  int64_t M, N, K;
  const typename Cfg::ElementA* a;
  const typename Cfg::ElementB* b;
  typename Cfg::ElementD* out;
  const typename Cfg::ElementBias* bias;
  bool accumulate;  // wgrad beta = 1: empty experts keep their dW
  float alpha;
  const float* scale_a;  // per_expert: [G] scale_inv; blockwise: the block scales
  const float* scale_b;
  DeviceArrays<Cfg> arr;
  StatusBlock* status;
  RowClass row_class;
  bool write_other;    // also fill arr.problems_other with the complementary class
  bool total_at_most;  // SplitsTotal::at_most: sum(splits) < M is no fault (rows past it unused)
};

// Expert g's entries (see the mapping in sm90_config.cuh): `start` and `rows` are its clamped row
// range, `block_start` the sum of ceil(m_j/128) over j < g (the columnwise scale blocks of FP8).
template <class Cfg>
__device__ void setup_expert(const SetupParams<Cfg>& p, int g, int64_t start, int rows,
                             int64_t block_start) {
  auto& A = p.arr;
  const int64_t N = p.N, K = p.K;
  const int64_t nb = (N + 127) / 128, kb = K / 128;
  int64_t sa = 0, sb = 0;  // blockwise: element offsets of expert g's block scales
  if constexpr (Cfg::kRole == Role::forward) {
    A.problems[g] = make_shape(rows, int(N), int(K));
    A.ptr_a[g] = p.a + start * K;
    A.ptr_b[g] = p.b + g * N * K;
    A.ptr_d[g] = p.out + start * N;
    A.stride_a[g] = stride_ld<typename Cfg::StrideA>(K);
    A.stride_b[g] = stride_ld<typename Cfg::StrideB>(K);
    A.stride_d[g] = stride_ld<typename Cfg::StrideD>(N);
    sa = start * kb;   // x 1x128: [M, K/128]
    sb = g * nb * kb;  // W 128x128: expert g's [ceil(N/128), K/128]
  } else if constexpr (Cfg::kRole == Role::forward_swap) {  // decode: W fills the M' tile
    A.problems[g] = make_shape(int(N), rows, int(K));
    A.ptr_a[g] = p.b + g * N * K;
    A.ptr_b[g] = p.a + start * K;
    A.ptr_d[g] = p.out + start * N;
    A.stride_a[g] = stride_ld<typename Cfg::StrideA>(K);
    A.stride_b[g] = stride_ld<typename Cfg::StrideB>(K);
    A.stride_d[g] = stride_ld<typename Cfg::StrideD>(N);
    sa = g * nb * kb;  // A = W 128x128
    sb = start * kb;   // B = x 1x128
  } else if constexpr (Cfg::kRole == Role::dgrad) {
    A.problems[g] = make_shape(rows, int(K), int(N));
    A.ptr_a[g] = p.a + start * N;
    A.ptr_b[g] = p.b + g * N * K;  // 16-bit: W [N, K]; FP8: W's columnwise copy [K, N]
    A.ptr_d[g] = p.out + start * K;
    A.stride_a[g] = stride_ld<typename Cfg::StrideA>(N);
    A.stride_b[g] = stride_ld<typename Cfg::StrideB>(Cfg::kFp8 ? N : K);
    A.stride_d[g] = stride_ld<typename Cfg::StrideD>(K);
    sa = start * (N / 128);  // dy 1x128: [M, N/128]
    sb = g * kb * nb;        // W columnwise 128x128: expert g's [K/128, ceil(N/128)]
  } else {                   // wgrad
    // An empty expert has no K' steps; CUTLASS would emit an uninitialized accumulator, so it
    // multiplies zero rows instead (dW_g = 0), or is skipped when accumulating. FP8 reads the
    // columnwise copies [N, m_g] and [K, m_g] with leading dimension m_g, which TMA needs in
    // 16-byte steps: an expert with another split is reported and skipped. 16-bit operands are
    // read in place, dy_g^T (N x m_g, M'-major) and x_g^T (K x m_g, N'-major).
    const bool empty = rows == 0;
    const bool misaligned = Cfg::kFp8 && rows % 16 != 0;
    if (misaligned) report_fault(p.status, kFaultSplitAlignment, OpId::grouped_gemm, g, rows);
    const int kk = empty ? kEmptyRows<Cfg> : rows;
    A.problems[g] = make_shape(misaligned || (empty && p.accumulate) ? 0 : int(N), int(K), kk);
    A.ptr_a[g] = empty ? reinterpret_cast<const typename Cfg::ElementA*>(A.zeros) : p.a + start * N;
    A.ptr_b[g] = empty ? reinterpret_cast<const typename Cfg::ElementB*>(A.zeros) : p.b + start * K;
    A.ptr_c[g] = p.out + g * N * K;
    A.ptr_d[g] = p.out + g * N * K;
    A.stride_a[g] = stride_ld<typename Cfg::StrideA>(Cfg::kFp8 ? kk : N);
    A.stride_b[g] = stride_ld<typename Cfg::StrideB>(Cfg::kFp8 ? kk : K);
    A.stride_c[g] = stride_ld<typename Cfg::StrideC>(K);
    A.stride_d[g] = stride_ld<typename Cfg::StrideD>(K);
    sa = N * block_start;  // dy columnwise 128x1: expert g's [N, ceil(m_g/128)]
    sb = K * block_start;  // x columnwise 128x1: expert g's [K, ceil(m_g/128)]
  }
  if constexpr (Cfg::kScaling == Scaling::per_expert) {  // a null scale array counts as ones
    A.alpha[g] = p.alpha * (p.scale_a ? p.scale_a[g] : 1.0f) * (p.scale_b ? p.scale_b[g] : 1.0f);
    A.ptr_alpha[g] = &A.alpha[g];
  }
  if constexpr (Cfg::kScaling == Scaling::blockwise) {
    const bool swap = Cfg::kRole == Role::forward_swap;        // A's scales are the weight's
    const bool zero = Cfg::kRole == Role::wgrad && rows == 0;  // zero data, zero scales
    A.ptr_sfa[g] =
        zero ? reinterpret_cast<const float*>(A.zeros) : (swap ? p.scale_b : p.scale_a) + sa;
    A.ptr_sfb[g] =
        zero ? reinterpret_cast<const float*>(A.zeros) : (swap ? p.scale_a : p.scale_b) + sb;
    // CUTLASS rebuilds these from the problem shape in the kernel; filled for completeness.
    const auto mnk = A.problems[g];
    const auto mnkl = make_shape(get<0>(mnk), get<1>(mnk), get<2>(mnk), 1);
    A.layout_sfa[g] = Cfg::ScaleConfig::tile_atom_to_shape_SFA(mnkl);
    A.layout_sfb[g] = Cfg::ScaleConfig::tile_atom_to_shape_SFB(mnkl);
  }
}

// Each expert's rows by the splits rule (the common scan: never addresses past M) and its first
// 128-row block, then its problem size, operand pointers, strides and scales.
template <class Cfg, int kThreads>
__global__ void __launch_bounds__(kThreads) setup_kernel(SetupParams<Cfg> p) {
  const int64_t zero_words = static_cast<int64_t>(zeros_bytes<Cfg>(p.N, p.K) / 4);
  for (int64_t i = threadIdx.x; i < zero_words; i += kThreads)
    reinterpret_cast<uint32_t*>(p.arr.zeros)[i] = 0u;
  SplitsScanArgs splits;
  splits.splits = p.splits;
  splits.splits64 = p.splits64;
  splits.G = p.G;
  splits.row_bound = p.M;
  splits.expected_total = p.M;
  splits.total_at_most = p.total_at_most;
  splits.status = p.status;
  splits.op = OpId::grouped_gemm;
  auto blocks = [](int64_t rows) { return Counts<1>{{(rows + 127) / 128}}; };
  scan_splits<kThreads, 1>(splits, blocks, [&](const ExpertSpan<1>& e) {
    const int g = static_cast<int>(e.g);
    p.arr.ptr_bias[g] = p.bias ? p.bias + g * p.N : nullptr;
    p.arr.ptr_c[g] = nullptr;
    setup_expert(p, g, e.start, static_cast<int>(e.rows), e.before.v[0]);
    // The other launch's experts get no tiles (M' = 0) in this one.
    auto& pr = p.arr.problems[g];
    const auto all = pr;
    const auto none = make_shape(0, get<1>(all), get<2>(all));
    const bool here = p.row_class.has(e.rows);
    pr = here ? all : none;
    if (p.write_other) p.arr.problems_other[g] = here ? none : all;
  });
}

}  // namespace groupmm::cuda::sm90
