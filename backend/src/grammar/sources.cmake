# Sources of backend/src/grammar: grammars, JSON Schema to grammar, compiling for a vocabulary,
# the per-sequence matcher (they need the standard library, simdjson and a tokenizer only, so
# the fuzz build compiles them as they are: tests/fuzz/CMakeLists.txt).
target_sources(edge_backend PRIVATE
  src/grammar/grammar.cpp
  src/grammar/json_schema.cpp
  src/grammar/compiled_grammar.cpp
  src/grammar/grammar_matcher.cpp
  src/grammar/output_reach.cpp
)
