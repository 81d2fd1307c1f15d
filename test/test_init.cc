// Parameter initialisation: formulas, statistics, sharded init, errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/api.h"
#include "test/util/util.h"

using namespace tessel;
using tessel::testing::bitwise_equal;

namespace {

const PhiloxKey kKey{2024, stream_for("layers.0.attn.wq.weight")};

double sample_std(const Tensor& t, double* max_abs = nullptr) {
  auto v = t.to_vector<double>();
  double m = 0, s = 0, mx = 0;
  for (double x : v) m += x;
  m /= double(v.size());
  for (double x : v) {
    s += (x - m) * (x - m);
    mx = std::max(mx, std::fabs(x));
  }
  if (max_abs) *max_abs = mx;
  return std::sqrt(s / double(v.size() - 1));
}

void check_rel(double got, double expect, double tol, const char* what) {
  INFO(what << ": got " << got << ", expected " << expect);
  CHECK(std::fabs(got / expect - 1.0) < tol);
}

Tensor slice_of(const Tensor& full, const Dims& offset, const Dims& shape) {
  Tensor v = full;
  for (int d = 0; d < shape.size(); ++d) v = raw::narrow(v, d, offset[d], shape[d]);
  return v;
}

}  // namespace

TEST_CASE("gains and fans") {
  CHECK(calculate_gain(Nonlinearity::Linear) == 1.0);
  CHECK(calculate_gain(Nonlinearity::Sigmoid) == 1.0);
  CHECK(calculate_gain(Nonlinearity::Tanh) == 5.0 / 3.0);
  CHECK(calculate_gain(Nonlinearity::Relu) == std::sqrt(2.0));
  CHECK(calculate_gain(Nonlinearity::LeakyRelu, 0.0) == std::sqrt(2.0));
  CHECK(calculate_gain(Nonlinearity::LeakyRelu, 0.2) == std::sqrt(2.0 / 1.04));
  CHECK(calculate_gain(Nonlinearity::Selu) == 0.75);
  Fans f = compute_fans({64, 32});
  CHECK(f.fan_in == 32);
  CHECK(f.fan_out == 64);
  Fans c = compute_fans({16, 8, 3, 5});
  CHECK(c.fan_in == 8 * 15);
  CHECK(c.fan_out == 16 * 15);
}

TEST_CASE("kaiming and xavier standard deviations match their formulas within 2%") {
  const Dims shape{512, 1024};  // fan_in 1024, fan_out 512
  const double fan_in = 1024, fan_out = 512;
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16}) {
    INFO(dtype_name(dt));
    double mx = 0;
    Tensor w = empty(shape, dt);
    kaiming_uniform_(w, kKey);  // leaky_relu, a = 0: gain sqrt(2)
    double sd = std::sqrt(2.0) / std::sqrt(fan_in);
    check_rel(sample_std(w, &mx), sd, 0.02, "kaiming_uniform_");
    CHECK(mx <= std::sqrt(3.0) * sd * (1 + 1e-2));
    kaiming_uniform_(w, kKey, std::sqrt(5.0));  // nn.Linear's default: bound 1/sqrt(fan_in)
    CHECK(sample_std(w, &mx) > 0);
    CHECK(mx <= 1.0 / std::sqrt(fan_in) * (1 + 1e-2));
    check_rel(sample_std(w), 1.0 / std::sqrt(3.0 * fan_in), 0.02, "kaiming_uniform_ a=sqrt(5)");
    kaiming_normal_(w, kKey, 0.0, FanMode::FanOut, Nonlinearity::Relu);
    check_rel(sample_std(w), std::sqrt(2.0) / std::sqrt(fan_out), 0.02, "kaiming_normal_ fan_out relu");
    kaiming_normal_(w, kKey, 0.0, FanMode::FanIn, Nonlinearity::Tanh);
    check_rel(sample_std(w), 5.0 / 3.0 / std::sqrt(fan_in), 0.02, "kaiming_normal_ tanh");
    kaiming_normal_(w, kKey, 0.1, FanMode::FanIn, Nonlinearity::LeakyRelu);
    check_rel(sample_std(w), std::sqrt(2.0 / 1.01) / std::sqrt(fan_in), 0.02, "kaiming_normal_ leaky 0.1");
    kaiming_normal_(w, kKey, 0.0, FanMode::FanIn, Nonlinearity::Linear);
    check_rel(sample_std(w), 1.0 / std::sqrt(fan_in), 0.02, "kaiming_normal_ linear");
    xavier_uniform_(w, kKey);
    double xs = std::sqrt(2.0 / (fan_in + fan_out));
    check_rel(sample_std(w, &mx), xs, 0.02, "xavier_uniform_");
    CHECK(mx <= std::sqrt(3.0) * xs * (1 + 1e-2));
    xavier_normal_(w, kKey, 2.0);
    check_rel(sample_std(w), 2.0 * xs, 0.02, "xavier_normal_ gain 2");
  }
  // Convolution-shaped weights use the receptive field.
  Tensor conv = empty({64, 32, 3, 3});
  kaiming_normal_(conv, kKey, 0.0, FanMode::FanIn, Nonlinearity::Relu);
  check_rel(sample_std(conv), std::sqrt(2.0 / (32 * 9)), 0.02, "kaiming_normal_ conv");
}

TEST_CASE("normal_, uniform_, trunc_normal_ and constants") {
  Tensor t = empty({256, 256});
  normal_(t, kKey, 0.0, 0.02);
  check_rel(sample_std(t), 0.02, 0.02, "normal_ std 0.02");
  normal_(t, kKey, 3.0, 0.0);  // std 0: the mean everywhere
  CHECK(t.to_vector<float>() == std::vector<float>(size_t(t.numel()), 3.0f));
  double mx = 0;
  uniform_(t, kKey, -0.5, 0.5);
  sample_std(t, &mx);
  CHECK(mx <= 0.5);
  trunc_normal_(t, kKey, 0.0, 0.02, -0.04, 0.04);
  sample_std(t, &mx);
  CHECK(mx <= 0.04f);
  Tensor i = empty({3}, DType::Int64);
  CHECK(zeros_(i).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0});
  CHECK(ones_(i).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1});
  CHECK(constant_(t, 0.25).to_vector<float>()[7] == 0.25f);
}

TEST_CASE("init writes in place under no-grad and bumps the version") {
  Tensor w = zeros({8, 4}).requires_grad_(true);
  uint32_t v = w.version();
  kaiming_uniform_(w, kKey);  // allowed on a leaf that requires grad (runs under no-grad)
  CHECK(w.version() == v + 1);
  CHECK(w.requires_grad());
  CHECK(w.is_leaf());
  CHECK(w.grad_fn() == nullptr);
  CHECK(sample_std(w) > 0);
  uint32_t v2 = w.version();
  zeros_(w);
  CHECK(w.version() == v2 + 1);
  // A view writes through to its base.
  Tensor base = zeros({6, 6});
  normal_(base.narrow(0, 2, 2), kKey);
  auto vals = base.to_vector<float>();
  CHECK(vals[0] == 0.0f);
  CHECK(vals[12] != 0.0f);
  CHECK(vals[24] == 0.0f);
}

TEST_CASE("sharded init equals the slice of the full init (fans from the global shape)") {
  const Dims global{48, 30};
  using InitFn = std::function<void(const Tensor&, const GlobalBlock&)>;
  std::vector<std::pair<const char*, InitFn>> inits = {
      {"kaiming_uniform_", [](const Tensor& t, const GlobalBlock& b) {
         kaiming_uniform_(t, kKey, 0.0, FanMode::FanIn, Nonlinearity::LeakyRelu, b);
       }},
      {"kaiming_normal_", [](const Tensor& t, const GlobalBlock& b) {
         kaiming_normal_(t, kKey, 0.0, FanMode::FanOut, Nonlinearity::Relu, b);
       }},
      {"xavier_uniform_", [](const Tensor& t, const GlobalBlock& b) { xavier_uniform_(t, kKey, 1.0, b); }},
      {"xavier_normal_", [](const Tensor& t, const GlobalBlock& b) { xavier_normal_(t, kKey, 1.0, b); }},
      {"trunc_normal_", [](const Tensor& t, const GlobalBlock& b) { trunc_normal_(t, kKey, 0, 0.02, -0.04, 0.04, b); }},
      {"normal_", [](const Tensor& t, const GlobalBlock& b) { normal_(t, kKey, 0, 0.02, b); }},
      {"uniform_", [](const Tensor& t, const GlobalBlock& b) { uniform_(t, kKey, -1, 1, b); }},
  };
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float64}) {
    for (auto& [name, init] : inits) {
      INFO(name << " " << dtype_name(dt));
      Tensor full = empty(global, dt);
      init(full, {});
      // Row shards (tensor parallel, column-parallel linear), column shards, uneven, empty.
      for (int world : {1, 2, 3, 4, 7, 64}) {
        for (int dim : {0, 1}) {
          int64_t n = global[dim], chunk = (n + world - 1) / world;
          for (int r = 0; r < world; ++r) {
            int64_t start = std::min<int64_t>(n, r * chunk), len = std::min<int64_t>(chunk, n - start);
            Dims off{0, 0}, shp = global;
            off[dim] = start;
            shp[dim] = len;
            Tensor shard = empty(shp, dt);
            init(shard, {global, off});
            REQUIRE(bitwise_equal(shard, slice_of(full, off, shp)));
            // Into a transposed local buffer.
            Tensor tbuf = empty({shp[1], shp[0]}, dt);
            Tensor view = raw::transpose(tbuf, 0, 1);
            init(view, {global, off});
            REQUIRE(bitwise_equal(view, slice_of(full, off, shp)));
          }
        }
      }
    }
  }
}

TEST_CASE("init errors name the op") {
  using Catch::Contains;
  Tensor i = zeros({4, 4}, DType::Int32);
  CHECK_THROWS_WITH(normal_(i, kKey), Contains("normal_") && Contains("int32"));
  CHECK_THROWS_WITH(uniform_(i, kKey), Contains("uniform_") && Contains("int32"));
  CHECK_THROWS_WITH(kaiming_uniform_(i, kKey), Contains("kaiming_uniform_") && Contains("int32"));
  CHECK_THROWS_WITH(xavier_normal_(zeros({4, 4}, DType::Bool), kKey), Contains("xavier_normal_") && Contains("bool"));
  CHECK_THROWS_WITH(trunc_normal_(i, kKey), Contains("trunc_normal_") && Contains("int32"));
  Tensor f = zeros({4, 4});
  CHECK_THROWS_WITH(uniform_(f, kKey, 1.0, 1.0), Contains("uniform_") && Contains("lo < hi"));
  CHECK_THROWS_WITH(uniform_(f, kKey, 2.0, 1.0), Contains("uniform_"));
  CHECK_THROWS_WITH(uniform_(f, kKey, 0.0, INFINITY), Contains("uniform_"));
  CHECK_THROWS_WITH(uniform_(zeros({4}, DType::BFloat16), kKey, 1.001, 1.002), Contains("uniform_") &&
                                                                                Contains("bfloat16"));
  CHECK_THROWS_WITH(uniform_(f, kKey, -3.4e38, 3.4e38), Contains("uniform_") && Contains("overflows"));
  CHECK_THROWS_WITH(normal_(f, kKey, 0.0, -1.0), Contains("normal_") && Contains("std"));
  CHECK_THROWS_WITH(normal_(f, kKey, NAN, 1.0), Contains("normal_"));
  CHECK_THROWS_WITH(trunc_normal_(f, kKey, 0.0, 0.0), Contains("trunc_normal_") && Contains("std > 0"));
  CHECK_THROWS_WITH(trunc_normal_(f, kKey, 0.0, 1.0, 2.0, 1.0), Contains("trunc_normal_") && Contains("a < b"));
  CHECK_THROWS_WITH(trunc_normal_(zeros({4}, DType::BFloat16), kKey, 1.0, 1.0, 1.001, 1.002),
                    Contains("trunc_normal_") && Contains("bfloat16"));
  CHECK_THROWS_WITH(kaiming_normal_(zeros({5}), kKey), Contains("kaiming_normal_") && Contains("2 dimensions"));
  CHECK_THROWS_WITH(xavier_uniform_(zeros({5}), kKey), Contains("xavier_uniform_") && Contains("2 dimensions"));
  CHECK_THROWS_WITH(normal_(zeros({1, 4}).expand({3, 4}), kKey), Contains("normal_") && Contains("overlapping"));
  CHECK_THROWS_WITH(normal_(f, kKey, 0, 1, {{4, 3}, {0, 0}}), Contains("normal_") && Contains("does not fit"));
  CHECK_THROWS_WITH(kaiming_uniform_(f, kKey, 0, FanMode::FanIn, Nonlinearity::Relu, {{4}, {0}}),
                    Contains("kaiming_uniform_") && Contains("rank"));
  // Zero-element tensors are a no-op.
  CHECK_NOTHROW(kaiming_uniform_(zeros({0, 4}), kKey));
}
