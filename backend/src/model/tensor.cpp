#include "edge/backend/model/tensor.h"

namespace edge::backend {

std::string_view type_name(const tensor_view& tensor) {
  switch (tensor.encoding) {
    case tensor_encoding::elements:
      switch (tensor.type) {
        case kernels::dtype::f32: return "F32";
        case kernels::dtype::f16: return "F16";
        case kernels::dtype::bf16: return "BF16";
        case kernels::dtype::fp8_e4m3: return "F8_E4M3";
      }
      break;
    case tensor_encoding::int32: return "I32";
    case tensor_encoding::int64: return "I64";
    case tensor_encoding::ggml_q4_0: return "Q4_0";
    case tensor_encoding::ggml_q8_0: return "Q8_0";
  }
  return "unknown";
}

}  // namespace edge::backend
