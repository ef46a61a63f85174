target_sources(edge_backend PRIVATE src/engine/scheduler.cpp src/engine/step_driver.cpp src/engine/engine.cpp src/engine/generator.cpp
  src/engine/submission.cpp src/engine/request_rules.cpp src/engine/eval.cpp)
