# Sources of backend/src/runtime: target_sources(edge_backend PRIVATE src/runtime/<file>.cpp ...)
