// groupmm/core.hpp: dtypes, tensor views, grouped tensors, the per-stream Context, errors.
//
// The core takes raw pointers in small descriptors plus a stream; nothing here knows about torch.
// Tensors are row-major; shapes have rank <= 3. Device split counts are int32 or int64.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace groupmm {

// ================================================================================================
// Errors
// ================================================================================================

// Thrown for every host-side validation failure and CUDA/cuBLAS error. The message names the op,
// the argument, the expected and the actual value, then [file:line].
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... T>
std::string cat(const T&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* expr, cudaError_t err);
[[noreturn]] void throw_cublas_error(const char* file, int line, const char* expr, int status);
}  // namespace detail

// GROUPMM_CHECK(cond, "op: arg=", v, " must be ...") throws groupmm::Error with file:line.
#define GROUPMM_CHECK(cond, ...)                                                               \
  do {                                                                                         \
    if (!(cond))                                                                               \
      ::groupmm::detail::throw_error(__FILE__, __LINE__, ::groupmm::detail::cat(__VA_ARGS__)); \
  } while (0)
#define GROUPMM_CHECK_CUDA(expr)                                                    \
  do {                                                                              \
    cudaError_t groupmm_err_ = (expr);                                              \
    if (groupmm_err_ != cudaSuccess)                                                \
      ::groupmm::detail::throw_cuda_error(__FILE__, __LINE__, #expr, groupmm_err_); \
  } while (0)
#define GROUPMM_CHECK_CUBLAS(expr)                                                   \
  do {                                                                               \
    int groupmm_st_ = static_cast<int>(expr);                                        \
    if (groupmm_st_ != 0)                                                            \
      ::groupmm::detail::throw_cublas_error(__FILE__, __LINE__, #expr, groupmm_st_); \
  } while (0)
// After a kernel launch: the launch error, if any.
#define GROUPMM_CHECK_LAUNCH() GROUPMM_CHECK_CUDA(cudaGetLastError())

// ================================================================================================
// DType, Device
// ================================================================================================

enum class DType : uint8_t {
  bf16,
  fp16,
  fp32,
  int32,
  int64,
  fp8e4m3,
  fp8e5m2,
  e8m0,
  fp4e2m1x2,  // two e2m1 values per byte; shapes count elements, storage is ceil(n/2) bytes
};

const char* dtype_name(DType t);
int dtype_bits(DType t);  // bits per element (4 for fp4e2m1x2)
int64_t dtype_storage_bytes(DType t, int64_t numel);
bool dtype_is_float(DType t);

enum class Device : uint8_t { CPU, CUDA };
const char* device_name(Device d);

// True when a CUDA device is visible and usable by this build (sm_90 class); always false in a
// CPU-only library (groupmm/version.hpp: GROUPMM_WITH_CUDA_KERNELS 0), which refuses Device::CUDA.
bool cuda_available();
// CUDA if available, else CPU.
Device default_device();
// True when `stream` is capturing a CUDA graph (cudaStreamIsCapturing; an error of the query, as
// for the legacy stream while another stream captures, counts as false and is cleared). A
// Context must be created outside capture: it allocates its status block (cudaMalloc, which
// capture forbids), so its constructor refuses a capturing stream with a clear error.
bool stream_capturing(cudaStream_t stream);

// ================================================================================================
// TensorView: non-owning, row-major, rank <= 3
// ================================================================================================

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::fp32;
  Device device = Device::CPU;
  int rank = 0;  // 0 = absent (optional arguments)
  std::array<int64_t, 3> shape{0, 0, 0};

  TensorView() = default;
  TensorView(void* p, DType t, Device d, std::initializer_list<int64_t> dims);

  bool present() const { return rank > 0; }
  int64_t dim(int i) const { return shape[static_cast<size_t>(i)]; }
  int64_t numel() const;
  int64_t nbytes() const { return dtype_storage_bytes(dtype, numel()); }
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  std::string shape_string() const;  // "[4096, 7168]"
  std::string to_string() const;     // "bf16[4096, 7168]@cuda"
};

// ================================================================================================
// Tensor: owning, stream-ordered device allocation or host memory
// ================================================================================================

// Device Tensors are allocated stream-ordered from a memory pool of groupmm's own per device (not
// the device's default pool, whose settings stay the process's), which keeps the memory freed
// Tensors leave for later ones: an op that synchronizes does not give it back to the driver and map
// it again (the throughput EP plan synchronizes every step). That reserve is at most the largest
// set of Tensors alive at once; release_cached_device_memory() returns the part no Tensor uses to
// the driver (as torch.cuda.empty_cache does for torch's allocator). Memory the PyTorch package's
// ops return comes from torch's allocator, not from these pools.
void release_cached_device_memory();

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(std::initializer_list<int64_t> dims, DType t, Device d,
                      cudaStream_t stream = nullptr);
  static Tensor empty_like(const TensorView& v, Device d, cudaStream_t stream = nullptr);
  ~Tensor();
  Tensor(Tensor&& o) noexcept;
  Tensor& operator=(Tensor&& o) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  void* data() const { return view_.data; }
  template <class T>
  T* ptr() const {
    return static_cast<T*>(view_.data);
  }
  int64_t numel() const { return view_.numel(); }
  int64_t nbytes() const { return view_.nbytes(); }
  void reset();

 private:
  TensorView view_;
  cudaStream_t stream_ = nullptr;
};

// Copies between views of equal size (any device pair), ordered on `stream`. Host destinations
// are synchronized before return.
void copy(const TensorView& dst, const TensorView& src, cudaStream_t stream = nullptr);
// A copy of `src` on device `d`.
Tensor clone_to(const TensorView& src, Device d, cudaStream_t stream = nullptr);
// Fills every byte of a view with `byte` (poisoning in tests: 0xFF is NaN for every float type).
void fill_bytes(const TensorView& v, uint8_t byte, cudaStream_t stream = nullptr);

// ================================================================================================
// GroupedTensor: G members stacked along the first dim
// ================================================================================================

// What a grouped tensor was quantized with (quantize.hpp documents each recipe).
enum class QuantRecipe : uint8_t { none, fp8_current, fp8_block, mxfp8, nvfp4, mxfp4 };
const char* recipe_name(QuantRecipe r);
// How its block scales are laid out (quantize.hpp, "Layouts"): plain row-major, swizzled 128x4
// with per-expert 128-row padding (mxfp8, nvfp4, mxfp4), or mn_major, tokens contiguous
// (fp8_block).
enum class ScaleLayout : uint8_t { plain, swizzled, mn_major };
const char* scale_layout_name(ScaleLayout l);

struct GroupedTensor {
  int64_t num_groups = 0;
  TensorView data;                  // [M_total, K], or [G, N, K] for uniform (weight) groups
  TensorView splits;                // [G] int32/int64 row counts on the device; absent if uniform
  TensorView scale_inv;             // rowwise scales (layout per recipe)
  TensorView columnwise_data;       // columnwise (transposed-use) copy
  TensorView columnwise_scale_inv;  // its scales
  TensorView amax;                  // [G] fp32 per-expert amax
  TensorView global_scale;          // [G] fp32 (NVFP4 S_enc), absent otherwise
  QuantRecipe recipe = QuantRecipe::none;
  ScaleLayout scale_layout = ScaleLayout::plain;  // of scale_inv and columnwise_scale_inv
  bool block_2d = false;  // weights quantized in 2-D blocks (fp8_block 128x128, nvfp4 16x16)
  bool uniform() const { return !splits.present(); }
  std::string to_string() const;
};

// ================================================================================================
// Device status word: how kernels report faults in device-side data (splits) without a sync
// ================================================================================================

// What sum(splits) may be for an op over a row buffer of M rows: exactly M (the default: a short
// sum is kFaultSplitsTotalMismatch), or at most M (an op that takes a SplitsTotal neither reads
// nor writes the rows past the sum, unless its header names an output it must write there; a sum
// above M is still kFaultSplitsOverflow + kFaultSplitsTotalMismatch). at_most serves buffers sized
// for a bound, such as expert-parallel capacity mode's (ep.hpp), whose tail belongs to no expert.
enum class SplitsTotal : uint8_t { exact, at_most };
const char* splits_total_name(SplitsTotal t);

// The split faults are those of the splits rule (offsets.hpp), which every op follows.
enum FaultBits : uint32_t {
  kFaultNegativeSplit = 1u << 0,        // a split was < 0 (treated as 0)
  kFaultSplitsTotalMismatch = 1u << 1,  // sum of splits != the expected row count
  kFaultSplitsOverflow = 1u << 2,       // splits run past the buffer (rows clamped, group skipped)
  kFaultBadIndex = 1u << 3,             // an index (e.g. expert id) out of range (entry skipped)
  kFaultSplitAlignment = 1u << 4,  // a split breaks an op's alignment rule (group's output skipped)
  kFaultEpCapacity = 1u << 5,  // an expert-parallel capacity was exceeded (rows dropped; group =
                               // the peer rank, value = what it needed)
};

enum class OpId : uint32_t {
  none = 0,
  group_offsets,
  grouped_gemm,
  group_quantize,
  group_dequantize,
  group_dbias,
  swizzle_scales,
  moe_permute,
  moe_unpermute,
  swiglu,
  layer,
  moe_router,
  weighted_swiglu,
  ep_dispatch,     // the expert-parallel plans (ep.hpp)
  moe_gate_up,     // moe_gate_up_swiglu and the gathered ops (moe.hpp)
  moe_down_dgrad,  // moe_down_dgrad_swiglu (moe.hpp)
  count_
};
const char* op_name(OpId op);

// The status block lives in device memory (host memory on the CPU backend):
// [0] fault bits (atomicOr), [1] first faulting op, [2] its group, [3..4] the offending value.
struct StatusBlock {
  uint32_t bits;
  uint32_t op;
  int32_t group;
  uint32_t pad;
  int64_t value;
};
// Host version used by the CPU backend; the CUDA one lives in src/kernels/common/status.cuh.
void report_fault_host(StatusBlock* s, uint32_t bit, OpId op, int32_t group, int64_t value);
std::string describe_status(const StatusBlock& s);

// ================================================================================================
// Context: one per stream. Owns a workspace, library handles, the status block.
// ================================================================================================

class Context {
 public:
  // Device::CUDA throws a clear error when no usable GPU exists.
  explicit Context(Device device = default_device(), cudaStream_t stream = nullptr);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  int sm_count() const { return sm_count_; }
  // The SMs the persistent GEMMs (the grouped GEMMs, 16-bit and quantized, and the kernel layer's
  // gathered GEMM) size their grids by: sm_count(), or fewer while a limit is set, so that kernels
  // on other streams (an exchange's NCCL kernels) find SMs free while a GEMM runs. A limit changes
  // which CTA computes a tile, never a result: every tile is computed whole by one CTA and no
  // configuration choice reads it. 0 = no limit; a limit of at least sm_count() is no limit. A
  // kernel launched in clusters rounds the limit down to whole clusters (one cluster at least).
  int gemm_sm_count() const {
    return gemm_sm_limit_ > 0 && gemm_sm_limit_ < sm_count_ ? gemm_sm_limit_ : sm_count_;
  }
  void set_gemm_sm_limit(int sms);  // sms >= 0
  int gemm_sm_limit() const { return gemm_sm_limit_; }
  int smem_per_sm() const { return smem_per_sm_; }  // bytes of shared memory per SM
  int64_t l2_bytes() const { return l2_bytes_; }    // L2 cache size (0 on Device::CPU)
  int device_index() const { return device_index_; }
  int cc() const { return cc_; }  // 90 for sm_90

  // Internal scratch space that grows on demand. Growing allocates, so it throws while the
  // stream is capturing; ops that are graph safe take an explicit workspace or call
  // reserve_workspace() before capture.
  void* workspace(size_t bytes);
  void reserve_workspace(size_t bytes) { (void)workspace(bytes); }
  size_t workspace_size() const { return ws_bytes_; }

  // cuBLAS handle bound to this stream (created on first use). Opaque to keep cublas.h private.
  void* cublas_handle();

  // Status block: device pointer on CUDA, host pointer on CPU.
  StatusBlock* status() const { return status_; }
  // Synchronizes the stream, reads the status block, resets it, throws Error if a fault was set.
  void check();
  // Reads and resets the status without throwing (synchronizes).
  StatusBlock take_status();
  // Debug option: ops call check() after themselves (off by default; not graph compatible).
  void set_debug_checks(bool on) { debug_checks_ = on; }
  bool debug_checks() const { return debug_checks_; }
  // Called by every op at its end.
  void after_op();

  bool capturing() const;
  void synchronize();

  // Per-device state of the CUDA backend, kept here rather than in globals: true the first time
  // `kernel` is passed on this Context (the backend then sets the kernel's launch attributes on
  // this device, e.g. its dynamic shared-memory limit).
  bool first_use(const void* kernel);

 private:
  Device device_;
  cudaStream_t stream_ = nullptr;
  int device_index_ = -1;
  int sm_count_ = 0;
  int gemm_sm_limit_ = 0;
  int smem_per_sm_ = 0;
  int64_t l2_bytes_ = 0;
  int cc_ = 0;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  void* cublas_ = nullptr;
  StatusBlock* status_ = nullptr;
  bool debug_checks_ = false;
  std::vector<const void*> used_kernels_;
};

// ---- validation helpers shared by ops (each message names the op and the argument) -----------
void check_view(const char* op, const char* arg, const TensorView& v, DType dtype, int rank,
                Device device);
void check_dim(const char* op, const char* arg, const TensorView& v, int i, int64_t expected);
void check_splits(const char* op, const TensorView& splits, int64_t groups, Device device);
// True when the bytes of a and b overlap (aliasing checks of ops whose outputs may not alias).
bool views_overlap(const TensorView& a, const TensorView& b);

}  // namespace groupmm
