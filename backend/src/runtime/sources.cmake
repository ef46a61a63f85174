# The KV cache, the forward pass, the executors and the sampler are in edge_backend_core (backend/CMakeLists.txt).
target_sources(edge_backend PRIVATE src/runtime/stop_checker.cpp src/runtime/sequence_decoder.cpp)
