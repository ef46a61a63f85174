// The process's metrics: one prometheus-cpp registry for the metric families, plus collectors
// computed at scrape time (process_*). Served as Prometheus text by the gateway's own /metrics
// handler: there is no second HTTP server.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/registry.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace edge::monitoring {

// Content-Type of the Prometheus text exposition format.
inline constexpr std::string_view text_content_type = "text/plain; version=0.0.4; charset=utf-8";

// Every metric name edgeinfer defines starts with this.
inline constexpr std::string_view metric_prefix = "edgeinfer_";

class metrics_registry {
 public:
  // Registers edgeinfer_build_info and the process collector.
  metrics_registry();

  prometheus::Registry& families() { return *registry_; }
  // The engine's families (engine_metrics): in scrape() with the rest, and alone in
  // scrape_engine(), which names no tenant (what a Kubernetes endpoint picker reads).
  prometheus::Registry& engine_families() { return *engine_registry_; }

  // Thread-safe; collectors live as long as the registry.
  void add_collector(std::shared_ptr<const prometheus::Collectable> collector);

  // All families and collectors in the text exposition format. Thread-safe.
  std::string scrape() const;
  // The engine's families only, in the same format. Thread-safe.
  std::string scrape_engine() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Registry> engine_registry_;
  mutable std::mutex collectors_mutex_;
  std::vector<std::shared_ptr<const prometheus::Collectable>> collectors_;
};

// process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds, process_start_time_seconds, process_threads: the series
// the official Prometheus clients export, read from /proc at scrape time.
std::shared_ptr<const prometheus::Collectable> make_process_collector();

}  // namespace edge::monitoring
