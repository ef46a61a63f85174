#include "edge/monitoring/gateway_metrics.h"

#include <string>

#include "edge/monitoring/metrics_registry.h"

namespace edge::monitoring {
namespace {

std::string name(const char* suffix) { return std::string(metric_prefix) + suffix; }

}  // namespace

const prometheus::Histogram::BucketBoundaries& gateway_metrics::duration_buckets() {
  // From sub-millisecond health checks to multi-minute generation streams.
  static const prometheus::Histogram::BucketBoundaries buckets = {
      0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
  return buckets;
}

const prometheus::Histogram::BucketBoundaries& gateway_metrics::compile_buckets() {
  // From a small schema on a small vocabulary to a large one on 150k tokens (and the waits behind
  // such compiles).
  static const prometheus::Histogram::BucketBoundaries buckets = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                                  0.5,   1,     2.5,  5,     10,   30,  60};
  return buckets;
}

gateway_metrics::gateway_metrics(prometheus::Registry& registry)
    : http_requests(prometheus::BuildCounter()
                        .Name(name("http_requests_total"))
                        .Help("HTTP requests answered, by route pattern and status code")
                        .Register(registry)),
      http_request_duration(prometheus::BuildHistogram()
                                .Name(name("http_request_duration_seconds"))
                                .Help("Time from a request's headers read to its response's last byte written")
                                .Register(registry)),
      open_connections(prometheus::BuildGauge()
                           .Name(name("http_open_connections"))
                           .Help("Client connections currently open")
                           .Register(registry)
                           .Add({})),
      buffered_body_bytes(prometheus::BuildGauge()
                              .Name(name("http_buffered_body_bytes"))
                              .Help("Bytes of request bodies still being received, all connections together")
                              .Register(registry)
                              .Add({})),
      http_overload_rejections(prometheus::BuildCounter()
                                   .Name(name("http_overload_rejections_total"))
                                   .Help("Connections and requests refused at a limit of the server's own: "
                                         "max_connections, max_buffered_body_bytes")
                                   .Register(registry)),
      active_streams(prometheus::BuildGauge()
                         .Name(name("active_streams"))
                         .Help("Server-Sent Event streams currently open")
                         .Register(registry)
                         .Add({})),
      tenant_requests(prometheus::BuildCounter()
                          .Name(name("tenant_requests_total"))
                          .Help("Requests of each tenant by outcome; tenants past the label cap are \"other\"")
                          .Register(registry)),
      tenant_tokens(prometheus::BuildCounter()
                        .Name(name("tenant_tokens_total"))
                        .Help("Tokens served to each tenant, by kind: prompt, completion, cached")
                        .Register(registry)),
      quota_rejections(prometheus::BuildCounter()
                           .Name(name("quota_rejections_total"))
                           .Help("Requests refused by a tenant quota, by tenant and the limit that refused")
                           .Register(registry)),
      backend_requests(prometheus::BuildCounter()
                           .Name(name("backend_requests_total"))
                           .Help("Requests a backend accepted from this gateway")
                           .Register(registry)),
      backend_up(prometheus::BuildGauge()
                     .Name(name("backend_up"))
                     .Help("1 while a backend is ready, serves the gateway's model and is not ejected")
                     .Register(registry)),
      backend_in_flight(prometheus::BuildGauge()
                            .Name(name("backend_in_flight"))
                            .Help("Requests this gateway sent to a backend that have not ended")
                            .Register(registry)),
      backend_kv_usage(prometheus::BuildGauge()
                           .Name(name("backend_kv_cache_usage_ratio"))
                           .Help("KV cache usage of a backend (0..1), as its latest load report says")
                           .Register(registry)),
      backend_waiting(prometheus::BuildGauge()
                          .Name(name("backend_requests_waiting"))
                          .Help("Requests waiting in a backend's queue, as its latest load report says")
                          .Register(registry)),
      backend_retries(prometheus::BuildCounter()
                          .Name(name("backend_retries_total"))
                          .Help("Requests retried on another backend after a failure before they started, by cause")
                          .Register(registry)),
      backend_ejections(prometheus::BuildCounter()
                            .Name(name("backend_ejections_total"))
                            .Help("Times a backend was ejected after consecutive failures")
                            .Register(registry)),
      backend_stream_errors(prometheus::BuildCounter()
                                .Name(name("backend_stream_errors_total"))
                                .Help("Streams from a backend that broke after the request started")
                                .Register(registry)),
      backend_usage_corrections(prometheus::BuildCounter()
                                    .Name(name("backend_usage_corrections_total"))
                                    .Help("Requests whose usage, as a backend reported it, was corrected before "
                                          "charging")
                                    .Register(registry)),
      backend_routes(prometheus::BuildCounter()
                         .Name(name("backend_routes_total"))
                         .Help("Why the first backend tried for a request was chosen")
                         .Register(registry)),
      quota_store_up(prometheus::BuildGauge()
                         .Name(name("quota_store_up"))
                         .Help("1 while the quota store (--quota-store) answers, 0 while it cannot be reached")
                         .Register(registry)
                         .Add({})),
      quota_store_errors(prometheus::BuildCounter()
                             .Name(name("quota_store_errors_total"))
                             .Help("Calls to the quota store that failed, by operation: connect, acquire, settle, "
                                   "release, finish (settle and release at once), renew, retry (of queued calls)")
                             .Register(registry)),
      quota_store_pending(prometheus::BuildGauge()
                              .Name(name("quota_store_pending"))
                              .Help("Quota store calls queued until it answers again: settlements that failed and "
                                    "compensations of calls that timed out")
                              .Register(registry)
                              .Add({})),
      quota_store_dropped(prometheus::BuildCounter()
                              .Name(name("quota_store_dropped_total"))
                              .Help("Queued quota store calls dropped because the queue was full")
                              .Register(registry)
                              .Add({})),
      tenant_budget_used(prometheus::BuildGauge()
                             .Name(name("tenant_budget_used_ratio"))
                             .Help("Share of a token budget a tenant has spent, all gateways together")
                             .Register(registry)),
      tenant_store_up(prometheus::BuildGauge()
                          .Name(name("tenant_store_up"))
                          .Help("1 while the tenant store (--tenant-store) answers, 0 while it cannot be reached")
                          .Register(registry)
                          .Add({})),
      tenant_store_snapshot_age(prometheus::BuildGauge()
                                    .Name(name("tenant_store_snapshot_age_seconds"))
                                    .Help("Seconds since the snapshot of tenants and keys was last confirmed current")
                                    .Register(registry)
                                    .Add({})),
      tenant_store_errors(prometheus::BuildCounter()
                              .Name(name("tenant_store_errors_total"))
                              .Help("Calls and checks that could not reach the tenant store")
                              .Register(registry)
                              .Add({})),
      usage_ledger_pending_rows(prometheus::BuildGauge()
                                    .Name(name("usage_ledger_pending_rows"))
                                    .Help("Rows of usage (tenant x hour) not yet written to the tenant store")
                                    .Register(registry)
                                    .Add({})),
      grammar_compile_seconds(prometheus::BuildHistogram()
                                  .Name(name("grammar_compile_seconds"))
                                  .Help("Time to compile a request's grammar (response_format) for the tokenizer")
                                  .Register(registry)
                                  .Add({}, compile_buckets())),
      grammar_cache_hits(prometheus::BuildCounter()
                             .Name(name("grammar_cache_hits_total"))
                             .Help("Grammars found compiled in the cache, or being compiled for another request")
                             .Register(registry)
                             .Add({})),
      grammar_cache_misses(prometheus::BuildCounter()
                               .Name(name("grammar_cache_misses_total"))
                               .Help("Grammars not in the cache, compiled for the request")
                               .Register(registry)
                               .Add({})),
      tenant_grammar_compile_seconds(prometheus::BuildCounter()
                                         .Name(name("tenant_grammar_compile_seconds_total"))
                                         .Help("Grammar compile time charged to each tenant")
                                         .Register(registry)),
      grammar_compile_rejections(prometheus::BuildCounter()
                                     .Name(name("grammar_compile_rejections_total"))
                                     .Help("Grammars refused a compile, by tenant and reason: tenant_queue, "
                                           "tenant_budget, server_queue, shutting_down")
                                     .Register(registry)),
      grammar_compiles_waiting(prometheus::BuildGauge()
                                   .Name(name("grammar_compiles_waiting"))
                                   .Help("Grammar compiles queued and not begun, all tenants together")
                                   .Register(registry)
                                   .Add({})),
      grammar_compile_wait_seconds(prometheus::BuildHistogram()
                                       .Name(name("grammar_compile_wait_seconds"))
                                       .Help("Time a grammar compile waited for its turn")
                                       .Register(registry)
                                       .Add({}, compile_buckets())),
      grammar_compiles_dropped(prometheus::BuildCounter()
                                   .Name(name("grammar_compiles_dropped_total"))
                                   .Help("Grammar compiles dropped before they began: every request waiting left")
                                   .Register(registry)
                                   .Add({})),
      grammar_cache_bytes(prometheus::BuildGauge()
                              .Name(name("grammar_cache_bytes"))
                              .Help("Memory the cached compiled grammars hold")
                              .Register(registry)
                              .Add({})) {
  // Both limits from the start, at 0: an alert's rate() needs the series before the first refusal.
  for (const char* limit : {"max_connections", "max_buffered_body_bytes"}) http_overload_rejections.Add({{"limit", limit}});
}

}  // namespace edge::monitoring
