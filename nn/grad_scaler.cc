#include "nn/grad_scaler.h"

#include <algorithm>
#include <map>

#include "autograd/api.h"
#include "autograd/grad_mode.h"
#include "dtensor/mesh.h"
#include "kernels/amp.h"
#include "runtime/comm/comm.h"

namespace tessel::nn {

GradScaler::GradScaler(GradScalerOptions options) : opts_(options), scale_(options.init_scale) {
  TESSEL_CHECK(opts_.init_scale > 0, "GradScaler", "init_scale must be > 0, got {}", opts_.init_scale);
  TESSEL_CHECK(opts_.growth_factor > 1.0, "GradScaler", "growth_factor must be > 1, got {}", opts_.growth_factor);
  TESSEL_CHECK(opts_.backoff_factor > 0.0 && opts_.backoff_factor < 1.0, "GradScaler",
               "backoff_factor must be in (0, 1), got {}", opts_.backoff_factor);
  TESSEL_CHECK(opts_.growth_interval >= 1, "GradScaler", "growth_interval must be >= 1, got {}",
               opts_.growth_interval);
}

void GradScaler::set_scale(double scale) {
  TESSEL_CHECK(scale > 0, "GradScaler", "scale must be > 0, got {}", scale);
  scale_ = scale;
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!opts_.enabled) return loss;
  return mul(loss, Scalar(scale_));
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!opts_.enabled) return;
  TESSEL_CHECK(!unscaled_, "GradScaler", "unscale_ was already called for this step (call update() after step())");
  NoGradGuard no_grad;
  const float inv = float(1.0 / scale_);
  std::map<std::pair<int, int>, Tensor> flags;  // one float32 flag per device
  std::vector<MeshPtr> meshes;                   // of the distributed gradients, each once
  for (const ParamGroup& group : optimizer.param_groups()) {
    for (const NamedTensor& p : group.params) {
      Tensor g = p.tensor.grad();
      if (!g.defined()) continue;
      // A distributed gradient: this rank's piece (a pending sum's pieces
      // scale like the sum: the scale is a power of two).
      const Tensor local = g.is_distributed() ? raw::local_of(g) : g;
      if (g.is_distributed() && std::none_of(meshes.begin(), meshes.end(),
                                             [&](const MeshPtr& m) { return same_mesh(m, g.mesh()); }))
        meshes.push_back(g.mesh());
      const Device d = local.device();
      Tensor& flag = flags[{int(d.type), d.index}];
      if (!flag.defined()) flag = zeros(Dims{}, TensorOptions(DType::Float32).with_device(d));
      kernels::amp_unscale(d, local, flag, inv);
      g.bump_version();
    }
  }
  found_inf_ = false;
  for (const auto& [key, flag] : flags) found_inf_ = found_inf_ || flag.item<float>() != 0.0f;
  // An inf in one rank's piece skips the step on every rank: the flag is
  // combined (max) over every dim of each mesh the gradients live on, so the
  // ranks never disagree about stepping.
  for (const MeshPtr& mesh : meshes) combine_found_inf(*mesh);
  unscaled_ = true;
}

void GradScaler::combine_found_inf(const Mesh& mesh) {
  Tensor any = full(Dims{}, found_inf_ ? 1.0 : 0.0, TensorOptions(DType::Float32));
  for (int m = 0; m < mesh.ndim(); ++m)
    if (mesh.comm(m)) mesh.comm(m)->all_reduce(any, comm::ReduceOp::Max)->wait();
  found_inf_ = any.item<float>() != 0.0f;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!opts_.enabled) {
    optimizer.step();
    return true;
  }
  if (!unscaled_) unscale_(optimizer);
  if (found_inf_) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!opts_.enabled) return;
  if (found_inf_) {
    scale_ *= opts_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= opts_.growth_interval) {
    scale_ *= opts_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = false;
}

}  // namespace tessel::nn
