#pragma once
// TESSEL_SKIP("reason"): ends the current test case and counts it as skipped
// (Catch2 v2 has no skip). Used for tests that need a GPU, MPI, or torch.
#include <catch2/catch.hpp>

namespace tessel::testing {
int& skip_counter();
}

#define TESSEL_SKIP(reason)                 \
  do {                                      \
    WARN("SKIPPED: " << reason);            \
    ++::tessel::testing::skip_counter();    \
    return;                                 \
  } while (0)
