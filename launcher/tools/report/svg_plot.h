#pragma once

#include <string>
#include <utility>
#include <vector>

namespace railshard::report {

// A small static SVG chart writer for railshard-report's HTML page: line charts (linear or
// log2 x axis) and bar charts, with axes, tick labels, a legend and horizontal reference
// lines. Self-contained markup: no scripts, no external fonts or styles.

enum class PlotAxis { kLinear, kLog2 };
enum class TickFormat { kNumber, kBytes };  // kBytes: 1K, 64K, 1M, ... (powers of two)

struct PlotSeries {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in this order
  bool markers = true;
};

struct ReferenceLine {
  std::string label;
  double y = 0;
};

struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  PlotAxis x_axis = PlotAxis::kLinear;
  TickFormat x_format = TickFormat::kNumber;
  std::vector<PlotSeries> series;
  std::vector<ReferenceLine> lines;
  int width = 900;
  int height = 400;
};

struct BarChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<std::pair<std::string, double>> bars;
  int width = 760;
  int height = 360;
};

std::string renderSvg(const LineChart& chart);
std::string renderSvg(const BarChart& chart);

// "Nice" tick values (1, 2, 5 x 10^k steps) covering [lo, hi] with about `target` ticks.
std::vector<double> niceTicks(double lo, double hi, int target);
// Text escaped for XML/HTML content and attribute values.
std::string escapeXml(const std::string& text);
// 1024 -> "1K", 1048576 -> "1M", 0 -> "0"; other values as plain numbers.
std::string bytesLabel(double bytes);

}  // namespace railshard::report
