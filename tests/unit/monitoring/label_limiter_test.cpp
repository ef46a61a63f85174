#include <doctest/doctest.h>

#include <string>

#include "edge/monitoring/gateway_metrics.h"
#include "edge/monitoring/label_limiter.h"
#include "edge/monitoring/metrics_registry.h"

TEST_CASE("tenant labels are capped: the first N values keep their names, later ones are \"other\"") {
  edge::monitoring::label_limiter labels(2);
  CHECK(labels.label("a") == "a");
  CHECK(labels.label("b") == "b");
  CHECK(labels.label("c") == "other");
  CHECK(labels.label("a") == "a");
  CHECK(labels.label("d") == "other");
  CHECK(labels.tracked() == 2);
}

TEST_CASE("the per-tenant gateway families are exported with capped tenant labels") {
  edge::monitoring::metrics_registry metrics;
  edge::monitoring::gateway_metrics gateway(metrics.families());
  for (int i = 0; i < 105; ++i) {
    const std::string tenant = gateway.tenant_labels.label("tenant-" + std::to_string(i));
    gateway.quota_rejections.Add({{"tenant", tenant}, {"limit", "requests_per_minute"}}).Increment();
    gateway.tenant_requests.Add({{"tenant", tenant}, {"outcome", "ok"}}).Increment();
    gateway.tenant_tokens.Add({{"tenant", tenant}, {"kind", "prompt"}}).Increment(10);
  }
  const std::string text = metrics.scrape();
  CHECK(text.find("edgeinfer_quota_rejections_total{limit=\"requests_per_minute\",tenant=\"tenant-0\"} 1") !=
        std::string::npos);
  CHECK(text.find("edgeinfer_quota_rejections_total{limit=\"requests_per_minute\",tenant=\"other\"} 5") !=
        std::string::npos);
  CHECK(text.find("tenant=\"tenant-100\"") == std::string::npos);
  CHECK(text.find("edgeinfer_tenant_requests_total{outcome=\"ok\",tenant=\"other\"} 5") != std::string::npos);
  CHECK(text.find("edgeinfer_tenant_tokens_total{kind=\"prompt\",tenant=\"tenant-99\"} 10") != std::string::npos);
}
