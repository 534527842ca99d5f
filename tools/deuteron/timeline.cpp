#include "timeline.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "deuteron/error.h"

namespace deuteron::cli {

namespace {

constexpr int kWidth = 1800;
constexpr double kLeft = 190, kRight = 40;  // the lanes' names left of the plot
constexpr double kLaneHeight = 46, kLaneGap = 10;
constexpr double kTitleHeight = 66, kAxisHeight = 44, kPanelGap = 18;

struct Rgb {
  double r, g, b;
};

// Colour-blind-safe categorical colours (Okabe and Ito), then greys.
const Rgb kPalette[] = {{0.00, 0.45, 0.70}, {0.90, 0.62, 0.00}, {0.00, 0.62, 0.45}, {0.80, 0.47, 0.65},
                        {0.34, 0.71, 0.91}, {0.94, 0.89, 0.26}, {0.60, 0.40, 0.20}, {0.50, 0.50, 0.50}};
const Rgb kCompute{0.20, 0.20, 0.55}, kStep{0.55, 0.55, 0.55}, kBubble{0.84, 0.19, 0.15}, kWait{0.88, 0.88, 0.88};

bool is_bubble(const std::string& key) { return key.rfind("bubble", 0) == 0; }
bool is_wait(const std::string& key) { return key.rfind("waiting", 0) == 0; }

// A colour per legend key: compute, step, bubble and wait fixed, operands from the palette in
// the order they first appear (a write-back takes its tensor's colour, drawn lighter).
class Colours {
 public:
  Rgb of(const std::string& key) {
    if (key == "compute") return kCompute;
    if (key.rfind("grid step", 0) == 0) return kStep;
    if (is_bubble(key)) return kBubble;
    if (is_wait(key)) return kWait;
    std::string tensor = key.substr(key.find(' ') + 1);
    auto it = tensors_.find(tensor);
    if (it == tensors_.end()) it = tensors_.emplace(tensor, kPalette[tensors_.size() % std::size(kPalette)]).first;
    Rgb c = it->second;
    if (key.rfind("write-back", 0) == 0) c = {0.45 + 0.55 * c.r, 0.45 + 0.55 * c.g, 0.45 + 0.55 * c.b};
    return c;
  }

 private:
  std::map<std::string, Rgb> tensors_;
};

// A time unit that makes `span` read as a number between 1 and 1000.
std::pair<double, const char*> unit_for(double span) {
  if (span >= 1) return {1, "s"};
  if (span >= 1e-3) return {1e3, "ms"};
  if (span >= 1e-6) return {1e6, "us"};
  return {1e9, "ns"};
}

// Tick spacing of 1, 2 or 5 times a power of ten giving about `n` ticks over `span`.
double tick_step(double span, int n) {
  double raw = span / n, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

void text(cairo_t* cr, double x, double y, const std::string& s, double size, bool bold = false, double align = 0) {
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_move_to(cr, x - align * e.x_advance, y);
  cairo_show_text(cr, s.c_str());
}

double text_width(cairo_t* cr, const std::string& s, double size) {
  cairo_set_font_size(cr, size);
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  return e.x_advance;
}

void fill(cairo_t* cr, Rgb c) { cairo_set_source_rgb(cr, c.r, c.g, c.b); }

// Diagonal red hatching over a bubble, so it reads as idle time even in grey print.
void hatch(cairo_t* cr, double x, double y, double w, double h) {
  cairo_save(cr);
  cairo_rectangle(cr, x, y, w, h);
  cairo_clip(cr);
  fill(cr, {1.0, 0.88, 0.86});
  cairo_paint(cr);
  fill(cr, kBubble);
  cairo_set_line_width(cr, 1.5);
  for (double d = -h; d < w; d += 7) {
    cairo_move_to(cr, x + d, y + h);
    cairo_line_to(cr, x + d + h, y);
  }
  cairo_stroke(cr);
  cairo_restore(cr);
}

double panel_height(const TimelinePanel& p) {
  return kTitleHeight + double(p.lanes.size()) * (kLaneHeight + kLaneGap) + kAxisHeight;
}

void draw_panel(cairo_t* cr, const TimelinePanel& p, double top, Colours& colours) {
  double t_end = 0;
  for (const TimelineLane& l : p.lanes)
    for (const TimelineBar& b : l.bars) t_end = std::max(t_end, b.end);
  if (t_end <= 0) t_end = 1e-9;
  double plot_w = kWidth - kLeft - kRight;
  auto x_of = [&](double t) { return kLeft + t / t_end * plot_w; };

  fill(cr, {0, 0, 0});
  text(cr, 20, top + 22, p.title, 17, true);
  fill(cr, {0.25, 0.25, 0.25});
  text(cr, 20, top + 42, p.note, 13);
  double y0 = top + kTitleHeight;
  double lanes_h = double(p.lanes.size()) * (kLaneHeight + kLaneGap) - kLaneGap;

  // The grid steps: dashed lines where each starts.
  cairo_save(cr);
  const double dash[] = {4, 4};
  cairo_set_dash(cr, dash, 2, 0);
  cairo_set_line_width(cr, 1);
  for (size_t i = 0; i < p.marks.size(); ++i) {
    double x = std::round(x_of(p.marks[i])) + 0.5;
    fill(cr, {0.55, 0.55, 0.55});
    cairo_move_to(cr, x, y0 - 4);
    cairo_line_to(cr, x, y0 + lanes_h + 4);
    cairo_stroke(cr);
    if (i < p.mark_labels.size()) {
      fill(cr, {0.3, 0.3, 0.3});
      text(cr, x + 3, y0 - 6, p.mark_labels[i], 11);
    }
  }
  cairo_restore(cr);

  for (size_t li = 0; li < p.lanes.size(); ++li) {
    const TimelineLane& lane = p.lanes[li];
    double y = y0 + double(li) * (kLaneHeight + kLaneGap);
    fill(cr, {0.96, 0.96, 0.96});
    cairo_rectangle(cr, kLeft, y, plot_w, kLaneHeight);
    cairo_fill(cr);
    fill(cr, {0, 0, 0});
    text(cr, kLeft - 10, y + kLaneHeight / 2 + 5, lane.name, 13, true, 1.0);
    for (const TimelineBar& b : lane.bars) {
      double x = x_of(b.start), w = std::max(x_of(b.end) - x, 0.8);
      if (is_bubble(b.key)) {
        hatch(cr, x, y + 4, w, kLaneHeight - 8);
      } else {
        fill(cr, colours.of(b.key));
        cairo_rectangle(cr, x, y + 4, w, kLaneHeight - 8);
        cairo_fill(cr);
      }
      if (w > 5 && !is_wait(b.key)) {  // a thin white edge keeps neighbouring blocks apart
        fill(cr, {1, 1, 1});
        cairo_set_line_width(cr, 1);
        cairo_rectangle(cr, x + 0.5, y + 4.5, w - 1, kLaneHeight - 9);
        cairo_stroke(cr);
      }
      if (!b.label.empty() && text_width(cr, b.label, 11) + 6 < w) {
        Rgb c = colours.of(b.key);
        bool dark = 0.3 * c.r + 0.59 * c.g + 0.11 * c.b < 0.55 && !is_bubble(b.key);
        fill(cr, dark ? Rgb{1, 1, 1} : Rgb{0, 0, 0});
        text(cr, x + w / 2, y + kLaneHeight / 2 + 4, b.label, 11, false, 0.5);
      }
    }
  }

  // The time axis.
  double ya = y0 + lanes_h + 8;
  auto [scale, unit] = unit_for(t_end);
  double step = tick_step(t_end * scale, 10);
  fill(cr, {0, 0, 0});
  cairo_set_line_width(cr, 1);
  cairo_move_to(cr, kLeft, ya + 0.5);
  cairo_line_to(cr, kLeft + plot_w, ya + 0.5);
  cairo_stroke(cr);
  for (double v = 0; v <= t_end * scale * (1 + 1e-9); v += step) {
    double x = std::round(x_of(v / scale)) + 0.5;
    cairo_move_to(cr, x, ya);
    cairo_line_to(cr, x, ya + 6);
    cairo_stroke(cr);
    text(cr, x, ya + 20, fmt::format("{:g}", std::round(v / step) * step), 12, false, 0.5);
  }
  text(cr, kLeft + plot_w, ya + 36, fmt::format("time ({})", unit), 12, false, 1.0);
}

}  // namespace

TimelinePanel schedule_panel(const model::Schedule& s, const std::string& title, const std::string& note) {
  using K = model::Event::Kind;
  TimelinePanel p;
  p.title = title;
  p.note = note;
  p.lanes = {{"memory", {}}, {"compute", {}}};
  int64_t last_step = -1;
  for (const model::Event& e : s.events) {
    TimelineBar b{e.start, e.end, "", ""};
    std::string tensor = e.operand >= 0 ? s.operands[size_t(e.operand)] : "";
    std::string block = e.trip >= 0 ? fmt::format("{}{}", tensor, e.trip) : tensor;
    switch (e.kind) {
      case K::Copy: b.key = "copy " + tensor; b.label = block; break;
      case K::WriteBack: b.key = "write-back " + tensor; b.label = block; break;
      case K::Compute:
        b.key = "compute";
        b.label = e.trips > 1 ? fmt::format("inner loop: {} trips", e.trips) : e.trip >= 0 ? fmt::format("{}", e.trip) : "";
        break;
      case K::Step: b.key = "grid step overhead"; break;
      case K::Bubble: b.key = "bubble: an inner loop waits for its first block"; break;
      case K::Wait: b.key = "waiting for memory"; break;
    }
    p.lanes[e.lane == model::Event::Lane::Memory ? 0 : 1].bars.push_back(b);
    if (e.kind == K::Step && e.step != last_step) {
      last_step = e.step;
      p.marks.push_back(e.start);
      p.mark_labels.push_back(fmt::format("step {}", e.step));
    }
  }
  return p;
}

void write_timeline_png(const std::string& path, const std::string& heading, const std::vector<TimelinePanel>& panels) {
  // The legend: every key in the order it first appears.
  std::vector<std::string> keys;
  for (const TimelinePanel& p : panels)
    for (const TimelineLane& l : p.lanes)
      for (const TimelineBar& b : l.bars)
        if (std::find(keys.begin(), keys.end(), b.key) == keys.end()) keys.push_back(b.key);
  constexpr int kLegendColumns = 3;
  double legend_h = 30 + std::ceil(double(keys.size()) / kLegendColumns) * 24;
  double height = 50 + legend_h + 10;
  for (const TimelinePanel& p : panels) height += panel_height(p) + kPanelGap;

  cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, kWidth, int(std::ceil(height)));
  cairo_t* cr = cairo_create(surface);
  fill(cr, {1, 1, 1});
  cairo_paint(cr);
  fill(cr, {0, 0, 0});
  text(cr, 20, 32, heading, 20, true);

  Colours colours;
  double top = 50;
  for (const TimelinePanel& p : panels) {
    draw_panel(cr, p, top, colours);
    top += panel_height(p) + kPanelGap;
  }
  fill(cr, {0, 0, 0});
  text(cr, 20, top + 16, "legend", 13, true);
  double col_w = (kWidth - 40) / double(kLegendColumns);
  for (size_t i = 0; i < keys.size(); ++i) {
    double x = 20 + double(i % kLegendColumns) * col_w, y = top + 28 + double(i / kLegendColumns) * 24;
    if (is_bubble(keys[i])) {
      hatch(cr, x, y, 28, 16);
    } else {
      fill(cr, colours.of(keys[i]));
      cairo_rectangle(cr, x, y, 28, 16);
      cairo_fill(cr);
    }
    fill(cr, {0, 0, 0});
    std::string label = keys[i];
    if (label.rfind("copy ", 0) == 0) label = label.substr(5) + " blocks copied in (inner-loop copies numbered by trip)";
    else if (label.rfind("write-back ", 0) == 0) label = label.substr(11) + " blocks written back";
    text(cr, x + 36, y + 13, label, 13);
  }

  cairo_destroy(cr);
  cairo_surface_flush(surface);
  cairo_status_t status = cairo_surface_write_to_png(surface, path.c_str());
  cairo_surface_destroy(surface);
  if (status != CAIRO_STATUS_SUCCESS)
    throw ArgumentError(fmt::format("cannot write the timeline to '{}': {}", path, cairo_status_to_string(status)), "",
                        "pass a --timeline path in a writable directory");
}

}  // namespace deuteron::cli
