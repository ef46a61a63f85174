# The KV cache, executors and sampler are in edge_backend_core (backend/CMakeLists.txt).
target_sources(edge_backend PRIVATE src/runtime/stop_checker.cpp src/runtime/generator.cpp src/runtime/sequence_decoder.cpp src/runtime/eval.cpp)
