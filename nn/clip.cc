#include "nn/clip.h"

#include <cmath>

#include <map>

#include "autograd/api.h"
#include "autograd/ops/common.h"
#include "dtensor/ops.h"
#include "dtensor/sharding.h"
#include "kernels/canonical.h"
#include "kernels/elementwise.h"
#include "kernels/optim.h"
#include "runtime/comm/comm.h"
#include "runtime/numerics.h"
#include "runtime/numerics.h"

namespace tessel::nn {
namespace {

float total_norm(const std::vector<Tensor>& params, const char* op) {
  return norm_of_square_sums(square_sums(params, op));
}

}  // namespace

// Step 1 of clip.h for each parameter (-1 where there is no gradient).
std::vector<float> square_sums(const std::vector<Tensor>& params, const char* op) {
  int64_t count = 0;
  Device device = kCPU;
  for (const Tensor& p : params) {
    TESSEL_CHECK(p.defined(), op, "parameter {} is undefined", count);
    Tensor g = p.grad();
    if (!g.defined()) continue;
    TESSEL_CHECK(g.dtype() == DType::Float32 || is_half(g.dtype()), op,
                 "gradients must be float32, bfloat16 or float16; got {}", g.desc());
    if (count == 0) device = g.device();
    TESSEL_CHECK(g.device() == device, op, "gradients on different devices: {} and {}", device.str(),
                 g.device().str());
    ++count;
  }
  std::vector<float> out(params.size(), -1.0f);
  if (count == 0) return out;
  // One slot per defined gradient.
  Tensor sums = raw::empty({count}, DType::Float32, device);
  const int v = numerics::reduction_chunks();
  int64_t i = 0;
  // Distributed gradients: each rank sums the squares of its piece; pieces of
  // sharded mesh dims are then added over those dims' groups (replicas are
  // counted once). Parameters sharded over the same mesh dims share one
  // all-reduce.
  MeshPtr mesh;
  std::map<uint32_t, std::vector<int64_t>> by_shard_dims;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    int v_local = v;
    if (g.is_distributed()) {
      if (g.placements().any_partial()) g = redistribute(g, dtensor::unshard(g.placements(), {}, true));
      if (numerics::bitwise()) {
        // The single-device sum of squares runs over the whole gradient in
        // memory order: a piece may compute its subtree only if it is a whole
        // run of the canonical chunks; otherwise gather the gradient.
        std::vector<int> all;
        for (int d = 0; d < g.dim(); ++d) all.push_back(d);
        v_local = dtensor::local_chunks(g.shape(), g.placements(), *g.mesh(), all, v);
        if (v_local == 0) {
          g = redistribute(g, Placements::replicated(g.mesh()->ndim()));
          v_local = v;
        }
      }
      uint32_t mask = 0;
      for (int m = 0; m < g.placements().size(); ++m)
        if (g.placements()[m].is_shard() && g.mesh()->size(m) > 1) mask |= 1u << m;
      if (mask) by_shard_dims[mask].push_back(i);
      mesh = g.mesh();
      g = raw::local_of(g);
    }
    if (!g.is_contiguous()) g = detail::contiguous_raw(g);
    kernels::sum_squares(device, g, v_local, raw::select(sums, 0, i++));
  }
  if (device.is_meta()) {
    for (size_t k = 0; k < params.size(); ++k)
      if (params[k].grad().defined()) out[k] = 0.0f;
    return out;
  }
  Tensor host = device.type == DeviceType::CPU ? sums : sums.to(kCPU);
  float* s = host.data<float>();
  for (const auto& [mask, idx] : by_shard_dims) {
    Tensor buf = raw::empty({int64_t(idx.size())}, DType::Float32, kCPU);
    for (size_t k = 0; k < idx.size(); ++k) buf.data<float>()[k] = s[idx[k]];
    // Inner mesh dims first: neighbouring pieces differ in the innermost
    // cutting dim, so this finishes the canonical tree level by level.
    for (int m = mesh->ndim() - 1; m >= 0; --m)
      if (mask >> m & 1u) mesh->comm(m)->all_reduce(buf, comm::ReduceOp::Sum)->wait();
    for (size_t k = 0; k < idx.size(); ++k) s[idx[k]] = buf.data<float>()[k];
  }
  i = 0;
  for (size_t k = 0; k < params.size(); ++k)
    if (params[k].grad().defined()) out[k] = s[i++];
  return out;
}

// Steps 2-3: the entries >= 0, padded with +0 to a power of two, combined by
// the balanced tree; the square root.
float norm_of_square_sums(const std::vector<float>& sums) {
  std::vector<float> leaves;
  for (float x : sums)
    if (!(x < 0)) leaves.push_back(x);  // -1 marks "no gradient"; a NaN sum must stay (x >= 0 dropped it)
  if (leaves.empty()) return 0.0f;
  size_t padded = 1;
  while (padded < leaves.size()) padded *= 2;
  leaves.resize(padded, 0.0f);
  return std::sqrt(kernels::tree_combine(leaves.data(), int(padded), kernels::SumCombine<float>()));
}

namespace {

}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  return double(total_norm(params, "grad_norm"));
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite) {
  TESSEL_CHECK(max_norm >= 0, "clip_grad_norm_", "invalid max_norm = {} (must be >= 0)", max_norm);
  NoGradGuard no_grad;
  const float total = total_norm(params, "clip_grad_norm_");
  TESSEL_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm_",
               "the total norm of the gradients is {} (error_if_nonfinite)", total);
  const float scale = float(max_norm) / (total + 1e-6f);
  if (scale < 1.0f) {
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      kernels::scale_inplace(g.device(), raw::local_of(g), scale);
      g.bump_version();
    }
  }
  return double(total);
}

}  // namespace tessel::nn
