// CUTLASS SM90 ptr-array grouped GEMM: the kernel configuration (element types, operand layouts,
// tile, cluster, schedule, scaling) and the CUTLASS types it resolves to. One template serves every
// pass and operand format; variants are template parameters, never copies.
//
// Problem mapping (row-major tensors; CUTLASS computes D[M', N'] = A[M', K'] B[N', K']^T):
//   16-bit operands
//     forward      M'=m_g N'=N   K'=K    A=x_g  (K-major)  B=W_g (K-major)    D=y_g  row-major
//     forward swap M'=N   N'=m_g K'=K    A=W_g  (K-major)  B=x_g (K-major)    D=y_g^T col-major
//     dgrad        M'=m_g N'=K   K'=N    A=dy_g (K-major)  B=W_g (N'-major)   D=dx_g row-major
//     wgrad        M'=N   N'=K   K'=m_g  A=dy_g (M'-major) B=x_g (N'-major)   D=dW_g row-major
//   FP8 operands (wgmma reads FP8 from shared memory K-major only, so dgrad and wgrad read the
//   columnwise copies that group_quantize writes, and every pass is TN)
//     forward      M'=m_g N'=N   K'=K    A=x_g rowwise          B=W_g rowwise
//     forward swap M'=N   N'=m_g K'=K    A=W_g rowwise          B=x_g rowwise      D=y_g^T
//     dgrad        M'=m_g N'=K   K'=N    A=dy_g rowwise         B=W_g columnwise [K, N]
//     wgrad        M'=N   N'=K   K'=m_g  A=dy_g columnwise      B=x_g columnwise [K, m_g]
#pragma once

#include <string>
#include <type_traits>

#include "gemm/backends.hpp"
#include "gemm/cuda/config_row.hpp"
#include "gemm/cuda/sm90_blockwise_wide_mainloop.cuh"

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace groupmm::cuda::sm90 {

using namespace cute;

template <class T>
constexpr bool is_fp8_v =
    std::is_same_v<T, cutlass::float_e4m3_t> || std::is_same_v<T, cutlass::float_e5m2_t>;

template <class T>
const char* element_name() {
  if constexpr (std::is_same_v<T, cutlass::bfloat16_t>) return "bf16";
  if constexpr (std::is_same_v<T, cutlass::half_t>) return "fp16";
  if constexpr (std::is_same_v<T, float>) return "fp32";
  if constexpr (std::is_same_v<T, cutlass::float_e4m3_t>) return "e4m3";
  if constexpr (std::is_same_v<T, cutlass::float_e5m2_t>) return "e5m2";
  return "?";
}

// ---- kernel configuration ----------------------------------------------------------------------
template <class ElementA_, class ElementB_, class ElementD_, Role kRole_, class Tile_,
          class Cluster_, Schedule kSched_, Scaling kScaling_ = Scaling::none,
          bool kFastAccum_ = false, int kEpiTileN_ = 0, bool kWideBlockwise_ = false>
struct Sm90GroupedConfig {
  using ElementA = ElementA_;
  using ElementB = ElementB_;
  using ElementD = ElementD_;
  using Tile = Tile_;
  using Cluster = Cluster_;
  static constexpr Role kRole = kRole_;
  static constexpr Schedule kSched = kSched_;
  static constexpr Scaling kScaling = kScaling_;
  static constexpr bool kFastAccum = kFastAccum_;
  // Epilogue subtile width: 0 = CUTLASS's choice (32 columns for a 16-bit out); else the tile's
  // M by kEpiTileN. A wider subtile stages the output in fewer, larger TMA stores (fewer barriers
  // per tile), at the cost of shared memory taken from the mainloop's stages.
  static constexpr int kEpiTileN = kEpiTileN_;
  // Blockwise forward/dgrad on a 128x192 tile: groupmm's consumer mainloop and scale loader
  // (sm90_blockwise_wide_mainloop.cuh), which CUTLASS's collective cannot do with 128x128
  // weight blocks.
  static constexpr bool kWideBlockwise = kWideBlockwise_;
  static constexpr bool kFp8 = is_fp8_v<ElementA>;

  static_assert(kFp8 == is_fp8_v<ElementB>, "both operands are FP8 or neither");
  static_assert(kFp8 || (std::is_same_v<ElementA, ElementB> &&
                         (std::is_same_v<ElementA, cutlass::bfloat16_t> ||
                          std::is_same_v<ElementA, cutlass::half_t>)),
                "16-bit operands are both bf16 or both fp16");
  static_assert(!kFp8 || kScaling != Scaling::none, "FP8 operands carry scales");
  static_assert(kFp8 || kScaling != Scaling::blockwise, "block scales are FP8's");
  static_assert(kFp8 || kScaling == Scaling::none || kRole == Role::forward,
                "16-bit operands take a per-expert alpha in the forward pass only (4-bit weights)");
  static_assert(!kFp8 || kRole != Role::forward_swap || std::is_same_v<ElementA, ElementB>,
                "a swapped FP8 forward has one operand type (the weight becomes A)");
  static_assert(!kFastAccum || kScaling == Scaling::per_expert,
                "fast accumulation is an option of per-expert FP8");
  static_assert(kRole == Role::wgrad || std::is_same_v<ElementD, ElementA> ||
                    (kFp8 && !std::is_same_v<ElementD, float>) ||
                    (!kFp8 && kScaling == Scaling::none && std::is_same_v<ElementD, float>),
                "forward/dgrad write the operand dtype or fp32 (FP8: a 16-bit dtype)");
  static_assert(kSched == Schedule::pingpong || size<0>(Tile{}) >= 128,
                "cooperative schedules split M over two warpgroups");
  static_assert(kScaling != Scaling::blockwise || size<2>(Tile{}) == 128,
                "blockwise scales are applied per 128-deep K tile");
  static_assert(
      kEpiTileN == 0 || (kSched == Schedule::cooperative && kEpiTileN % 32 == 0 &&
                         size<1>(Tile{}) % (kEpiTileN > 0 ? kEpiTileN : 1) == 0),
      "an explicit epilogue subtile is a cooperative tile's full M by a divisor of its N");
  static_assert(!kWideBlockwise || (kScaling == Scaling::blockwise &&
                                    (kRole == Role::forward || kRole == Role::dgrad) &&
                                    kSched == Schedule::cooperative && size<0>(Tile{}) == 128 &&
                                    size<1>(Tile{}) == 192),
                "the wide blockwise mainloop: a cooperative 128x192 blockwise forward or dgrad");

  // FP8 wgmma reads K-major shared memory only: every FP8 pass is TN (see the mapping above).
  using LayoutA = std::conditional_t<kRole == Role::wgrad && !kFp8, cutlass::layout::ColumnMajor,
                                     cutlass::layout::RowMajor>;
  using LayoutB = std::conditional_t<(kRole == Role::dgrad || kRole == Role::wgrad) && !kFp8,
                                     cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  using LayoutD = std::conditional_t<kRole == Role::forward_swap, cutlass::layout::ColumnMajor,
                                     cutlass::layout::RowMajor>;
  // The wgrad epilogue reads C (= D) for beta = 1, which only an fp32 main_grad takes (the
  // validation refuses beta = 1 for a 16-bit out); the others have no source. A source costs a
  // second tensormap update per expert change in the ptr-array epilogue.
  static constexpr bool kHasSource = kRole == Role::wgrad && std::is_same_v<ElementD, float>;
  using ElementC = std::conditional_t<kHasSource, ElementD, void>;
  // Bias is read in the output's type: the operand dtype for 16-bit outputs, fp32 with an fp32
  // out (unused by wgrad, which has no bias).
  using ElementBias = ElementD;
  static constexpr int kAlignA = 16 / sizeof(ElementA);
  static constexpr int kAlignB = 16 / sizeof(ElementB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);

  // ---- mainloop schedule ----
  using KernelSchedule = std::conditional_t<
      kScaling == Scaling::blockwise,
      std::conditional_t<kSched == Schedule::cooperative,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise>,
      std::conditional_t<
          kFastAccum,
          std::conditional_t<kSched == Schedule::cooperative,
                             cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum,
                             cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum>,
          std::conditional_t<kSched == Schedule::cooperative,
                             cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                             cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>>>;
  using EpilogueSchedule =
      std::conditional_t<kSched == Schedule::cooperative,
                         cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
                         cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;

  // ---- block scales (blockwise only): K-major fp32, one per 128 K and per row of the operand
  // (1x128), per 128 rows (128x128 weights), compact per expert. These are exactly the plain
  // layouts group_quantize writes: rowwise [rows, K/128], 128x128 [row blocks, K/128] and the
  // columnwise per-expert [K, ceil(m_g/128)] blocks.
  // (Both K-major: CUTLASS 4.2 derives SFB's shared-memory strides from SFA's major, so mixed
  // majors would be wrong.)
  // Rows per scale: 128 for the weights' 128x128 blocks (B, or A when swapped), else 1. The wide
  // blockwise tile declares 64 to get three scale slots per stage; its own loader reads the
  // 128-row blocks.
  static constexpr int kScaleRowsA = kRole == Role::forward_swap ? 128 : 1;
  static constexpr int kScaleRowsB = kRole == Role::wgrad || kRole == Role::forward_swap ? 1
                                     : kWideBlockwise                                    ? 64
                                                                                         : 128;
  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<kScaleRowsA, kScaleRowsB, 128, cute::GMMA::Major::K,
                                                cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using MainloopLayoutA = std::conditional_t<kScaling == Scaling::blockwise,
                                             cute::tuple<LayoutA*, LayoutSFA*>, LayoutA*>;
  using MainloopLayoutB = std::conditional_t<kScaling == Scaling::blockwise,
                                             cute::tuple<LayoutB*, LayoutSFB*>, LayoutB*>;

  // ---- epilogues ----
  // forward/dgrad: D = alpha * acc + bias[g] (bias along N for row-major y, along M' when the
  // operands are swapped; a null pointer array means no bias). Per-expert FP8 reads alpha through
  // a per-group pointer array. wgrad: D = alpha * acc + beta * C (alpha per group likewise).
  using BiasBroadcast = std::conditional_t<
      kRole == Role::forward_swap,
      cutlass::epilogue::fusion::Sm90ColBroadcast<0, Tile, ElementBias*, float, Stride<_1, _0, _0>>,
      cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, ElementBias*, float,
                                                  Stride<_0, _1, _0>>>;
  using AlphaBroadcast = std::conditional_t<
      kScaling == Scaling::per_expert,
      cutlass::epilogue::fusion::Sm90ScalarBroadcastPtrArray<float, Stride<_0, _0, int64_t>>,
      cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>>;
  using BiasEVT = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      AlphaBroadcast, cutlass::epilogue::fusion::Sm90AccFetch, BiasBroadcast>;
  using LinComb = cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementD, float>;
  using FusionOp = std::conditional_t<kRole == Role::wgrad, LinComb, BiasEVT>;

  using EpilogueTile =
      std::conditional_t<kEpiTileN == 0, cutlass::epilogue::collective::EpilogueTileAuto,
                         Shape<decltype(size<0>(Tile{})), Int<(kEpiTileN > 0 ? kEpiTileN : 1)>>>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, EpilogueTile, float,
      float, ElementC, LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD, EpilogueSchedule,
      FusionOp>::CollectiveOp;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, MainloopLayoutA, kAlignA,
      ElementB, MainloopLayoutB, kAlignB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using CollectiveMainloop =
      std::conditional_t<kWideBlockwise, BlockwiseWideMainloop<BuiltMainloop>, BuiltMainloop>;

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
    const char* scaling = kScaling == Scaling::per_expert  ? " per-expert scaled"
                          : kScaling == Scaling::blockwise ? " block scaled"
                                                           : "";
    return detail::cat(
        "sm90 ", role, " ", element_name<ElementA>(), "x", element_name<ElementB>(), "->",
        element_name<ElementD>(), scaling, kFastAccum ? " fast-accum" : "", " tile ",
        int(size<0>(Tile{})), "x", int(size<1>(Tile{})), "x", int(size<2>(Tile{})), " cluster ",
        int(size<0>(Cluster{})), "x", int(size<1>(Cluster{})), " ",
        kSched == Schedule::cooperative ? "cooperative" : "pingpong",
        kEpiTileN == 0 ? std::string()
                       : detail::cat(" epilogue ", int(size<0>(Tile{})), "x", kEpiTileN),
        kWideBlockwise ? " wide blockwise mainloop" : "");
  }
};

// ---- a row of configs.def as a configuration -----------------------------------------------
// The element type of a DType the kernels take (void for others, which the config refuses).
template <DType T>
auto element_of() {
  if constexpr (T == DType::bf16)
    return cutlass::bfloat16_t{};
  else if constexpr (T == DType::fp16)
    return cutlass::half_t{};
  else if constexpr (T == DType::fp32)
    return float{};
  else if constexpr (T == DType::fp8e4m3)
    return cutlass::float_e4m3_t{};
  else if constexpr (T == DType::fp8e5m2)
    return cutlass::float_e5m2_t{};
}
template <DType T>
using ElementOf = decltype(element_of<T>());

// Row: a type whose static constexpr KernelRow `value` is the row (GROUPMM_SM90_INSTANTIATE).
template <class Row, const KernelRow& R = Row::value>
using ConfigOf =
    Sm90GroupedConfig<ElementOf<R.a>, ElementOf<R.b>, ElementOf<R.out>, R.role,
                      Shape<Int<R.tile_m>, Int<R.tile_n>, Int<R.tile_k>>,
                      Shape<Int<R.cluster_m>, Int<R.cluster_n>, _1>, R.schedule,
                      scaling_of(R.recipe), R.fast_accum, R.epilogue_n, R.wide_blockwise>;

}  // namespace groupmm::cuda::sm90
