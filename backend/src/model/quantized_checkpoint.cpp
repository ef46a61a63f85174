// write_quantized_checkpoint: a loaded INT4 / FP8 model as a compressed-tensors folder
// (layout in edge/backend/model/quantized_checkpoint.h).
#include "edge/backend/model/quantized_checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "edge/backend/io/dtype_names.h"
#include "edge/backend/io/gguf.h"
#include "edge/backend/io/output_files.h"
#include "edge/backend/io/safetensors.h"
#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/json_text.h"
#include "hf_config_text.h"
#include "rope_row_order.h"
#include "tensor_schema.h"
#include "kernels/quantize/quantize.h"

namespace edge::backend {
namespace {

namespace fs = std::filesystem;
using kernels::weight_format;

// compressed-tensors packs eight 4-bit values into each int32.
constexpr std::int64_t nibbles_per_word = 8;
// Files a Hugging Face source keeps its tokenizer and chat template in (and the ones an
// earlier `edgeinfer quantize` wrote for GGUF and llama2.c sources).
constexpr std::string_view tokenizer_files[] = {"tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json",
                                                "chat_template.jinja", "generation_config.json", "tokenizer.gguf",
                                                "tokenizer.bin"};

// ---- the tensors --------------------------------------------------------------------------------

// Maps a written row to the model's row: the identity, or the RoPE reordering of Q/K.
using row_map = std::function<std::int64_t(std::int64_t)>;

row_map identity_rows() {
  return [](std::int64_t r) { return r; };
}

// A plain tensor (embedding, norm, bias) as the model holds it, rows reordered by `rows_of`.
output_tensor plain_tensor(std::string name, const tensor_view& view, row_map rows_of) {
  const std::int64_t rows = view.shape.size() == 1 ? view.shape[0] : view.rows();
  const std::size_t row_bytes =
      view.shape.size() == 1 ? kernels::dtype_size(view.type) : view.bytes() / static_cast<std::size_t>(rows);
  output_tensor t{.name = std::move(name), .type = {.type = view.type, .encoding = view.encoding}, .shape = view.shape};
  t.write = [view, rows, row_bytes, rows_of = std::move(rows_of)](atomic_file& out) -> status {
    for (std::int64_t r = 0; r < rows; ++r) {
      EDGE_RETURN_IF_ERROR(out.write(view.data + static_cast<std::size_t>(rows_of(r)) * row_bytes, row_bytes));
    }
    return {};
  };
  return t;
}

// The quantized formats a compressed-tensors checkpoint holds as such: pack-quantized INT4 and
// float-quantized FP8. The others (INT8, the GGUF K-quants) are written exactly as f32.
bool compressed_tensors_holds(weight_format format) {
  return format == weight_format::int4 || format == weight_format::fp8_e4m3;
}

// A weight matrix under `stem` ("model.layers.0.self_attn.q_proj."): weight_packed /
// weight_scale / weight_shape for INT4, weight / weight_scale for FP8, weight for the rest.
void add_matrix(std::vector<output_tensor>& plan, const std::string& stem, const weight_matrix& w, row_map rows_of) {
  const std::int64_t rows = w.rows();
  const std::int64_t cols = w.cols();
  switch (w.format) {
    case weight_format::int4: {
      const std::int64_t words = (cols + nibbles_per_word - 1) / nibbles_per_word;
      const std::int64_t groups = cols / w.group_size;
      output_tensor packed{.name = stem + "weight_packed", .type = {.encoding = tensor_encoding::int32},
                           .shape = {rows, words}};
      packed.write = [w, rows, cols, words, rows_of](atomic_file& out) -> status {
        const std::int64_t row_bytes = kernels::int4_row_bytes(cols);
        std::vector<std::uint32_t> row(static_cast<std::size_t>(words));  // [words]
        for (std::int64_t r = 0; r < rows; ++r) {
          const auto* source = reinterpret_cast<const std::uint8_t*>(w.data) + rows_of(r) * row_bytes;
          std::fill(row.begin(), row.end(), 0u);
          for (std::int64_t i = 0; i < cols; ++i) {
            const auto code = static_cast<std::uint32_t>(kernels::int4_get(source, i) + kernels::int4_traits::code_offset);
            row[static_cast<std::size_t>(i / nibbles_per_word)] |=
                code << (kernels::int4_traits::nibble_bits * (i % nibbles_per_word));
          }
          EDGE_RETURN_IF_ERROR(out.write(row.data(), row.size() * sizeof(std::uint32_t)));
        }
        return {};
      };
      plan.push_back(std::move(packed));
      output_tensor scales{.name = stem + "weight_scale", .type = {.type = kernels::dtype::f32}, .shape = {rows, groups}};
      scales.write = [w, rows, groups, rows_of](atomic_file& out) -> status {
        for (std::int64_t r = 0; r < rows; ++r) {
          EDGE_RETURN_IF_ERROR(out.write(w.scales + rows_of(r) * groups, static_cast<std::size_t>(groups) * sizeof(float)));
        }
        return {};
      };
      plan.push_back(std::move(scales));
      output_tensor shape{.name = stem + "weight_shape", .type = {.encoding = tensor_encoding::int64}, .shape = {2}};
      shape.write = [rows, cols](atomic_file& out) -> status {
        EDGE_RETURN_IF_ERROR(out.write_scalar(rows));
        return out.write_scalar(cols);
      };
      plan.push_back(std::move(shape));
      return;
    }
    case weight_format::fp8_e4m3: {
      const tensor_view codes{.name = stem + "weight", .type = kernels::dtype::fp8_e4m3, .shape = w.shape, .data = w.data};
      plan.push_back(plain_tensor(stem + "weight", codes, rows_of));
      output_tensor scales{.name = stem + "weight_scale", .type = {.type = kernels::dtype::f32}, .shape = {rows, 1}};
      scales.write = [w, rows, rows_of](atomic_file& out) -> status {
        for (std::int64_t r = 0; r < rows; ++r) EDGE_RETURN_IF_ERROR(out.write_scalar(w.scales[rows_of(r)]));
        return {};
      };
      plan.push_back(std::move(scales));
      return;
    }
    case weight_format::f32:
    case weight_format::f16:
    case weight_format::bf16: {
      const tensor_view plain{.name = stem + "weight", .type = *kernels::element_dtype(w.format), .shape = w.shape,
                              .data = w.data};
      plan.push_back(plain_tensor(stem + "weight", plain, rows_of));
      return;
    }
    case weight_format::int8:
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q6_k: {
      // compressed-tensors has no layout for these: written exactly, as f32 (a float module).
      output_tensor decoded{.name = stem + "weight", .type = {.type = kernels::dtype::f32}, .shape = {rows, cols}};
      decoded.write = [w, rows, cols, rows_of](atomic_file& out) -> status {
        std::vector<float> row(static_cast<std::size_t>(cols));  // [cols]
        const kernels::weight_view view{.format = w.format, .values = w.data, .scales = w.scales,
                                        .group_size = w.group_size};
        for (std::int64_t r = 0; r < rows; ++r) {
          EDGE_RETURN_IF_ERROR(kernels::run_dequantize(
              {.w = view, .k = cols, .row_begin = rows_of(r), .rows = 1, .y = row.data(), .y_stride = cols}, {}));
          EDGE_RETURN_IF_ERROR(out.write(row.data(), row.size() * sizeof(float)));
        }
        return {};
      };
      plan.push_back(std::move(decoded));
      return;
    }
  }
}

// Whether the classifier can be written as the embedding's tie: the same bytes in the same type.
bool classifier_is_embedding(const model& m) {
  const auto type = kernels::element_dtype(m.weights.lm_head.format);
  return m.config.tie_embeddings && type && *type == m.weights.token_embedding.type &&
         m.weights.lm_head.data == m.weights.token_embedding.data;
}

struct checkpoint_plan {
  std::vector<output_tensor> tensors;
  // Linear module name → INT4 group size (pack-quantized) or 0 (FP8), for quantization_config.
  std::map<std::string, std::int64_t> quantized_modules;
  // Linear modules left in float (the classifier, MoE routers): quantization_config's ignore.
  std::vector<std::string> float_modules;
  bool tied = false;
};

checkpoint_plan plan_checkpoint(const model& m) {
  const model_weights& w = m.weights;
  checkpoint_plan plan;
  plan.tied = classifier_is_embedding(m);
  // The Q/K rows (and biases) of a model that holds them in adjacent-pair RoPE order are written
  // in the half-split order transformers uses. A latent attention layer's RoPE rows are written
  // as held (the configuration keeps rope_interleave); w_uk_t is computed on load and not written.
  const bool reorder = m.config.rope == rope_layout::adjacent_pairs && !m.config.mla;
  const std::int64_t head_dim = m.config.head_dim;
  const auto rows_of = [&](const schema_tensor& t) -> row_map {
    if (!reorder || !t.rope_rows) return identity_rows();
    return [head_dim](std::int64_t r) { return adjacent_pair_row(r, head_dim); };
  };
  const auto matrix = [&](const schema_tensor& t, const weight_matrix& matrix_weights) {
    const std::string module = t.hf.substr(0, t.hf.size() - std::string_view(".weight").size());
    add_matrix(plan.tensors, module + ".", matrix_weights, rows_of(t));
    if (compressed_tensors_holds(matrix_weights.format)) {
      plan.quantized_modules[module] = matrix_weights.format == weight_format::int4 ? matrix_weights.group_size : 0;
    } else {
      plan.float_modules.push_back(module);
    }
  };

  // Every tensor of the schema that the weights hold, the classifier included: a tied one is
  // the embedding's table, which is never quantized, named in the ignore list only.
  model_config untied = m.config;
  untied.tie_embeddings = false;
  for (const schema_tensor& t : tensor_schema(untied)) {
    if (t.hf.empty()) continue;
    if (t.model_slot == &tensor_names::token_embedding) {
      plan.tensors.push_back(plain_tensor(t.hf, w.token_embedding, identity_rows()));
    } else if (t.model_slot == &tensor_names::final_norm) {
      plan.tensors.push_back(plain_tensor(t.hf, w.final_norm, identity_rows()));
    } else if (t.model_slot == &tensor_names::lm_head) {
      if (plan.tied) {
        plan.float_modules.push_back(t.hf.substr(0, t.hf.size() - std::string_view(".weight").size()));
      } else {
        matrix(t, w.lm_head);
      }
    } else if (t.layer >= 0 && t.layer < m.config.num_layers) {
      const layer_weights& l = w.layers[static_cast<std::size_t>(t.layer)];
      if (t.layer_matrix != nullptr) matrix(t, l.*t.layer_matrix);
      if (t.layer_vector != nullptr) plan.tensors.push_back(plain_tensor(t.hf, l.*t.layer_vector, rows_of(t)));
      if (t.expert_matrix != nullptr) matrix(t, l.experts[static_cast<std::size_t>(t.expert)].*t.expert_matrix);
    }
  }
  return plan;
}

// ---- config.json ------------------------------------------------------------------------------

std::string quantization_config_json(const checkpoint_plan& plan, weight_format format) {
  std::string groups;
  if (format == weight_format::int4) {
    // One config group per group size; with a single size every Linear is its target.
    std::map<std::int64_t, std::vector<std::string>> by_size;
    for (const auto& [module, size] : plan.quantized_modules) by_size[size].push_back(module);
    std::size_t index = 0;
    for (const auto& [size, modules] : by_size) {
      std::string targets;
      if (by_size.size() == 1) {
        targets = "\"Linear\"";
      } else {
        for (const auto& module : modules) targets += (targets.empty() ? "" : ", ") + json_string(module);
      }
      groups += edge::format(
          "{}\"group_{}\": {{\"targets\": [{}], \"weights\": {{\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, "
          "\"strategy\": \"group\", \"group_size\": {}, \"dynamic\": false, \"actorder\": null, \"observer\": "
          "\"minmax\"}}, \"input_activations\": null, \"output_activations\": null}}",
          index == 0 ? "" : ", ", index, targets, size);
      ++index;
    }
  } else {
    groups =
        "\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 8, \"type\": \"float\", \"symmetric\": "
        "true, \"strategy\": \"channel\", \"dynamic\": false, \"observer\": \"minmax\"}, \"input_activations\": null, "
        "\"output_activations\": null}";
  }
  std::string ignored;
  for (const std::string& module : plan.float_modules) ignored += (ignored.empty() ? "" : ", ") + json_string(module);
  return edge::format(
      "{{\"quant_method\": \"compressed-tensors\", \"format\": \"{}\", \"quantization_status\": \"compressed\", "
      "\"config_groups\": {{{}}}, \"ignore\": [{}], \"kv_cache_scheme\": null, \"global_compression_ratio\": null, "
      "\"sparsity_config\": {{}}}}",
      format == weight_format::int4 ? "pack-quantized" : "float-quantized", groups,
      ignored);
}

// The fields load_model reads, from the model's configuration (GGUF and llama2.c sources).
std::string config_fields_from_model(const model& m, bool tied) {
  const model_config& c = m.config;
  std::string out;
  out += hf_config_shape_fields(c);
  out += "  \"hidden_act\": \"silu\",\n";
  out += hf_config_class_fields(c);
  out += "  \"torch_dtype\": \"" + std::string(torch_dtype_name(m.weights.token_embedding.type)) + "\",\n";
  out += std::string("  \"tie_word_embeddings\": ") + (tied ? "true" : "false") + ",\n";
  if (m.synthetic) out += "  \"edgeinfer_synthetic\": true,\n";
  return out;
}

// A Hugging Face source's own config.json, field by field, without its quantization_config and
// with tie_word_embeddings as written.
result<std::string> config_fields_from_source(const fs::path& config_path, bool tied) {
  std::FILE* f = std::fopen(config_path.c_str(), "rb");
  if (f == nullptr) return not_found(edge::format("cannot open {}: {}", config_path.string(), std::strerror(errno)));
  std::string text;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof(buffer), f)) > 0;) text.append(buffer, n);
  std::fclose(f);
  simdjson::dom::parser parser;
  auto object = parse_json_object(parser, text);
  if (!object.ok()) return object.error().with_context(config_path.string());
  std::string out;
  for (auto field : *object) {
    if (field.key == "quantization_config" || field.key == "tie_word_embeddings") continue;
    out += "  " + json_string(field.key) + ": " + simdjson::minify(field.value) + ",\n";
  }
  out += std::string("  \"tie_word_embeddings\": ") + (tied ? "true" : "false") + ",\n";
  return out;
}

// ---- tokenizer files ----------------------------------------------------------------------------

// tokenizer.gguf: a GGUF without tensors holding the source's general.* and tokenizer.*
// metadata, which is all a GGUF vocabulary and chat template need.
status write_gguf_tokenizer(const fs::path& source, const fs::path& path) {
  EDGE_ASSIGN_OR_RETURN(const auto file, load_gguf(source));
  gguf_metadata_writer keys;
  for (const auto& [key, value] : file.metadata) {
    if (!key.starts_with("general.") && !key.starts_with("tokenizer.")) continue;
    if (const auto* array = value.as_array(); array && !array->empty() && array->front().as_array()) {
      continue;  // arrays of arrays: no vocabulary key uses them
    }
    keys.add(key, value);
  }
  return write_gguf(path, keys, {});
}

status copy_tokenizer_file(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) return unavailable(edge::format("cannot copy {} to {}: {}", from.string(), to.string(), ec.message()));
  return {};
}

status write_tokenizer(const model& m, const load_options& source, const fs::path& folder) {
  std::error_code ec;
  switch (m.format) {
    case model_format::hugging_face: {
      bool any = false;
      for (std::string_view name : tokenizer_files) {
        const fs::path from = source.path / name;
        if (!fs::is_regular_file(from, ec)) continue;
        EDGE_RETURN_IF_ERROR(copy_tokenizer_file(from, folder / name));
        any = true;
      }
      if (!any) return not_found(edge::format("{} has no tokenizer files to copy", source.path.string()));
      return {};
    }
    case model_format::gguf: return write_gguf_tokenizer(source.path, folder / "tokenizer.gguf");
    case model_format::llama2c: {
      fs::path tokenizer;
      if (source.tokenizer) {
        tokenizer = *source.tokenizer;
      } else {
        const fs::path beside = source.path.parent_path();
        for (const fs::path& candidate :
             {beside / "tokenizer.bin", beside / edge::format("tok{}.bin", m.config.vocab_size)}) {
          if (fs::is_regular_file(candidate, ec)) {
            tokenizer = candidate;
            break;
          }
        }
      }
      if (tokenizer.empty()) return not_found(edge::format("no tokenizer file beside {}", source.path.string()));
      return copy_tokenizer_file(tokenizer, folder / "tokenizer.bin");
    }
  }
  return {};
}

// ---- the folder ---------------------------------------------------------------------------------

status prepare_folder(const fs::path& folder) {
  EDGE_ASSIGN_OR_RETURN(const bool has_files, output_folder_has_files(folder));
  if (has_files) return failed_precondition(edge::format("{} is not empty; choose a new folder", folder.string()));
  return {};
}

}  // namespace

namespace {

// Whether any matrix is in CPU row tiles (a model loaded with load_options::cpu_tiles); the
// writers read rows.
bool holds_cpu_tiles(const model_weights& w) {
  const auto tiled = [](const weight_matrix& m) { return m.layout != kernels::weight_layout::rows; };
  if (tiled(w.lm_head)) return true;
  for (const layer_weights& l : w.layers) {
    for (const weight_matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.wq_b, &l.wkv_b,
                                   &l.w_uk_t, &l.index_wq, &l.index_wk}) {
      if (tiled(*m)) return true;
    }
    for (const expert_weights& e : l.experts) {
      if (tiled(e.w_gate) || tiled(e.w_up) || tiled(e.w_down)) return true;
    }
  }
  return false;
}

}  // namespace

result<fs::path> write_quantized_checkpoint(const model& m, const quantized_checkpoint_options& options) {
  if (holds_cpu_tiles(m.weights)) {
    return failed_precondition("the model was loaded in CPU row tiles; load it without load_options::cpu_tiles to write it");
  }
  const weight_format format = projection_format(m.weights);
  if (!compressed_tensors_holds(format)) {
    return invalid_argument(edge::format("the model's projections are {}; quantize writes int4 or fp8 weights",
                                         kernels::to_string(format)));
  }

  const bool lm_head_quantized = compressed_tensors_holds(m.weights.lm_head.format);
  if (lm_head_quantized && m.weights.lm_head.format != format) {
    return status(status_code::unimplemented,
                  edge::format("the classifier is stored as {} and the projections as {}; a compressed-tensors "
                               "checkpoint written here holds one quantized format",
                               kernels::to_string(m.weights.lm_head.format), kernels::to_string(format)));
  }
  EDGE_RETURN_IF_ERROR(prepare_folder(options.out));
  checkpoint_plan plan = plan_checkpoint(m);

  std::string config = "{\n";
  if (m.format == model_format::hugging_face) {
    EDGE_ASSIGN_OR_RETURN(const auto fields, config_fields_from_source(options.source.path / "config.json", plan.tied));
    config += fields;
  } else {
    config += config_fields_from_model(m, plan.tied);
  }
  config += "  \"quantization_config\": " + quantization_config_json(plan, format) + "\n}\n";

  EDGE_RETURN_IF_ERROR(write_tokenizer(m, options.source, options.out));

  std::uint64_t total = 0;
  std::uint64_t written = 0;
  for (const auto& t : plan.tensors) total += t.bytes();
  if (options.progress) {
    // Told after each tensor: the writer only asks the tensors for their bytes.
    options.progress(0, total);
    for (auto& t : plan.tensors) {
      t.write = [write = std::move(t.write), bytes = t.bytes(), total, &written,
                 &progress = options.progress](atomic_file& out) -> status {
        EDGE_RETURN_IF_ERROR(write(out));
        written += bytes;
        progress(written, total);
        return {};
      };
    }
  }
  const safetensors_metadata metadata = {{"edgeinfer_quantized", std::string(kernels::to_string(format))}};
  EDGE_RETURN_IF_ERROR(write_safetensors_weights(options.out, plan.tensors, metadata, options.max_shard_bytes));
  // Last, so that the folder is only loadable once everything else is in place.
  EDGE_RETURN_IF_ERROR(write_text_file(options.out / "config.json", config));
  return options.out;
}

}  // namespace edge::backend
