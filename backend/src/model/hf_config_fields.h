// The fields of a Hugging Face config.json that belong to its class rather than to every model's
// shape: attention biases and norms, the latent attention and its indexer, the router. Which of
// them a class carries, and transformers' defaults for them, are its architecture row's
// (architecture_traits.h); each field's name is written once, in a table that both the reader
// (parse_hf_config) and the writers (make-model's synthetic folders, quantize's checkpoints) use.
#pragma once

#include <string>

#include "edge/backend/model/model_config.h"
#include "edge/common/json_fields.h"
#include "edge/common/status.h"

namespace edge::backend {

// Reads the class's fields into `config`, whose arch and shape (head_dim, num_layers) are read.
status read_class_fields(const json_fields& fields, model_config& config);

// The class's fields of `c`, as config.json spells them: one field per line, each ending in ",\n".
std::string hf_config_class_fields(const model_config& c);

}  // namespace edge::backend
