// Registers the CUDA random kernels (kernels/cuda/random.cu) in the random
// KernelTables: builds the block geometry on the host and launches.
#include "kernels/cuda/random_launch.h"
#include "kernels/random.h"

namespace tessel::kernels::cuda {
namespace {

void check_device(const char* op, const Tensor& t) {
  TESSEL_CHECK(t.device().is_cuda(), op, "expected a CUDA tensor, got {}", t.desc());
}

void random_fill_cuda(const Tensor& out, const RandomParams& p, const GlobalBlock& block) {
  check_device(random_dist_name(p.dist), out);
  RandomGeometry g = make_random_geometry(out, block);
  const char* err = launch_random_fill(out.dtype(), p, g, out.raw_data(), nullptr);
  TESSEL_CHECK(err == nullptr, random_dist_name(p.dist), "CUDA kernel for {} failed: {}", out.desc(), err);
}

void dropout_cuda(const Tensor& in, const Tensor& out, PhiloxKey key, uint32_t keep_threshold, double scale,
                  const GlobalBlock& block) {
  check_device("dropout", in);
  check_device("dropout", out);
  TESSEL_CHECK(in.shape() == out.shape() && in.dtype() == out.dtype(), "dropout",
               "input {} and output {} must have the same shape and dtype", in.desc(), out.desc());
  RandomGeometry g = make_random_geometry(out, block, &in);
  const char* err = launch_dropout(out.dtype(), key, keep_threshold, scale, g, in.raw_data(), out.raw_data(), nullptr);
  TESSEL_CHECK(err == nullptr, "dropout", "CUDA kernel for {} failed: {}", out.desc(), err);
}

}  // namespace

TESSEL_REGISTER_KERNEL(random_fill, DeviceType::CUDA, random_fill_cuda);
TESSEL_REGISTER_KERNEL(dropout, DeviceType::CUDA, dropout_cuda);

}  // namespace tessel::kernels::cuda
