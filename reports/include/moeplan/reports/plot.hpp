#pragma once
// Small self-contained charts for `moeplan report`: line and marker charts as inline SVG (the
// HTML report) and bars in text (the terminal and markdown reports). No plotting library is
// packaged for C++ in Debian that writes SVG without a display stack; these need ~200 lines.
#include <string>
#include <utility>
#include <vector>

namespace moeplan::plot {

using XY = std::pair<double, double>;

struct Series {
  std::string name;
  std::vector<XY> points;  // drawn in the order given
  bool markers = false;    // a dot at each point (few points: a sweep over r_a)
  bool dashed = false;     // the dense baseline's: its curve, or its figure as a reference line
  // A reference line drawn beside the dense baseline's own (dashed) curve: grey and dotted, so
  // that the two are told apart (validation BPC against time: the curve and its final BPC).
  bool level = false;
  // Hollow circles in the series' colour at these points, beside its line: where a curve first
  // came to a reference line (the time table's "reached" figure).
  std::vector<XY> rings = {};
  // The name of an earlier series whose colour this one is drawn in, dashed and thinner, taking
  // no colour of its own: a replicate's own dense baseline beside that replicate's points. Where
  // no earlier series has the name, black.
  std::string beside = {};
  // The mean of the coloured series beside it: black, solid and thicker, taking no colour.
  bool mean = false;
  // Vertical bars with short caps in the series' colour, each from lo to hi at x: an interval
  // around a point (the 95 % confidence interval of a mean margin).
  struct Whisker {
    double x, lo, hi;
  };
  std::vector<Whisker> whiskers = {};
};

// A dashed horizontal line at y (a baseline) across the x range of `over`'s points, widened to
// at least 0.1 (a single point's r_a) so that it still reads as a line.
Series reference_line(const Series& over, std::string name, double y);

struct Chart {
  std::string title;
  std::string x_label, y_label;
  std::vector<Series> series;
  // The y axis spans each series' points from this fraction of its x range on (a training
  // curve's first steps would squash the rest); what falls outside is clipped at the frame.
  double y_from_fraction = 0;
  std::string id = "chart";  // unique within a document (the clip path's id)
};

// Tick values covering [lo, hi]: a step of 1, 2 or 5 times a power of ten, the smallest such
// step that gives at most `target` intervals; the first tick at or below lo, the last at or
// above hi. lo == hi is widened to one step around the value.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

// A tick's label: 4 significant digits, k/M/B/T suffixes from 1e4 up; no "-0".
std::string tick_label(double v);

// At most `max_points` points: consecutive runs of points averaged in x and y (the first and
// last points kept as they are, so a curve still starts and ends where it did).
std::vector<XY> bucket_means(const std::vector<XY>& points, size_t max_points);

// The drawing area of a chart: data coordinates to SVG pixels (y grows downwards in SVG).
struct Frame {
  static constexpr double kWidth = 720, kHeight = 360;
  static constexpr double kLeft = 70, kRight = 190, kTop = 34, kBottom = 46;  // margins
  double x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
  std::vector<double> x_ticks, y_ticks;  // from lo to hi: the axes' labelled values
  double x_px(double x) const;
  double y_px(double y) const;
};

// The frame whose axes span every series' points on nice ticks, widened past the outer ticks by a
// dot's reach (6 px: a ring's radius, its stroke and a pixel) where a dot or a ring would lie on
// the frame's edge (0.2 of an r_a sweep on the 0.2 tick), so that no dot is cut in half.
Frame frame_for(const Chart& chart);

// An <svg> element: axes with ticks and labels, a grid, one polyline per series, a legend.
// Names and labels are escaped; NaN and infinite points are left out.
std::string render_svg(const Chart& chart);

// One line per bar: label, value text, then a bar of `width` characters at the largest |value|;
// '#' for negative values (better, for a BPC difference), '+' for positive ones.
std::string text_bars(const std::vector<std::pair<std::string, double>>& bars,
                      const std::string& value_format, int width = 40);

}  // namespace moeplan::plot
