// Runtime: dtypes, half conversions, shapes, views, allocator, version counters.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "autograd/api.h"
#include "runtime/allocator.h"
#include "runtime/half.h"
#include "test/util/util.h"
#include "test/skip.h"

using namespace tessel;
using tessel::testing::bitwise_equal;

TEST_CASE("bf16 conversion rounds to nearest even") {
  CHECK(bf16(1.0f).bits == 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  CHECK(bf16(1.00390625f).bits == 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even).
  CHECK(bf16(1.01171875f).bits == 0x3f82);
  CHECK(bf16(1.0f + 1.0f / 128 + 1.0f / 1024).bits == 0x3f81);
  CHECK(std::isnan(float(bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(float(bf16(std::numeric_limits<float>::infinity())) == std::numeric_limits<float>::infinity());
  CHECK(bf16(3.4e38f).bits == 0x7f80);  // rounds up to inf
  CHECK(bf16(-0.0f).bits == 0x8000);
}

TEST_CASE("f16 conversion is exact for every half value and rounds to nearest even") {
  // Round trip: every finite half converts to float and back unchanged.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t b = uint16_t(h);
    if ((b & 0x7c00) == 0x7c00 && (b & 0x3ff)) continue;  // NaN
    float f = f16::to_float(b);
    REQUIRE(f16::from_float(f) == b);
  }
  CHECK(f16(65504.0f).bits == 0x7bff);
  CHECK(f16(65520.0f).bits == 0x7c00);       // halfway to 2^16: rounds to inf
  CHECK(f16(65519.0f).bits == 0x7bff);
  CHECK(f16(5.9604645e-8f).bits == 0x0001);  // smallest subnormal
  CHECK(f16(2.9802322e-8f).bits == 0x0000);  // exactly half the smallest subnormal: ties to even (0)
  CHECK(f16(2.99e-8f).bits == 0x0001);
  CHECK(f16(1.0f + 1.0f / 2048).bits == 0x3c00);  // tie -> even
  CHECK(f16(1.0f + 3.0f / 2048).bits == 0x3c02);  // tie -> even (up)
}

TEST_CASE("dtype promotion and names") {
  CHECK(promote_types(DType::Int32, DType::Float16) == DType::Float16);
  CHECK(promote_types(DType::BFloat16, DType::Float16) == DType::Float32);
  CHECK(promote_types(DType::Int64, DType::Int32) == DType::Int64);
  CHECK(promote_types(DType::Float64, DType::Float32) == DType::Float64);
  CHECK(dtype_from_name("bf16") == DType::BFloat16);
  CHECK_THROWS_WITH(dtype_from_name("float8"), Catch::Contains("unknown dtype name 'float8'"));
  CHECK(Scalar(2.5).result_dtype(DType::Int32) == DType::Float32);
  CHECK(Scalar(2).result_dtype(DType::Float16) == DType::Float16);
}

TEST_CASE("views share storage and compute strides") {
  Tensor x = arange(24).reshape({2, 3, 4});
  CHECK(x.strides() == Dims{12, 4, 1});
  Tensor t = x.transpose(0, 2);
  CHECK(t.shape() == Dims{4, 3, 2});
  CHECK(t.strides() == Dims{1, 4, 12});
  CHECK(t.shares_storage(x));
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.contiguous().to_vector<int64_t>()[1] == 12);

  Tensor s = x.slice(2, 1, 4, 2);  // columns 1 and 3
  CHECK(s.shape() == Dims{2, 3, 2});
  CHECK(s.to_vector<int64_t>() == std::vector<int64_t>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23});
  Tensor sel = x.select(1, -1);
  CHECK(sel.to_vector<int64_t>() == std::vector<int64_t>{8, 9, 10, 11, 20, 21, 22, 23});
  Tensor n = x.narrow(0, 1, 1);
  CHECK(n.offset() == 12);

  Tensor e = tensor({1.f, 2.f, 3.f}).reshape({3, 1}).expand({3, 4});
  CHECK(e.strides() == Dims{1, 0});
  CHECK(e.to_vector<float>()[5] == 2.f);

  Tensor u = x.unsqueeze(1);
  CHECK(u.shape() == Dims{2, 1, 3, 4});
  CHECK(u.squeeze(1).shape() == x.shape());
  CHECK(x.flatten(1).shape() == Dims{2, 12});
  CHECK(x.permute({2, 0, 1}).shape() == Dims{4, 2, 3});
}

TEST_CASE("view works on compatible non-contiguous layouts and refuses others") {
  Tensor x = arange(24).reshape({2, 3, 4});
  Tensor p = x.permute({1, 0, 2});  // [3, 2, 4] with strides [4, 12, 1]
  Tensor v = p.view({3, 2, 2, 2});  // splitting the contiguous last dim is fine
  CHECK(v.shares_storage(x));
  CHECK(v.strides() == Dims{4, 12, 2, 1});
  CHECK(bitwise_equal(v.contiguous(), p.contiguous().view({3, 2, 2, 2})));
  CHECK_THROWS_WITH(p.view({3, 8}), Catch::Contains("without a copy"));
  Tensor r = p.reshape({3, 8});  // reshape copies instead
  CHECK_FALSE(r.shares_storage(x));
  CHECK(r.to_vector<int64_t>()[4] == 12);
  CHECK(x.view({-1, 4}).shape() == Dims{6, 4});
  CHECK_THROWS_WITH(x.view({5, -1}), Catch::Contains("invalid for 24 elements"));
}

TEST_CASE("view errors name the op and the shapes") {
  Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH(x.transpose(0, 2), Catch::Contains("transpose") && Catch::Contains("out of range"));
  CHECK_THROWS_WITH(x.narrow(1, 2, 2), Catch::Contains("narrow") && Catch::Contains("[2, 4)"));
  CHECK_THROWS_WITH(x.select(0, 2), Catch::Contains("select") && Catch::Contains("index 2"));
  CHECK_THROWS_WITH(x.expand({3, 3}), Catch::Contains("expand") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(x.permute({0, 0}), Catch::Contains("repeats"));
  CHECK_THROWS_WITH(zeros({1, 2, 3, 4, 5, 6, 7, 8, 9}), Catch::Contains("at most 8 dimensions"));
  CHECK_THROWS_WITH(Tensor().shape(), Catch::Contains("undefined"));
  CHECK_THROWS_WITH(x.data<int32_t>(), Catch::Contains("int32") && Catch::Contains("float32"));
}

TEST_CASE("in-place ops bump the version counter shared by views") {
  Tensor x = zeros({4});
  Tensor v = x.slice(0, 1, 3);
  uint32_t v0 = x.version();
  v.fill_(2.0);
  CHECK(x.version() == v0 + 1);
  CHECK(x.to_vector<float>() == std::vector<float>{0, 2, 2, 0});
  x.add_(ones({4}));
  CHECK(v.version() == v0 + 2);
  x.mul_(tensor({1.f, 2.f, 3.f, 4.f}));
  CHECK(x.to_vector<float>() == std::vector<float>{1, 6, 9, 4});
  x.copy_(tensor({5.f}));
  CHECK(x.to_vector<float>() == std::vector<float>{5, 5, 5, 5});
  CHECK_THROWS_WITH(zeros({3}).expand({2, 3}).fill_(1), Catch::Contains("overlapping"));
}

TEST_CASE("casts round half-precision to nearest even and truncate to int") {
  Tensor x = tensor({1.00390625f, -2.7f, 0.5f, 70000.f});
  CHECK(x.to(DType::BFloat16).to(DType::Float32).to_vector<float>()[0] == 1.0f);
  CHECK(x.to(DType::Int32).to_vector<int32_t>() == std::vector<int32_t>{1, -2, 0, 70000});
  CHECK(std::isinf(x.to(DType::Float16).to_vector<float>()[3]));
  CHECK(tensor({0.f, 2.f}).to(DType::Bool).to_vector<bool>() == std::vector<bool>{false, true});
}

TEST_CASE("pooling allocator: no system allocations in a steady-state loop") {
  CHECK(cpu_size_class(1) == 64);
  CHECK(cpu_size_class(4097) == 4608);
  CHECK(cpu_size_class(1 << 20) == (1 << 20));
  CHECK(cpu_size_class((1 << 20) + 1) == (1 << 20) + (1 << 17));
  // The largest class at most n: a class itself, <= n, and the next class up is above n.
  CHECK(cpu_size_class_at_most(64) == 64);
  CHECK(cpu_size_class_at_most(4097) == 4096);
  CHECK(cpu_size_class_at_most(4608) == 4608);
  CHECK(cpu_size_class_at_most(22299200) == (size_t(20) << 20));  // NanoGPT tiny's arena: 21.3 MiB
  for (size_t n = 64; n < (size_t(1) << 26); n = n * 5 / 4 + 7) {
    const size_t c = cpu_size_class_at_most(n);
    CHECK(cpu_size_class(c) == c);
    CHECK(c <= n);
    CHECK(cpu_size_class(c + 1) > n);
  }
  CHECK_THROWS_WITH(cpu_size_class_at_most(63), Catch::Contains("no size class is at most 63 bytes"));
  if (!cpu_allocator_pools()) TESSEL_SKIP("TESSEL_CPU_ALLOCATOR=system: no pool to serve the loop from");
  Allocator* a = cpu_allocator();
  auto step = [] {
    Tensor w = ones({64, 64});
    Tensor x = full({64, 64}, 0.5);
    for (int i = 0; i < 5; ++i) {
      Tensor y = add(mul(x, w), 1.0);
      Tensor s = sum(y, {1});
      x = y;
    }
  };
  step();  // warm-up fills the pool
  step();
  AllocatorStats before = a->stats();
  for (int i = 0; i < 20; ++i) step();
  AllocatorStats after = a->stats();
  CHECK(after.requests > before.requests);
  CHECK(after.system_allocs == before.system_allocs);
}

TEST_CASE("meta tensors carry shapes without memory") {
  Tensor m = empty({1024, 1024, 1024}, TensorOptions(kMeta));
  CHECK(m.raw_data() == nullptr);
  Tensor y = add(m, m).transpose(0, 1);
  CHECK(y.device().is_meta());
  CHECK(y.shape() == Dims{1024, 1024, 1024});
  CHECK(sum(m, {0}).shape() == Dims{1024, 1024});
  CHECK_THROWS_WITH(m.to_vector<float>(), Catch::Contains("meta"));
}

TEST_CASE("StorageImpl::rebind points a view of external memory at other memory; owning storage refuses") {
  float first[4] = {1, 2, 3, 4}, second[4] = {5, 6, 7, 8};
  auto view = std::make_shared<StorageImpl>(first, sizeof(first), kCPU, std::function<void(void*)>());
  CHECK(view->data() == first);
  view->rebind(second);
  CHECK(view->data() == second);
  CHECK(view->nbytes() == sizeof(first));
  StorageImpl owning(16, kCPU);
  CHECK_THROWS_WITH(owning.rebind(second), Catch::Contains("StorageImpl::rebind") && Catch::Contains("owns its memory"));
}
