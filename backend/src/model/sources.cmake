# Sources of backend/src/model: models from the file formats (GGUF, llama2.c, Hugging Face
# folders), load_model, the synthetic models of `edgeinfer make-model` and the
# compressed-tensors checkpoints of `edgeinfer quantize` (both written through src/io). What the
# executors need without JSON (GGUF and llama2.c models, weight binding) is in
# edge_backend_core (backend/CMakeLists.txt).
target_sources(edge_backend PRIVATE
  src/model/hf_model.cpp
  src/model/hf_config_fields.cpp
  src/model/model_loader.cpp
  src/model/cpu_tile_weights.cpp
  src/model/synthetic.cpp
  src/model/quantized_checkpoint.cpp
)
