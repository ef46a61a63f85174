target_sources(edge_backend PRIVATE src/engine/scheduler.cpp src/engine/engine.cpp)
