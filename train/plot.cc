#include "train/plot.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"
#include "train/atomic_file.h"

namespace tessel::train {

LossSeries loss_series(const std::vector<StepMetrics>& records, const std::string& eval_key) {
  LossSeries s;
  for (const StepMetrics& m : records) {
    if (m.loss && std::isfinite(*m.loss)) s.train.emplace_back(double(m.step), *m.loss);
    if (auto e = m.extra(eval_key); e && std::isfinite(*e)) s.eval.emplace_back(double(m.step), *e);
  }
  return s;
}

std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, max_ticks - 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double f : {1.0, 2.0, 5.0, 10.0}) {
    step = f * mag;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  const double k0 = std::ceil(lo / step - 1e-9);
  for (int k = 0; k <= 100; ++k) {
    const double v = (k0 + k) * step;
    if (v > hi + step * 1e-9) break;
    ticks.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  return ticks;
}

namespace {

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// Shortest readable label for a tick value.
std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::abs(v);
  if (a >= 1e5 || a < 1e-3) return fmt::format(FMT_STRING("{:.2g}"), v);
  std::string s = fmt::format(FMT_STRING("{:.4f}"), v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

std::string loss_curve_svg(const LossSeries& series, const PlotOptions& o) {
  TESSEL_CHECK(o.width >= 200 && o.height >= 150, "plot", "the plot needs at least 200x150 pixels, got {}x{}", o.width,
               o.height);
  // Data ranges (both series), padded when degenerate.
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto* pts : {&series.train, &series.eval}) {
    for (const auto& [x, y] : *pts) {
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // no data: empty axes
  if (x1 <= x0) x0 -= 1, x1 += 1;
  if (y1 <= y0) {
    const double pad = std::max(std::abs(y0) * 0.1, 0.5);
    y0 -= pad, y1 += pad;
  } else {
    const double pad = (y1 - y0) * 0.05;
    y0 -= pad, y1 += pad;
  }
  const std::vector<double> xt = nice_ticks(x0, x1), yt = nice_ticks(y0, y1);

  const double left = 70, right = 20, top = 40, bottom = 50;
  const double pw = o.width - left - right, ph = o.height - top - bottom;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + (1.0 - (y - y0) / (y1 - y0)) * ph; };

  std::string s;
  s += fmt::format(
      FMT_STRING("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"),
      o.width, o.height);
  s += fmt::format(FMT_STRING("<rect class=\"background\" x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n"), o.width,
                   o.height);
  s += fmt::format(FMT_STRING("<text class=\"title\" x=\"{:.1f}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">{}</text>\n"),
                   left + pw / 2, escape_xml(o.title));
  // Grid, ticks and tick labels.
  for (double v : xt) {
    const double x = px(v);
    s += fmt::format(FMT_STRING("<line class=\"grid\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#eeeeee\"/>\n"),
                     x, top, top + ph);
    s += fmt::format(FMT_STRING("<line class=\"tick\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"black\"/>\n"),
                     x, top + ph, top + ph + 5);
    s += fmt::format(FMT_STRING("<text class=\"tick-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n"), x,
                     top + ph + 18, tick_label(v));
  }
  for (double v : yt) {
    const double y = py(v);
    s += fmt::format(FMT_STRING("<line class=\"grid\" x1=\"{1:.1f}\" y1=\"{0:.1f}\" x2=\"{2:.1f}\" y2=\"{0:.1f}\" stroke=\"#eeeeee\"/>\n"),
                     y, left, left + pw);
    s += fmt::format(FMT_STRING("<line class=\"tick\" x1=\"{1:.1f}\" y1=\"{0:.1f}\" x2=\"{2:.1f}\" y2=\"{0:.1f}\" stroke=\"black\"/>\n"),
                     y, left - 5, left);
    s += fmt::format(FMT_STRING("<text class=\"tick-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n"), left - 8,
                     y + 4, tick_label(v));
  }
  // Axes and their labels.
  s += fmt::format(FMT_STRING("<line class=\"axis\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"black\"/>\n"),
                   left, top + ph, left + pw);
  s += fmt::format(FMT_STRING("<line class=\"axis\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"black\"/>\n"),
                   left, top, top + ph);
  s += fmt::format(FMT_STRING("<text class=\"axis-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step</text>\n"),
                   left + pw / 2, double(o.height) - 10);
  s += fmt::format(
      FMT_STRING("<text class=\"axis-label\" x=\"18\" y=\"{0:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0:.1f})\">"
      "loss</text>\n"),
      top + ph / 2);
  // Train loss.
  if (!series.train.empty()) {
    s += "<polyline class=\"train-loss\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < series.train.size(); ++i) {
      if (i) s += ' ';
      s += fmt::format(FMT_STRING("{:.2f},{:.2f}"), px(series.train[i].first), py(series.train[i].second));
    }
    s += "\"/>\n";
  }
  // Eval loss.
  for (const auto& [x, y] : series.eval) {
    s += fmt::format(FMT_STRING("<circle class=\"eval-loss\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3.5\" fill=\"#d62728\"/>\n"), px(x),
                     py(y));
  }
  // Legend.
  const double lx = left + pw - 130, ly = top + 12;
  s += fmt::format(FMT_STRING("<g class=\"legend\">\n<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" "
                   "stroke=\"#1f77b4\" stroke-width=\"1.5\"/>\n<text x=\"{3:.1f}\" y=\"{4:.1f}\">train loss</text>\n"),
                   lx, ly, lx + 20, lx + 26, ly + 4);
  s += fmt::format(FMT_STRING("<circle cx=\"{0:.1f}\" cy=\"{1:.1f}\" r=\"3.5\" fill=\"#d62728\"/>\n<text x=\"{2:.1f}\" "
                   "y=\"{3:.1f}\">held-out loss</text>\n</g>\n"),
                   lx + 10, ly + 18, lx + 26, ly + 22);
  s += "</svg>\n";
  return s;
}

void write_loss_curve_svg(const std::string& path, const LossSeries& series, const PlotOptions& opts) {
  write_file_atomic(path, loss_curve_svg(series, opts));
}

}  // namespace tessel::train
