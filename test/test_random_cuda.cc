// CUDA random kernels against the CPU ones, bit for bit (docs/design.md §4 level 1:
// CPU or CUDA -> identical bits). Skips without a GPU.
#include <catch2/catch.hpp>

#include <functional>

#include "autograd/api.h"
#include "autograd/ops/common.h"
#include "kernels/elementwise.h"
#include "kernels/random.h"
#include "runtime/device.h"
#include "test/skip.h"
#include "test/util/util.h"

using namespace tessel;
using tessel::testing::bitwise_equal;

namespace {

const Device kCuda(DeviceType::CUDA, 0);
const PhiloxKey kKey{0xfeedfacecafebeefull, stream_for("test.cuda", {3})};

Tensor to_host(const Tensor& d) {
  REQUIRE(d.is_contiguous());
  Tensor h = raw::empty(d.shape(), d.dtype(), kCPU);
  kernels::copy(kCuda, d, h);
  return h;
}

Tensor to_device(const Tensor& h) {
  Tensor c = detail::contiguous_raw(h);
  Tensor d = raw::empty(h.shape(), h.dtype(), kCuda);
  kernels::copy(kCuda, c, d);
  return d;
}

Tensor slice_of(const Tensor& full, const Dims& offset, const Dims& shape) {
  Tensor v = full;
  for (int d = 0; d < shape.size(); ++d) v = raw::narrow(v, d, offset[d], shape[d]);
  return v;
}

// One random op drawing a tensor of `shape` on `device`, placed at `block`.
struct Kind {
  const char* name;
  std::vector<DType> dtypes;
  std::function<Tensor(const Dims&, DType, Device, const GlobalBlock&)> gen;
};

std::vector<Kind> kinds() {
  const std::vector<DType> floats = {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16};
  auto opts = [](DType t, Device d) { return TensorOptions(t).with_device(d); };
  return {
      {"rand", floats, [=](const Dims& s, DType t, Device d, const GlobalBlock& b) { return rand(s, kKey, opts(t, d), b); }},
      {"randn", floats,
       [=](const Dims& s, DType t, Device d, const GlobalBlock& b) { return randn(s, kKey, opts(t, d), b); }},
      {"uniform_", floats,
       [=](const Dims& s, DType t, Device d, const GlobalBlock& b) {
         return uniform_(raw::empty(s, t, d), kKey, -3.0, 5.0, b);
       }},
      {"normal_", floats,
       [=](const Dims& s, DType t, Device d, const GlobalBlock& b) {
         return normal_(raw::empty(s, t, d), kKey, 2.0, 0.5, b);
       }},
      {"trunc_normal_", floats,
       [=](const Dims& s, DType t, Device d, const GlobalBlock& b) {
         return trunc_normal_(raw::empty(s, t, d), kKey, 0.5, 2.0, -1.0, 3.0, b);
       }},
      {"bernoulli", {DType::Bool, DType::Float32, DType::Int64},
       [=](const Dims& s, DType t, Device d, const GlobalBlock& b) { return bernoulli(s, 0.3, kKey, opts(t, d), b); }},
      {"randint", {DType::Int64, DType::Int32, DType::Float32, DType::Float64},
       [=](const Dims& s, DType t, Device d, const GlobalBlock& b) {
         return tessel::randint(-5, 1000, s, kKey, opts(t, d), b);
       }},
  };
}

// float32 and 16-bit draws are the CPU's bits (tmath). float64 normal and
// truncated-normal draws go through the platform's log/sin/cos/erf (libm on
// the CPU, libdevice on the GPU), which the contract leaves out
// (docs/numerics.md "What is not in the contract"): a few ulps apart, so they
// are compared with a tolerance; float64 uniform draws are exact arithmetic.
bool same_draws(const Tensor& gpu, const Tensor& cpu, const std::string& kind) {
  const bool libm = kind == "randn" || kind == "normal_" || kind == "trunc_normal_";
  if (cpu.dtype() == DType::Float64 && libm) return tessel::testing::allclose(gpu, cpu, 1e-14, 1e-15);
  return bitwise_equal(gpu, cpu);
}

}  // namespace

TEST_CASE("without a GPU, CUDA tensors fail with a clear error") {
  if (cuda_available()) TESSEL_SKIP("a GPU is present");
  CHECK_THROWS_AS(rand({4}, kKey, TensorOptions().with_device(kCuda)), Error);
}

TEST_CASE("CUDA draws the same bits as the CPU") {
  if (!cuda_available()) TESSEL_SKIP("no GPU");
  const std::vector<std::pair<Dims, GlobalBlock>> cases = {
      {{}, {}},
      {{1037}, {}},
      {{(1 << 20) + 3}, {}},
      {{33, 65}, {}},
      {{7, 1, 13}, {{20, 3, 40}, {5, 2, 3}}},   // an unaligned block
      {{50, 1}, {{50, 7}, {0, 3}}},             // a column
      {{0, 9}, {{4, 9}, {2, 0}}},               // empty
  };
  for (const Kind& kind : kinds()) {
    for (DType dt : kind.dtypes) {
      for (const auto& [shape, block] : cases) {
        INFO(kind.name << " " << dtype_name(dt) << " shape " << shape.str());
        Tensor cpu = kind.gen(shape, dt, kCPU, block);
        Tensor gpu = kind.gen(shape, dt, kCuda, block);
        CHECK(gpu.device() == kCuda);
        REQUIRE(same_draws(to_host(gpu), cpu, kind.name));
      }
    }
  }
}

TEST_CASE("CUDA fills strided views of blocks like the CPU") {
  if (!cuda_available()) TESSEL_SKIP("no GPU");
  const Dims global{40, 30};
  const Dims off{8, 3}, shp{17, 21};
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16}) {
    Tensor full = raw::empty(global, dt);
    normal_(full, kKey, 0.0, 1.0);
    Tensor buf = raw::empty({shp[1], shp[0]}, dt, kCuda);
    normal_(raw::transpose(buf, 0, 1), kKey, 0.0, 1.0, {global, off});
    CHECK(same_draws(raw::transpose(to_host(buf), 0, 1).contiguous(), slice_of(full, off, shp).contiguous(),
                     "normal_"));
    Tensor ubuf = raw::empty({shp[1], shp[0]}, dt, kCuda);
    kaiming_uniform_(raw::transpose(ubuf, 0, 1), kKey, 0.0, FanMode::FanIn, Nonlinearity::Relu, {global, off});
    Tensor ufull = raw::empty(global, dt);
    kaiming_uniform_(ufull, kKey, 0.0, FanMode::FanIn, Nonlinearity::Relu);
    CHECK(bitwise_equal(raw::transpose(to_host(ubuf), 0, 1), slice_of(ufull, off, shp)));
  }
}

TEST_CASE("CUDA dropout equals CPU dropout, forward and backward kernel") {
  if (!cuda_available()) TESSEL_SKIP("no GPU");
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(dt));
    Tensor x = testing::uniform({129, 67}, 8, -2, 2, dt);
    Tensor cpu = dropout(x, 0.3, kKey);
    Tensor gpu = dropout(to_device(x), 0.3, kKey);
    REQUIRE(bitwise_equal(to_host(gpu), cpu));
    // A block of a larger batch, with a transposed input.
    Tensor xt = raw::transpose(to_device(testing::uniform({67, 129}, 9, -2, 2, dt)), 0, 1);
    GlobalBlock block{{300, 67}, {100, 0}};
    Tensor gpu_b = dropout(xt, 0.3, kKey, true, block);
    Tensor host_in = raw::transpose(to_host(raw::transpose(xt, 0, 1)), 0, 1);
    REQUIRE(bitwise_equal(to_host(gpu_b), dropout(host_in, 0.3, kKey, true, block)));
    // The kernel backward uses (the same kernel on the gradient).
    Tensor g = testing::uniform({129, 67}, 10, -1, 1, dt);
    Tensor dx_gpu = raw::empty(g.shape(), dt, kCuda);
    Tensor dx_cpu = raw::empty(g.shape(), dt, kCPU);
    uint32_t thr = kernels::bernoulli_threshold(0.7);
    kernels::dropout(kCuda, to_device(g), dx_gpu, kKey, thr, 1.0 / 0.7, GlobalBlock{});
    kernels::dropout(kCPU, g, dx_cpu, kKey, thr, 1.0 / 0.7, GlobalBlock{});
    REQUIRE(bitwise_equal(to_host(dx_gpu), dx_cpu));
  }
}
