// Catch2 main for every tessel test binary.
//
// Adds two things to Catch2 v2: TESSEL_SKIP (test/skip.h), and a summary line
//   [tessel-summary] passed=N failed=M skipped=K
// printed at the end of the run, which ./tessel test aggregates across
// binaries into "N passed, M failed, K skipped". Under mpirun each rank prints
// "[tessel-summary-rank R] ..." instead, and test/mpi_test.sh aggregates.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>

#include "test/skip.h"

namespace tessel::testing {

int& skip_counter() {
  static int n = 0;
  return n;
}

namespace {

struct SummaryListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  int passed = 0, failed = 0, skipped = 0;
  int skips_before = 0;

  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    skips_before = skip_counter();
  }
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    if (stats.totals.assertions.failed > 0 || stats.totals.testCases.failed > 0) {
      ++failed;
    } else if (skip_counter() > skips_before) {
      ++skipped;
    } else {
      ++passed;
    }
    TestEventListenerBase::testCaseEnded(stats);
  }
  void testRunEnded(const Catch::TestRunStats& stats) override {
    // Under mpirun every rank runs the tests; each prints its own line, and
    // the launcher script (test/mpi_test.sh) prints the one summary.
    if (const char* rank = std::getenv("OMPI_COMM_WORLD_RANK")) {
      std::printf("[tessel-summary-rank %s] passed=%d failed=%d skipped=%d\n", rank, passed, failed, skipped);
    } else {
      std::printf("[tessel-summary] passed=%d failed=%d skipped=%d\n", passed, failed, skipped);
    }
    std::fflush(stdout);
    TestEventListenerBase::testRunEnded(stats);
  }
};

}  // namespace
}  // namespace tessel::testing

using TesselSummaryListener = tessel::testing::SummaryListener;
CATCH_REGISTER_LISTENER(TesselSummaryListener)

int main(int argc, char* argv[]) {
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc != 0) return rc;
  return session.run();
}
