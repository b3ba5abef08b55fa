// Host/device buffer pairs for the MoE op tests: a host buffer and its device twin (poisoned),
// and a PermuteMap on both sides (tests/cuda/test_moe_ops_gpu.cpp, test_gate_up_swiglu_gpu.cpp).
#pragma once

#include <vector>

#include "base/cpu_util.hpp"
#include "common/test_util.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {

template <class T>
std::vector<T> to_host(const TensorView& v) {
  std::vector<T> h(size_t(v.nbytes()) / sizeof(T));
  copy(TensorView(h.data(), v.dtype, Device::CPU, {v.numel()}),
       TensorView(v.data, v.dtype, v.device, {v.numel()}));
  return h;
}

// A host buffer and its device twin (device side poisoned with 0xFF unless filled from host).
struct Pair {
  std::vector<uint8_t> bytes;
  TensorView host;
  Tensor dev;
  Pair(DType t, std::initializer_list<int64_t> dims) {
    host = TensorView(nullptr, t, Device::CPU, dims);
    bytes.assign(size_t(host.nbytes()), 0xFF);
    host.data = bytes.data();
    dev = Tensor::empty(dims, t, Device::CUDA);
    fill_bytes(dev, 0xFF);
  }
  void upload() { copy(dev, host); }
  template <class T>
  T* h() {
    return reinterpret_cast<T*>(bytes.data());
  }
  void fill_floats(const std::vector<float>& v) {
    for (size_t i = 0; i < v.size(); ++i) cpu::store_f(host, int64_t(i), v[i]);
    upload();
  }
  std::vector<uint8_t> dev_bytes() const { return to_host<uint8_t>(dev.view()); }
  // GPU result equals the CPU result bit for bit
  void expect_same(const char* what) const {
    EXPECT_EQ(dev_bytes(), bytes) << what << " differs from the CPU reference";
  }
};

// A PermuteMap on the host and on the device (dest_row and the [3E] row_start | kept | splits).
struct MapPair {
  Pair dest, meta;
  PermuteMap host, dev;
  MapPair(int64_t T, int64_t k, int64_t E, int64_t align = 1, int64_t capacity = 0)
      : dest(DType::int32, {T, k}), meta(DType::int32, {3 * E}) {
    for (PermuteMap* m : {&host, &dev}) {
      const bool d = m == &dev;
      m->tokens = T;
      m->topk = k;
      m->experts = E;
      m->align = align;
      m->capacity = capacity;
      m->rows = moe_permuted_rows(T, k, E, align, capacity);
      m->dest_row = d ? dest.dev.view() : dest.host;
      int32_t* b = d ? meta.dev.ptr<int32_t>() : meta.h<int32_t>();
      const Device dv = d ? Device::CUDA : Device::CPU;
      m->row_start = TensorView(b, DType::int32, dv, {E});
      m->kept = TensorView(b + E, DType::int32, dv, {E});
      m->splits = TensorView(b + 2 * E, DType::int32, dv, {E});
    }
  }
};

}  // namespace groupmm::test
