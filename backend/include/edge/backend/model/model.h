// A loaded Llama-family model: hyperparameters, weight views, tokenizer and chat template.
//
// Formats (chosen by content, not by name):
//   * a GGUF file (architecture "llama"; tensors F32/F16/BF16; tokenizer from its metadata)
//   * a llama2.c checkpoint (.bin), with its tokenizer file beside it or given explicitly
//   * a Hugging Face folder: config.json (LlamaForCausalLM, Qwen2ForCausalLM,
//     MistralForCausalLM), model.safetensors or sharded *.safetensors with
//     model.safetensors.index.json, tokenizer.json, tokenizer_config.json
//
// Weights are used in place from the file mappings wherever their layout allows (a tensor a
// file places at an address misaligned for its type is copied into owned_buffers). Every page
// of every weight is read in before load_model returns, so the first request does not wait on
// the disk. RoPE layout: adjacent_pairs for GGUF "llama" (llama.cpp's converter permutes the
// Q/K rows of Hugging Face checkpoints for it) and llama2.c; half_split for Hugging Face
// folders and GGUF "qwen2".
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "edge/backend/model/mapped_file.h"
#include "edge/backend/model/model_config.h"
#include "edge/backend/model/tensor.h"
#include "edge/backend/tokenizer/chat_template.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/status.h"

namespace edge::backend {

struct layer_weights {
  tensor_view attn_norm;  // [hidden]
  tensor_view wq;         // [num_heads * head_dim, hidden]
  tensor_view wk;         // [num_kv_heads * head_dim, hidden]
  tensor_view wv;         // [num_kv_heads * head_dim, hidden]
  tensor_view wo;         // [hidden, num_heads * head_dim]
  tensor_view bq;         // [num_heads * head_dim]     (Qwen2 only; absent otherwise)
  tensor_view bk;         // [num_kv_heads * head_dim]  (Qwen2 only)
  tensor_view bv;         // [num_kv_heads * head_dim]  (Qwen2 only)
  tensor_view ffn_norm;   // [hidden]
  tensor_view w_gate;     // [intermediate, hidden]
  tensor_view w_up;       // [intermediate, hidden]
  tensor_view w_down;     // [hidden, intermediate]
};

struct model_weights {
  tensor_view token_embedding;  // [vocab, hidden]
  std::vector<layer_weights> layers;
  tensor_view final_norm;       // [hidden]
  tensor_view lm_head;          // [vocab, hidden]; the token embedding when tied
};

enum class model_format { gguf, llama2c, hugging_face };

struct model {
  std::string name;  // the served model id by default
  model_format format = model_format::gguf;
  model_config config;
  model_weights weights;
  std::unique_ptr<tokenizer> tok;
  chat_template_kind chat_template = chat_template_kind::plain;
  bool synthetic = false;  // written by `edgeinfer make-model`: random weights

  // What the views point into.
  std::vector<std::shared_ptr<const mapped_file>> files;
  std::vector<std::vector<std::byte>> owned_buffers;
};

struct load_options {
  std::filesystem::path path;                     // file or folder
  // llama2.c: the tokenizer file; by default tokenizer.bin, else tok<vocab_size>.bin, beside it.
  std::optional<std::filesystem::path> tokenizer;
  // Overrides the template recognised from the model's own Jinja template (GGUF
  // tokenizer.chat_template, tokenizer_config.json "chat_template" or chat_template.jinja).
  std::optional<chat_template_kind> chat_template;
  // Called with (bytes done, bytes total) while weights are read; may be empty.
  std::function<void(std::uint64_t, std::uint64_t)> progress;
};

// Errors say which file: not_found for a missing model or tokenizer; invalid_argument for a file
// in no format edgeinfer reads, a tensor type it does not read (the quantized GGUF types, for
// now) or a tensor whose shape disagrees with the configuration; data_loss for truncation;
// unimplemented for architectures and features not supported (e.g. other RoPE scaling types).
result<std::unique_ptr<model>> load_model(const load_options& options);

}  // namespace edge::backend
