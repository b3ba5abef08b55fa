// binding.hpp: the glue between torch tensors and groupmm's core (TensorView, Context).
//
// Every op kernel builds one Call: it picks the device guard, the groupmm Context for torch's
// current stream, turns torch tensors into TensorViews (checking that all of them live on the
// op's device), allocates outputs and workspace from torch's allocator, and at the end reports
// device faults at once on the CPU (free there: the work is already done). On CUDA, faults stay
// in the Context's status block until groupmm.check() (a sync), as in the core.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "groupmm/core.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/quantize.hpp"

// Registers an ops file's kernels (a function of groupmm_torch::Kernels&) for both dispatch keys:
// one kernel serves CPU and CUDA tensors, the core dispatching on the Context's device.
#define GROUPMM_TORCH_CPU_AND_CUDA(register_fn) \
  TORCH_LIBRARY_IMPL(groupmm, CPU, m) {         \
    ::groupmm_torch::Kernels kernels(m);        \
    register_fn(kernels);                       \
  }                                             \
  TORCH_LIBRARY_IMPL(groupmm, CUDA, m) {        \
    ::groupmm_torch::Kernels kernels(m);        \
    register_fn(kernels);                       \
  }

namespace groupmm_torch {

// A core error's message without the source locations groupmm::Error gives C++ callers
// (" [tensor.cpp:197]", one per nested error): Python users get the message alone, as users of the
// command line do. Anything else in the message is kept.
std::string without_source_locations(const std::string& msg);

// Registers op kernels with a torch::Library, each wrapped once here, so that every op raises the
// core's errors (groupmm::Error: validation, device faults, CUDA errors) in Python without source
// locations. The wrapper adds one call and a zero-cost try block to an op's host path.
class Kernels {
 public:
  explicit Kernels(torch::Library& m) : m_(m) {}

  template <class R, class... Args>
  Kernels& impl(const char* name, R (*fn)(Args...)) {
    m_.impl(name, [fn](Args... args) -> R {
      try {
        return fn(std::forward<Args>(args)...);
      } catch (const groupmm::Error& e) {
        throw groupmm::Error(without_source_locations(e.what()));
      }
    });
    return *this;
  }

 private:
  torch::Library& m_;
};

groupmm::DType to_groupmm(at::ScalarType t, const char* op, const char* arg);
// The torch dtype of a groupmm dtype (packed fp4 pairs travel as uint8 bytes).
at::ScalarType torch_dtype(groupmm::DType t);

// String options shared by several ops; errors name the op and the value.
groupmm::QuantRecipe recipe_of(c10::string_view r, const char* op);
groupmm::ScaleLayout layout_of(c10::string_view l, const char* op);
// An op's splits_total argument: 'exact' (sum(splits) == rows) or 'at_most' (sum <= rows, the
// rows past the sum neither read nor written; core.hpp SplitsTotal).
groupmm::SplitsTotal splits_total_of(c10::string_view t, const char* op);

// An optional tensor that an op takes or returns as "absent": a 1-D tensor with no element.
inline bool absent(const at::Tensor& t) {
  return t.dim() == 1 && t.numel() == 0;
}
// Checks that a part of a quantized tensor is exactly what group_quantize_shapes says it is
// (dtype and shape), naming `what` (e.g. "group_quantize(recipe=fp8_block, ...)") when it is not.
void check_spec(const char* op, const std::string& arg, const at::Tensor& t,
                const groupmm::TensorSpec& spec, const std::string& what);

// The Context that runs ops on `device` and torch's current stream there (created on first use
// and kept for the process: a graph captured on a stream must find the same Context at replay
// time, and a Context holds the status block its kernels write).
groupmm::Context& context_for(const at::Device& device);

class Call {
 public:
  Call(const char* op, const at::Tensor& anchor);
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  groupmm::Context& ctx() { return *ctx_; }
  const at::TensorOptions& options() const { return opts_; }

  // A view of an input (a contiguous copy is made and kept alive when it is not contiguous).
  groupmm::TensorView in(const at::Tensor& t, const char* arg);
  groupmm::TensorView in(const std::optional<at::Tensor>& t, const char* arg);
  // A uint8 tensor (packed fp4 pairs, checkpoint bytes) viewed as `dtype` with `shape` (counted
  // in elements of dtype); its byte count must match. Read or written in place (contiguous).
  groupmm::TensorView bytes(const at::Tensor& t, const char* arg, groupmm::DType dtype,
                            std::initializer_list<int64_t> shape);
  // A view of a tensor the op writes: it must be contiguous and on the op's device.
  groupmm::TensorView out(const at::Tensor& t, const char* arg);
  // A new output tensor from torch's allocator, and its view.
  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype);
  // A new tensor for a quantized output of group_quantize_shapes (an absent spec gives an absent
  // tensor; packed fp4 data is uint8 [rows, K/2]). Not zeroed: the ops write every scale byte,
  // the slack past the last expert's blocks included (quantize.hpp "Layouts").
  at::Tensor empty(const groupmm::TensorSpec& spec);
  // Workspace bytes from torch's allocator (stream-ordered on CUDA, graph-pool aware while
  // capturing), alive until the Call ends; nullptr for 0 bytes.
  void* workspace(size_t bytes);
  // Call after the core op returns: on the CPU, throws the device fault (bad splits) as an error.
  void finish();

 private:
  void check_device(const at::Tensor& t, const char* arg) const;
  groupmm::Device core_device() const;
  const char* op_;
  at::Device device_;
  at::TensorOptions opts_;
  // The op's CUDA device made current for the call (nothing on the CPU); set up before ctx_.
  c10::OptionalDeviceGuard guard_;
  groupmm::Context* ctx_;
  std::vector<at::Tensor> keep_;
};

groupmm::TensorView view_of(const at::Tensor& t, groupmm::Device d, const char* op,
                            const char* arg);

// A core op with its arguments, outputs and workspace bound to a Call: the op kernel runs it once;
// the _core_call_us bench hook (ops_hooks.cpp) runs it many times to time the C++ call alone, so
// both measure exactly the same core call.
struct Bound {
  std::function<void()> run;
  std::vector<at::Tensor> outputs;
};

// The ops the bench hook times (defined next to their op kernels).
Bound bind_gemm(Call& call, groupmm::GemmPass pass, const at::Tensor& a, const at::Tensor& b,
                const at::Tensor& splits, const std::optional<at::Tensor>& bias,
                std::optional<at::ScalarType> out_dtype);
Bound bind_group_quantize(Call& call, const at::Tensor& input,
                          const std::optional<at::Tensor>& splits, c10::string_view recipe,
                          std::optional<at::ScalarType> fp8_dtype, c10::string_view direction,
                          c10::string_view scale_layout, bool pow2_scales, bool block_2d,
                          groupmm::SplitsTotal splits_total = groupmm::SplitsTotal::exact);
Bound bind_router(Call& call, const at::Tensor& logits,
                  const std::optional<at::Tensor>& expert_bias, int64_t topk,
                  c10::string_view score, int64_t n_group, int64_t topk_group, bool renormalize,
                  double scaling_factor, double aux_loss_coeff, double z_loss_coeff);
Bound bind_permute(Call& call, const at::Tensor& x, const at::Tensor& dest_row,
                   const at::Tensor& row_start, const at::Tensor& kept, const at::Tensor& splits,
                   int64_t align, int64_t capacity, const std::optional<at::Tensor>& weights);
Bound bind_unpermute(Call& call, const at::Tensor& y_perm, const at::Tensor& dest_row,
                     const at::Tensor& row_start, const at::Tensor& kept, const at::Tensor& splits,
                     int64_t align, int64_t capacity, const std::optional<at::Tensor>& add,
                     const std::optional<at::Tensor>& bias = std::nullopt,
                     const std::optional<at::Tensor>& expert_ids = std::nullopt,
                     const std::optional<at::Tensor>& weights = std::nullopt);

}  // namespace groupmm_torch
