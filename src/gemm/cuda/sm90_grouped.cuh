// CUTLASS SM90 ptr-array grouped GEMM: host side. One small setup kernel (sm90_setup.cuh) turns
// the device splits into the per-expert problem sizes, pointers, strides and scales that the
// CUTLASS grouped kernel (configured in sm90_config.cuh) reads, all in a caller workspace, so the
// pair is graph safe: no host read of splits, no allocation.
#pragma once

#include <typeinfo>

#include "gemm/cuda/sm90_setup.cuh"

namespace groupmm::cuda::sm90 {

// ---- host side ----------------------------------------------------------------------------------
template <class Cfg>
typename Cfg::Gemm::Arguments make_arguments(const DeviceArrays<Cfg>& arr, int G, float alpha,
                                             float beta, bool has_bias, int device, int sms,
                                             bool along_n) {
  constexpr bool kPerExpert = Cfg::kScaling == Scaling::per_expert;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  // The persistent grid is sized from sm_count and must be whole clusters: a GEMM SM limit
  // (Context::gemm_sm_count) is rounded down to a multiple of the cluster size, one cluster least.
  constexpr int kClusterSize = int(cute::size(typename Cfg::Cluster{}));
  hw.sm_count = std::max(kClusterSize, sms / kClusterSize * kClusterSize);
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
  // Set either way: the scheduler's heuristic would read host problem shapes, which we never have.
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.raster_order = along_n ? Raster::AlongN : Raster::AlongM;
  return args;
}

template <class Cfg>
size_t workspace_size(const GemmDims& d, int sms) {
  DeviceArrays<Cfg> arr = carve<Cfg>(nullptr, d.G, d.N, d.K);
  auto args = make_arguments<Cfg>(arr, static_cast<int>(d.G), 1.0f, 0.0f, false, 0, sms, false);
  return arr.bytes + Cfg::Gemm::get_workspace_size(args) + 256;
}

// What the CUTLASS kernel parameters of one launch depend on (run() below).
struct ParamsKey {
  const void* problems;  // the argument arrays (problem sizes first)
  const void* cutlass_ws;
  int64_t G, N, K;  // the arrays' layout
  float alpha, beta;
  bool bias;
  int device, sms;
  bool along_n;
  bool operator==(const ParamsKey& o) const {
    return problems == o.problems && cutlass_ws == o.cutlass_ws && G == o.G && N == o.N &&
           K == o.K && alpha == o.alpha && beta == o.beta && bias == o.bias && device == o.device &&
           sms == o.sms && along_n == o.along_n;
  }
};

template <class Cfg>
struct ParamsCache {
  ParamsKey key{};
  typename Cfg::Gemm::Params params{};
  dim3 grid;        // the persistent grid for these parameters
  size_t need = 0;  // workspace bytes the launch uses
  bool valid = false;
};

// The launch of GemmUniversalAdapter::run(params, stream) for our kernels, less its per-launch
// host work: it calls cudaFuncSetAttribute(NonPortableClusterSizeAllowed) before every cluster
// launch (our clusters have 1 or 2 CTAs, within the portable size) and recomputes the grid. The
// dynamic shared memory attribute is set by initialize(), which ran for these parameters.
template <class Cfg>
cudaError_t launch_gemm(const ParamsCache<Cfg>& c, cudaStream_t stream) {
  using Kernel = typename Cfg::GemmKernel;
  using Cluster = typename Cfg::Cluster;
  static_assert(size(Cluster{}) <= 8, "a portable cluster size (no opt-in attribute)");
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = size<0>(Cluster{});
  attr[0].val.clusterDim.y = size<1>(Cluster{});
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t lc{};
  lc.gridDim = c.grid;
  lc.blockDim = Kernel::get_block_shape();
  lc.dynamicSmemBytes = Kernel::SharedStorageSize;
  lc.stream = stream;
  lc.attrs = attr;
  lc.numAttrs = size(Cluster{}) > 1 ? 1 : 0;  // 1x1: a plain launch, as CUTLASS does
  void* args[] = {const_cast<typename Cfg::Gemm::Params*>(&c.params)};
  return cudaLaunchKernelExC(&lc, reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>),
                             args);
}

// The setup kernel of one launch: the per-expert arrays from the device splits.
template <class Cfg>
void launch_setup(Context& ctx, const GemmLaunch& a, const DeviceArrays<Cfg>& arr,
                  const LaunchPart& part) {
  const GemmDims& d = a.dims;
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
  sp.row_class = part.row_class;
  sp.write_other = part.write_other;
  sp.total_at_most = a.splits_at_most;
  setup_kernel<Cfg, 256><<<1, 256, 0, ctx.stream()>>>(sp);
  GROUPMM_CHECK_LAUNCH();
}

// The arrays' layout, the same for the two configurations of a split (engine.cu checks).
template <class Cfg>
size_t arrays_layout_id() {
  using C = Cfg;  // a function type names every type of the arrays (ElementC may be void)
  using Signature =
      void(typename C::Problem*, typename C::ElementA*, typename C::ElementB*,
           typename C::ElementC*, typename C::ElementD*, typename C::ElementBias*,
           typename C::StrideA*, typename C::StrideB*, typename C::StrideC*, typename C::StrideD*);
  return typeid(Signature).hash_code();
}

template <class Cfg>
void run(Context& ctx, const GemmLaunch& a, void* ws, size_t ws_bytes, const LaunchPart& part) {
  const GemmDims& d = a.dims;
  void* base = reinterpret_cast<void*>(align_up(reinterpret_cast<uintptr_t>(ws), 256));
  DeviceArrays<Cfg> arr = carve<Cfg>(base, d.G, d.N, d.K);
  if (part.shared == nullptr) {
    launch_setup<Cfg>(ctx, a, arr, part);
  } else {
    // Second launch of a split: the first launch's arrays with the complementary problem sizes,
    // and a CUTLASS workspace of its own.
    void* own_ws = arr.cutlass_ws;
    arr = carve<Cfg>(const_cast<void*>(part.shared), d.G, d.N, d.K);
    arr.problems = arr.problems_other;
    arr.cutlass_ws = own_ws;
  }
  const size_t arrays_bytes = carve<Cfg>(nullptr, d.G, d.N, d.K).bytes;

  // The kernel parameters depend only on the key below: problem sizes, operand pointers and TMA
  // descriptors are per-expert device arrays that the setup kernel writes and the kernel reads.
  // Building them (TMA descriptor encoding, the shared-memory attribute) costs microseconds of
  // host time per launch, so each thread keeps the last ones per configuration.
  const ParamsKey key{arr.problems,
                      arr.cutlass_ws,
                      d.G,
                      d.N,
                      d.K,
                      a.alpha,
                      a.beta,
                      a.bias != nullptr,
                      ctx.device_index(),
                      ctx.gemm_sm_count(),
                      part.along_n};
  thread_local ParamsCache<Cfg> cache;
  if (!cache.valid || !(cache.key == key)) {
    cache.valid = false;
    auto args = make_arguments<Cfg>(arr, static_cast<int>(d.G), a.alpha, a.beta, key.bias,
                                    key.device, key.sms, key.along_n);
    typename Cfg::Gemm gemm;
    const size_t cws = Cfg::Gemm::get_workspace_size(args);
    GROUPMM_CHECK(arrays_bytes + cws + 256 <= ws_bytes, "grouped_gemm: workspace too small (",
                  ws_bytes, " < ", arrays_bytes + cws + 256, ")");
    cutlass::Status st = gemm.can_implement(args);
    GROUPMM_CHECK(st == cutlass::Status::kSuccess, "grouped_gemm: CUTLASS cannot implement ",
                  Cfg::name(), ": ", cutlassGetStatusString(st));
    st = gemm.initialize(args, arr.cutlass_ws, ctx.stream());
    GROUPMM_CHECK(st == cutlass::Status::kSuccess, "grouped_gemm: CUTLASS initialize failed for ",
                  Cfg::name(), ": ", cutlassGetStatusString(st));
    cache.params = gemm.params();
    cache.grid = Cfg::Gemm::get_grid_shape(cache.params);
    cache.need = arrays_bytes + cws + 256;
    cache.key = key;
    cache.valid = true;
  }
  GROUPMM_CHECK(cache.need <= ws_bytes, "grouped_gemm: workspace too small (", ws_bytes, " < ",
                cache.need, ")");
  const cudaError_t st = launch_gemm(cache, ctx.stream());
  if (st != cudaSuccess) (void)cudaGetLastError();  // reported here, not by the next op's check
  GROUPMM_CHECK(st == cudaSuccess, "grouped_gemm: launch failed for ", Cfg::name(), ": ",
                cudaGetErrorString(st));
}

// ---- registry of instantiated configurations ---------------------------------------------------
struct KernelEntry {
  std::string (*name)();
  size_t (*workspace_size)(const GemmDims&, int);
  void (*run)(Context&, const GemmLaunch&, void*, size_t, const LaunchPart&);
  size_t (*layout_id)();
};

template <class Cfg>
KernelEntry entry() {
  return {&Cfg::name, &workspace_size<Cfg>, &run<Cfg>, &arrays_layout_id<Cfg>};
}

}  // namespace groupmm::cuda::sm90

// One translation unit per row of configs.def (CUTLASS kernels are slow to compile), generated
// by CMake (cmake/gemm_configs.cmake) as `GROUPMM_SM90_INSTANTIATE(<the row's arguments>)`. It
// checks the row's name against its parameters and defines sm90::<name>(), the KernelEntry that
// engine.cu registers.
#define GROUPMM_SM90_INSTANTIATE(NAME, ...)                                             \
  namespace groupmm::cuda::sm90 {                                                       \
  struct NAME##_row {                                                                   \
    static constexpr KernelRow value = GROUPMM_SM90_KERNEL_ROW(NAME, __VA_ARGS__);      \
  };                                                                                    \
  static_assert(name_matches(NAME##_row::value),                                        \
                "configs.def: the name " #NAME " does not spell its row's parameters"); \
  KernelEntry NAME() {                                                                  \
    return entry<ConfigOf<NAME##_row>>();                                               \
  }                                                                                     \
  }
