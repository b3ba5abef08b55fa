// CUTLASS SM90 ptr-array grouped GEMM: host side. One small setup kernel (sm90_setup.cuh) turns
// the device splits into the per-expert problem sizes, pointers, strides and scales that the
// CUTLASS grouped kernel (configured in sm90_config.cuh) reads, all in a caller workspace, so the
// pair is graph safe: no host read of splits, no allocation.
#pragma once

#include "cuda/gemm/sm90_setup.cuh"

namespace groupmm::cuda::sm90 {

// ---- host side ----------------------------------------------------------------------------------
template <class Cfg>
typename Cfg::Gemm::Arguments make_arguments(const DeviceArrays<Cfg>& arr, int G, float alpha,
                                             float beta, bool has_bias, int device, int sms) {
  constexpr bool kPerExpert = Cfg::kScaling == Scaling::per_expert;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = sms;
  typename Cfg::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {G, arr.problems, nullptr};
  if constexpr (Cfg::kScaling == Scaling::blockwise) {
    args.mainloop = {arr.ptr_a,   arr.stride_a,   arr.ptr_b,   arr.stride_b,
                     arr.ptr_sfa, arr.layout_sfa, arr.ptr_sfb, arr.layout_sfb};
  } else {
    args.mainloop = {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b};
  }
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
    if constexpr (kPerExpert) {  // alpha_g from the setup kernel
      f.alpha_ptr_array = arr.ptr_alpha;
      f.dAlpha = {_0{}, _0{}, 1};
    }
  } else if constexpr (kPerExpert) {
    // EVT arguments: {alpha per group, acc fetch, bias broadcast, multiply_add}
    f = {{{alpha}, {nullptr}, {arr.ptr_alpha}, {{_0{}, _0{}, 1}}},
         {},
         {has_bias ? arr.ptr_bias : nullptr},
         {}};
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
void run(Context& ctx, const GemmLaunch& a, void* ws, size_t ws_bytes, RowClass row_class) {
  const GemmDims& d = a.dims;
  void* base = reinterpret_cast<void*>(align_up(reinterpret_cast<uintptr_t>(ws), 256));
  DeviceArrays<Cfg> arr = carve<Cfg>(base, d.G, d.N, d.K);

  SetupParams<Cfg> sp{};
  sp.splits = a.splits.data;
  sp.splits64 = a.splits.dtype == DType::int64;
  sp.G = static_cast<int>(d.G);
  sp.M = d.M;
  sp.N = d.N;
  sp.K = d.K;
  sp.a = static_cast<const typename Cfg::ElementA*>(a.a);
  sp.b = static_cast<const typename Cfg::ElementB*>(a.b);
  sp.out = static_cast<typename Cfg::ElementD*>(a.out);
  sp.bias = static_cast<const typename Cfg::ElementBias*>(a.bias);
  sp.accumulate = a.beta != 0.0f;
  sp.alpha = a.alpha;
  sp.scale_a = a.scale_a;
  sp.scale_b = a.scale_b;
  sp.arr = arr;
  sp.status = ctx.status();
  sp.row_class = row_class;
  setup_kernel<Cfg, 256><<<1, 256, 0, ctx.stream()>>>(sp);
  GROUPMM_CHECK_LAUNCH();

  auto args = make_arguments<Cfg>(arr, sp.G, a.alpha, a.beta, sp.bias != nullptr,
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
  void (*run)(Context&, const GemmLaunch&, void*, size_t, RowClass);
};

template <class Cfg>
KernelEntry entry() {
  return {&Cfg::name, &workspace_size<Cfg>, &run<Cfg>};
}

}  // namespace groupmm::cuda::sm90

// One translation unit per configuration (they are slow to compile): each defines a function
// returning its KernelEntry, declared in kernels.hpp.
#define GROUPMM_SM90_KERNEL(fn, EAB, ED, ROLE, TM, TN, TK, CM, CN, SCHED) \
  GROUPMM_SM90_KERNEL_SCALED(fn, EAB, EAB, ED, ROLE, TM, TN, TK, CM, CN, SCHED, none, false)
#define GROUPMM_SM90_KERNEL_SCALED(fn, EA, EB, ED, ROLE, TM, TN, TK, CM, CN, SCHED, SCALING, FAST) \
  namespace groupmm::cuda::sm90 {                                                                  \
  KernelEntry fn() {                                                                               \
    return entry<Sm90GroupedConfig<EA, EB, ED, Role::ROLE, Shape<Int<TM>, Int<TN>, Int<TK>>,       \
                                   Shape<Int<CM>, Int<CN>, _1>, Schedule::SCHED, Scaling::SCALING, \
                                   FAST>>();                                                       \
  }                                                                                                \
  }
