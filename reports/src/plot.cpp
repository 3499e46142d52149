#include "moeplan/reports/plot.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

#include <fmt/format.h>

#include "moeplan/accounting/units.hpp"
#include "moeplan/sweeps/escape.hpp"

namespace moeplan::plot {

namespace {

bool finite(const XY& p) {
  return std::isfinite(p.first) && std::isfinite(p.second);
}

std::string escape(const std::string& s) {
  return escape_html(s);
}

// Distinguishable on white and for the common colour-vision deficiencies (Okabe and Ito's set).
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#F0E442", "#999999"};
// Past the palette's eight, series repeat its colours with another stroke: solid, dotted,
// dash-dot, short dashes, long dashes (40 series apart; the dense baseline's reference line is
// black, dashed "6 4").
constexpr const char* kStrokes[] = {"", " stroke-dasharray=\"1.5 3\"",
                                    " stroke-dasharray=\"8 3 2 3\"", " stroke-dasharray=\"4 2\"",
                                    " stroke-dasharray=\"12 3\""};

// About how wide text is drawn in a sans-serif face: 0.6 em a character (DejaVu Sans averages
// about 0.6 em over ids like "moe-ra0.300 (not equal-resource)"; Arial about 0.53). For the
// space a legend or a title needs, not for placing glyphs.
double text_px(std::string_view text, double font_px) {
  size_t chars = 0;
  for (char c : text) chars += ((unsigned char)c & 0xC0) != 0x80;  // UTF-8 lead bytes
  return double(chars) * 0.6 * font_px;
}

// A series drawn with a dot at each point: asked for (markers), or a single point, through which
// a line draws nothing.
bool dotted(const Series& s) {
  size_t drawn = 0;
  for (const XY& p : s.points) drawn += finite(p);
  return s.markers || drawn == 1;
}

// A dot's radius, a ring's, and how far past a point either reaches (the radius, the ring's
// stroke and a pixel's rounding); a whisker's cap reaches less far than a ring.
constexpr double kDotRadius = 3.5, kRingRadius = 4.5, kDotReach = kRingRadius + 1.5;
constexpr double kCapHalf = 4;

bool finite(const Series::Whisker& w) {
  return std::isfinite(w.x) && std::isfinite(w.lo) && std::isfinite(w.hi);
}

// How a series is drawn: its colour, dash pattern, line width and legend line width. One look a
// series, the first that applies: `beside` (its named series' colour, dashed, thin), `mean`
// (black, solid, thick), `level` (grey, dotted), `dashed` (the dense baseline: black, dashed),
// else the palette's next colour, with another stroke each time the palette comes round. Only
// the last takes a colour.
struct Pen {
  const char* colour;
  const char* stroke;
  double width, legend_width;
};
Pen pen_for(const Series& s, size_t& colour,
            const std::vector<std::pair<std::string, const char*>>& drawn_in) {
  if (!s.beside.empty()) {
    const char* c = "#000000";
    for (const auto& [name, its] : drawn_in)
      if (name == s.beside) c = its;
    return {c, " stroke-dasharray=\"6 4\"", 1.2, 2};
  }
  if (s.mean) return {"#000000", "", 2.8, 3};
  if (s.level) return {"#777777", " stroke-dasharray=\"2 3\"", 1.8, 2};
  if (s.dashed) return {"#000000", " stroke-dasharray=\"6 4\"", 1.8, 2};
  const size_t n = colour++;
  return {kPalette[n % std::size(kPalette)],
          kStrokes[n / std::size(kPalette) % std::size(kStrokes)], 1.8, 2};
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0, 1};
  if (hi < lo) std::swap(lo, hi);
  target = std::max(1, target);
  double range = hi - lo;
  if (range <= 0) range = lo != 0 ? std::fabs(lo) * 0.1 : 1;
  if (!std::isfinite(range)) return {lo, hi};  // ends a double apart by more than the largest
  const double raw = range / target;
  const double decade = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * decade;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * decade >= raw * (1 - 1e-9)) {
      step = m * decade;
      break;
    }
  // Integer multiples of the step, so that 0.1·3 prints as 0.3.
  auto first = int64_t(std::floor(lo / step + 1e-9));
  auto last = int64_t(std::ceil(hi / step - 1e-9));
  if (last <= first) {  // lo == hi on a tick: one step either side
    --first;
    ++last;
  }
  std::vector<double> ticks;
  for (int64_t i = first; i <= last; ++i) {
    const double v = double(i) * step;
    // Near the largest double a tick rounded past it is inf, and the SVG got "nan" coordinates:
    // the data's own ends serve as the ticks then.
    if (!std::isfinite(v)) return {lo, hi};
    ticks.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  }
  return ticks;
}

std::string tick_label(double v) {
  if (v == 0) return "0";
  if (std::fabs(v) >= 1e4) return human(v, 4);
  return fmt::format("{:.4g}", v);
}

std::vector<XY> bucket_means(const std::vector<XY>& points, size_t max_points) {
  if (points.size() <= max_points || max_points < 3) return points;
  std::vector<XY> out;
  out.reserve(max_points);
  out.push_back(points.front());
  const size_t inner = points.size() - 2, buckets = max_points - 2;
  for (size_t b = 0; b < buckets; ++b) {
    const size_t from = 1 + b * inner / buckets, to = 1 + (b + 1) * inner / buckets;
    double sx = 0, sy = 0;
    for (size_t i = from; i < to; ++i) {
      sx += points[i].first;
      sy += points[i].second;
    }
    const double n = double(to - from);
    out.emplace_back(sx / n, sy / n);
  }
  out.push_back(points.back());
  return out;
}

Series reference_line(const Series& over, std::string name, double y) {
  double x0 = 0, x1 = 0;
  if (!over.points.empty()) x0 = x1 = over.points.front().first;
  for (const auto& [x, v] : over.points) x0 = std::min(x0, x), x1 = std::max(x1, x);
  if (x1 - x0 < 0.1) x0 -= 0.05, x1 += 0.05;
  return Series{std::move(name), {{x0, y}, {x1, y}}, false, true};
}

double Frame::x_px(double x) const {
  return kLeft + (x - x_lo) / (x_hi - x_lo) * (kWidth - kLeft - kRight);
}

double Frame::y_px(double y) const {
  return kHeight - kBottom - (y - y_lo) / (y_hi - y_lo) * (kHeight - kTop - kBottom);
}

Frame frame_for(const Chart& chart) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const Series& s : chart.series) {
    double sx0 = std::numeric_limits<double>::infinity(), sx1 = -sx0;
    for (const XY& p : s.points)
      if (finite(p)) {
        sx0 = std::min(sx0, p.first);
        sx1 = std::max(sx1, p.first);
      }
    const double from = sx0 + chart.y_from_fraction * (sx1 - sx0);
    for (const XY& p : s.points)
      if (finite(p)) {
        x0 = std::min(x0, p.first);
        x1 = std::max(x1, p.first);
        if (p.first < from) continue;
        y0 = std::min(y0, p.second);
        y1 = std::max(y1, p.second);
      }
    for (const Series::Whisker& w : s.whiskers)
      if (finite(w)) {
        x0 = std::min(x0, w.x);
        x1 = std::max(x1, w.x);
        y0 = std::min({y0, w.lo, w.hi});
        y1 = std::max({y1, w.lo, w.hi});
      }
  }
  if (!(x0 <= x1)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // nothing to draw
  const std::vector<double> xt = nice_ticks(x0, x1), yt = nice_ticks(y0, y1);
  Frame f{xt.front(), xt.back(), yt.front(), yt.back(), xt, yt};
  // Room for the dots: a dot's reach, in data units of the ticks' span (the widened
  // span differs from it by a few pixels' worth, which the margin absorbs). A dot the y axis
  // leaves out (y_from_fraction) stays out.
  const double dx =
      kDotReach * (xt.back() - xt.front()) / (Frame::kWidth - Frame::kLeft - Frame::kRight);
  const double dy =
      kDotReach * (yt.back() - yt.front()) / (Frame::kHeight - Frame::kTop - Frame::kBottom);
  auto room = [&](const XY& p) {
    if (!finite(p) || p.second < yt.front() || p.second > yt.back()) return;
    f.x_lo = std::min(f.x_lo, p.first - dx);
    f.x_hi = std::max(f.x_hi, p.first + dx);
    f.y_lo = std::min(f.y_lo, p.second - dy);
    f.y_hi = std::max(f.y_hi, p.second + dy);
  };
  for (const Series& s : chart.series) {
    if (dotted(s))
      for (const XY& p : s.points) room(p);
    for (const XY& p : s.rings) room(p);
    for (const Series::Whisker& w : s.whiskers)
      if (finite(w)) room({w.x, w.lo}), room({w.x, w.hi});
  }
  return f;
}

std::string render_svg(const Chart& chart) {
  const Frame f = frame_for(chart);
  const double left = Frame::kLeft, right = Frame::kWidth - Frame::kRight, top = Frame::kTop,
               bottom = Frame::kHeight - Frame::kBottom;
  // The frame keeps its size; the picture grows to hold the longest legend entry, the title and
  // every legend entry (18 px each, from top + 6).
  double W = Frame::kWidth, H = Frame::kHeight;
  W = std::max(W, left + text_px(chart.title, 14 * 1.1) + 10);  // the title is bold
  for (const Series& ser : chart.series) W = std::max(W, right + 40 + text_px(ser.name, 12) + 10);
  if (!chart.series.empty()) H = std::max(H, top + 6 + 18 * double(chart.series.size() - 1) + 14);
  // The y axis title is drawn rotated, centred on the frame: a long one ("validation bits per
  // byte or token (lower is better)") is moved down until its top is inside, and the picture
  // grows to its bottom.
  const double y_label_px = text_px(chart.y_label, 12);
  const double y_label_mid = std::max((top + bottom) / 2, y_label_px / 2 + 4);
  H = std::max(H, y_label_mid + y_label_px / 2 + 4);
  W = std::ceil(W - 1e-9);  // whole pixels (0.6 · 15.4 · 100 is 924 and a rounding error)
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
      "{1}\" font-family=\"sans-serif\" font-size=\"12\" role=\"img\">\n<title>{2}</title>\n"
      "<text x=\"{3}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{2}</text>\n",
      W, H, escape(chart.title), left);
  // Grid, ticks and their labels.
  for (double t : f.x_ticks) {
    const double x = f.x_px(t);
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e4e4e4\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        x, top, bottom, bottom + 16, tick_label(t));
  }
  for (double t : f.y_ticks) {
    const double y = f.y_px(t);
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#e4e4e4\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        left, y, right, left - 6, y + 4, tick_label(t));
  }
  s += fmt::format(
      "<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\" fill=\"none\" stroke=\"#444\"/>\n"
      "<text x=\"{4}\" y=\"{5}\" text-anchor=\"middle\">{6}</text>\n"
      "<text transform=\"translate(16 {7}) rotate(-90)\" text-anchor=\"middle\">{8}</text>\n",
      left, top, right - left, bottom - top, (left + right) / 2, Frame::kHeight - 8,
      escape(chart.x_label), y_label_mid, escape(chart.y_label));
  // Series (clipped at the frame), then the legend beside the frame.
  const std::string clip = "clip-" + escape(chart.id);
  s += fmt::format(
      "<clipPath id=\"{}\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></clipPath>\n"
      "<g clip-path=\"url(#{})\">\n",
      clip, left, top, right - left, bottom - top, clip);
  size_t colour = 0;  // palette colours taken so far
  std::string legend;
  double legend_y = top + 6;
  std::vector<std::pair<std::string, const char*>> drawn_in;  // each series' name and colour
  for (const Series& ser : chart.series) {
    const Pen pen = pen_for(ser, colour, drawn_in);
    const char *c = pen.colour, *stroke = pen.stroke;
    const double width = pen.width;
    drawn_in.emplace_back(ser.name, c);
    std::string pts;
    for (const XY& p : ser.points)
      if (finite(p)) pts += fmt::format("{:.1f},{:.1f} ", f.x_px(p.first), f.y_px(p.second));
    if (!pts.empty()) pts.pop_back();
    s += fmt::format(
        "<polyline data-series=\"{}\" points=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"{}\"{}/>\n",
        escape(ser.name), pts, c, width, stroke);
    if (dotted(ser))
      for (const XY& p : ser.points)
        if (finite(p))
          s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\"/>\n",
                           f.x_px(p.first), f.y_px(p.second), kDotRadius, c);
    for (const Series::Whisker& w : ser.whiskers)
      if (finite(w)) {
        const double x = f.x_px(w.x), lo = f.y_px(w.lo), hi = f.y_px(w.hi);
        s += fmt::format(
            "<path data-whisker=\"{}\" d=\"M{:.1f},{:.1f}V{:.1f}M{:.1f},{:.1f}H{:.1f}M{:.1f},{:.1f}"
            "H{:.1f}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>\n",
            escape(ser.name), x, lo, hi, x - kCapHalf, lo, x + kCapHalf, x - kCapHalf, hi,
            x + kCapHalf, c);
      }
    for (const XY& p : ser.rings)
      if (finite(p))
        s += fmt::format(
            "<circle data-ring=\"{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"#ffffff\" "
            "stroke=\"{}\" stroke-width=\"1.8\"/>\n",
            escape(ser.name), f.x_px(p.first), f.y_px(p.second), kRingRadius, c);
    legend += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
        "stroke-width=\"{8}\"{4}/><text x=\"{5}\" y=\"{6:.1f}\">{7}</text>\n",
        right + 12, legend_y, right + 34, c, stroke, right + 40, legend_y + 4, escape(ser.name),
        pen.legend_width);
    legend_y += 18;
  }
  return s + "</g>\n" + legend + "</svg>\n";
}

std::string text_bars(const std::vector<std::pair<std::string, double>>& bars,
                      const std::string& value_format, int width) {
  size_t label_w = 0, value_w = 0;
  double most = 0;
  std::vector<std::string> values;
  for (const auto& [label, v] : bars) {
    label_w = std::max(label_w, label.size());
    values.push_back(fmt::format(fmt::runtime(value_format), v));
    value_w = std::max(value_w, values.back().size());
    if (std::isfinite(v)) most = std::max(most, std::fabs(v));
  }
  std::string out;
  for (size_t i = 0; i < bars.size(); ++i) {
    const double v = bars[i].second;
    const int n = most > 0 && std::isfinite(v) ? int(std::lround(std::fabs(v) / most * width)) : 0;
    out += fmt::format("  {:<{}}  {:>{}}  {}\n", bars[i].first, label_w, values[i], value_w,
                       std::string(size_t(n), v < 0 ? '#' : '+'));
  }
  return out;
}

}  // namespace moeplan::plot
