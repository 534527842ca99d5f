// Pipeline pictures (`deuteron model --timeline`, `deuteron run --timeline`): lanes of bars
// against time, drawn into a PNG with cairo (text and PNG output in one well-kept library).
#pragma once

#include <string>
#include <vector>

#include "model/model.h"

namespace deuteron::cli {

struct TimelineBar {
  double start = 0, end = 0;  // seconds
  std::string key;            // legend entry (its colour): "copy k", "compute", "bubble", ...
  std::string label;          // drawn inside the bar when it fits
};

struct TimelineLane {
  std::string name;
  std::vector<TimelineBar> bars;
};

// One picture: a title, a note under it, and lanes sharing one time axis; `marks` are the
// times at which grid steps start (dashed lines, labelled `mark_labels`).
struct TimelinePanel {
  std::string title, note;
  std::vector<TimelineLane> lanes;
  std::vector<double> marks;
  std::vector<std::string> mark_labels;
};

// The lanes of a simulated schedule: memory and compute, one bar per event, the grid steps
// marked.
TimelinePanel schedule_panel(const model::Schedule& s, const std::string& title, const std::string& note);

// Draws the panels one under the other, each on its own time axis, with one legend, into a
// PNG at `path`. Throws ArgumentError when the file cannot be written.
void write_timeline_png(const std::string& path, const std::string& heading, const std::vector<TimelinePanel>& panels);

}  // namespace deuteron::cli
