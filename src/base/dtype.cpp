// DType and Device names and sizes.
#include "groupmm/core.hpp"

namespace groupmm {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
    case DType::fp32:
      return "fp32";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
    case DType::fp8e4m3:
      return "fp8e4m3";
    case DType::fp8e5m2:
      return "fp8e5m2";
    case DType::e8m0:
      return "e8m0";
    case DType::fp4e2m1x2:
      return "fp4e2m1x2";
  }
  return "?";
}

int dtype_bits(DType t) {
  switch (t) {
    case DType::bf16:
    case DType::fp16:
      return 16;
    case DType::fp32:
    case DType::int32:
      return 32;
    case DType::int64:
      return 64;
    case DType::fp8e4m3:
    case DType::fp8e5m2:
    case DType::e8m0:
      return 8;
    case DType::fp4e2m1x2:
      return 4;
  }
  return 0;
}

int64_t dtype_storage_bytes(DType t, int64_t numel) {
  return (numel * dtype_bits(t) + 7) / 8;
}

bool dtype_is_float(DType t) {
  return t != DType::int32 && t != DType::int64;
}

const char* device_name(Device d) {
  return d == Device::CPU ? "cpu" : "cuda";
}

const char* recipe_name(QuantRecipe r) {
  switch (r) {
    case QuantRecipe::none:
      return "none";
    case QuantRecipe::fp8_current:
      return "fp8_current";
    case QuantRecipe::fp8_block:
      return "fp8_block";
    case QuantRecipe::mxfp8:
      return "mxfp8";
    case QuantRecipe::nvfp4:
      return "nvfp4";
    case QuantRecipe::mxfp4:
      return "mxfp4";
  }
  return "?";
}

}  // namespace groupmm
