#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "edge/monitoring/metrics_registry.h"

namespace edge::monitoring {
namespace {

prometheus::MetricFamily gauge_family(std::string name, std::string help, double value,
                                      prometheus::MetricType type = prometheus::MetricType::Gauge) {
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return {std::move(name), std::move(help), type, {metric}};
}

// Seconds since the epoch at which the machine booted (/proc/stat "btime").
double boot_time_seconds() {
  std::ifstream stat("/proc/stat");
  std::string key;
  double value = 0;
  while (stat >> key) {
    if (key == "btime") {
      stat >> value;
      return value;
    }
    stat.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

class process_collector final : public prometheus::Collectable {
 public:
  process_collector()
      : ticks_per_second_(static_cast<double>(::sysconf(_SC_CLK_TCK))),
        page_size_(static_cast<double>(::sysconf(_SC_PAGESIZE))),
        boot_time_(boot_time_seconds()) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    std::ifstream stat_file("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
    // Fields after the command name, which is in parentheses and may contain spaces.
    const auto close = stat.rfind(')');
    if (close != std::string::npos) {
      std::istringstream fields(stat.substr(close + 2));
      std::vector<std::string> f;
      for (std::string field; fields >> field;) f.push_back(field);
      // proc(5) numbering: state is field 3, so index = field number - 3.
      const auto field = [&](std::size_t number) { return std::stod(f.at(number - 3)); };
      if (f.size() >= 22) {
        out.push_back(gauge_family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                                   (field(14) + field(15)) / ticks_per_second_, prometheus::MetricType::Counter));
        out.push_back(gauge_family("process_threads", "Number of OS threads in the process.", field(20)));
        out.push_back(gauge_family("process_start_time_seconds",
                                   "Start time of the process since unix epoch in seconds.",
                                   boot_time_ + field(22) / ticks_per_second_));
        out.push_back(gauge_family("process_virtual_memory_bytes", "Virtual memory size in bytes.", field(23)));
        out.push_back(gauge_family("process_resident_memory_bytes", "Resident memory size in bytes.",
                                   field(24) * page_size_));
      }
    }
    std::error_code ec;
    std::size_t open_fds = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      ++open_fds;
    }
    out.push_back(gauge_family("process_open_fds", "Number of open file descriptors.",
                               static_cast<double>(open_fds)));
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
      out.push_back(gauge_family("process_max_fds", "Maximum number of open file descriptors.",
                                 static_cast<double>(limit.rlim_cur)));
    }
    return out;
  }

 private:
  double ticks_per_second_;
  double page_size_;
  double boot_time_;
};

}  // namespace

std::shared_ptr<const prometheus::Collectable> make_process_collector() {
  return std::make_shared<process_collector>();
}

}  // namespace edge::monitoring
