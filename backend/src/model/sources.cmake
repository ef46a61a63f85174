# Sources of backend/src/model: target_sources(edge_backend PRIVATE src/model/<file>.cpp ...)
