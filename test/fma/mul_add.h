#pragma once
namespace tessel::testing {
// a * b + c from a translation unit compiled with -ffp-contract=fast -mfma.
float contracted_mul_add(float a, float b, float c);
}  // namespace tessel::testing
