// The internal API of `edgeinfer backend`: the engine alone behind HTTP, for split gateways
// (internal_protocol.h has the wire format).
//
//   POST /internal/v1/generate   token ids in, NDJSON events out; closing the connection
//                                cancels the request (its KV blocks are freed at the engine's
//                                next step)
//   GET  /internal/v1/info       the model's identity (id, context, chat template, tokenizer
//                                fingerprint, block size)
//   GET  /internal/v1/load       waiting, running, in flight, KV blocks, prefix-cache summary
//
// No tenants and no API keys: the gateway has checked those. Every internal route wants
// `Authorization: Bearer TOKEN` (401 otherwise): the backend's --internal-token, or the token it
// made on its first start (load_or_create_internal_token); the operational routes (/healthz,
// /readyz, /metrics) stay open for probes and scrapers. Until the engine runs,
// the internal routes answer 503 model_not_ready; once its engine has failed, generate answers
// 503 backend_unavailable (the gateway tries another backend).
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

#include "edge/backend/engine/engine.h"
#include "edge/common/status.h"
#include "edge/gateway/http/http.h"
#include "edge/gateway/split/internal_protocol.h"

namespace edge::gateway {

class grammar_compiler;

struct internal_backend {
  backend_info info;
  backend::engine* engine = nullptr;
  grammar_compiler* grammars = nullptr;  // compiles the grammars requests carry
};

// Empty until the engine runs; then holds it for the server's life. Thread-safe.
class internal_backend_slot {
 public:
  void publish(std::shared_ptr<const internal_backend> backend);
  std::shared_ptr<const internal_backend> get() const;

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const internal_backend> backend_;  // guarded by mutex_
};

struct internal_route_options {
  std::string token;  // what callers must present; empty refuses every caller
  // A stream that wrote nothing this long gets a heartbeat line, so that the gateway's read
  // timeout tells a dead backend from a request still waiting in the queue.
  std::chrono::milliseconds heartbeat{std::chrono::seconds(5)};
};

// The token of a backend started without --internal-token: made on its first start from the
// kernel's CSPRNG, kept in `state_dir` (created if missing) as internal_token_file_name, a
// file only its owner may read (0600), and read back on every later start (a file others may
// read is refused). Backends started at once on one folder end up with the same token.
struct stored_internal_token {
  std::string token;
  std::filesystem::path file;
  bool created = false;  // made by this call: the first start
};
result<stored_internal_token> load_or_create_internal_token(const std::filesystem::path& state_dir);

// `backends` must outlive the router.
void add_internal_routes(router& routes, const internal_backend_slot& backends, internal_route_options options);

}  // namespace edge::gateway
