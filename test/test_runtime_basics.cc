#include <catch2/catch.hpp>

#include "runtime/dtype.h"
#include "runtime/half.h"
#include "runtime/shape.h"
#include "test/skip.h"

using namespace tessel;

TEST_CASE("dtype promotion follows the lattice") {
  CHECK(promote_types(DType::Int32, DType::Float32) == DType::Float32);
  CHECK(promote_types(DType::Float16, DType::BFloat16) == DType::Float32);
  CHECK(promote_types(DType::Bool, DType::Int64) == DType::Int64);
}

TEST_CASE("coordinates_of: row-major coordinates of a linear index") {
  CHECK(coordinates_of(Dims{2, 16}, 19) == Dims{1, 3});
  CHECK(coordinates_of(Dims{2, 3, 4}, 23) == Dims{1, 2, 3});
  CHECK(coordinates_of(Dims{5}, 4) == Dims{4});
  CHECK(coordinates_of(Dims{}, 0) == Dims{});
}
