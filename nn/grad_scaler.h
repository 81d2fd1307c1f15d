#pragma once
// Dynamic loss scaling for float16 mixed precision (PyTorch's GradScaler
// semantics; bfloat16 has float32's range and does not need it).
//
//   nn::GradScaler scaler;                        // scale 2^16
//   Tensor loss = cross_entropy(...);
//   scaler.scale(loss).backward();                // gradients of loss * scale
//   nn::clip_grad_norm_(...) needs scaler.unscale_(opt) first (optional)
//   scaler.step(opt);                             // unscales, skips the step on inf/NaN
//   scaler.update();                              // backoff on inf/NaN, growth after clean steps
//
// The unscale runs one kernel per gradient (kernels/amp.h: multiply by
// float(1 / scale) computed in double, and flag any inf/NaN into one float32
// per device); step() then reads the flags back (one small device-to-host
// copy per device). Deterministic: the flags only ever go 0 -> 1, and the
// scale follows a fixed rule. A skipped step leaves parameters, optimizer
// state and step counts untouched.
#include <cstdint>
#include <vector>

#include "dtensor/mesh.h"
#include "nn/optim.h"
#include "runtime/tensor.h"

namespace tessel::nn {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;   // > 1
  double backoff_factor = 0.5;  // in (0, 1)
  int64_t growth_interval = 2000;  // clean steps before the scale grows
  bool enabled = true;             // disabled: scale() and unscale are identities, step() always steps
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale (differentiable); loss itself when disabled.
  Tensor scale(const Tensor& loss) const;
  // Divides every defined .grad of the optimizer's parameters by the scale,
  // in place, recording inf/NaN. At most once per step (throws otherwise).
  void unscale_(Optimizer& optimizer);
  // Unscales (unless unscale_ ran this step), then runs optimizer.step()
  // unless a gradient held an inf or NaN. Returns whether it stepped.
  bool step(Optimizer& optimizer);
  // Ends the step: scale *= backoff_factor after an inf/NaN, *= growth_factor
  // after growth_interval consecutive clean steps.
  void update();

  double get_scale() const { return scale_; }
  void set_scale(double scale);
  bool found_inf() const { return found_inf_; }  // of the current (or last updated) step
  // After unscale_: combines found_inf (max) over every dim of `mesh`, for
  // ranks whose gradients live on different meshes (pipeline stages).
  // Collective over the mesh.
  void combine_found_inf(const Mesh& mesh);
  int64_t growth_tracker() const { return growth_tracker_; }
  void set_growth_tracker(int64_t t) { growth_tracker_ = t; }
  bool enabled() const { return opts_.enabled; }

 private:
  GradScalerOptions opts_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace tessel::nn
