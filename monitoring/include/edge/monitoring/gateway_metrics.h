// The gateway's metric families, declared in one place.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstddef>

#include "edge/monitoring/label_limiter.h"

namespace edge::monitoring {

struct gateway_metrics {
  explicit gateway_metrics(prometheus::Registry& registry);

  // edgeinfer_http_requests_total{route, code}: route is the matched pattern
  // ("/v1/models/{id}") or "unmatched", so label values stay bounded.
  prometheus::Family<prometheus::Counter>& http_requests;
  // edgeinfer_http_request_duration_seconds{route}: from the request's headers being read to
  // the last byte of its response written (the whole stream, for SSE).
  prometheus::Family<prometheus::Histogram>& http_request_duration;
  // edgeinfer_http_open_connections: client connections currently open.
  prometheus::Gauge& open_connections;
  // edgeinfer_http_buffered_body_bytes: bytes of request bodies still being received, all
  // connections together (bounded by --max-buffered-body-bytes).
  prometheus::Gauge& buffered_body_bytes;
  // edgeinfer_http_overload_rejections_total{limit}: refused because the server was at one of
  // its own limits: max_connections (a connection answered 503 and closed as it was accepted),
  // max_buffered_body_bytes (a request whose body would have taken the bodies being received
  // past their budget).
  prometheus::Family<prometheus::Counter>& http_overload_rejections;
  // edgeinfer_active_streams: Server-Sent Event streams currently open.
  prometheus::Gauge& active_streams;

  // Per-tenant families. Their `tenant` label goes through tenant_labels: the first
  // max_tenant_labels tenants seen keep their name, the rest are "other".
  //
  // `api` names the API a request spoke: chat_completions, completions, messages, count_tokens
  // (Anthropic's), responses.
  //
  // edgeinfer_tenant_requests_total{tenant, api, outcome}: requests by how they ended.
  prometheus::Family<prometheus::Counter>& tenant_requests;
  // edgeinfer_tenant_tokens_total{tenant, api, kind}: kind is prompt, completion or cached.
  prometheus::Family<prometheus::Counter>& tenant_tokens;
  // edgeinfer_quota_rejections_total{tenant, api, limit}: limit is the name of the quota kind that
  // refused (the gateway's tenancy/quota_kinds.h lists them).
  prometheus::Family<prometheus::Counter>& quota_rejections;
  label_limiter tenant_labels{max_tenant_labels};

  // Routing of a split gateway (`edgeinfer gateway --backend URL ...`); the `backend` label is
  // the backend's URL as configured, so its values are bounded by the command line.
  //
  // edgeinfer_backend_requests_total{backend}: requests a backend accepted from this gateway.
  prometheus::Family<prometheus::Counter>& backend_requests;
  // edgeinfer_backend_up{backend}: 1 while the backend is ready, serves the gateway's model and
  // is not ejected; 0 otherwise.
  prometheus::Family<prometheus::Gauge>& backend_up;
  // edgeinfer_backend_in_flight{backend}: requests sent there that have not ended.
  prometheus::Family<prometheus::Gauge>& backend_in_flight;
  // edgeinfer_backend_kv_cache_usage_ratio{backend} and edgeinfer_backend_requests_waiting{backend}:
  // the latest load report of each backend, as the router weighs it.
  prometheus::Family<prometheus::Gauge>& backend_kv_usage;
  prometheus::Family<prometheus::Gauge>& backend_waiting;
  // edgeinfer_backend_retries_total{reason}: requests sent to another backend after one failed
  // before the request started: connect (refused, timed out), status (5xx, 401),
  // stream (broken before the first event).
  prometheus::Family<prometheus::Counter>& backend_retries;
  // edgeinfer_backend_ejections_total{backend}: times a backend was ejected after consecutive
  // failures.
  prometheus::Family<prometheus::Counter>& backend_ejections;
  // edgeinfer_backend_stream_errors_total{backend}: streams that broke after they started (the
  // client got an error event).
  prometheus::Family<prometheus::Counter>& backend_stream_errors;
  // edgeinfer_backend_usage_corrections_total{backend}: requests whose usage figures, as the
  // backend reported them, the gateway corrected before charging (outside what it sent,
  // relayed and asked for).
  prometheus::Family<prometheus::Counter>& backend_usage_corrections;
  // edgeinfer_backend_routes_total{reason}: why the first backend tried was chosen: affinity
  // (it holds the prompt's prefix), rendezvous (a new prefix's hash placed it), least_loaded,
  // session (the client's session key placed it).
  prometheus::Family<prometheus::Counter>& backend_routes;
  // The quota store (--quota-store). edgeinfer_quota_store_up: 1 while it answers (always, in
  // memory), 0 during an outage of a shared store. edgeinfer_quota_store_errors_total{operation}:
  // calls to it that failed, by operation (connect, acquire, settle, release, finish, renew,
  // retry). edgeinfer_quota_store_pending: calls queued to be applied once it answers again
  // (settlements that failed, compensations of calls that timed out);
  // edgeinfer_quota_store_dropped_total: those dropped because the queue was full.
  prometheus::Gauge& quota_store_up;
  prometheus::Family<prometheus::Counter>& quota_store_errors;
  prometheus::Gauge& quota_store_pending;
  prometheus::Counter& quota_store_dropped;
  // The tenant store (--tenant-store), refreshed with every flush of the usage ledger (1 s):
  // edgeinfer_tenant_store_up: 1 while it answers (always, for SQLite), 0 during an outage of
  // PostgreSQL, when requests are authenticated from the last snapshot;
  // edgeinfer_tenant_store_snapshot_age_seconds: since the snapshot of tenants and keys was last
  // confirmed current; edgeinfer_tenant_store_errors_total: calls and checks that could not reach
  // it. edgeinfer_usage_ledger_pending_rows: (tenant, hour) rows of usage not yet written (they
  // grow during an outage and are written once the store answers; a crash meanwhile loses them).
  // edgeinfer_tenant_budget_used_ratio{tenant, budget}: the share of a token budget a tenant
  // has spent (budget daily_tokens: today's prompt + completion tokens in the tenant store, all
  // gateways together, over the limit), for tenants that have the budget; refreshed every 10 s.
  prometheus::Family<prometheus::Gauge>& tenant_budget_used;
  prometheus::Gauge& tenant_store_up;
  prometheus::Gauge& tenant_store_snapshot_age;
  prometheus::Counter& tenant_store_errors;
  prometheus::Gauge& usage_ledger_pending_rows;
  // Structured outputs (grammar_compiler.h): edgeinfer_grammar_compile_seconds, the time to
  // compile a grammar for the tokenizer (cache misses only); edgeinfer_grammar_cache_hits_total
  // and edgeinfer_grammar_cache_misses_total, lookups of the compiled-grammar cache (a request
  // that waits for a compile of the same grammar in flight is a hit).
  prometheus::Histogram& grammar_compile_seconds;
  prometheus::Counter& grammar_cache_hits;
  prometheus::Counter& grammar_cache_misses;
  // edgeinfer_tenant_grammar_compile_seconds_total{tenant}: compile time each tenant was charged
  // (its budget, --grammar-compile-budget). edgeinfer_grammar_compile_rejections_total{tenant,
  // reason}: grammars refused a compile: tenant_queue, tenant_budget (429), server_queue,
  // shutting_down (503). Tenant labels through tenant_labels.
  prometheus::Family<prometheus::Counter>& tenant_grammar_compile_seconds;
  prometheus::Family<prometheus::Counter>& grammar_compile_rejections;
  // edgeinfer_grammar_compiles_waiting: compiles queued and not begun, all tenants;
  // edgeinfer_grammar_compile_wait_seconds: how long each waited for its turn;
  // edgeinfer_grammar_compiles_dropped_total: compiles dropped before they began because every
  // request waiting for them had left; edgeinfer_grammar_cache_bytes: what the compiled grammars
  // cached hold (bounded by --grammar-cache-memory).
  prometheus::Gauge& grammar_compiles_waiting;
  prometheus::Histogram& grammar_compile_wait_seconds;
  prometheus::Counter& grammar_compiles_dropped;
  prometheus::Gauge& grammar_cache_bytes;

  static constexpr std::size_t max_tenant_labels = 100;

  static const prometheus::Histogram::BucketBoundaries& duration_buckets();
  static const prometheus::Histogram::BucketBoundaries& compile_buckets();
};

}  // namespace edge::monitoring
