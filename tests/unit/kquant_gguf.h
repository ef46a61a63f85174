// GGUF files with K-quant tensors for tests (the unit tests and tests/gpu): an F32 GGUF
// rewritten with the project's GGUF writer, its matrices re-encoded into K-quant blocks built by
// kquant_blocks.h, as llama.cpp's quantizer would lay out a Q4_K_M file.
#pragma once

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "edge/backend/io/gguf.h"
#include "edge/backend/io/output_files.h"
#include "kquant_blocks.h"

namespace edge::testing {

// Which tensors become which K-quant; nullopt keeps a tensor as it is.
using kquant_choice = std::function<std::optional<kernels::weight_format>(const std::string&)>;

// llama.cpp's Q4_K_M in small: Q4_K, the value projections and the classifier Q6_K; and one
// Q5_K (Q5_K_M's kind) so that all three meet in one model.
inline std::optional<kernels::weight_format> q4_k_m_mix(const std::string& name) {
  if (name == "output.weight" || name.ends_with("attn_v.weight")) return kernels::weight_format::q6_k;
  if (name == "blk.1.attn_k.weight") return kernels::weight_format::q5_k;
  return kernels::weight_format::q4_k;
}

inline backend::tensor_encoding kquant_encoding(kernels::weight_format f) {
  return f == kernels::weight_format::q4_k   ? backend::tensor_encoding::ggml_q4_k
         : f == kernels::weight_format::q5_k ? backend::tensor_encoding::ggml_q5_k
                                             : backend::tensor_encoding::ggml_q6_k;
}

// `in` (an F32 GGUF) rewritten to `out` with every matrix whose rows are whole super-blocks in
// the format `choose` gives it, and the tensors in `drop` left out; what each re-encoded tensor
// holds.
inline result<std::map<std::string, kquant_matrix>> write_kquant_gguf(const std::filesystem::path& in,
                                                                      const std::filesystem::path& out,
                                                                      const kquant_choice& choose,
                                                                      const std::vector<std::string>& drop = {}) {
  EDGE_ASSIGN_OR_RETURN(const backend::gguf_file file, backend::load_gguf(in));
  backend::gguf_metadata_writer keys;
  for (const auto& [key, value] : file.metadata) keys.add(key, value);
  std::map<std::string, kquant_matrix> encoded;
  std::vector<backend::output_tensor> tensors;
  for (const backend::tensor_view& t : file.tensors) {
    if (std::find(drop.begin(), drop.end(), t.name) != drop.end()) continue;
    const auto format = t.shape.size() == 2 && t.cols() % kq_elements == 0 ? choose(t.name) : std::nullopt;
    if (!format) {
      tensors.push_back({.name = t.name, .type = {.type = t.type, .encoding = t.encoding}, .shape = t.shape,
                         .write = [t](backend::atomic_file& f) { return f.write(t.data, t.bytes()); }});
      continue;
    }
    if (t.encoding != backend::tensor_encoding::elements || t.type != kernels::dtype::f32) {
      return invalid_argument(t.name + " is not F32");
    }
    auto& m = encoded[t.name] =
        quantize_kquant_matrix(*format, reinterpret_cast<const float*>(t.data), t.rows(), t.cols());
    tensors.push_back({.name = t.name, .type = {.type = kernels::dtype::f16, .encoding = kquant_encoding(*format)},
                       .shape = t.shape,
                       .write = [&m](backend::atomic_file& f) { return f.write(m.bytes.data(), m.bytes.size()); }});
  }
  EDGE_RETURN_IF_ERROR(backend::write_gguf(out, keys, tensors));
  return encoded;
}

}  // namespace edge::testing
