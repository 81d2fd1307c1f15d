// The build check of the numerics contract (runtime/numerics.h): tessel's
// own build does not fuse a * b + c, a translation unit compiled with
// contraction does, and the check tells them apart.
#include <catch2/catch.hpp>

#include "runtime/numerics.h"
#include "test/fma/mul_add.h"

using namespace tessel;

namespace {
[[gnu::noinline]] float plain_mul_add(float a, float b, float c) { return a * b + c; }
}  // namespace

TEST_CASE("numerics: the build check tells contracted code from the contract's") {
  CHECK_FALSE(numerics::fuses_multiply_add(&plain_mul_add));  // this file: tessel's flags
  CHECK(numerics::fuses_multiply_add(&testing::contracted_mul_add));
  CHECK_NOTHROW(numerics::check_no_contraction("test"));
  numerics::BitwiseGuard g(true);  // the check passes for tessel's own build
  CHECK(numerics::bitwise());
}
