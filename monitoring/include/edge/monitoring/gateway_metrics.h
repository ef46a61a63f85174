// The gateway's metric families, declared in one place.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

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

  static const prometheus::Histogram::BucketBoundaries& duration_buckets();
};

}  // namespace edge::monitoring
