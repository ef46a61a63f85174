# Sources of backend/src/io that need JSON: the safetensors reader (simdjson). The rest of the
# checkpoint I/O layer (file mappings, the dtype names, GGUF) is standard-library-only and in
# edge_backend_core (backend/CMakeLists.txt).
target_sources(edge_backend PRIVATE
  src/io/safetensors_reader.cpp
)
