#include "launcher/tools/report/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace railshard::report {

namespace {

// Colour-blind-safe palette (Okabe-Ito), cycled.
constexpr const char* kPalette[] = {"#0072B2", "#E69F00", "#009E73", "#D55E00",
                                    "#CC79A7", "#56B4E9", "#F0E442", "#000000"};

constexpr int kLeft = 78;
constexpr int kRight = 24;
constexpr int kTop = 40;
constexpr int kBottom = 56;

const char* colour(size_t i) {
  return kPalette[i % std::size(kPalette)];
}

std::string number(double value) {
  char text[32];
  if (value == 0) return "0";
  const double magnitude = std::fabs(value);
  if (magnitude >= 1e6 || magnitude < 1e-3) {
    std::snprintf(text, sizeof(text), "%.3g", value);
  } else {
    std::snprintf(text, sizeof(text), "%.6g", value);
  }
  return text;
}

std::string coordinate(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", value);
  return text;
}

// The plot area and the mapping of data to pixels.
struct Frame {
  double x0, x1, y0, y1;  // data ranges
  int width, height;
  bool log2_x = false;
  int right = kRight;  // margin right of the plot area (room for the legend)

  double px(double x) const {
    const double v = log2_x ? std::log2(x) : x;
    const double span = x1 - x0;
    const double t = span > 0 ? (v - x0) / span : 0.5;
    return kLeft + t * (width - kLeft - right);
  }
  double py(double y) const {
    const double span = y1 - y0;
    const double t = span > 0 ? (y - y0) / span : 0;
    return height - kBottom - t * (height - kTop - kBottom);
  }
};

void header(std::ostringstream& out, int width, int height, const std::string& title) {
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
      << "<text x=\"" << width / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" "
      << "font-weight=\"bold\">" << escapeXml(title) << "</text>\n";
}

void axisLabels(std::ostringstream& out, int width, int height, int right,
                const std::string& x_label, const std::string& y_label) {
  out << "<text x=\"" << (kLeft + width - right) / 2 << "\" y=\"" << height - 12
      << "\" text-anchor=\"middle\">" << escapeXml(x_label) << "</text>\n"
      << "<text transform=\"translate(16," << (kTop + height - kBottom) / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escapeXml(y_label) << "</text>\n";
}

void yAxis(std::ostringstream& out, const Frame& f, const std::vector<double>& ticks) {
  for (double t : ticks) {
    const std::string y = coordinate(f.py(t));
    out << "<line x1=\"" << kLeft << "\" x2=\"" << f.width - f.right << "\" y1=\"" << y
        << "\" y2=\"" << y << "\" stroke=\"#e0e0e0\"/>\n"
        << "<text x=\"" << kLeft - 6 << "\" y=\"" << y << "\" dy=\"4\" text-anchor=\"end\">"
        << number(t) << "</text>\n";
  }
  out << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft << "\" y1=\"" << kTop << "\" y2=\""
      << f.height - kBottom << "\" stroke=\"#333\"/>\n"
      << "<line x1=\"" << kLeft << "\" x2=\"" << f.width - f.right << "\" y1=\""
      << f.height - kBottom << "\" y2=\"" << f.height - kBottom << "\" stroke=\"#333\"/>\n";
}

void noData(std::ostringstream& out, int width, int height) {
  out << "<text x=\"" << width / 2 << "\" y=\"" << height / 2
      << "\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n</svg>\n";
}

}  // namespace

std::string escapeXml(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string bytesLabel(double bytes) {
  static const char* kUnits[] = {"", "K", "M", "G", "T"};
  if (bytes <= 0) return "0";
  double value = bytes;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return number(value) + kUnits[unit];
}

std::vector<double> niceTicks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double exponent = std::floor(std::log10(raw));
  double multiple = 1;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    multiple = m;
    if (m * std::pow(10.0, exponent) >= raw) break;
  }
  // Ticks as k x multiple x 10^exponent, dividing by 10^-exponent below 1 so that 3 x 0.1
  // comes out 0.3 rather than 0.30000000000000004.
  const double scale = std::pow(10.0, std::fabs(exponent));
  const auto tick = [&](double k) {
    return exponent < 0 ? k * multiple / scale : k * multiple * scale;
  };
  const double step = tick(1);
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9); tick(k) <= hi + step * 1e-9; k += 1) {
    ticks.push_back(k == 0 ? 0 : tick(k));
  }
  return ticks;
}

std::string renderSvg(const LineChart& chart) {
  std::ostringstream out;
  header(out, chart.width, chart.height, chart.title);
  // The legend sits right of the plot area, so it never hides a line.
  size_t longest = 0;
  for (const auto& s : chart.series) longest = std::max(longest, s.label.size());
  const int legend = chart.series.empty() ? 0 : std::min<int>(260, 36 + 7 * longest);
  const int right = kRight + legend;
  axisLabels(out, chart.width, chart.height, right, chart.x_label, chart.y_label);
  const bool log2_x = chart.x_axis == PlotAxis::kLog2;
  double x0 = INFINITY, x1 = -INFINITY, y1 = 0;
  for (const auto& s : chart.series) {
    for (const auto& [x, y] : s.points) {
      if (log2_x && x <= 0) continue;  // no place on a log axis
      const double v = log2_x ? std::log2(x) : x;
      x0 = std::min(x0, v);
      x1 = std::max(x1, v);
      y1 = std::max(y1, y);
    }
  }
  if (!(x1 >= x0)) {
    noData(out, chart.width, chart.height);
    return out.str();
  }
  for (const auto& line : chart.lines) y1 = std::max(y1, line.y);
  if (log2_x) {
    x0 = std::floor(x0);
    x1 = std::ceil(x1);
    if (x1 == x0) {
      x0 -= 1;
      x1 += 1;
    }
  } else if (x1 == x0) {
    x0 -= 0.5;
    x1 += 0.5;
  }
  if (y1 <= 0) y1 = 1;
  const auto y_ticks = niceTicks(0, y1 * 1.08, 5);
  Frame f{x0, x1, 0, std::max(y_ticks.back(), y1 * 1.08), chart.width, chart.height, log2_x, right};
  yAxis(out, f, y_ticks);

  // X ticks: every power of two (thinned to at most ~12) on a log axis, nice numbers otherwise.
  std::vector<double> x_ticks;
  if (log2_x) {
    const int first = static_cast<int>(x0);
    const int last = static_cast<int>(x1);
    const int stride = std::max(1, (last - first + 11) / 12);
    for (int k = first; k <= last; k += stride) x_ticks.push_back(std::ldexp(1.0, k));
  } else {
    x_ticks = niceTicks(x0, x1, 8);
  }
  for (double t : x_ticks) {
    const std::string x = coordinate(f.px(t));
    out << "<line x1=\"" << x << "\" x2=\"" << x << "\" y1=\"" << chart.height - kBottom
        << "\" y2=\"" << chart.height - kBottom + 5 << "\" stroke=\"#333\"/>\n"
        << "<text x=\"" << x << "\" y=\"" << chart.height - kBottom + 18
        << "\" text-anchor=\"middle\">"
        << (chart.x_format == TickFormat::kBytes ? bytesLabel(t) : number(t)) << "</text>\n";
  }

  for (const auto& line : chart.lines) {
    const std::string y = coordinate(f.py(line.y));
    out << "<line x1=\"" << kLeft << "\" x2=\"" << chart.width - right << "\" y1=\"" << y
        << "\" y2=\"" << y << "\" stroke=\"#c00000\" stroke-width=\"1.5\" "
        << "stroke-dasharray=\"6 4\"/>\n"
        << "<text x=\"" << chart.width - right - 4 << "\" y=\"" << y
        << "\" dy=\"-5\" text-anchor=\"end\" fill=\"#c00000\">" << escapeXml(line.label)
        << "</text>\n";
  }

  for (size_t i = 0; i < chart.series.size(); ++i) {
    const auto& s = chart.series[i];
    std::string path;
    for (const auto& [x, y] : s.points) {
      if (log2_x && x <= 0) continue;
      if (!path.empty()) path += ' ';
      path += coordinate(f.px(x));
      path += ',';
      path += coordinate(f.py(y));
    }
    out << "<polyline fill=\"none\" stroke=\"" << colour(i) << "\" stroke-width=\"2\" points=\""
        << path << "\"/>\n";
    if (s.markers) {
      for (const auto& [x, y] : s.points) {
        if (log2_x && x <= 0) continue;
        out << "<circle cx=\"" << coordinate(f.px(x)) << "\" cy=\"" << coordinate(f.py(y))
            << "\" r=\"3.5\" fill=\"" << colour(i) << "\"/>\n";
      }
    }
    const int lx = chart.width - legend;
    const int ly = kTop + 8 + static_cast<int>(i) * 16;
    out << "<rect x=\"" << lx << "\" y=\"" << ly - 6 << "\" width=\"14\" height=\"4\" "
        << "fill=\"" << colour(i) << "\"/>\n"
        << "<text x=\"" << lx + 20 << "\" y=\"" << ly << "\">" << escapeXml(s.label) << "</text>\n";
  }
  out << "</svg>\n";
  return out.str();
}

std::string renderSvg(const BarChart& chart) {
  std::ostringstream out;
  header(out, chart.width, chart.height, chart.title);
  axisLabels(out, chart.width, chart.height, kRight, chart.x_label, chart.y_label);
  if (chart.bars.empty()) {
    noData(out, chart.width, chart.height);
    return out.str();
  }
  double y1 = 0;
  for (const auto& bar : chart.bars) y1 = std::max(y1, bar.second);
  if (y1 <= 0) y1 = 1;
  const auto y_ticks = niceTicks(0, y1 * 1.05, 5);
  Frame f{0, 1, 0, std::max(y_ticks.back(), y1 * 1.05), chart.width, chart.height, false};
  yAxis(out, f, y_ticks);
  const double slot = static_cast<double>(chart.width - kLeft - kRight) / chart.bars.size();
  const double bar_width = std::max(1.0, slot * 0.7);
  // Label every bar while they fit, else every k-th.
  const size_t label_every = std::max<size_t>(1, static_cast<size_t>(std::ceil(40.0 / slot)));
  for (size_t i = 0; i < chart.bars.size(); ++i) {
    const auto& [label, value] = chart.bars[i];
    const double x = kLeft + slot * i + (slot - bar_width) / 2;
    const double top = f.py(std::max(0.0, value));
    out << "<rect x=\"" << coordinate(x) << "\" y=\"" << coordinate(top) << "\" width=\""
        << coordinate(bar_width) << "\" height=\"" << coordinate(chart.height - kBottom - top)
        << "\" fill=\"" << colour(0) << "\"><title>" << escapeXml(label) << ": " << number(value)
        << "</title></rect>\n";
    if (i % label_every == 0) {
      out << "<text x=\"" << coordinate(x + bar_width / 2) << "\" y=\""
          << chart.height - kBottom + 18 << "\" text-anchor=\"middle\">" << escapeXml(label)
          << "</text>\n";
    }
  }
  out << "</svg>\n";
  return out.str();
}

}  // namespace railshard::report
