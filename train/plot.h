#pragma once
// A self-contained SVG loss curve: train loss per step (one polyline) and
// held-out loss points (circles), axes with "nice" ticks and labels, a title
// and a legend. No scripts, no external fonts or styles.
//
// Element contract (what tests and tools may rely on):
//   <svg xmlns="http://www.w3.org/2000/svg" ...> root;
//   <polyline class="train-loss" points="x,y x,y ..."/> with one point per
//     finite train loss (absent when there is none);
//   one <circle class="eval-loss" .../> per finite eval loss;
//   <line class="tick" .../> + <text class="tick-label">…</text> per axis tick;
//   <text class="title">, <text class="axis-label"> for "step" and "loss".
#include <string>
#include <utility>
#include <vector>

#include "train/metrics.h"

namespace tessel::train {

struct LossSeries {
  std::vector<std::pair<double, double>> train;  // (step, loss)
  std::vector<std::pair<double, double>> eval;   // (step, eval loss)
};

// Train points from records with a loss; eval points from the extra
// `eval_key` ("eval_loss"). Non-finite values are dropped.
LossSeries loss_series(const std::vector<StepMetrics>& records, const std::string& eval_key = "eval_loss");

struct PlotOptions {
  std::string title = "Training loss";
  int width = 800;
  int height = 480;
};

std::string loss_curve_svg(const LossSeries& series, const PlotOptions& opts = {});
// Writes the SVG atomically (AtomicFile).
void write_loss_curve_svg(const std::string& path, const LossSeries& series, const PlotOptions& opts = {});

// Up to ~max_ticks "nice" tick values (1, 2, 5 x 10^k steps) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int max_ticks = 6);

}  // namespace tessel::train
