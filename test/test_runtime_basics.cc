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

