# Sources of backend/src/tokenizer: target_sources(edge_backend PRIVATE src/tokenizer/<file>.cpp ...)
