// binding.cpp: Call, the Context pool, the dtype map and the error messages (see binding.hpp).
//
// Only device-generic c10 APIs are used for the device guard and the current stream, so the
// extension links libc10/libtorch_cpu alone and builds against CPU-only and CUDA torch alike.
#include "binding.hpp"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace groupmm_torch {

namespace {
// The dtypes both sides have (packed fp4 pairs travel as uint8: see torch_dtype).
constexpr std::pair<at::ScalarType, groupmm::DType> kDTypes[] = {
    {at::kBFloat16, groupmm::DType::bf16},       {at::kHalf, groupmm::DType::fp16},
    {at::kFloat, groupmm::DType::fp32},          {at::kInt, groupmm::DType::int32},
    {at::kLong, groupmm::DType::int64},          {at::kFloat8_e4m3fn, groupmm::DType::fp8e4m3},
    {at::kFloat8_e5m2, groupmm::DType::fp8e5m2}, {at::kFloat8_e8m0fnu, groupmm::DType::e8m0},
};

bool file_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

// The length of a source location " [name.ext:123]" at msg[i] (what groupmm::Error appends), or 0.
size_t source_location_at(const std::string& msg, size_t i) {
  if (msg.compare(i, 2, " [") != 0) return 0;
  size_t j = i + 2;
  bool dot = false;
  while (j < msg.size() && file_name_char(msg[j])) dot |= msg[j++] == '.';
  if (j == i + 2 || !dot || j >= msg.size() || msg[j] != ':') return 0;
  const size_t digits = ++j;
  while (j < msg.size() && msg[j] >= '0' && msg[j] <= '9') ++j;
  if (j == digits || j >= msg.size() || msg[j] != ']') return 0;
  return j + 1 - i;
}
}  // namespace

std::string without_source_locations(const std::string& msg) {
  std::string out;
  out.reserve(msg.size());
  for (size_t i = 0; i < msg.size();) {
    const size_t n = source_location_at(msg, i);
    if (n > 0) {
      i += n;
    } else {
      out += msg[i++];
    }
  }
  return out;
}

groupmm::DType to_groupmm(at::ScalarType t, const char* op, const char* arg) {
  for (const auto& [torch_t, ours] : kDTypes)
    if (torch_t == t) return ours;
  TORCH_CHECK_TYPE(false, "groupmm.", op, ": ", arg, " has dtype ", t,
                   ", which groupmm does not take (bfloat16, float16, float32, int32, int64, "
                   "float8_e4m3fn, float8_e5m2, float8_e8m0fnu)");
}

at::ScalarType torch_dtype(groupmm::DType t) {
  if (t == groupmm::DType::fp4e2m1x2) return at::kByte;
  for (const auto& [torch_t, ours] : kDTypes)
    if (ours == t) return torch_t;
  TORCH_CHECK(false, "groupmm: no torch dtype for ", groupmm::dtype_name(t));
}

groupmm::QuantRecipe recipe_of(c10::string_view r, const char* op) {
  using groupmm::QuantRecipe;
  for (QuantRecipe q : {QuantRecipe::fp8_current, QuantRecipe::fp8_block, QuantRecipe::mxfp8,
                        QuantRecipe::nvfp4, QuantRecipe::mxfp4})
    if (r == groupmm::recipe_name(q)) return q;
  TORCH_CHECK_VALUE(false, "groupmm.", op, ": recipe='", std::string(r),
                    "' must be 'fp8_current', 'fp8_block', 'mxfp8', 'nvfp4' or 'mxfp4'");
}

groupmm::ScaleLayout layout_of(c10::string_view l, const char* op) {
  using groupmm::ScaleLayout;
  for (ScaleLayout s : {ScaleLayout::plain, ScaleLayout::swizzled, ScaleLayout::mn_major})
    if (l == groupmm::scale_layout_name(s)) return s;
  TORCH_CHECK_VALUE(false, "groupmm.", op, ": scale_layout='", std::string(l),
                    "' must be 'plain', 'swizzled' or 'mn_major'");
}

groupmm::SplitsTotal splits_total_of(c10::string_view t, const char* op) {
  if (t == "exact") return groupmm::SplitsTotal::exact;
  TORCH_CHECK_VALUE(t == "at_most", "groupmm.", op, ": splits_total='", std::string(t),
                    "' must be 'exact' or 'at_most'");
  return groupmm::SplitsTotal::at_most;
}

void check_spec(const char* op, const std::string& arg, const at::Tensor& t,
                const groupmm::TensorSpec& spec, const std::string& what) {
  if (!spec.present()) {
    TORCH_CHECK_VALUE(absent(t), "groupmm.", op, ": ", arg, " is ", t.sizes(), " but ", what,
                      " does not write it (pass an empty tensor)");
    return;
  }
  const std::vector<int64_t> shape(spec.shape.begin(), spec.shape.begin() + spec.rank);
  const at::ScalarType dt = torch_dtype(spec.dtype);
  // Packed fp4 data is [rows, K/2] bytes where the spec counts [rows, K] elements.
  std::vector<int64_t> want = shape;
  if (spec.dtype == groupmm::DType::fp4e2m1x2) want.back() /= 2;
  TORCH_CHECK_TYPE(t.scalar_type() == dt, "groupmm.", op, ": ", arg, " has dtype ", t.scalar_type(),
                   " but ", what, " writes ", dt);
  TORCH_CHECK_VALUE(t.sizes() == at::IntArrayRef(want), "groupmm.", op, ": ", arg, " has shape ",
                    t.sizes(), " but ", what, " writes ", at::IntArrayRef(want));
}

groupmm::TensorView view_of(const at::Tensor& t, groupmm::Device d, const char* op,
                            const char* arg) {
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.dim() <= 3, "groupmm.", op, ": ", arg, " has ", t.dim(),
                    " dims; groupmm takes 1 to 3");
  groupmm::TensorView v;
  v.data = t.data_ptr();
  v.dtype = to_groupmm(t.scalar_type(), op, arg);
  v.device = d;
  v.rank = static_cast<int>(t.dim());
  for (int i = 0; i < v.rank; ++i) v.shape[static_cast<size_t>(i)] = t.size(i);
  return v;
}

groupmm::Context& context_for(const at::Device& device) {
  if (device.is_cpu()) {
    // One per thread: autograd may run backward on another thread, and the CPU Context's
    // workspace and status block are plain host memory without locks.
    thread_local groupmm::Context cpu(groupmm::Device::CPU);
    return cpu;
  }
  TORCH_CHECK(device.is_cuda(), "groupmm: tensors on ", device, " are not supported (cpu, cuda)");
  const c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream stream = impl.getStream(device);
  auto* handle = static_cast<cudaStream_t>(stream.native_handle());
  // The last (device, stream) this thread asked for: consecutive ops on one stream skip the lock
  // and the map (the pool never drops a Context, so the pointer stays valid).
  thread_local struct {
    int device = -1;
    cudaStream_t stream = nullptr;
    groupmm::Context* ctx = nullptr;
  } last;
  if (last.ctx != nullptr && last.device == device.index() && last.stream == handle)
    return *last.ctx;
  static std::mutex mu;
  // Never destroyed: a Context frees device memory in its destructor, which must not run after
  // the CUDA runtime has shut down at process exit.
  static auto* pool = new std::map<std::pair<int, cudaStream_t>, std::unique_ptr<groupmm::Context>>;
  const std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*pool)[{device.index(), handle}];
  if (!slot) {
    // The core refuses it too; said here in torch's terms (torch.cuda.graph captures on its own
    // side stream unless given one).
    TORCH_CHECK(!groupmm::stream_capturing(handle), "groupmm: the first groupmm op on CUDA stream ",
                static_cast<void*>(handle), " runs while it captures a CUDA graph; groupmm makes ",
                "a stream's state (its status block) on the first op there, which capture forbids. "
                "Warm up on the capture stream first: `with torch.cuda.stream(s): <one eager "
                "call>`, then `with torch.cuda.graph(g, stream=s): ...`");
    slot = std::make_unique<groupmm::Context>(groupmm::Device::CUDA, handle);
  }
  last = {device.index(), handle, slot.get()};
  return *slot;
}

Call::Call(const char* op, const at::Tensor& anchor)
    : op_(op),
      device_(anchor.device()),
      opts_(anchor.options()),
      guard_(device_.is_cuda() ? std::optional<at::Device>(device_) : std::nullopt),
      ctx_(&context_for(device_)) {}

void Call::check_device(const at::Tensor& t, const char* arg) const {
  TORCH_CHECK(t.device() == device_, "groupmm.", op_, ": ", arg, " is on ", t.device(),
              " but the op runs on ", device_, " (every tensor of one call on one device)");
}

groupmm::Device Call::core_device() const {
  return device_.is_cuda() ? groupmm::Device::CUDA : groupmm::Device::CPU;
}

groupmm::TensorView Call::in(const at::Tensor& t, const char* arg) {
  check_device(t, arg);
  if (t.is_contiguous()) return view_of(t, core_device(), op_, arg);
  keep_.push_back(t.contiguous());
  return view_of(keep_.back(), core_device(), op_, arg);
}

groupmm::TensorView Call::bytes(const at::Tensor& t, const char* arg, groupmm::DType dtype,
                                std::initializer_list<int64_t> shape) {
  check_device(t, arg);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kByte, "groupmm.", op_, ": ", arg, " has dtype ",
                   t.scalar_type(), "; expected uint8 (", groupmm::dtype_name(dtype), " bytes)");
  TORCH_CHECK_VALUE(t.is_contiguous(), "groupmm.", op_, ": ", arg, " must be contiguous");
  groupmm::TensorView v(t.data_ptr(), dtype, core_device(), shape);
  TORCH_CHECK_VALUE(v.nbytes() == t.numel(), "groupmm.", op_, ": ", arg, " has ", t.numel(),
                    " bytes (shape ", t.sizes(), "), expected ", v.nbytes());
  return v;
}

groupmm::TensorView Call::in(const std::optional<at::Tensor>& t, const char* arg) {
  return t.has_value() ? in(*t, arg) : groupmm::TensorView();
}

groupmm::TensorView Call::out(const at::Tensor& t, const char* arg) {
  check_device(t, arg);
  TORCH_CHECK_VALUE(t.is_contiguous(), "groupmm.", op_, ": ", arg,
                    " is written in place and must be contiguous");
  return view_of(t, core_device(), op_, arg);
}

// Straight from the device's registered allocator (torch's caching allocator on CUDA: stream
// ordered, graph-pool aware), which is where at::empty ends up after its dispatch. An op allocates
// up to six tensors, and the dispatcher round trip of each was host time of the op (issue 20's
// <= 10 us per op). The op's device is current (guard_), so the allocator serves that device.
// Under torch.use_deterministic_algorithms with fill_uninitialized_memory, at::empty's own fill
// is kept (rows past sum(splits) are left unwritten by the ops).
at::Tensor Call::empty(at::IntArrayRef shape, at::ScalarType dtype) {
  const auto& g = at::globalContext();
  if (g.deterministicAlgorithms() && g.deterministicFillUninitializedMemory())
    return at::empty(shape, opts_.dtype(dtype));
  if (device_.is_cpu()) return at::detail::empty_cpu(shape, dtype);
  return at::detail::empty_generic(shape, c10::GetAllocator(device_.type()),
                                   c10::DispatchKeySet(c10::DispatchKey::CUDA), dtype,
                                   std::nullopt);
}

at::Tensor Call::empty(const groupmm::TensorSpec& s) {
  if (!s.present()) return empty({0}, at::kFloat);
  std::vector<int64_t> shape(s.shape.begin(), s.shape.begin() + s.rank);
  if (s.dtype == groupmm::DType::fp4e2m1x2) shape.back() = (shape.back() + 1) / 2;
  return empty(shape, torch_dtype(s.dtype));
}

void* Call::workspace(size_t bytes) {
  if (bytes == 0) return nullptr;
  keep_.push_back(empty({static_cast<int64_t>(bytes)}, at::kByte));
  return keep_.back().data_ptr();
}

void Call::finish() {
  if (device_.is_cpu()) ctx_->check();
}

}  // namespace groupmm_torch
