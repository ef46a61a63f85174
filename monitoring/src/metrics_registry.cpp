#include "edge/monitoring/metrics_registry.h"

#include <prometheus/gauge.h>
#include <prometheus/text_serializer.h>

#include "edge/common/version.h"

namespace edge::monitoring {

metrics_registry::metrics_registry()
    : registry_(std::make_shared<prometheus::Registry>()), engine_registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::BuildGauge()
      .Name(std::string(metric_prefix) + "build_info")
      .Help("Build of the running edgeinfer; the value is always 1")
      .Register(*registry_)
      .Add({{"version", std::string(version_string())},
            {"commit", std::string(git_commit())},
            {"cuda", cuda_compiled() ? "true" : "false"}})
      .Set(1);
  add_collector(make_process_collector());
}

void metrics_registry::add_collector(std::shared_ptr<const prometheus::Collectable> collector) {
  std::lock_guard lock(collectors_mutex_);
  collectors_.push_back(std::move(collector));
}

std::string metrics_registry::scrape() const {
  std::vector<prometheus::MetricFamily> all = registry_->Collect();
  std::vector<prometheus::MetricFamily> engine = engine_registry_->Collect();
  all.insert(all.end(), std::make_move_iterator(engine.begin()), std::make_move_iterator(engine.end()));
  {
    std::lock_guard lock(collectors_mutex_);
    for (const auto& collector : collectors_) {
      auto more = collector->Collect();
      all.insert(all.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    }
  }
  return prometheus::TextSerializer{}.Serialize(all);
}

std::string metrics_registry::scrape_engine() const {
  return prometheus::TextSerializer{}.Serialize(engine_registry_->Collect());
}

}  // namespace edge::monitoring
