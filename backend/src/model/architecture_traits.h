// What each architecture is called by each side that names it, and the defaults the names
// imply: one row per architecture, read by the Hugging Face reader (class -> architecture and
// transformers' defaults), the GGUF reader (general.architecture and what its converter keeps),
// the writers of config.json (architecture -> class), the synthetic vocabulary's format and
// to_string(architecture).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "edge/backend/model/model_config.h"

namespace edge::backend {

struct architecture_traits {
  architecture arch;
  std::string_view model_type;  // config.json's model_type, and the name edgeinfer gives it
  std::string_view hf_class;    // transformers' class, config.json's architectures[0]
  // transformers' defaults for the fields a config.json may leave out.
  std::int64_t default_max_position;
  bool default_qkv_bias;
  bool default_qk_norm;
  std::int64_t default_head_dim;  // 0: hidden_size / num_attention_heads
  // llama.cpp's general.architecture ("" where edgeinfer reads no GGUF of it), and the RoPE
  // layout and per-head Q/K norms its converter leaves such a file with.
  std::string_view gguf_name;
  rope_layout gguf_rope;
  bool gguf_qkv_bias;
  bool gguf_qk_norm;
  // config.json turns a sliding attention window on with use_sliding_window (Qwen's classes);
  // for the others a sliding_window value does.
  bool sliding_window_switch;
  // The vocabulary make-model writes for it speaks ChatML (Qwen's; GLM's, whose own special
  // tokens are not made), else Llama 3's format.
  bool synthetic_chatml;
};

std::span<const architecture_traits> architecture_table();
const architecture_traits& traits_of(architecture arch);
// The rows whose hf_class or gguf_name is `name`; null for none.
const architecture_traits* find_hf_class(std::string_view name);
const architecture_traits* find_gguf_architecture(std::string_view name);
// "A, B and C": the names the readers take, for their errors.
std::string supported_hf_classes();
std::string supported_gguf_architectures();

}  // namespace edge::backend
