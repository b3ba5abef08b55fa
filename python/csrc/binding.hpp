// binding.hpp: the glue between torch tensors and groupmm's core (TensorView, Context).
//
// Every op kernel builds one Call: it picks the device guard, the groupmm Context for torch's
// current stream, turns torch tensors into TensorViews (checking that all of them live on the
// op's device), allocates outputs and workspace from torch's allocator, and at the end reports
// device faults at once on the CPU (free there: the work is already done). On CUDA, faults stay
// in the Context's status block until groupmm.check() (a sync), as in the core.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "groupmm/core.hpp"

namespace groupmm_torch {

groupmm::DType to_groupmm(at::ScalarType t, const char* op, const char* arg);

// The Context that runs ops on `device` and torch's current stream there (created on first use
// and kept for the process: a graph captured on a stream must find the same Context at replay
// time, and a Context holds the status block its kernels write).
groupmm::Context& context_for(const at::Device& device);

class Call {
 public:
  Call(const char* op, const at::Tensor& anchor);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  groupmm::Context& ctx() { return *ctx_; }
  const at::TensorOptions& options() const { return opts_; }

  // A view of an input (a contiguous copy is made and kept alive when it is not contiguous).
  groupmm::TensorView in(const at::Tensor& t, const char* arg);
  groupmm::TensorView in(const std::optional<at::Tensor>& t, const char* arg);
  // A view of a tensor the op writes: it must be contiguous and on the op's device.
  groupmm::TensorView out(const at::Tensor& t, const char* arg);
  // A new output tensor from torch's allocator, and its view.
  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype);
  // Workspace bytes from torch's allocator (stream-ordered on CUDA, graph-pool aware while
  // capturing), alive until the Call ends; nullptr for 0 bytes.
  void* workspace(size_t bytes);
  // Call after the core op returns: on the CPU, throws the device fault (bad splits) as an error.
  void finish();

 private:
  void check_device(const at::Tensor& t, const char* arg) const;
  const char* op_;
  at::Device device_;
  at::TensorOptions opts_;
  groupmm::Context* ctx_;
  std::vector<at::Tensor> keep_;
  struct Guard;
  Guard* guard_;
};

groupmm::TensorView view_of(const at::Tensor& t, groupmm::Device d, const char* op,
                            const char* arg);

}  // namespace groupmm_torch
