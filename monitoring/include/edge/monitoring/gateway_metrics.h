// The gateway's metric families, declared in one place.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

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

  // edgeinfer_active_streams: Server-Sent Event streams currently open.
  prometheus::Gauge& active_streams;
  // edgeinfer_tenant_tokens_total{tenant, kind}: tokens served per tenant; kind is "prompt"
  // or "completion". Label with tenant_label().
  prometheus::Family<prometheus::Counter>& tenant_tokens;

  static const prometheus::Histogram::BucketBoundaries& duration_buckets();

  // Tenant label values are capped so that the number of series stays bounded: the first
  // max_tenant_labels tenants seen keep their names, later ones are counted as "other".
  // (A counter cannot move from "other" to its own name later without breaking monotonicity,
  // so the cap is by first appearance, not by traffic.) Thread-safe.
  static constexpr std::size_t max_tenant_labels = 100;
  static constexpr std::string_view other_tenants = "other";
  std::string tenant_label(std::string_view tenant);

 private:
  std::mutex tenants_mutex_;
  std::unordered_set<std::string> tenants_;  // guarded by tenants_mutex_
};

}  // namespace edge::monitoring
