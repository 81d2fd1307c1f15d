// Learning-rate schedules: exact values at the boundaries, the documented
// formulas in between, errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "nn/schedule.h"

using namespace tessel;
using nn::LrSchedule;

TEST_CASE("warmup then cosine: exact boundaries") {
  const auto s = LrSchedule::cosine(6e-4, 6e-5, 10, 110);
  CHECK(s.lr(0) == 6e-4 * (1.0 / 10));  // first update: max_lr / W
  CHECK(s.lr(4) == 6e-4 * (5.0 / 10));
  CHECK(s.lr(9) == 6e-4);               // end of warmup reaches max_lr exactly
  CHECK(s.lr(10) == 6e-4);              // cosine starts at max_lr exactly
  CHECK(s.lr(60) == Approx(0.5 * (6e-4 + 6e-5)).epsilon(1e-14));  // halfway: the mean
  CHECK(s.lr(35) == Approx(6e-5 + (6e-4 - 6e-5) * 0.5 * (1 + std::cos(M_PI * 0.25))).epsilon(1e-14));
  CHECK(s.lr(109) > 6e-5);
  CHECK(s.lr(109) == Approx(6e-5).epsilon(1e-2));
  CHECK(s.lr(110) == 6e-5);  // from total_steps on: min_lr exactly
  CHECK(s.lr(1000000) == 6e-5);
  CHECK(s(35) == s.lr(35));
  // Monotone: up during warmup, down after.
  for (int64_t t = 1; t < 10; ++t) CHECK(s.lr(t) > s.lr(t - 1));
  for (int64_t t = 11; t <= 110; ++t) CHECK(s.lr(t) < s.lr(t - 1));
}

TEST_CASE("the documented cosine expression, evaluated as written") {
  const auto s = LrSchedule::cosine(1.0, 0.1, 3, 13);
  for (int64_t t = 3; t < 13; ++t) {
    const double p = double(t - 3) / 10.0;
    CHECK(s.lr(t) == 1.0 - (1.0 - 0.1) * (0.5 * (1.0 - std::cos(M_PI * p))));
  }
}

TEST_CASE("no warmup, and warmup == total") {
  const auto s = LrSchedule::cosine(1.0, 0.0, 0, 4);
  CHECK(s.lr(0) == 1.0);
  CHECK(s.lr(2) == Approx(0.5).epsilon(1e-15));
  CHECK(s.lr(4) == 0.0);
  const auto w = LrSchedule::linear(2.0, 0.5, 4, 4);
  CHECK(w.lr(0) == 0.5);
  CHECK(w.lr(3) == 2.0);
  CHECK(w.lr(4) == 0.5);
}

TEST_CASE("linear decay") {
  const auto s = LrSchedule::linear(1.0, 0.2, 2, 10);
  CHECK(s.lr(0) == 0.5);
  CHECK(s.lr(1) == 1.0);
  CHECK(s.lr(2) == 1.0);
  CHECK(s.lr(6) == 1.0 - (1.0 - 0.2) * 0.5);
  CHECK(s.lr(9) == 1.0 - (1.0 - 0.2) * (7.0 / 8.0));
  CHECK(s.lr(10) == 0.2);
  CHECK(s.lr(11) == 0.2);
}

TEST_CASE("constant, with and without warmup") {
  const auto c = LrSchedule::constant(3e-4);
  CHECK(c.lr(0) == 3e-4);
  CHECK(c.lr(123456) == 3e-4);
  const auto w = LrSchedule::constant(1.0, 4);
  CHECK(w.lr(0) == 0.25);
  CHECK(w.lr(1) == 0.5);
  CHECK(w.lr(3) == 1.0);
  CHECK(w.lr(4) == 1.0);
  CHECK(w.lr(400) == 1.0);
}

TEST_CASE("schedule errors name the schedule and the value") {
  CHECK_THROWS_WITH(LrSchedule::cosine(-1, 0, 0, 10),
                    Catch::Contains("LrSchedule(cosine)") && Catch::Contains("max_lr = -1"));
  CHECK_THROWS_WITH(LrSchedule::cosine(1, 2, 0, 10),
                    Catch::Contains("LrSchedule(cosine)") && Catch::Contains("min_lr = 2"));
  CHECK_THROWS_WITH(LrSchedule::linear(1, -0.5, 0, 10),
                    Catch::Contains("LrSchedule(linear)") && Catch::Contains("min_lr = -0.5"));
  CHECK_THROWS_WITH(LrSchedule::linear(1, 0, 20, 10),
                    Catch::Contains("LrSchedule(linear)") && Catch::Contains("total_steps = 10") &&
                        Catch::Contains("warmup_steps = 20"));
  CHECK_THROWS_WITH(LrSchedule::constant(1, -2),
                    Catch::Contains("LrSchedule(constant)") && Catch::Contains("warmup_steps = -2"));
  CHECK_THROWS_WITH(LrSchedule::constant(NAN), Catch::Contains("LrSchedule(constant)") && Catch::Contains("nan"));
  CHECK_THROWS_WITH(LrSchedule::constant(1).lr(-1),
                    Catch::Contains("LrSchedule(constant)") && Catch::Contains("step = -1"));
}
