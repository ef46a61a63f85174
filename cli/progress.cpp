#include "progress.h"

#include <unistd.h>

#include <cstdio>

#include "edge/common/format.h"

namespace edge::cli {
namespace {

constexpr int bar_width = 30;
constexpr auto redraw_interval = std::chrono::milliseconds(50);

}  // namespace

progress_bar::progress_bar(std::string label) : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1) {}

progress_bar::~progress_bar() {
  if (drawn_) std::fputc('\n', stderr);
}

void progress_bar::update(std::uint64_t done, std::uint64_t total) {
  if (!enabled_ || total == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total && now - last_draw_ < redraw_interval) return;
  last_draw_ = now;
  const double fraction = static_cast<double>(done) / static_cast<double>(total);
  const int filled = static_cast<int>(fraction * bar_width);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(bar_width, '.');
  std::fprintf(stderr, "\r%s [%s] %3.0f%% %s / %s", label_.c_str(), bar.c_str(), fraction * 100.0,
               format_bytes(done).c_str(), format_bytes(total).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace edge::cli
