# Sources of backend/src/tokenizer: target_sources(edge_backend PRIVATE src/tokenizer/<file>.cpp ...)
target_sources(edge_backend PRIVATE
  src/tokenizer/file_io.cpp
  src/tokenizer/pcre_regex.cpp
  src/tokenizer/unicode_normalize.cpp
  src/tokenizer/markup.cpp
  src/tokenizer/vocabulary.cpp
  src/tokenizer/spm_tokenizer.cpp
  src/tokenizer/bpe_tokenizer.cpp
  src/tokenizer/hf_tokenizer_json.cpp
  src/tokenizer/gguf_vocab.cpp
  src/tokenizer/llama2c_tokenizer.cpp
  src/tokenizer/tokenizer.cpp
  src/tokenizer/chat_formats.cpp
  src/tokenizer/chat_template.cpp
  src/tokenizer/synthetic_tokenizer.cpp
  src/tokenizer/jinja/lexer.cpp
  src/tokenizer/jinja/parser.cpp
  src/tokenizer/jinja/value.cpp
  src/tokenizer/jinja/python_text.cpp
  src/tokenizer/jinja/interpreter.cpp
  src/tokenizer/jinja/builtins.cpp
)
