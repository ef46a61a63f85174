# Sources of backend/src/model: file formats (GGUF, safetensors, llama2.c, Hugging Face
# folders), load_model, the synthetic-model writer of `edgeinfer make-model` and the
# compressed-tensors writer of `edgeinfer quantize`. The formats the executors need without
# JSON (GGUF, llama2.c, weight binding) are in edge_backend_core (backend/CMakeLists.txt).
target_sources(edge_backend PRIVATE
  src/model/safetensors.cpp
  src/model/hf_model.cpp
  src/model/model_loader.cpp
  src/model/synthetic_tokenizer.cpp
  src/model/synthetic.cpp
  src/model/quantized_checkpoint.cpp
)
