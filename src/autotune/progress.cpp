#include "autotune/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "runtime/process.h"
#include "deuteron/error.h"

namespace deuteron::autotune {

std::string format_seconds(double s) {
  if (s <= 0) return "-";
  if (s >= 1) return fmt::format("{:.2f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

Progress::Progress(const std::string& mode, std::string title) : title_(std::move(title)) {
  if (mode == "auto") {
    mode_ = isatty(STDERR_FILENO) ? Mode::Bar : Mode::Lines;
  } else if (mode == "bar") {
    mode_ = Mode::Bar;
  } else if (mode == "lines") {
    mode_ = Mode::Lines;
  } else if (mode == "quiet") {
    mode_ = Mode::Quiet;
  } else {
    throw ArgumentError(fmt::format("unknown progress mode '{}'", mode), "", "use auto, bar, lines or quiet");
  }
}

Progress::~Progress() { finish(); }

void Progress::clear_bar() {
  if (bar_shown_) {
    std::fputs("\r\033[K", stderr);
    bar_shown_ = false;
  }
}

void Progress::start(const std::string& text) {
  if (mode_ == Mode::Quiet) return;
  std::fprintf(stderr, "deuteron: %s\n", text.c_str());
}

void Progress::message(const std::string& text) {
  if (mode_ == Mode::Quiet) return;
  clear_bar();
  std::fprintf(stderr, "  %s\n", text.c_str());
  if (mode_ == Mode::Bar) update(last_, true);
}

void Progress::phase(const std::string& text) {
  phase_ = text;
  if (mode_ == Mode::Lines) std::fprintf(stderr, "  %s\n", text.c_str());
  if (mode_ == Mode::Bar) update(last_, true);
}

void Progress::update(const State& s, bool force) {
  last_ = s;
  if (mode_ == Mode::Quiet || finished_) return;
  double now = runtime::monotonic_seconds();
  double every = mode_ == Mode::Bar ? 0.2 : 5.0;
  if (!force && now - last_draw_ < every) return;
  last_draw_ = now;
  std::string stats = fmt::format("{} tried ({} failed, {} rejected), {} pruned, best {}{}, {:.0f} s", s.tried,
                                  s.failed, s.rejected, s.pruned, format_seconds(s.best_s),
                                  s.default_s > 0 ? " (default " + format_seconds(s.default_s) + ")" : "",
                                  s.elapsed_s);
  if (mode_ == Mode::Lines) {
    std::fprintf(stderr, "  %s\n", stats.c_str());
    return;
  }
  double frac = 0;
  if (s.budget > 0) frac = std::max(frac, double(s.tried) / s.budget);
  if (s.time_budget_s > 0) frac = std::max(frac, s.elapsed_s / s.time_budget_s);
  frac = std::min(frac, 1.0);
  const int width = 24;
  int full = int(frac * width + 0.5);
  std::string bar = std::string(size_t(full), '#') + std::string(size_t(width - full), '.');
  std::fprintf(stderr, "\r\033[K[%s] %s%s%s", bar.c_str(), stats.c_str(), phase_.empty() ? "" : "; ",
               phase_.c_str());
  std::fflush(stderr);
  bar_shown_ = true;
}

void Progress::finish() {
  if (finished_) return;
  if (mode_ == Mode::Bar && bar_shown_) {
    update(last_, true);
    std::fputs("\n", stderr);
    bar_shown_ = false;
  }
  finished_ = true;
}

}  // namespace deuteron::autotune
