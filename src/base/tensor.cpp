// TensorView, Tensor (owning), copies, GroupedTensor printing, validation helpers.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "groupmm/core.hpp"

namespace groupmm {

// ---- TensorView --------------------------------------------------------------------------------
TensorView::TensorView(void* p, DType t, Device d, std::initializer_list<int64_t> dims)
    : data(p), dtype(t), device(d), rank(static_cast<int>(dims.size())) {
  GROUPMM_CHECK(dims.size() >= 1 && dims.size() <= 3, "TensorView: rank=", dims.size(),
                " must be 1..3");
  size_t i = 0;
  for (int64_t v : dims) {
    GROUPMM_CHECK(v >= 0, "TensorView: shape[", i, "]=", v, " must be >= 0");
    shape[i++] = v;
  }
  (void)numel();  // the element count must fit (see numel)
}

// The fields are public, so a view may have been written by hand: numel() refuses a rank outside
// 0..3, negative dims and more than 2^56 elements (far past any memory; byte counts stay in int64),
// so that no op computes a size from a malformed view.
int64_t TensorView::numel() const {
  GROUPMM_CHECK(rank >= 0 && rank <= 3, "TensorView: rank=", rank, " must be 0..3");
  if (rank == 0) return 0;
  constexpr int64_t kMaxNumel = int64_t(1) << 56;
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = shape[static_cast<size_t>(i)];
    GROUPMM_CHECK(d >= 0, "TensorView: shape[", i, "]=", d, " must be >= 0");
    GROUPMM_CHECK(d == 0 || n <= kMaxNumel / d, "TensorView: shape ", shape_string(),
                  " has more than 2^56 elements");
    n *= d;
  }
  return n;
}

std::string TensorView::shape_string() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < rank && i < 3; ++i) os << (i ? ", " : "") << shape[static_cast<size_t>(i)];
  os << "]";
  return os.str();
}

std::string TensorView::to_string() const {
  if (!present()) return "(absent)";
  return detail::cat(dtype_name(dtype), shape_string(), "@", device_name(device));
}

// ---- Tensor ------------------------------------------------------------------------------------
namespace {

// Device Tensors come from a stream-ordered pool of groupmm's own per device, which keeps the
// memory its Tensors free for the next ones (release threshold: no limit). The device's default
// pool, whose settings belong to the process, returns everything above its threshold (0 unless
// someone set it) to the driver at the next synchronization: an op that synchronizes every step
// (the throughput EP plan) would then map its buffers afresh every step. The pools are created on
// first use and live as long as the process; release_cached_device_memory() trims them.
std::mutex g_pools_mutex;
std::vector<cudaMemPool_t> g_pools;  // by device ordinal; null: not created yet

cudaMemPool_t device_pool(cudaStream_t stream) {
  int dev = 0;
  GROUPMM_CHECK_CUDA(cudaStreamGetDevice(stream, &dev));
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  if (size_t(dev) >= g_pools.size()) g_pools.resize(size_t(dev) + 1, nullptr);
  cudaMemPool_t& pool = g_pools[size_t(dev)];
  if (pool == nullptr) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t created = nullptr;
    GROUPMM_CHECK_CUDA(cudaMemPoolCreate(&created, &props));
    uint64_t keep = UINT64_MAX;
    const cudaError_t e = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &keep);
    if (e != cudaSuccess) cudaMemPoolDestroy(created);
    GROUPMM_CHECK_CUDA(e);
    pool = created;
  }
  return pool;
}

void* allocate(size_t bytes, Device d, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (d == Device::CUDA) {
    GROUPMM_CHECK_CUDA(cudaMallocFromPoolAsync(&p, bytes, device_pool(stream), stream));
  } else {
    p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    GROUPMM_CHECK(p != nullptr, "Tensor: host allocation of ", bytes, " bytes failed");
  }
  return p;
}

}  // namespace

void release_cached_device_memory() {
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  for (cudaMemPool_t pool : g_pools)
    if (pool != nullptr) GROUPMM_CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
}

Tensor Tensor::empty(std::initializer_list<int64_t> dims, DType t, Device d, cudaStream_t stream) {
  Tensor out;
  out.view_ = TensorView(nullptr, t, d, dims);
  out.stream_ = stream;
  out.view_.data = allocate(static_cast<size_t>(out.view_.nbytes()), d, stream);
  return out;
}

Tensor Tensor::empty_like(const TensorView& v, Device d, cudaStream_t stream) {
  Tensor out;
  out.view_ = v;
  out.view_.device = d;
  out.stream_ = stream;
  out.view_.data = allocate(static_cast<size_t>(v.nbytes()), d, stream);
  return out;
}

void Tensor::reset() {
  if (view_.data) {
    if (view_.device == Device::CUDA) {
      cudaFreeAsync(view_.data, stream_);  // no throw from a destructor path
    } else {
      std::free(view_.data);
    }
  }
  view_ = TensorView();
}

Tensor::~Tensor() {
  reset();
}

Tensor::Tensor(Tensor&& o) noexcept : view_(o.view_), stream_(o.stream_) {
  o.view_ = TensorView();
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    reset();
    view_ = o.view_;
    stream_ = o.stream_;
    o.view_ = TensorView();
  }
  return *this;
}

// ---- copies ------------------------------------------------------------------------------------
void copy(const TensorView& dst, const TensorView& src, cudaStream_t stream) {
  GROUPMM_CHECK(dst.nbytes() == src.nbytes(), "copy: dst ", dst.to_string(), " and src ",
                src.to_string(), " differ in size");
  const size_t bytes = static_cast<size_t>(src.nbytes());
  if (bytes == 0) return;
  GROUPMM_CHECK(dst.data != nullptr && src.data != nullptr,
                "copy: ", dst.data == nullptr ? "dst" : "src", ".data is null");
  if (dst.device == Device::CPU && src.device == Device::CPU) {
    std::memcpy(dst.data, src.data, bytes);
    return;
  }
  GROUPMM_CHECK_CUDA(cudaMemcpyAsync(dst.data, src.data, bytes, cudaMemcpyDefault, stream));
  if (dst.device == Device::CPU) GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
}

Tensor clone_to(const TensorView& src, Device d, cudaStream_t stream) {
  Tensor t = Tensor::empty_like(src, d, stream);
  copy(t.view(), src, stream);
  return t;
}

void fill_bytes(const TensorView& v, uint8_t byte, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(v.nbytes());
  if (bytes == 0) return;
  GROUPMM_CHECK(v.data != nullptr, "fill_bytes: v.data is null");
  if (v.device == Device::CPU) {
    std::memset(v.data, byte, bytes);
  } else {
    GROUPMM_CHECK_CUDA(cudaMemsetAsync(v.data, byte, bytes, stream));
  }
}

// ---- GroupedTensor -----------------------------------------------------------------------------
std::string GroupedTensor::to_string() const {
  std::ostringstream os;
  os << "GroupedTensor(G=" << num_groups << ", recipe=" << recipe_name(recipe)
     << ", data=" << data.to_string();
  if (splits.present()) os << ", splits=" << splits.to_string();
  if (scale_inv.present()) os << ", scale_inv=" << scale_inv.to_string();
  if (columnwise_data.present()) os << ", columnwise=" << columnwise_data.to_string();
  if (columnwise_scale_inv.present())
    os << ", columnwise_scale_inv=" << columnwise_scale_inv.to_string();
  if (amax.present()) os << ", amax=" << amax.to_string();
  if (global_scale.present()) os << ", global_scale=" << global_scale.to_string();
  if (scale_layout != ScaleLayout::plain) os << ", " << scale_layout_name(scale_layout);
  if (block_2d) os << ", 2d blocks";
  os << ")";
  return os.str();
}

// ---- validation --------------------------------------------------------------------------------
// data aligned to the dtype's element size: the CPU backend reads elements through typed pointers.
static void check_element_aligned(const char* op, const char* arg, const TensorView& v) {
  const int64_t bytes = dtype_bits(v.dtype) / 8;
  GROUPMM_CHECK(bytes <= 1 || reinterpret_cast<uintptr_t>(v.data) % uintptr_t(bytes) == 0, op, ": ",
                arg, ".data=", v.data, " must be aligned to its ", bytes, "-byte elements");
}

void check_view(const char* op, const char* arg, const TensorView& v, DType dtype, int rank,
                Device device) {
  GROUPMM_CHECK(v.present(), op, ": ", arg, " is required");
  // A hand-written view: its rank and dims, then its size (numel).
  GROUPMM_CHECK(v.rank <= 3, op, ": ", arg, ".rank=", v.rank, " must be ", rank);
  for (int i = 0; i < v.rank; ++i)
    GROUPMM_CHECK(v.dim(i) >= 0, op, ": ", arg, ".shape[", i, "]=", v.dim(i), " must be >= 0");
  (void)v.numel();
  GROUPMM_CHECK(v.dtype == dtype, op, ": ", arg, ".dtype=", dtype_name(v.dtype), " must be ",
                dtype_name(dtype));
  GROUPMM_CHECK(v.rank == rank, op, ": ", arg, ".rank=", v.rank, " must be ", rank, " (shape ",
                v.shape_string(), ")");
  GROUPMM_CHECK(v.device == device, op, ": ", arg, " is on ", device_name(v.device),
                " but the context is ", device_name(device));
  GROUPMM_CHECK(v.data != nullptr || v.numel() == 0, op, ": ", arg, ".data is null");
  check_element_aligned(op, arg, v);
}

void check_dim(const char* op, const char* arg, const TensorView& v, int i, int64_t expected) {
  GROUPMM_CHECK(v.dim(i) == expected, op, ": ", arg, ".shape[", i, "]=", v.dim(i), " must equal ",
                expected);
}

void check_splits(const char* op, const TensorView& splits, int64_t groups, Device device) {
  GROUPMM_CHECK(splits.present(), op, ": splits is required");
  (void)splits.numel();
  GROUPMM_CHECK(splits.dtype == DType::int32 || splits.dtype == DType::int64, op,
                ": splits.dtype=", dtype_name(splits.dtype), " must be int32 or int64");
  GROUPMM_CHECK(splits.rank == 1, op, ": splits.rank=", splits.rank, " must be 1");
  GROUPMM_CHECK(groups < 0 || splits.dim(0) == groups, op, ": splits.shape[0]=", splits.dim(0),
                " must equal the number of groups ", groups);
  GROUPMM_CHECK(splits.device == device, op, ": splits is on ", device_name(splits.device),
                " but the context is ", device_name(device));
  GROUPMM_CHECK(splits.data != nullptr || splits.numel() == 0, op, ": splits.data is null");
  check_element_aligned(op, "splits", splits);
}

bool views_overlap(const TensorView& a, const TensorView& b) {
  const char* pa = static_cast<const char*>(a.data);
  const char* pb = static_cast<const char*>(b.data);
  return a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace groupmm
