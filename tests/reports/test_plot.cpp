// The report's charts: tick choice, labels, thinning, the data-to-pixel mapping and the SVG it
// writes, each against values worked out by hand here.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "moeplan/reports/plot.hpp"
#include "strings.hpp"

using namespace moeplan::plot;
using moeplan::test::occurrences;

namespace {

void check_ticks(double lo, double hi, const std::vector<double>& want) {
  CAPTURE(lo);
  CAPTURE(hi);
  const std::vector<double> got = nice_ticks(lo, hi);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
}

// A series' <polyline> element in an SVG, up to its end.
std::string polyline(const std::string& svg, const std::string& name) {
  const size_t at = svg.find("<polyline data-series=\"" + name + "\"");
  REQUIRE_MESSAGE(at != std::string::npos, name);
  return svg.substr(at, svg.find("/>", at) - at);
}

}  // namespace

TEST_CASE("nice ticks: steps of 1, 2 or 5 times a power of ten, covering the range") {
  check_ticks(0, 1.87, {0, 0.5, 1, 1.5, 2});                  // 1.87/5 = 0.374 -> 0.5
  check_ticks(1.7699, 1.8813, {1.75, 1.8, 1.85, 1.9});        // 0.0223 -> 0.05
  check_ticks(0.2, 0.495, {0.2, 0.3, 0.4, 0.5});              // 0.059 -> 0.1
  check_ticks(0, 9.5e11, {0, 2e11, 4e11, 6e11, 8e11, 1e12});  // 1.9e11 -> 2e11
  check_ticks(-0.3, 0.3, {-0.4, -0.2, 0, 0.2, 0.4});          // 0.12 -> 0.2
  check_ticks(3, 3, {2.9, 3, 3.1});                           // one value: a step either side
  CHECK(nice_ticks(-0.3, 0.3)[2] == 0.0);                     // exactly zero, not 5.55e-17
  // Near the largest double a tick rounded up to 2e308 was inf, and the SVG had "nan" in it.
  for (const auto& [lo, hi] : {std::pair{1.0, 1.7e308}, std::pair{-1.7e308, 1.7e308}}) {
    const std::vector<double> big = nice_ticks(lo, hi);
    REQUIRE(big.size() >= 2);
    for (double t : big) CHECK(std::isfinite(t));
    CHECK(big.front() <= lo);
    CHECK(big.back() >= hi);
  }
}

TEST_CASE("tick labels") {
  CHECK(tick_label(0.3) == "0.3");
  CHECK(tick_label(1.85) == "1.85");
  CHECK(tick_label(2e11) == "200B");
  CHECK(tick_label(1e12) == "1T");
  CHECK(tick_label(4e6) == "4M");
  CHECK(tick_label(-0.0) == "0");
}

TEST_CASE("bucket means keep the ends and average runs of points") {
  std::vector<XY> p;
  for (int i = 0; i < 10; ++i) p.emplace_back(i, 2 * i);
  // Inner points 1..8 in 3 buckets: [1, 3), [3, 6), [6, 9).
  const std::vector<XY> want = {{0, 0}, {1.5, 3}, {4, 8}, {7, 14}, {9, 18}};
  CHECK(bucket_means(p, 5) == want);
  CHECK(bucket_means(p, 10) == p);
  CHECK(bucket_means(p, 50) == p);
}

TEST_CASE("frame: data corners to the drawing area's corners; a hand-placed polyline") {
  Chart c;
  c.series.push_back({"a<b", {{0, 0}, {1, 1}, {2, 2}}, false, false});
  const Frame f = frame_for(c);  // ticks 0, 0.5, ..., 2 on both axes
  CHECK(f.x_lo == 0);
  CHECK(f.x_hi == 2);
  CHECK(f.x_px(0) == Frame::kLeft);
  CHECK(f.x_px(2) == Frame::kWidth - Frame::kRight);
  CHECK(f.y_px(0) == Frame::kHeight - Frame::kBottom);
  CHECK(f.y_px(2) == Frame::kTop);
  // x: 70 + 1/2 · (720 − 70 − 190) = 300; y: 360 − 46 − 1/2 · (360 − 34 − 46) = 174.
  const std::string svg = render_svg(c);
  CHECK(svg.find("points=\"70.0,314.0 300.0,174.0 530.0,34.0\"") != std::string::npos);
  CHECK(svg.find("data-series=\"a&lt;b\"") != std::string::npos);  // names escaped
  CHECK(svg.find("a<b") == std::string::npos);
  CHECK(svg.find("<circle") == std::string::npos);  // a line of three points: no markers
  // A series of one point (a run evaluated once) is a polyline through one point, which draws
  // nothing: it gets its dot, at (300, 174) for (1, 1) in the same frame.
  c.series.push_back({"one", {{1, 1}}, false, false});
  CHECK(render_svg(c).find("<circle cx=\"300.0\" cy=\"174.0\"") != std::string::npos);
}

TEST_CASE("frame: non-finite points are left out; the y axis can skip each curve's start") {
  Chart c;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  c.series.push_back({"s", {{0, 100}, {1, nan}, {2, 1.2}, {10, 1.9}}, false, false});
  const std::string svg = render_svg(c);
  CHECK(svg.find("nan") == std::string::npos);
  CHECK(frame_for(c).y_hi == 100);
  // From 15 % of x on (x >= 1.5) the points at x 2 and 10 set y: 1.2 .. 1.9; 0.7 / 5 = 0.14 ->
  // a step of 0.2, ticks 1.2 .. 2.
  c.y_from_fraction = 0.15;
  const Frame f = frame_for(c);
  CHECK(f.y_lo == doctest::Approx(1.2));
  CHECK(f.y_hi == doctest::Approx(2.0));
  CHECK(f.x_lo == 0);
  CHECK(f.x_hi == 10);
}

TEST_CASE("the ticks drawn are the frame's own: every label inside the frame") {
  // y 19.9 .. 65.2: 45.3 / 5 = 9.06 -> a step of 10, ticks 10 .. 70 (a second pass over the
  // frame's 10 .. 70 would pick a step of 20 and label 0 and 80 outside it).
  Chart c;
  c.series.push_back({"t", {{0.2, 54.5}, {0.5, 65.2}}, true, false});
  c.series.push_back({"d", {{0.2, 19.9}, {0.5, 19.9}}, false, true});
  const Frame f = frame_for(c);
  CHECK(f.y_ticks == std::vector<double>{10, 20, 30, 40, 50, 60, 70});
  const std::string svg = render_svg(c);
  for (const char* label : {">10<", ">30<", ">70<"}) CHECK(svg.find(label) != std::string::npos);
  for (const char* label : {">0<", ">80<"}) CHECK(svg.find(label) == std::string::npos);
}

TEST_CASE("dots and rings: the frame widened past the outer ticks so that none is cut in half") {
  // An r_a sweep's dots at 0.2 .. 0.5 and BPC 1 .. 2 lie on the outer ticks. A dot reaches 6 px
  // (a ring's 4.5 px radius, its stroke and a pixel) past its point; in units of the ticks' span
  // over the drawing area (460 x 280 px) that is 6 · 0.3 / 460 = 0.0039130 in x and
  // 6 · 1 / 280 = 0.0214286 in y. By hand: x 0.1960870 .. 0.5039130, y 0.9785714 .. 2.0214286;
  // the dot at (0.2, 1) at x 70 + 0.0039130 / 0.3078261 · 460 = 75.85 px,
  // y 314 − 0.0214286 / 1.0428571 · 280 = 308.25 px: 5.8 px inside the frame's corner.
  Chart c;
  c.series.push_back({"moe", {{0.2, 1}, {0.3, 1.5}, {0.5, 2}}, true, false});
  Frame f = frame_for(c);
  CHECK(f.x_lo == doctest::Approx(0.1960870).epsilon(1e-6));
  CHECK(f.x_hi == doctest::Approx(0.5039130).epsilon(1e-6));
  CHECK(f.y_lo == doctest::Approx(0.9785714).epsilon(1e-6));
  CHECK(f.y_hi == doctest::Approx(2.0214286).epsilon(1e-6));
  REQUIRE(f.x_ticks.size() == 4);  // the ticks stay the data's: 0.2, 0.3, 0.4, 0.5
  CHECK(f.x_ticks.front() == doctest::Approx(0.2));
  CHECK(f.x_ticks.back() == doctest::Approx(0.5));
  CHECK(render_svg(c).find("<circle cx=\"75.8\" cy=\"308.2\" r=\"3.5\"") != std::string::npos);
  // A line without dots fills the frame to its ends (the data-corner case above); a ring on it
  // at its end widens the frame as a dot does, one inside it does not.
  Chart line;
  line.series.push_back({"a", {{0, 0}, {1, 1}, {2, 2}}, false, false});
  line.series[0].rings = {{1, 1}};
  CHECK(frame_for(line).x_hi == 2);
  line.series[0].rings.push_back({2, 2});
  CHECK(frame_for(line).x_hi == doctest::Approx(2 + 6.0 * 2 / 460));
  // A ring in the series' colour, white inside, named by its series.
  const std::string svg = render_svg(line);
  CHECK(svg.find("r=\"4.5\" fill=\"#ffffff\" stroke=\"#0072B2\" stroke-width=\"1.8\"/>") !=
        std::string::npos);
  CHECK(occurrences(svg, "data-ring=\"a\"") == 2);

  // A dot the y axis leaves out (y_from_fraction) stays out: it does not widen the frame to it.
  Chart skip;
  skip.series.push_back({"s", {{0, 100}, {1, 1}, {2, 2}}, true, false});
  skip.y_from_fraction = 0.5;
  f = frame_for(skip);
  CHECK(f.y_hi == doctest::Approx(2 + 6.0 / 280));
  CHECK(f.y_lo == doctest::Approx(1 - 6.0 / 280));
}

TEST_CASE("whiskers: a bar with caps in the series' colour; the frame holds their ends") {
  // The data-corner frame above (0 .. 2 on both axes, 460 x 280 px): a whisker at x 1 from 0.5
  // to 1.5 is at x 300 px, from y 314 − 0.25 · 280 = 244 px up to 314 − 0.75 · 280 = 104 px, with
  // caps 4 px either side; it lies inside the frame and leaves it as it was.
  Chart c;
  c.series.push_back({"m", {{0, 0}, {1, 1}, {2, 2}}, false, false});
  c.series[0].whiskers = {{1, 0.5, 1.5}};
  Frame f = frame_for(c);
  CHECK(f.y_lo == 0);
  CHECK(f.y_hi == 2);
  const std::string svg = render_svg(c);
  CHECK(svg.find("<path data-whisker=\"m\" d=\"M300.0,244.0V104.0M296.0,244.0H304.0M296.0,104.0"
                 "H304.0\" fill=\"none\" stroke=\"#0072B2\"") != std::string::npos);
  // One reaching past the points, at x 2 from -1 to 3: the y ticks cover -1 .. 3 (step 1), and
  // the frame is widened a dot's reach past them for its caps, 6 · 4 / 280 in y and 6 · 2 / 460
  // in x (it is on the x axis' last tick).
  c.series[0].whiskers.push_back({2, -1, 3});
  f = frame_for(c);
  CHECK(f.y_ticks.front() == -1);
  CHECK(f.y_ticks.back() == 3);
  CHECK(f.y_lo == doctest::Approx(-1 - 6.0 * 4 / 280));
  CHECK(f.y_hi == doctest::Approx(3 + 6.0 * 4 / 280));
  CHECK(f.x_hi == doctest::Approx(2 + 6.0 * 2 / 460));
  CHECK(occurrences(render_svg(c), "data-whisker=\"m\"") == 2);
  // A non-finite whisker is left out, as a non-finite point is.
  c.series[0].whiskers.push_back({1.5, std::nan(""), 1});
  CHECK(occurrences(render_svg(c), "data-whisker=\"m\"") == 2);
}

TEST_CASE("a level line beside the dense curve: grey and dotted, taking no colour of the palette") {
  Chart c;
  c.series.push_back({"dense", {{0, 2}, {1, 1}}, false, true});
  Series level{"dense's final", {{0, 1}, {1, 1}}, false, false};
  level.level = true;
  c.series.push_back(level);
  c.series.push_back({"moe", {{0, 2.5}, {1, 0.9}}, false, false});
  const std::string svg = render_svg(c);
  CHECK(polyline(svg, "dense")
            .find("stroke=\"#000000\" stroke-width=\"1.8\" stroke-dasharray=\"6 4\"") !=
        std::string::npos);
  CHECK(polyline(svg, "dense's final")
            .find("stroke=\"#777777\" stroke-width=\"1.8\" stroke-dasharray=\"2 3\"") !=
        std::string::npos);
  CHECK(polyline(svg, "moe").find("stroke=\"#0072B2\"") != std::string::npos);  // the first colour
  CHECK(svg.find("stroke=\"#777777\" stroke-width=\"2\" stroke-dasharray=\"2 3\"/>") !=
        std::string::npos);  // and its legend entry
}

TEST_CASE("a line beside a series: in that series' colour, dashed and thinner, taking none") {
  Chart c;
  c.series.push_back({"p", {{0, 1}, {1, 2}}, true, false});
  c.series.push_back({"q", {{0, 2}, {1, 1}}, true, false});
  Series base{"p's base", {{0, 1.5}, {1, 1.5}}, false, false};
  base.beside = "p";
  c.series.push_back(base);
  c.series.push_back({"r", {{0, 3}, {1, 3}}, false, false});
  Series lost{"x", {{0, 0.5}, {1, 0.5}}, false, false};
  lost.beside = "no such series";
  c.series.push_back(lost);
  const std::string svg = render_svg(c);
  CHECK(polyline(svg, "p's base")
            .find("stroke=\"#0072B2\" stroke-width=\"1.2\" stroke-dasharray=\"6 4\"") !=
        std::string::npos);
  CHECK(polyline(svg, "q").find("stroke=\"#D55E00\" stroke-width=\"1.8\"") != std::string::npos);
  CHECK(polyline(svg, "r").find("stroke=\"#009E73\"") != std::string::npos);  // the third colour
  CHECK(polyline(svg, "x").find("stroke=\"#000000\" stroke-width=\"1.2\"") != std::string::npos);
}

TEST_CASE("a mean line: black, solid and thicker, taking no colour of the palette") {
  Chart c;
  c.series.push_back({"a", {{0, 1}, {1, 2}}, true, false});
  Series mean{"mean", {{0, 1.5}, {1, 1.5}}, true, false};
  mean.mean = true;
  c.series.push_back(mean);
  c.series.push_back({"b", {{0, 2}, {1, 1}}, true, false});
  const std::string svg = render_svg(c);
  CHECK(polyline(svg, "mean").ends_with("stroke=\"#000000\" stroke-width=\"2.8\""));  // solid
  CHECK(polyline(svg, "b").find("stroke=\"#D55E00\"") != std::string::npos);  // the second colour
  CHECK(svg.find("stroke=\"#000000\" stroke-width=\"3\"/><text") != std::string::npos);  // legend
}

TEST_CASE("text bars: scaled to the largest magnitude, # below zero and + above") {
  const std::string got = text_bars({{"a", -0.1}, {"bb", 0.05}}, "{:+.4f}", 10);
  CHECK(got == "  a   -0.1000  ##########\n  bb  +0.0500  +++++\n");
}

TEST_CASE("reference line: across the points' x range, at least 0.1 wide, dashed") {
  const Series two{"s", {{0.2, 1}, {0.5, 2}}, true, false};
  const Series line = reference_line(two, "base", 1.5);
  CHECK(line.points == std::vector<XY>{{0.2, 1.5}, {0.5, 1.5}});
  CHECK(line.dashed);
  const Series one{"s", {{0.3, 1}}, true, false};
  const Series wide = reference_line(one, "base", 2);
  REQUIRE(wide.points.size() == 2);
  CHECK(wide.points[0].first == doctest::Approx(0.25));
  CHECK(wide.points[1].first == doctest::Approx(0.35));
}

namespace {

// "p" and i (GCC 12's -Wrestrict misreads `"p" + std::to_string(i)`, GCC bug 105329).
std::string numbered(int i) {
  std::string s = "p";
  s += std::to_string(i);
  return s;
}

double attribute(const std::string& svg, const std::string& name) {
  const size_t at = svg.find(" " + name + "=\"");
  REQUIRE(at != std::string::npos);
  return std::stod(svg.substr(at + name.size() + 3));
}

}  // namespace

TEST_CASE("the picture grows to hold long legend entries, a long title and many series") {
  Chart c;
  c.series.push_back({"dense", {{0, 1}, {1, 2}}, false, false});
  std::string svg = render_svg(c);
  CHECK(attribute(svg, "width") == 720);  // short names: the frame's own size
  CHECK(attribute(svg, "height") == 360);
  // The legend's text starts at 720 − 190 + 40 = 570; a name of 32 characters at 12 px and 0.6
  // em a character needs 230.4 px, and 10 px to spare: 810.4, drawn 811 wide. The frame stays.
  c.series.push_back({"moe-ra0.300 (not equal-resource)", {{0, 1}, {1, 3}}, false, false});
  svg = render_svg(c);
  CHECK(attribute(svg, "width") == 811);
  CHECK(svg.find("points=\"70.0,314.0 530.0,34.0\"") != std::string::npos);
  // A title of 100 characters, bold 14 px (0.6 · 15.4 px each): 70 + 924 + 10 = 1004.
  c.title = std::string(100, 'x');
  CHECK(attribute(render_svg(c), "width") == 1004);
  // 25 series: entries every 18 px from top + 6 = 40, the last at 40 + 24 · 18 = 472, its text
  // baseline 4 px lower; the picture is 472 + 14 = 486 high (it was 360: seven were cut off).
  c.title.clear();
  c.series.clear();
  for (int i = 0; i < 25; ++i) c.series.push_back({numbered(i), {{0, 1}}, false, false});
  svg = render_svg(c);
  CHECK(attribute(svg, "height") == 486);
  CHECK(svg.find("y=\"476.0\">p24</text>") != std::string::npos);
}

TEST_CASE("past eight series the palette repeats with another stroke, so no two look alike") {
  Chart c;
  for (int i = 0; i < 17; ++i) c.series.push_back({numbered(i), {{0, 1}}, false, false});
  c.series.push_back({"dense", {{0, 1}}, false, true});
  const std::string svg = render_svg(c);
  // Series 0, 8 and 16 share the first colour: solid, dotted, dash-dot.
  for (const char* name : {"p0", "p8", "p16"})
    CHECK(polyline(svg, name).find("#0072B2") != std::string::npos);
  CHECK(polyline(svg, "p0").find("dasharray") == std::string::npos);
  CHECK(polyline(svg, "p8").find("stroke-dasharray=\"1.5 3\"") != std::string::npos);
  CHECK(polyline(svg, "p16").find("stroke-dasharray=\"8 3 2 3\"") != std::string::npos);
  CHECK(polyline(svg, "dense").find("stroke-dasharray=\"6 4\"") != std::string::npos);
  // The legend draws each entry with its series' stroke.
  CHECK(svg.find("stroke=\"#0072B2\" stroke-width=\"2\" stroke-dasharray=\"1.5 3\"/>") !=
        std::string::npos);
}

TEST_CASE("control characters in a name: the SVG stays well-formed XML") {
  Chart c;
  c.series.push_back({"moe\x01ra\x1b[31m", {{0, 1}}, false, false});
  const std::string svg = render_svg(c);
  for (char ch = 1; ch < 0x20; ++ch)
    if (ch != '\n' && ch != '\t' && ch != '\r') CHECK(svg.find(ch) == std::string::npos);
  CHECK(svg.find("moe\xEF\xBF\xBDra\xEF\xBF\xBD[31m") != std::string::npos);  // U+FFFD each
}

TEST_CASE("a long y axis title stays inside the picture; series 25-40 have strokes of their own") {
  Chart c;
  c.series.push_back({"a", {{0, 1}}, false, false});
  c.y_label = std::string(51, 'y');  // 51 · 7.2 px = 367.2 px, longer than the frame is high
  const std::string svg = render_svg(c);
  // Centred at 367.2 / 2 + 4 = 187.6 instead of the frame's middle (174, top −9.6): the picture
  // is 187.6 + 187.6 = 375.2 high, drawn 375.2.
  CHECK(svg.find("translate(16 187.6) rotate(-90)") != std::string::npos);
  CHECK(attribute(svg, "height") == doctest::Approx(375.2));
  // A short title keeps the frame's middle.
  c.y_label = "loss";
  CHECK(render_svg(c).find("translate(16 174) rotate(-90)") != std::string::npos);
  c.series.clear();
  for (int i = 0; i < 40; ++i) c.series.push_back({numbered(i), {{0, 1}}, false, false});
  const std::string many = render_svg(c);
  auto stroke_of = [&](int i) {
    const size_t at = many.find("<polyline data-series=\"" + numbered(i) + "\"");
    REQUIRE(at != std::string::npos);
    return many.substr(at, many.find("/>", at) - at).substr(many.substr(at).find(" stroke="));
  };
  for (int i = 0; i < 8; ++i)
    for (int j : {i + 8, i + 16, i + 24, i + 32}) CHECK(stroke_of(i) != stroke_of(j));
  CHECK(stroke_of(24) != stroke_of(32));
}
