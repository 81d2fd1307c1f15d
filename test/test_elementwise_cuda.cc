// CUDA elementwise kernels (binary ops, copy with conversion, fill, where,
// unary ops and their backward) against the CPU kernels on random inputs,
// with broadcast and strided operands. float32 and 16-bit results are
// compared bit for bit (docs/design.md §4 level 4); float64 transcendentals and
// pow use the platform's math library and get a tolerance. Skips without a GPU.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "kernels/elementwise.h"
#include "kernels/unary.h"
#include "test/util/cuda.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
using kernels::BinaryOp;
using kernels::UnaryOp;

namespace {

const std::vector<DType> kAll = {DType::Bool, DType::Int32, DType::Int64, DType::Float16,
                                 DType::BFloat16, DType::Float32, DType::Float64};

Tensor random_of(const Dims& shape, uint64_t seed, DType dt, double lo = -3, double hi = 3) {
  if (dt == DType::Bool) return randint(shape, seed, 0, 2, DType::Int64).to(DType::Bool);
  if (is_integral(dt)) return randint(shape, seed, -50, 50, dt);
  return uniform(shape, seed, lo, hi, dt);
}

// The operand layouts every elementwise test runs: contiguous, broadcast
// (a row and a scalar), and a transposed view.
struct Layout {
  const char* name;
  Dims a_shape;
  bool a_transposed;
  Dims b_shape;
};
const std::vector<Layout> kLayouts = {
    {"contiguous", {33, 17}, false, {33, 17}},
    {"row broadcast", {33, 17}, false, {1, 17}},
    {"scalar", {33, 17}, false, {}},
    {"transposed", {17, 33}, true, {33, 17}},
};

Tensor view_of(const Tensor& t, bool transposed) { return transposed ? raw::transpose(t, 0, 1) : t; }

bool valid_binary(BinaryOp op, DType dt) {
  if (kernels::is_logical(op)) return dt == DType::Bool;
  if (op == BinaryOp::Div || op == BinaryOp::Pow) return is_floating(dt);
  if (dt == DType::Bool) return kernels::is_comparison(op) || op == BinaryOp::Add || op == BinaryOp::Mul ||
                                op == BinaryOp::Maximum || op == BinaryOp::Minimum;
  return true;
}

}  // namespace

TEST_CASE("binary ops on CUDA equal the CPU for every dtype and layout") {
  TESSEL_REQUIRE_GPU();
  const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum,
                          BinaryOp::Minimum, BinaryOp::Pow, BinaryOp::Eq, BinaryOp::Ne, BinaryOp::Lt,
                          BinaryOp::Le, BinaryOp::Gt, BinaryOp::Ge, BinaryOp::LogicalAnd, BinaryOp::LogicalOr,
                          BinaryOp::LogicalXor};
  for (BinaryOp op : ops) {
    for (DType dt : kAll) {
      if (!valid_binary(op, dt)) continue;
      for (const Layout& l : kLayouts) {
        INFO(kernels::binary_op_name(op) << " " << dtype_name(dt) << " " << l.name);
        const bool pow = op == BinaryOp::Pow;
        Tensor a = view_of(random_of(l.a_shape, 1, dt, pow ? 0.1 : -3, 3), l.a_transposed);
        Tensor b = random_of(l.b_shape, 2, dt, pow ? -2 : -3, pow ? 2 : 3);
        const Dims shape{33, 17};
        const DType od = kernels::is_comparison(op) || kernels::is_logical(op) ? DType::Bool : dt;
        Tensor cpu = raw::empty(shape, od), gpu = raw::empty(shape, od, kCuda);
        kernels::binary(kCPU, op, a, raw::expand(b, shape), cpu);
        Tensor ad = view_of(to_cuda(l.a_transposed ? raw::transpose(a, 0, 1) : a), l.a_transposed);
        kernels::binary(kCuda, op, ad, raw::expand(to_cuda(b), shape), gpu);
        if (pow && dt == DType::Float64) CHECK(allclose(to_cpu(gpu), cpu, 1e-14, 0));
        else if (pow) CHECK(allclose(to_cpu(gpu), cpu, 2e-7, 0));  // CUDA powf vs glibc powf: not in the contract
        else CHECK_SAME_BITS(gpu, cpu);
      }
    }
  }
}

TEST_CASE("copy on CUDA converts every dtype pair like the CPU, any direction and layout") {
  TESSEL_REQUIRE_GPU();
  for (DType sd : kAll) {
    Tensor src = random_of({23, 41}, 3, sd, -300, 300);
    for (DType dd : kAll) {
      if (is_integral(dd) && is_floating(sd)) continue;  // float -> int: covered in range below
      INFO(dtype_name(sd) << " -> " << dtype_name(dd));
      Tensor cpu = raw::empty(src.shape(), dd);
      kernels::copy(kCPU, src, cpu);
      // host -> device with conversion, into a transposed destination
      Tensor dt_buf = raw::empty({41, 23}, dd, kCuda);
      kernels::copy(kCuda, src, raw::transpose(dt_buf, 0, 1));
      CHECK_SAME_BITS(raw::transpose(to_cpu(dt_buf), 0, 1).contiguous(), cpu);
      // device -> device with conversion from a strided source, then device -> host strided
      Tensor sd_dev = to_cuda(src);
      Tensor dd_dev = raw::empty(src.shape(), dd, kCuda);
      kernels::copy(kCuda, raw::transpose(raw::transpose(sd_dev, 0, 1), 0, 1), dd_dev);
      Tensor back = raw::empty({41, 23}, dd);
      kernels::copy(kCuda, dd_dev, raw::transpose(back, 0, 1));
      CHECK_SAME_BITS(raw::transpose(back, 0, 1).contiguous(), cpu);
      // device -> host with conversion
      Tensor h = raw::empty(src.shape(), dd);
      kernels::copy(kCuda, sd_dev, h);
      CHECK_SAME_BITS(h, cpu);
    }
  }
  // float -> integer inside the integer range.
  Tensor f = uniform({1000}, 5, -1e6, 1e6);
  for (DType dd : {DType::Int32, DType::Int64}) {
    Tensor cpu = raw::empty(f.shape(), dd);
    kernels::copy(kCPU, f, cpu);
    Tensor gpu = raw::empty(f.shape(), dd, kCuda);
    kernels::copy(kCuda, to_cuda(f), gpu);
    CHECK_SAME_BITS(gpu, cpu);
  }
}

TEST_CASE("large copies cross the pinned staging chunks intact") {
  TESSEL_REQUIRE_GPU();
  const int64_t n = (int64_t(20) << 20) / 4 + 12345;  // ~20 MiB of float32: three staging chunks
  Tensor x = uniform({n}, 6);
  Tensor d = x.to(kCuda);
  CHECK(d.device() == kCuda);
  CHECK(bitwise_equal(d.to(kCPU), x));
  // bfloat16 on the device, read back as float through item()/to_vector().
  Tensor b = x.to(DType::BFloat16).to(kCuda);
  CHECK(b.to_vector<float>() == x.to(DType::BFloat16).to_vector<float>());
}

TEST_CASE("fill and where on CUDA equal the CPU") {
  TESSEL_REQUIRE_GPU();
  for (DType dt : kAll) {
    INFO(dtype_name(dt));
    Tensor cpu = raw::empty({9, 11}, dt), buf = raw::empty({11, 9}, dt, kCuda);
    kernels::fill(kCPU, cpu, Scalar(-2.75));
    kernels::fill(kCuda, raw::transpose(buf, 0, 1), Scalar(-2.75));
    CHECK_SAME_BITS(raw::transpose(to_cpu(buf), 0, 1).contiguous(), cpu);
    Tensor c = random_of({9, 11}, 7, DType::Bool), a = random_of({9, 11}, 8, dt), b = random_of({1, 11}, 9, dt);
    Tensor w_cpu = raw::empty({9, 11}, dt), w_gpu = raw::empty({9, 11}, dt, kCuda);
    kernels::where(kCPU, c, a, raw::expand(b, {9, 11}), w_cpu);
    kernels::where(kCuda, to_cuda(c), to_cuda(a), raw::expand(to_cuda(b), {9, 11}), w_gpu);
    CHECK_SAME_BITS(w_gpu, w_cpu);
  }
}

TEST_CASE("unary ops and their backward on CUDA equal the CPU bit for bit (float64: tolerance)") {
  TESSEL_REQUIRE_GPU();
  for (int o = 0; o < kernels::kNumUnaryOps; ++o) {
    const UnaryOp op = UnaryOp(o);
    const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt ||
                          op == UnaryOp::Log1p || op == UnaryOp::Reciprocal;
    std::vector<DType> dts;
    if (op == UnaryOp::LogicalNot) dts = {DType::Bool};
    else if (op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Sign || op == UnaryOp::Square)
      dts = {DType::Int32, DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64};
    else dts = {DType::Float16, DType::BFloat16, DType::Float32, DType::Float64};
    for (DType dt : dts) {
      INFO(kernels::unary_op_name(op) << " " << dtype_name(dt));
      Tensor x = view_of(random_of({37, 29}, uint64_t(10 + o), dt, positive ? 0.05 : -6, 6), true);
      Tensor cpu = raw::empty(x.shape(), dt), gpu = raw::empty(x.shape(), dt, kCuda);
      kernels::unary(kCPU, op, x, cpu);
      Tensor xd = raw::transpose(to_cuda(raw::transpose(x, 0, 1)), 0, 1);
      kernels::unary(kCuda, op, xd, gpu);
      // float64 transcendentals are libm's on the CPU and libdevice's on the
      // GPU (not in the contract): a few ulps apart. The absolute term covers
      // cancellation, e.g. gelu_erf(-6) = -3 * (1 + erf(-4.24)): an ulp of erf
      // near -1 is 1e-16 absolute, far above an ulp of the 6e-9 result.
      if (dt == DType::Float64) CHECK(allclose(to_cpu(gpu), cpu, 1e-13, 1e-15));
      else CHECK_SAME_BITS(gpu, cpu);
      if (!is_floating(dt)) continue;
      Tensor g = random_of(x.shape(), uint64_t(50 + o), dt);
      Tensor dx_cpu = raw::empty(x.shape(), dt), dx_gpu = raw::empty(x.shape(), dt, kCuda);
      kernels::unary_backward(kCPU, op, g, x, cpu, dx_cpu);
      kernels::unary_backward(kCuda, op, to_cuda(g), xd, gpu, dx_gpu);
      if (dt == DType::Float64) CHECK(allclose(to_cpu(dx_gpu), dx_cpu, 1e-12, 1e-15));
      else CHECK_SAME_BITS(dx_gpu, dx_cpu);
    }
  }
}

TEST_CASE("ops through autograd on CUDA: GELU, SiLU, SwiGLU-style products, forward and backward") {
  TESSEL_REQUIRE_GPU();
  Tensor x = uniform({64, 48}, 11).requires_grad_();
  Tensor y = uniform({64, 48}, 12).requires_grad_();
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return gelu(in[0]) * silu(in[1]) + exp(in[0] - 1.0); },
                     {x, y});
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    Tensor a = uniform({16, 40}, 13, -2, 2, dt).requires_grad_();
    CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return tanh(in[0]) * sigmoid(in[0]); }, {a});
  }
}
