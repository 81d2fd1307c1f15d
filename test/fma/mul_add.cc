// a * b + c compiled WITH contraction (test/BUILD gives this file
// -ffp-contract=fast -mfma): what a user's build without tessel's flags does.
#include "test/fma/mul_add.h"

namespace tessel::testing {
float contracted_mul_add(float a, float b, float c) { return a * b + c; }
}  // namespace tessel::testing
