// Error construction for GROUPMM_CHECK*, and the status-block description.
#include "groupmm/core.hpp"

#include <cstring>

namespace groupmm::detail {

static std::string where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return cat(" [", base ? base + 1 : file, ":", line, "]");
}

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(msg + where(file, line));
}

void throw_cuda_error(const char* file, int line, const char* expr, cudaError_t err) {
  throw Error(cat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ",
                  expr, where(file, line)));
}

void throw_cublas_error(const char* file, int line, const char* expr, int status) {
  throw Error(cat("cuBLAS error ", status, " in ", expr, where(file, line)));
}

}  // namespace groupmm::detail

namespace groupmm {

const char* op_name(OpId op) {
  switch (op) {
    case OpId::none:
      return "none";
    case OpId::group_offsets:
      return "group_offsets";
    case OpId::grouped_gemm:
      return "grouped_gemm";
    case OpId::group_quantize:
      return "group_quantize";
    case OpId::group_dequantize:
      return "group_dequantize";
    case OpId::group_dbias:
      return "group_dbias";
    case OpId::swizzle_scales:
      return "swizzle_scales";
    case OpId::moe_permute:
      return "moe_permute";
    case OpId::moe_unpermute:
      return "moe_unpermute";
    case OpId::swiglu:
      return "swiglu";
    case OpId::layer:
      return "layer";
    case OpId::moe_router:
      return "moe_router";
    case OpId::weighted_swiglu:
      return "weighted_swiglu";
    case OpId::ep_dispatch:
      return "ep_dispatch";
    case OpId::moe_gate_up:
      return "moe_gate_up_swiglu";
    case OpId::moe_down_dgrad:
      return "moe_down_dgrad_swiglu";
    case OpId::count_:
      break;
  }
  return "unknown";
}

void report_fault_host(StatusBlock* s, uint32_t bit, OpId op, int32_t group, int64_t value) {
  if (s->bits == 0) {
    s->op = static_cast<uint32_t>(op);
    s->group = group;
    s->value = value;
  }
  s->bits |= bit;
}

std::string describe_status(const StatusBlock& s) {
  if (s.bits == 0) return "ok";
  std::ostringstream os;
  os << "device fault in " << op_name(static_cast<OpId>(s.op)) << " (status 0x" << std::hex
     << s.bits << std::dec << "):";
  if (s.bits & kFaultNegativeSplit) os << " negative split (treated as 0);";
  if (s.bits & kFaultSplitsTotalMismatch) os << " sum of splits != expected rows;";
  if (s.bits & kFaultSplitsOverflow) os << " splits run past the buffer (rows clamped);";
  if (s.bits & kFaultBadIndex) os << " index out of range (entry skipped);";
  if (s.bits & kFaultSplitAlignment) os << " split breaks the op's alignment rule (group skipped);";
  if (s.bits & kFaultEpCapacity) os << " expert-parallel capacity exceeded (rows dropped);";
  // A whole-tensor fault (the sum of the splits) has no group; its value is the sum. An EP
  // capacity fault alone names the peer rank and the rows or entries it needed.
  if (s.bits == kFaultEpCapacity && static_cast<OpId>(s.op) == OpId::ep_dispatch)
    os << " first at peer rank " << s.group << ", needed " << s.value;
  else if (s.group < 0)
    os << " the splits sum to " << s.value;
  else
    os << " first at group " << s.group << ", value " << s.value;
  return os.str();
}

}  // namespace groupmm
