#include <doctest/doctest.h>

#include <string>

#include "edge/monitoring/gateway_metrics.h"
#include "edge/monitoring/metrics_registry.h"

TEST_CASE("a scrape holds build info, process metrics and the gateway families") {
  edge::monitoring::metrics_registry metrics;
  edge::monitoring::gateway_metrics gateway(metrics.families());
  gateway.http_requests.Add({{"route", "/healthz"}, {"code", "200"}}).Increment();
  gateway.http_request_duration.Add({{"route", "/healthz"}}, edge::monitoring::gateway_metrics::duration_buckets())
      .Observe(0.002);
  gateway.open_connections.Increment();

  const std::string text = metrics.scrape();
  CHECK(text.find("# TYPE edgeinfer_build_info gauge") != std::string::npos);
  CHECK(text.find("edgeinfer_build_info{") != std::string::npos);
  CHECK(text.find("edgeinfer_http_requests_total{code=\"200\",route=\"/healthz\"} 1") != std::string::npos);
  CHECK(text.find("edgeinfer_http_request_duration_seconds_bucket{route=\"/healthz\",le=\"0.005\"} 1") !=
        std::string::npos);
  CHECK(text.find("edgeinfer_http_request_duration_seconds_bucket{route=\"/healthz\",le=\"0.001\"} 0") !=
        std::string::npos);
  CHECK(text.find("edgeinfer_http_open_connections 1") != std::string::npos);
  CHECK(text.find("# TYPE process_cpu_seconds_total counter") != std::string::npos);
  CHECK(text.find("process_resident_memory_bytes ") != std::string::npos);
  CHECK(text.find("process_open_fds ") != std::string::npos);
  CHECK(text.find("process_start_time_seconds ") != std::string::npos);
}

TEST_CASE("tenant labels are capped: tenants past the cap are counted as other") {
  edge::monitoring::metrics_registry metrics;
  edge::monitoring::gateway_metrics gateway(metrics.families());
  using gm = edge::monitoring::gateway_metrics;
  for (std::size_t i = 0; i < gm::max_tenant_labels; ++i) {
    CHECK(gateway.tenant_labels.label("tenant-" + std::to_string(i)) == "tenant-" + std::to_string(i));
  }
  CHECK(gateway.tenant_labels.label("one-too-many") == edge::monitoring::label_limiter::overflow_value);
  // Tenants seen before the cap was reached keep their own label.
  CHECK(gateway.tenant_labels.label("tenant-0") == "tenant-0");

  gateway.tenant_tokens.Add({{"tenant", gateway.tenant_labels.label("late")}, {"kind", "prompt"}}).Increment(5);
  gateway.active_streams.Increment();
  const std::string text = metrics.scrape();
  CHECK(text.find("edgeinfer_tenant_tokens_total{kind=\"prompt\",tenant=\"other\"} 5") != std::string::npos);
  CHECK(text.find("edgeinfer_active_streams 1") != std::string::npos);
}
