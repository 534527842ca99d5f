// What a tuning run tells the person waiting for it, on stderr: a progress bar redrawn in
// place on a terminal, plain lines every few seconds otherwise (logs, CI), or nothing.
#pragma once

#include <string>

namespace deuteron::autotune {

// "1.234 ms", "56.7 us", "2.10 s".
std::string format_seconds(double s);

class Progress {
 public:
  struct State {
    int tried = 0, ok = 0, failed = 0, rejected = 0, pruned = 0, compiling = 0;
    int budget = 0;  // candidates the effort allows
    double best_s = 0, default_s = 0, elapsed_s = 0, time_budget_s = 0;
  };
  // mode: auto (bar if stderr is a terminal, else lines), bar, lines, quiet.
  Progress(const std::string& mode, std::string title);
  ~Progress();
  void start(const std::string& text);
  // A line of its own (a failed candidate, a warning): the bar is redrawn below it.
  void message(const std::string& text);
  void phase(const std::string& text);
  void update(const State& s, bool force);
  void finish();

 private:
  void clear_bar();
  enum class Mode { Bar, Lines, Quiet } mode_;
  std::string title_, phase_;
  State last_;
  double last_draw_ = -1e9;
  bool bar_shown_ = false, finished_ = false;
};

}  // namespace deuteron::autotune
