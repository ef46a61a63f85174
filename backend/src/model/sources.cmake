# Sources of backend/src/model: file formats (GGUF, safetensors, llama2.c, Hugging Face
# folders), load_model, the synthetic-model writer of `edgeinfer make-model` and the
# compressed-tensors writer of `edgeinfer quantize`.
target_sources(edge_backend PRIVATE
  src/model/mapped_file.cpp
  src/model/gguf.cpp
  src/model/safetensors.cpp
  src/model/model_config.cpp
  src/model/model_checks.cpp
  src/model/tensor.cpp
  src/model/weight_conversion.cpp
  src/model/weight_binding.cpp
  src/model/gguf_model.cpp
  src/model/hf_model.cpp
  src/model/llama2c.cpp
  src/model/model_loader.cpp
  src/model/synthetic_tokenizer.cpp
  src/model/synthetic.cpp
  src/model/quantized_checkpoint.cpp
)
