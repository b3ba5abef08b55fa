// schema.cpp: every op of the torch.ops.groupmm namespace, in one place. CPU and CUDA kernels are
// in ops_*.cpp, the autograd formulas in ops_autograd*.cpp; fake (meta) kernels in
// python/groupmm/_meta.py. Splits are [G] int32/int64 on the op's device; sizes never depend on
// their values.
#include <torch/library.h>

TORCH_LIBRARY(groupmm, m) {
  // grouped GEMM (gemm.hpp): forward TN, dgrad NN, wgrad NT; weights [G, N, K]
  // out_dtype: the inputs' dtype (default) or float32 (the fp32 accumulator, no 16-bit rounding)
  // splits_total (every op over grouped activations, quantized ones included): 'exact'
  // (sum(splits) == rows) or 'at_most' (sum <= rows; the rows past the sum are neither read nor
  // written, output rows there are left as allocated; a sum above rows is a device fault)
  // expected_rows (every grouped GEMM): with 'at_most', the rows the splits are expected to sum
  // to, in [1, rows] (the M rows of x or dy; wgrad's reduction rows): the kernel choice is sized
  // by them instead of the rows (gemm.hpp GroupedGemmArgs::expected_rows; which rows are read and
  // written is the splits' alone). 0: the rows. Host-known, like the shapes.
  m.def(
      "grouped_mm(Tensor x, Tensor w, Tensor splits, Tensor? bias=None, "
      "ScalarType? out_dtype=None, str splits_total='exact', int expected_rows=0) -> Tensor");
  m.def(
      "grouped_mm_dgrad(Tensor dy, Tensor w, Tensor splits, ScalarType? out_dtype=None, "
      "str splits_total='exact', int expected_rows=0) -> Tensor");
  m.def(
      "grouped_mm_wgrad(Tensor dy, Tensor x, Tensor splits, ScalarType? out_dtype=None, "
      "str splits_total='exact', int expected_rows=0) -> Tensor");
  m.def(
      "grouped_mm_wgrad_accumulate(Tensor dy, Tensor x, Tensor splits, Tensor(a!) main_grad, "
      "str splits_total='exact', int expected_rows=0) -> ()");
  m.def(
      "group_dbias(Tensor dy, Tensor splits, ScalarType? out_dtype=None, "
      "str splits_total='exact') -> Tensor");
  m.def(
      "group_dbias_accumulate(Tensor dy, Tensor splits, Tensor(a!) main_grad, "
      "str splits_total='exact') -> ()");

  // grouped GEMM over quantized operands (gemm.hpp, QuantizedGemmArgs): each operand is the list
  // of the 5 tensors group_quantize returned; recipe fp8_current, fp8_block or mxfp8. Weights
  // [G, N, K] quantized without splits (fp8_block: block_2d=True), activations with them.
  // expected_rows as above (QuantizedGemmArgs::expected_rows).
  m.def(
      "grouped_mm_fp8(Tensor[] x, Tensor[] w, Tensor splits, str recipe, "
      "str scale_layout='plain', Tensor? bias=None, bool fast_accum=False, "
      "str splits_total='exact', int expected_rows=0) -> Tensor");
  m.def(
      "grouped_mm_fp8_dgrad(Tensor[] dy, Tensor[] w, Tensor splits, str recipe, "
      "str scale_layout='plain', str splits_total='exact', int expected_rows=0) -> Tensor");
  m.def(
      "grouped_mm_fp8_wgrad(Tensor[] dy, Tensor[] x, Tensor splits, str recipe, "
      "str scale_layout='plain', ScalarType? out_dtype=None, str splits_total='exact', "
      "int expected_rows=0) -> Tensor");
  m.def(
      "grouped_mm_fp8_wgrad_accumulate(Tensor[] dy, Tensor[] x, Tensor splits, str recipe, "
      "Tensor(a!) main_grad, str scale_layout='plain', str splits_total='exact', "
      "int expected_rows=0) -> ()");

  // 4-bit expert weights (quantize.hpp nvfp4 / mxfp4, gemm.hpp W4GemmArgs): packed e2m1 pairs are
  // uint8 [G, N, K/2] (element 2j in the low nibble), as checkpoints store them.
  m.def(
      "group_quantize_w4(Tensor w, str recipe, str scale_layout='plain') -> "
      "(Tensor data, Tensor scale_inv, Tensor global_scale)");
  m.def(
      "grouped_mm_w4(Tensor x, Tensor[] w, Tensor splits, str recipe, str scale_layout='plain', "
      "Tensor? bias=None, str path='automatic', str splits_total='exact', int expected_rows=0) "
      "-> Tensor");
  m.def(
      "import_mxfp4_weights(Tensor blocks, Tensor scales, str scale_layout='plain') -> "
      "(Tensor data, Tensor scale_inv)");
  m.def(
      "export_mxfp4_weights(Tensor data, Tensor scale_inv, str scale_layout='plain') -> "
      "(Tensor blocks, Tensor scales)");

  m.def("group_offsets(Tensor splits) -> (Tensor start, Tensor end)");
  // Context::check() on torch's current stream of device_like's device (a sync; eager only)
  m.def("check_status(Tensor device_like) -> ()");

  // MoE ops (moe.hpp)
  m.def("swiglu(Tensor gate_up) -> Tensor");
  m.def("swiglu_backward(Tensor dout, Tensor gate_up) -> Tensor");
  // splits given: sum(splits) <= M rows, the rows past the sum neither read nor written
  m.def("weighted_swiglu(Tensor gate_up, Tensor prob, Tensor? splits=None) -> Tensor");
  m.def(
      "weighted_swiglu_backward(Tensor dout, Tensor gate_up, Tensor prob, Tensor? splits=None) "
      "-> (Tensor dgate_up, Tensor dprob)");
  // the parameterized one (moe.hpp SwigluForm: gpt-oss's clamped SwiGLU): g' = min(g, limit),
  // u' = clamp(u, -limit, limit), out = g' sigmoid(alpha g') (u' + up_offset) prob; limit None =
  // no clamp; interleaved: gate = column 2i, up = 2i + 1 (else the two halves)
  m.def(
      "weighted_swiglu_ex(Tensor gate_up, Tensor prob, float alpha=1.0, float? limit=None, "
      "float up_offset=0.0, bool interleaved=False) -> Tensor");
  m.def(
      "weighted_swiglu_ex_backward(Tensor dout, Tensor gate_up, Tensor prob, float alpha=1.0, "
      "float? limit=None, float up_offset=0.0, bool interleaved=False) -> "
      "(Tensor dgate_up, Tensor dprob)");
  // the router's logits GEMM (moe_router_logits): x [T, H] bf16/fp16, w [E, H], bias [E] (x's
  // dtype, added to each fp32 sum) -> [T, E] fp32
  m.def("router_logits(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
  m.def("router_logits_backward(Tensor d_logits, Tensor x, Tensor w) -> (Tensor dx, Tensor dw)");
  m.def(
      "router(Tensor logits, Tensor? expert_bias, int topk, str score='softmax', int n_group=1, "
      "int topk_group=1, bool renormalize=False, float scaling_factor=1.0, "
      "float aux_loss_coeff=0.0, float z_loss_coeff=0.0) -> "
      "(Tensor expert_ids, Tensor weights, Tensor counts, Tensor aux_loss, Tensor z_loss)");
  m.def(
      "router_backward(Tensor logits, Tensor expert_ids, Tensor counts, Tensor d_weights, "
      "str score='softmax', int n_group=1, int topk_group=1, bool renormalize=False, "
      "float scaling_factor=1.0, float aux_loss_coeff=0.0, float z_loss_coeff=0.0) -> Tensor");
  m.def(
      "permute_plan(Tensor expert_ids, int experts, int align=1, int capacity=0) -> "
      "(Tensor dest_row, Tensor row_start, Tensor kept, Tensor splits)");
  m.def(
      "permute(Tensor x, Tensor dest_row, Tensor row_start, Tensor kept, Tensor splits, int align, "
      "int capacity, Tensor? weights=None) -> (Tensor x_perm, Tensor probs)");
  m.def(
      "permute_backward(Tensor d_x_perm, Tensor dest_row, Tensor row_start, Tensor kept, "
      "Tensor splits, int align, int capacity, Tensor? d_probs=None) -> "
      "(Tensor dx, Tensor d_weights)");
  m.def(
      "unpermute(Tensor y_perm, Tensor dest_row, Tensor row_start, Tensor kept, Tensor splits, "
      "int align, int capacity, Tensor? add=None, Tensor? bias=None, Tensor? expert_ids=None, "
      "Tensor? weights=None) -> Tensor");
  // permute + grouped_mm with w [E, 2F, H] + weighted_swiglu as one kernel-layer op (x gathered
  // inside the GEMM, the activation in its epilogue; moe_gate_up_swiglu):
  // -> h [R, F], the pre-activation [R, 2F] (empty unless pre_activation), probs [R] fp32.
  // Differentiable in x, weights and w (ops_autograd_moe.cpp); training needs pre_activation=True.
  m.def(
      "gate_up_swiglu(Tensor x, Tensor dest_row, Tensor row_start, Tensor kept, Tensor splits, "
      "int align, int capacity, Tensor weights, Tensor w, bool pre_activation=False, "
      "str config='') -> (Tensor h, Tensor gate_up, Tensor probs)");
  m.def(
      "unpermute_backward(Tensor dy, Tensor dest_row, Tensor row_start, Tensor kept, "
      "Tensor splits, int align, int capacity) -> Tensor");

  // grouped quantization (quantize.hpp)
  m.def(
      "group_quantize(Tensor input, Tensor? splits, str recipe, ScalarType? fp8_dtype=None, "
      "str direction='both', str scale_layout='plain', bool pow2_scales=False, "
      "bool block_2d=False, str splits_total='exact') -> (Tensor data, Tensor scale_inv, "
      "Tensor columnwise_data, Tensor columnwise_scale_inv, Tensor amax)");
  m.def(
      "group_dequantize(Tensor data, Tensor scale_inv, Tensor columnwise_data, "
      "Tensor columnwise_scale_inv, Tensor amax, Tensor? splits, int[] shape, str recipe, "
      "ScalarType? fp8_dtype=None, str scale_layout='plain', bool block_2d=False, "
      "bool from_columnwise=False, ScalarType? out_dtype=None) -> Tensor");

  // the rules of a quantization recipe (quantize.hpp, recipe_traits): recipe 'fp8_current',
  // 'fp8_block', 'mxfp8', 'nvfp4' or 'mxfp4'; scale_dtype is the core's dtype name
  m.def(
      "recipe_traits(str recipe) -> (int row_block, int col_block, str scale_dtype, bool fp4, "
      "int gemm_k_multiple, int gemm_n_multiple, int split_multiple, int in_features_multiple, "
      "int out_features_multiple, bool e5m2_gradients)");

  // hidden test and bench hooks (ops_hooks.cpp): not an API, eager only
  m.def(
      "_core_call_us(str op, Tensor[] tensors, int[] ints=[], str recipe='mxfp8', int iters=100) "
      "-> float");
  m.def(
      "_core_grouped_linear(Tensor x, Tensor splits, Tensor weight, Tensor? bias, Tensor? dy, "
      "str recipe='bf16', bool delay_wgrad=False, bool main_grad=False, "
      "ScalarType? grad_dtype=None, bool pow2_scales=False, bool high_precision_wgrad=False) -> "
      "(Tensor y, Tensor dx, Tensor dw, Tensor db)");
  m.def(
      "_core_layer_step_us(Tensor x, Tensor splits, Tensor weight, Tensor? bias, Tensor dy, "
      "str recipe='bf16', bool delay_wgrad=False, bool main_grad=False, int iters=20, "
      "int warmup=3) -> float");
  m.def(
      "_core_moe(Tensor x, Tensor router_weight, Tensor gate_up, Tensor down, "
      "Tensor? shared_up, Tensor? shared_down, Tensor? dy, int topk, str score='softmax', "
      "bool renormalize=False, int align=1, float capacity_factor=0.0, str recipe='bf16') -> "
      "(Tensor y, Tensor dx, Tensor d_router, Tensor d_gate_up, Tensor d_down, "
      "Tensor d_shared_up, Tensor d_shared_down)");

  // grouped GEMM of one pass ('forward', 'dgrad', 'wgrad') with the splits rule chosen:
  // splits_total 'exact' (sum == rows) or 'at_most' (rows past the sum neither read nor written;
  // zero_tail: forward / dgrad output rows past the sum are zeros; expected_rows as for
  // grouped_mm, after zero_tail). groupmm.grouped_mm (the torch._grouped_mm drop-in) is built on
  // it.
  m.def(
      "grouped_gemm(Tensor a, Tensor b, Tensor splits, str gemm_pass, Tensor? bias=None, "
      "ScalarType? out_dtype=None, str splits_total='exact', bool zero_tail=False, "
      "int expected_rows=0) -> Tensor");
}

// Expert parallelism over a torch.distributed process group (ep.hpp): ep_dispatch_plan,
// ep_capacity_plan_create, ep_capacity_plan, ep_dispatch(_backward), ep_combine(_backward) are
// defined in ops_ep.cpp's TORCH_LIBRARY_FRAGMENT, after the custom classes their schemas name
// (torch.classes.groupmm.EpGroup and EpPlan).
