// CUTLASS SM90 ptr-array grouped GEMM, one template for the three MoE passes.
//
// A kernel configuration (Sm90GroupedConfig) fixes the element types, operand layouts, tile,
// cluster and schedule. At run time one small setup kernel turns the device splits into the
// per-expert problem sizes, pointers and strides that the CUTLASS grouped kernel reads, all in a
// caller workspace, so the pair is graph safe: no host read of splits, no allocation.
//
// Problem mapping (row-major tensors; CUTLASS computes D[M', N'] = A[M', K'] B[N', K']^T):
//   forward      M'=m_g N'=N   K'=K    A=x_g  (K-major)  B=W_g (K-major)    D=y_g  row-major
//   forward swap M'=N   N'=m_g K'=K    A=W_g  (K-major)  B=x_g (K-major)    D=y_g^T col-major
//   dgrad        M'=m_g N'=K   K'=N    A=dy_g (K-major)  B=W_g (N'-major)   D=dx_g row-major
//   wgrad        M'=N   N'=K   K'=m_g  A=dy_g (M'-major) B=x_g (N'-major)   D=dW_g row-major
#pragma once

#include "core/gemm_impl.hpp"
#include "cuda/common/splits_scan.cuh"

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace groupmm::cuda::sm90 {

using namespace cute;

enum class Role : uint8_t { forward, forward_swap, dgrad, wgrad };
enum class Schedule : uint8_t { cooperative, pingpong };

// ---- kernel configuration ----------------------------------------------------------------------
template <class ElementAB_, class ElementD_, Role kRole_, class Tile_, class Cluster_,
          Schedule kSched_>
struct Sm90GroupedConfig {
  using ElementAB = ElementAB_;
  using ElementD = ElementD_;
  using Tile = Tile_;
  using Cluster = Cluster_;
  static constexpr Role kRole = kRole_;
  static constexpr Schedule kSched = kSched_;

  static_assert(std::is_same_v<ElementAB, cutlass::bfloat16_t> ||
                    std::is_same_v<ElementAB, cutlass::half_t>,
                "operands are bf16 or fp16");
  static_assert(kRole == Role::wgrad || std::is_same_v<ElementD, ElementAB>,
                "forward/dgrad write the operand dtype");
  static_assert(kSched == Schedule::pingpong || size<0>(Tile{}) >= 128,
                "cooperative schedules split M over two warpgroups");

  using LayoutA = std::conditional_t<kRole == Role::wgrad, cutlass::layout::ColumnMajor,
                                     cutlass::layout::RowMajor>;
  using LayoutB = std::conditional_t<kRole == Role::dgrad || kRole == Role::wgrad,
                                     cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  using LayoutD = std::conditional_t<kRole == Role::forward_swap, cutlass::layout::ColumnMajor,
                                     cutlass::layout::RowMajor>;
  // The wgrad epilogue reads C (= D) for beta = 1; the others have no source.
  using ElementC = std::conditional_t<kRole == Role::wgrad, ElementD, void>;
  using ElementBias = ElementAB;
  static constexpr int kAlignAB = 16 / sizeof(ElementAB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);

  using KernelSchedule =
      std::conditional_t<kSched == Schedule::cooperative,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>;
  using EpilogueSchedule =
      std::conditional_t<kSched == Schedule::cooperative,
                         cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
                         cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;

  // Epilogues. forward: D = alpha*acc + bias[g] (bias along N for row-major y, along M' when the
  // operands are swapped; a null pointer array means no bias). dgrad: the same with no bias.
  // wgrad: D = alpha*acc + beta*C.
  using BiasBroadcast = std::conditional_t<
      kRole == Role::forward_swap,
      cutlass::epilogue::fusion::Sm90ColBroadcast<0, Tile, ElementBias*, float, Stride<_1, _0, _0>>,
      cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, ElementBias*, float,
                                                  Stride<_0, _1, _0>>>;
  using BiasEVT = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>,
      cutlass::epilogue::fusion::Sm90AccFetch, BiasBroadcast>;
  using LinComb = cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementD, float>;
  using FusionOp = std::conditional_t<kRole == Role::wgrad, LinComb, BiasEVT>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD*, kAlignD,
      ElementD, LayoutD*, kAlignD, EpilogueSchedule, FusionOp>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA*, kAlignAB, ElementAB,
      LayoutB*, kAlignAB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideC = typename GemmKernel::InternalStrideC;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Problem = typename ProblemShape::UnderlyingProblemShape;

  static std::string name() {
    const char* role = kRole == Role::forward        ? "forward"
                       : kRole == Role::forward_swap ? "forward_swapAB"
                       : kRole == Role::dgrad        ? "dgrad"
                                                     : "wgrad";
    return detail::cat("sm90 ", role, " ", sizeof(ElementAB) == 2 ? "16-bit" : "", " tile ",
                       int(size<0>(Tile{})), "x", int(size<1>(Tile{})), "x", int(size<2>(Tile{})),
                       " cluster ", int(size<0>(Cluster{})), "x", int(size<1>(Cluster{})), " ",
                       kSched == Schedule::cooperative ? "cooperative" : "pingpong");
  }
};

// ---- device-side argument arrays in the workspace ----------------------------------------------
template <class Cfg>
struct DeviceArrays {
  typename Cfg::Problem* problems;
  const typename Cfg::ElementAB** ptr_a;
  const typename Cfg::ElementAB** ptr_b;
  const typename Cfg::ElementC** ptr_c;  // void** when the epilogue has no source
  typename Cfg::ElementD** ptr_d;
  const typename Cfg::ElementBias** ptr_bias;
  typename Cfg::StrideA* stride_a;
  typename Cfg::StrideB* stride_b;
  typename Cfg::StrideC* stride_c;
  typename Cfg::StrideD* stride_d;
  typename Cfg::ElementAB* zeros;  // one zero row of max(N, K) elements (empty wgrad experts)
  void* cutlass_ws;
  size_t bytes;  // total
};

inline size_t align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
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
  take(d.problems, sizeof(typename Cfg::Problem) * G);
  take(d.ptr_a, sizeof(void*) * G);
  take(d.ptr_b, sizeof(void*) * G);
  take(d.ptr_c, sizeof(void*) * G);
  take(d.ptr_d, sizeof(void*) * G);
  take(d.ptr_bias, sizeof(void*) * G);
  take(d.stride_a, sizeof(typename Cfg::StrideA) * G);
  take(d.stride_b, sizeof(typename Cfg::StrideB) * G);
  take(d.stride_c, sizeof(typename Cfg::StrideC) * G);
  take(d.stride_d, sizeof(typename Cfg::StrideD) * G);
  take(d.zeros, sizeof(typename Cfg::ElementAB) * static_cast<size_t>(std::max(N, K) + 64));
  d.cutlass_ws = static_cast<char*>(base) + off;
  d.bytes = off;
  return d;
}

// ---- setup kernel: splits -> problems, pointers, strides ---------------------------------------
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

template <class Cfg>
struct SetupParams {
  SplitsScanArgs splits;  // the splits rule with row bound M
  int64_t N, K;
  const typename Cfg::ElementAB* a;
  const typename Cfg::ElementAB* b;
  typename Cfg::ElementD* out;
  const typename Cfg::ElementBias* bias;
  bool accumulate;  // wgrad beta = 1: empty experts keep their dW
  DeviceArrays<Cfg> arr;
};

// Each expert's rows by the splits rule (the common scan: never addresses past M), then its
// problem size, operand pointers and strides.
template <class Cfg, int kThreads>
__global__ void __launch_bounds__(kThreads) setup_kernel(SetupParams<Cfg> p) {
  for (int64_t i = threadIdx.x; i < max(p.N, p.K) + 64; i += kThreads)
    p.arr.zeros[i] = typename Cfg::ElementAB(0.0f);
  const int64_t N = p.N, K = p.K;
  auto no_counts = [](int64_t) { return Counts<0>{}; };
  scan_splits<kThreads, 0>(p.splits, no_counts, [&](const ExpertSpan<0>& e) {
    const int64_t g = e.g, start = e.start;
    const int r = static_cast<int>(e.rows);
    auto& A = p.arr;
    // Expert g's problem (M', N', K'), operands and leading dimensions.
    auto set = [&](int m, int n, int k, const auto* a, const auto* b, auto* d, int64_t lda,
                   int64_t ldb, int64_t ldd) {
      A.problems[g] = make_shape(m, n, k);
      A.ptr_a[g] = a;
      A.ptr_b[g] = b;
      A.ptr_d[g] = d;
      A.stride_a[g] = stride_ld<typename Cfg::StrideA>(lda);
      A.stride_b[g] = stride_ld<typename Cfg::StrideB>(ldb);
      A.stride_d[g] = stride_ld<typename Cfg::StrideD>(ldd);
    };
    A.ptr_bias[g] = p.bias ? p.bias + g * N : nullptr;
    A.ptr_c[g] = nullptr;
    const auto* w_g = p.b + g * N * K;
    if constexpr (Cfg::kRole == Role::forward) {
      set(r, int(N), int(K), p.a + start * K, w_g, p.out + start * N, K, K, N);
    } else if constexpr (Cfg::kRole == Role::forward_swap) {
      set(int(N), r, int(K), w_g, p.a + start * K, p.out + start * N, K, K, N);
    } else if constexpr (Cfg::kRole == Role::dgrad) {
      set(r, int(K), int(N), p.a + start * N, w_g, p.out + start * K, N, K, K);
    } else {  // wgrad
      // An empty expert has no K' steps; CUTLASS would emit an uninitialized accumulator, so it
      // multiplies one zero row instead (dW_g = 0), or is skipped when accumulating. A is dy_g^T
      // (N x m_g, M'-major), B is x_g^T (K x m_g, N'-major); a zero row has no second dimension,
      // so its stride is irrelevant.
      const bool empty = r == 0;
      set(empty && p.accumulate ? 0 : int(N), int(K), empty ? 1 : r,
          empty ? p.arr.zeros : p.a + start * N, empty ? p.arr.zeros : p.b + start * K,
          p.out + g * N * K, N, K, K);
      A.ptr_c[g] = p.out + g * N * K;
      A.stride_c[g] = stride_ld<typename Cfg::StrideC>(K);
    }
  });
}

// ---- host side ----------------------------------------------------------------------------------
template <class Cfg>
typename Cfg::Gemm::Arguments make_arguments(const DeviceArrays<Cfg>& arr, int G, float alpha,
                                             float beta, bool has_bias, int device, int sms) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = sms;
  typename Cfg::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {G, arr.problems, nullptr};
  args.mainloop = {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b};
  args.epilogue.ptr_C = arr.ptr_c;
  args.epilogue.dC = arr.stride_c;
  args.epilogue.ptr_D = arr.ptr_d;
  args.epilogue.dD = arr.stride_d;
  auto& f = args.epilogue.thread;
  if constexpr (Cfg::kRole == Role::wgrad) {
    f.alpha = alpha;
    f.beta = beta;
    f.alpha_ptr = nullptr;
    f.beta_ptr = nullptr;
    f.dAlpha = {_0{}, _0{}, 0};
    f.dBeta = {_0{}, _0{}, 0};
  } else {
    // EVT arguments: {alpha broadcast, acc fetch, bias broadcast, multiply_add}
    f = {{{alpha}}, {}, {has_bias ? arr.ptr_bias : nullptr}, {}};
  }
  args.hw_info = hw;
  return args;
}

template <class Cfg>
size_t workspace_size(const GemmDims& d, int sms) {
  DeviceArrays<Cfg> arr = carve<Cfg>(nullptr, d.G, d.N, d.K);
  auto args = make_arguments<Cfg>(arr, static_cast<int>(d.G), 1.0f, 0.0f, false, 0, sms);
  return arr.bytes + Cfg::Gemm::get_workspace_size(args) + 256;
}

template <class Cfg>
void run(Context& ctx, const GroupedGemmArgs& a, const GemmDims& d, void* ws, size_t ws_bytes) {
  void* base = reinterpret_cast<void*>(align_up(reinterpret_cast<uintptr_t>(ws), 256));
  DeviceArrays<Cfg> arr = carve<Cfg>(base, d.G, d.N, d.K);

  SetupParams<Cfg> sp{};
  sp.splits.splits = a.splits.data;
  sp.splits.splits64 = a.splits.dtype == DType::int64;
  sp.splits.G = d.G;
  sp.splits.row_bound = d.M;
  sp.splits.expected_total = d.M;
  sp.splits.status = ctx.status();
  sp.splits.op = OpId::grouped_gemm;
  sp.N = d.N;
  sp.K = d.K;
  sp.a = static_cast<const typename Cfg::ElementAB*>(a.a.data);
  sp.b = static_cast<const typename Cfg::ElementAB*>(a.b.data);
  sp.out = static_cast<typename Cfg::ElementD*>(a.out.data);
  sp.bias = a.bias.present() ? static_cast<const typename Cfg::ElementBias*>(a.bias.data) : nullptr;
  sp.accumulate = a.beta != 0.0f;
  sp.arr = arr;
  setup_kernel<Cfg, 256><<<1, 256, 0, ctx.stream()>>>(sp);
  GROUPMM_CHECK_LAUNCH();

  auto args = make_arguments<Cfg>(arr, static_cast<int>(d.G), a.alpha, a.beta, sp.bias != nullptr,
                                  ctx.device_index(), ctx.sm_count());
  typename Cfg::Gemm gemm;
  const size_t cws = Cfg::Gemm::get_workspace_size(args);
  GROUPMM_CHECK(arr.bytes + cws + 256 <= ws_bytes, "grouped_gemm: workspace too small (", ws_bytes,
                " < ", arr.bytes + cws + 256, ")");
  cutlass::Status st = gemm.can_implement(args);
  GROUPMM_CHECK(st == cutlass::Status::kSuccess, "grouped_gemm: CUTLASS cannot implement ",
                Cfg::name(), ": ", cutlassGetStatusString(st));
  st = gemm.initialize(args, arr.cutlass_ws, ctx.stream());
  GROUPMM_CHECK(st == cutlass::Status::kSuccess, "grouped_gemm: CUTLASS initialize failed for ",
                Cfg::name(), ": ", cutlassGetStatusString(st));
  st = gemm.run(ctx.stream());
  GROUPMM_CHECK(st == cutlass::Status::kSuccess, "grouped_gemm: CUTLASS run failed for ",
                Cfg::name(), ": ", cutlassGetStatusString(st));
  GROUPMM_CHECK_LAUNCH();
}

// ---- registry of instantiated configurations ---------------------------------------------------
struct KernelEntry {
  std::string (*name)();
  size_t (*workspace_size)(const GemmDims&, int);
  void (*run)(Context&, const GroupedGemmArgs&, const GemmDims&, void*, size_t);
};

template <class Cfg>
KernelEntry entry() {
  return {&Cfg::name, &workspace_size<Cfg>, &run<Cfg>};
}

}  // namespace groupmm::cuda::sm90

// One translation unit per configuration (they are slow to compile): each defines a function
// returning its KernelEntry, declared in kernels.hpp.
#define GROUPMM_SM90_KERNEL(fn, EAB, ED, ROLE, TM, TN, TK, CM, CN, SCHED)                 \
  namespace groupmm::cuda::sm90 {                                                         \
  KernelEntry fn() {                                                                      \
    return entry<Sm90GroupedConfig<EAB, ED, Role::ROLE, Shape<Int<TM>, Int<TN>, Int<TK>>, \
                                   Shape<Int<CM>, Int<CN>, _1>, Schedule::SCHED>>();      \
  }                                                                                       \
  }
