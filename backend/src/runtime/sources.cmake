target_sources(edge_backend PRIVATE src/runtime/kv_cache.cpp src/runtime/kv_block_pool.cpp src/runtime/cpu_executor.cpp src/runtime/sampler.cpp src/runtime/stop_checker.cpp src/runtime/generator.cpp)
