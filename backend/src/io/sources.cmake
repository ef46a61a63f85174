# Sources of backend/src/io that need JSON: the safetensors reader (simdjson) and writer. The
# rest of the checkpoint I/O layer (file mappings, atomic output files, the dtype names, GGUF)
# is standard-library-only and in edge_backend_core (backend/CMakeLists.txt).
target_sources(edge_backend PRIVATE
  src/io/safetensors_reader.cpp
  src/io/safetensors_writer.cpp
)
