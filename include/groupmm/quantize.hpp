// groupmm/quantize.hpp: grouped quantization of MoE activations and weights in one launch,
// dequantization, scale swizzling, and the fused bias-gradient + quantize op.
//
// Numerics are exactly those of docs/numerics.md; the CPU reference and the CUDA kernels agree
// bit for bit (data and scales). Recipes (QuantRecipe in core.hpp):
//   fp8_current  FP8 (e4m3 or e5m2) with one scale per expert from the expert's amax.
//                scale_g = fmax / amax_g (1 when amax_g is 0, not finite, or the quotient is not
//                finite); pow2_scales rounds scale_g down to a power of two. scale_inv_g =
//                1/scale_g.
//   fp8_block    FP8 with fp32 block scales (DeepSeek-V3): 1x128 rowwise / 128x1 columnwise, or
//                128x128 for weights (block_2d). scale_inv = amax_block / fmax (pow2_scales:
//                rounded up to a power of two); q = fp8(x * scale), scale = fmax / amax_block (or
//                1/scale_inv with pow2). amax_block 0, not finite, or scale_inv not a normal fp32:
//                scale = scale_inv = 1.
//   mxfp8        OCP MX: 1x32 rowwise / 32x1 columnwise blocks, E8M0 scales, e4m3 (or e5m2) data;
//                the e8m0 exponent is float_to_e8m0_roundup(amax_block * (1/fmax)).
//   nvfp4        E2M1 data (two per byte, element 2j in the low nibble), 1x16 rowwise / 16x1
//                columnwise blocks (16x16 for weights with block_2d), E4M3 block scales, an fp32
//                per-expert S_enc = 2688 / amax_g (1 when amax_g is 0 / not finite / the quotient
//                is not finite); s_b = e4m3(amax_block * (S_enc / 6)); q = e2m1(x * scale_b)
//                with scale_b = S_enc / fp32(s_b): the textbook formula is evaluated as
//                x * (S_enc / s_b), as TransformerEngine does; one division per block (a quotient
//                past FLT_MAX saturates to FLT_MAX; s_b = 0 encodes every element as 0).
//   mxfp4        OCP MX with E2M1 data packed as nvfp4's (element 2j in the low nibble), 1x32
//                rowwise / 32x1 columnwise blocks, E8M0 scales by the mxfp8 rule with fmax = 6:
//                e = float_to_e8m0_roundup(amax_block * (1/6)), q = e2m1(x * 2^(127-e)) (a NaN
//                block, e = 255, encodes every element as 6); dequant q * 2^(e-127). For weights:
//                the format open-weight MoE checkpoints ship (import_mxfp4_weights below).
// Block amax: max |x| over the block; a NaN anywhere in the block makes it NaN (exact and
// order-independent on every backend). Blocks never straddle two experts: a partial block at the
// end of an expert is quantized over its valid rows only.
//
// ---- Layouts (M = M_total rows, K columns, G experts, m_g = rows of expert g) -----------------
// Expert g owns rows [start_g, start_g + m_g) with start_g = sum_{j<g} m_j. Derived per expert:
//   tiles_g  = ceil(m_g / 128)          tile_start_g = sum_{j<g} tiles_j
//   nb_g     = ceil(m_g / Bc)           cb_start_g   = sum_{j<g} nb_j   (Bc: column block rows)
//   cs4_g    = roundup(nb_g, 4)         cs4_start_g  = sum_{j<g} cs4_j
// rowwise data             [M, K] row-major in the data dtype (fp4e2m1x2: M*K/2 bytes).
// columnwise data          per expert the transposed [K, m_g] block, row-major (tokens contiguous),
//                          stored at element offset K*start_g; the whole buffer is [K, M]-sized.
//                          This is what a grouped wgrad GEMM (dW_g = dy_g^T x_g) reads as a K-major
//                          operand with leading dimension m_g.
// rowwise scales, plain    1xB blocks: [M, K/B] row-major (row = token).
//                          fp8 128x128 (weights): [M/128 + G, K/128]; expert g's block-rows start
//                          at row tile_start_g.
// rowwise scales, swizzled [M + 127*G, roundup(K/B, 4)] bytes; expert g's 128-row-padded block
//                          starts at swizzled row 128*tile_start_g; scale (r, c) of the block goes
//                          to (r/128)*128*Kp + (c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + (c%4).
// columnwise scales, plain per expert the [K, nb_g] scales of the transposed block, row-major, at
//                          element offset K*cb_start_g; buffer [M/Bc + G, K]-sized.
//                          fp8 128x128: per expert [K/128, nb_g] at (K/128)*cb_start_g.
// columnwise scales, swizzled per expert the [K, nb_g] scales padded to [roundup(K,128),
//                          roundup(nb_g,4)] and swizzled, at byte offset
//                          roundup(K,128)*cs4_start_g; buffer [M/Bc + 4*G, roundup(K,128)]-sized.
// rowwise scales, mn_major fp8_block only (the layout DeepGEMM and cuBLAS blockwise-scaled FP8
//                          GEMMs read, TransformerEngine's GEMM-ready one): tokens contiguous,
//                          [K/128, Mp] with Mp = roundup(M, 4) (16-byte aligned rows); scale
//                          (row m, block c) at c*Mp + m. 128x128: [K/128, roundup(M/128 + G, 4)],
//                          scale (block-row r, c) at c*ld + r.
// columnwise scales, mn_major fp8_block: per expert the [nb_g, K] scales (K contiguous) at
//                          element offset K*cb_start_g, scale (k, j) at K*(cb_start_g + j) + k;
//                          buffer [M/128 + G, K]. 128x128: per expert [nb_g, K/128].
// Per-expert padding inside a swizzled block is written as 0. Entries of a scale buffer past the
// last expert's blocks (the slack of the host-known bound; for mn_major rowwise scales, each scale
// column's entries past the splits' sum) are written 0, so no byte of a scale buffer depends on
// what its allocator handed out. Exception: plain 1xB rowwise scales ([M, K/B]) leave the rows
// past sum(splits) unwritten, as the data rows.
// fp8_current: scale_inv [G] fp32 serves both copies; amax [G] fp32 is written.
// nvfp4: amax [G] and global_scale [G] (S_enc) fp32 are written; dequant = q * fp32(s_b) / S_enc,
// and a GEMM's per-expert alpha is (1/S_enc_a) * (1/S_enc_b). mxfp4 has no per-expert scalars.
// NVFP4 and MXFP4 columnwise copies need even m_g (packed nibbles of one byte never belong to two
// rows); an odd split sets kFaultSplitAlignment and that expert's columnwise copy is skipped.
//
// ---- Contract ----------------------------------------------------------------------------------
// Inputs: activations [M, K] (splits [G] int32/int64, device) or weights [G, N, K] (splits
// absent, every expert has N rows). bf16, fp16 or fp32; 16-byte aligned pointers. K must be a
// multiple of the rowwise block (recipe_traits(recipe).row_block: 128 fp8_block, 32 mxfp8 and
// mxfp4, 16 nvfp4, 16 fp8_current).
// Swizzled scales: mxfp8, nvfp4 and mxfp4 only; mn_major scales: fp8_block only. block_2d:
// weights only, fp8_block or nvfp4.
// Device faults in splits: the splits rule of offsets.hpp with M = rows_total, reported with
// OpId::group_quantize; rows past sum(splits) are left unwritten. Never writes out of bounds.
// Graph safe: no host read of splits, no sync, no allocation when a workspace of
// group_quantize_workspace_size() bytes is passed (or reserved on the Context before capture).
// The first call of a kernel on a Context sets its shared-memory attribute on the device
// (cudaFuncSetAttribute, not a stream operation); warm up eagerly on that Context before capturing.
// Launches: a plan kernel (per-expert offsets), an amax kernel (fp8_current, nvfp4, unless fused),
// one quantize kernel over all experts, and a reduce kernel for dbias. Minimum SM: sm_90 (CUDA).
// Speed: fp8_current, fp8_block and mxfp8 are bandwidth kernels. NVFP4 has no bandwidth target on
// sm_90: Hopper has no FP4 arithmetic, so NVFP4 serves weight storage (4-bit weights x bf16
// activations) and parity with Blackwell recipes; it is kept exact, not fast.
#pragma once

#include <string>

#include "groupmm/core.hpp"

namespace groupmm {

// ---- Recipe traits -----------------------------------------------------------------------------
// The rules each recipe imposes on shapes, stated once. Validation reads them (group_quantize's K,
// the quantized and 4-bit grouped GEMMs' N, K and splits), so do both GroupedLinear
// implementations (nn/grouped_linear.hpp and the torch package, through the op
// torch.ops.groupmm.recipe_traits) and the MoE blocks' default padding.
//
// clang-format off
//   recipe       row_block col_block scale_dtype fp4  gemm K/N  split  features in/out  e5m2 grads
//   none         1         1         fp32        no   1 / 1     1      1 / 1            -
//   fp8_current  16        128       fp32        no   16 / 16   16     16 / 16          yes
//   fp8_block    128       128       fp32        no   128 / 128 16     128 / 128        no
//   mxfp8        32        32        e8m0        no   16 / 16   1      32 / 32          yes
//   nvfp4        16        16        fp8e4m3     yes  32 / 8    1      32 / 8           no
//   mxfp4        32        32        e8m0        yes  32 / 8    1      32 / 8           no
// clang-format on
// (fp8_current has no blocks: its row_block is the quantizer's K rule, its col_block the
// per-expert tile.) Host only; a constant function of the recipe.
struct RecipeTraits {
  int row_block = 1;  // block length along K of rowwise scales; K must be a multiple of it
  int col_block = 1;  // block length along M (tokens) of columnwise scales
  DType scale_dtype = DType::fp32;  // of the block scales (fp32, e8m0 or fp8e4m3)
  bool fp4 = false;                 // E2M1 data, two values per byte (fp4e2m1x2)
  // The recipe's grouped GEMM (gemm.hpp): K and N multiples. FP8 and MXFP8 operands
  // (QuantizedGemmArgs): on CUDA. 4-bit weights (W4GemmArgs): on both backends.
  int gemm_k_multiple = 1;
  int gemm_n_multiple = 1;
  // Rows per expert that the quantized wgrad GEMM needs (it reads the columnwise copies with
  // leading dimension m_g): an expert whose split is not a multiple sets kFaultSplitAlignment.
  // MoE blocks pad experts to it by default.
  int split_multiple = 1;
  // A GroupedLinear in this recipe (nn/grouped_linear.hpp): in_features (K) and out_features (N)
  // multiples, what its quantizations and GEMMs need together.
  int in_features_multiple = 1;
  int out_features_multiple = 1;
  bool e5m2_gradients = false;  // the layer may quantize dy as fp8e5m2 (grad_dtype)
  std::string to_string() const;
};
RecipeTraits recipe_traits(QuantRecipe recipe);

enum class QuantDirection : uint8_t { rowwise = 1, columnwise = 2, both = 3 };
const char* quant_direction_name(QuantDirection d);
inline bool has_rowwise(QuantDirection d) {
  return (static_cast<int>(d) & 1) != 0;
}
inline bool has_columnwise(QuantDirection d) {
  return (static_cast<int>(d) & 2) != 0;
}

// ScaleLayout (core.hpp): plain: row-major as listed; swizzled: 128x4 (mxfp8, nvfp4, mxfp4);
// mn_major: tokens contiguous (fp8_block). See "Layouts".

// How fp8_current and nvfp4 obtain each expert's amax, which they need before they scale any
// element. Every choice gives bit-identical results; only speed differs.
//  - separate: a streaming amax pass, then the quantize pass (the input is read twice from DRAM);
//  - fused: one kernel whose amax items run `amax_lag` experts ahead of its quantize items, so
//    that the quantize pass re-reads the tiles from L2;
//  - automatic: the one measured faster for the recipe: fused for fp8_current, separate for
//    nvfp4 (see docs/decisions.md, "Quantize: fused amax schedule for fp8_current, separate pass
//    for nvfp4").
enum class AmaxSchedule : uint8_t { automatic, separate, fused };
const char* amax_schedule_name(AmaxSchedule s);

struct QuantizeConfig {
  QuantRecipe recipe = QuantRecipe::mxfp8;
  DType fp8_dtype = DType::fp8e4m3;  // fp8_current / fp8_block / mxfp8 data: fp8e4m3 or fp8e5m2
  bool pow2_scales = false;          // fp8_current, fp8_block
  bool block_2d = false;             // weights: fp8_block 128x128, nvfp4 16x16
  QuantDirection direction = QuantDirection::both;
  ScaleLayout scale_layout = ScaleLayout::plain;  // swizzled: mx*, nvfp4; mn_major: fp8_block
  AmaxSchedule amax_schedule = AmaxSchedule::automatic;  // fp8_current, nvfp4 (CUDA backend)
  int amax_lag = 0;  // fused schedule: experts between amax and quantize items; 0 = automatic
  std::string to_string() const;

  int row_block() const;  // recipe_traits(recipe).row_block (16 for fp8_current)
  int col_block() const;  // recipe_traits(recipe).col_block (128 for fp8_current)
  DType data_dtype() const;
  DType scale_dtype() const;  // recipe_traits(recipe).scale_dtype: fp32, e8m0 or fp8e4m3
};

// What a quantized output needs (dtype + shape; rank 0 = not produced).
struct TensorSpec {
  DType dtype = DType::fp32;
  int rank = 0;
  std::array<int64_t, 3> shape{0, 0, 0};
  bool present() const { return rank > 0; }
  int64_t numel() const;
  std::string to_string() const;
};

struct QuantizedShapes {
  TensorSpec data, scale_inv, columnwise_data, columnwise_scale_inv, amax, global_scale;
  std::string to_string() const;
};

// Host-known output sizes for `rows_total` rows (M_total, or G*N for weights) of K columns in G
// experts. Throws the same errors as group_quantize for an invalid (K, config).
QuantizedShapes group_quantize_shapes(int64_t rows_total, int64_t K, int64_t G,
                                      const QuantizeConfig& cfg);

// Owning buffers for one quantized grouped tensor (tests, tools, layers).
struct QuantizedBuffers {
  Tensor data, scale_inv, columnwise_data, columnwise_scale_inv, amax, global_scale;
  // A GroupedTensor over these buffers (splits: the activation's splits, or absent for weights).
  GroupedTensor view(int64_t G, const TensorView& splits, const QuantizeConfig& cfg) const;
};
QuantizedBuffers allocate_quantized(const QuantizedShapes& s, Device d,
                                    cudaStream_t stream = nullptr);

struct GroupQuantizeArgs {
  TensorView
      input;  // [M, K] activations ([T, K] with row_map) or [G, N, K] weights; bf16/fp16/fp32
  TensorView splits;  // [G] int32/int64 row counts (device); absent for weights
  // exact: sum(splits) == M (a short sum is kFaultSplitsTotalMismatch). at_most (activations
  // only): sum(splits) <= M; the input rows past the sum are not read and the outputs' rows past
  // it are not written (data, columnwise data, plain 1xB rowwise scales), a short sum is no fault.
  // The scale buffers' slack is written 0 as always ("Layouts"; with at_most it also covers the
  // block rows the missing rows would have had), and amax / global_scale per expert as always.
  // On the rows the experts own, every output byte is exact mode's over a buffer of sum(splits)
  // rows. A sum above M is reported as in exact mode.
  SplitsTotal splits_total = SplitsTotal::exact;
  // Optional, activations only: the rows are gathered. row_map [M] int32 (device): output row r
  // quantizes input row row_map[r] of input [T, K] (any T), -1 a zero row (moe_permute_sources'
  // row map: the permuted rows straight from x, no permuted copy). Every output byte equals the
  // quantization of the gathered [M, K] rows; M = row_map.shape[0] is the rows the splits and
  // the outputs describe. An entry outside [-1, T) is kFaultBadIndex (read as a zero row);
  // entries past sum(splits) (at_most) are not read. fp8_current and fp8_block with bf16 input
  // (the FP8 training recipes' activations), not with amax_schedule=separate.
  TensorView row_map;
  QuantizeConfig config;
  // Outputs (caller-provided, at least group_quantize_shapes() elements, dtypes as given there):
  // out.data / out.scale_inv when rowwise, out.columnwise_data / out.columnwise_scale_inv when
  // columnwise, out.amax (fp8_current, nvfp4), out.global_scale (nvfp4).
  GroupedTensor out;
  std::string to_string() const;
};

// Device workspace bytes that group_quantize / bgrad_group_quantize need (host-known).
size_t group_quantize_workspace_size(const Context& ctx, const GroupQuantizeArgs& args,
                                     bool with_dbias = false);

// Quantizes every expert of args.input in one pass; returns args.out with recipe, splits,
// num_groups and scale_layout filled in. workspace null: the Context's workspace is used.
GroupedTensor group_quantize(Context& ctx, const GroupQuantizeArgs& args, void* workspace = nullptr,
                             size_t workspace_bytes = 0);

// Fused: the same quantization of dy, plus db[g, :] = sum of dy_g's rows (activations only).
// dbias [G, K] bf16/fp16/fp32; a zero-row expert gets 0. Summation order (bit-exact on both
// backends): fp32; per 128-row tile of the expert, per 16-row segment a sequential sum from +0,
// the tile sums its 8 segments in order, the expert sums its tiles in order.
GroupedTensor bgrad_group_quantize(Context& ctx, const GroupQuantizeArgs& args,
                                   const TensorView& dbias, void* workspace = nullptr,
                                   size_t workspace_bytes = 0);

// The config a grouped tensor from group_quantize was written with, as far as the tensor records
// it (recipe, data dtype, scale layout, 2-D blocks, the copies present; pow2_scales and the amax
// schedule are not recorded and left at their defaults): what group_dequantize needs.
QuantizeConfig quantize_config_of(const GroupedTensor& t);

// ---- dequantize ----------------------------------------------------------------------------
struct GroupDequantizeArgs {
  GroupedTensor in;  // as returned by group_quantize (recipe, splits, views)
  QuantizeConfig config;
  bool from_columnwise = false;  // read the columnwise copy instead of the rowwise one
  TensorView out;                // [M, K] or [G, N, K], bf16/fp16/fp32, un-transposed
  // at_most (activations only; GroupQuantizeArgs::splits_total): sum(in.splits) <= M, the rows
  // past the sum neither read nor written (out rows past it stay as they were).
  SplitsTotal splits_total = SplitsTotal::exact;
  std::string to_string() const;
};
// out = dequantized values (rows past sum(splits) unwritten). Graph safe as group_quantize.
void group_dequantize(Context& ctx, const GroupDequantizeArgs& args, void* workspace = nullptr,
                      size_t workspace_bytes = 0);
size_t group_dequantize_workspace_size(const Context& ctx, const GroupDequantizeArgs& args);

// ---- swizzle ---------------------------------------------------------------------------------
// Converts grouped 1-byte scales (e8m0 or fp8e4m3) between the plain and the swizzled layout
// described above. columnwise=false: rowwise scales, plain [M, C] <-> swizzled
// [M + 127*G, roundup(C,4)]. columnwise=true: per-expert [K, nb_g] (nb_g = ceil(m_g/block)) plain
// <-> swizzled (C = K). Swizzling writes padding and the slack past the last expert's blocks as
// 0; unswizzling writes the plain columnwise slack as 0 (plain rowwise rows past sum(splits) stay
// unwritten). Graph safe as group_quantize.
struct SwizzleScalesArgs {
  TensorView splits;       // [G] device row counts of the quantized tensor, or absent (weights):
  int64_t groups = 0;      // then G = groups uniform groups of rows_total / G rows
  int64_t rows_total = 0;  // M
  int64_t cols = 0;        // C = K/B (rowwise) or K (columnwise)
  bool columnwise = false;
  int block = 32;          // columnwise: block rows Bc (16 or 32)
  bool unswizzle = false;  // false: plain -> swizzled; true: swizzled -> plain
  TensorView plain;        // see above (numel >= the plain size)
  TensorView swizzled;     // numel >= the swizzled size
  std::string to_string() const;
};
int64_t swizzled_scales_numel(int64_t rows_total, int64_t cols, int64_t G, bool columnwise,
                              int block);
int64_t plain_scales_numel(int64_t rows_total, int64_t cols, int64_t G, bool columnwise, int block);
void swizzle_scales(Context& ctx, const SwizzleScalesArgs& args, void* workspace = nullptr,
                    size_t workspace_bytes = 0);
size_t swizzle_scales_workspace_size(int64_t G);

// ---- MXFP4 checkpoint tensors -------------------------------------------------------------------
// Open-weight MoE checkpoints ship MXFP4 expert weights [G, N, K] as two uint8 tensors:
//   blocks [G, N, K/32, 16]  the 32 E2M1 codes of each 1x32 block along K, two per byte, element 2j
//                            in the low nibble: byte for byte the data layout above ([G*N, K/2]);
//   scales [G, N, K/32]      each block's E8M0 exponent: the plain rowwise scale layout.
// import_mxfp4_weights relays them into the rowwise copy that group_quantize writes for weights
// with config {mxfp4, rowwise, weights.scale_layout} (plain: copies; swizzled: the 128x4 layout
// with zero padding and zero slack); export_mxfp4_weights is the inverse. A relayout, never a
// requantization: import then export returns the checkpoint's bytes, and importing the blocks and
// scales of values equals quantizing those values. Both backends; stream-ordered copies (graph
// safe; the swizzled layout needs swizzle_scales_workspace_size(G) bytes of workspace, or the
// Context's).
struct Mxfp4CheckpointArgs {
  int64_t G = 0, N = 0, K = 0;  // the weights' shape; K a multiple of 32
  // Checkpoint side: any views of the right byte count (a TensorView has rank <= 3; view blocks
  // as e8m0 bytes, e.g. [G * N, K / 2], or as fp4e2m1x2 [G, N, K]; scales as e8m0).
  TensorView blocks;  // G*N*K/2 bytes
  TensorView scales;  // G*N*K/32 bytes
  // Our side: data fp4e2m1x2 (>= G*N*K elements) and scale_inv e8m0 (group_quantize_shapes'
  // size for the layout); recipe mxfp4 (import sets it), scale_layout plain or swizzled.
  GroupedTensor weights;
  std::string to_string() const;
};
// Returns args.weights with num_groups, recipe and splits (absent) filled in.
GroupedTensor import_mxfp4_weights(Context& ctx, const Mxfp4CheckpointArgs& args,
                                   void* workspace = nullptr, size_t workspace_bytes = 0);
void export_mxfp4_weights(Context& ctx, const Mxfp4CheckpointArgs& args, void* workspace = nullptr,
                          size_t workspace_bytes = 0);

// The swizzled 128x4 index of scale (r, c) in a matrix with Kp (multiple of 4) padded columns.
inline int64_t swizzle_128x4_index(int64_t r, int64_t c, int64_t Kp) {
  return (r / 128) * 128 * Kp + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

}  // namespace groupmm
