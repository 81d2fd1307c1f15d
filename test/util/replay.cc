#include "test/util/replay.h"

#include <catch2/catch.hpp>

#include <cstring>

#include "autograd/api.h"

namespace tessel::testing {

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.raw_data(), y.raw_data(), size_t(x.nbytes())) == 0;
}

Replayed record_and_replay(const std::function<Tensor()>& fn, bool fuse) {
  Replayed r;
  NoGradGuard no_grad;
  int out = -1;
  {
    capture::Recorder rec("fusion test");
    rec.fuse_elementwise = fuse;
    Tensor y = fn();
    out = rec.output(y);
    r.program = rec.finish();
    r.eager = y.clone();  // (after the recording: not one of its launches)
    r.where = capture::layout_of(out, y);
  }
  r.program->replay();
  return r;
}

std::vector<FusionCase> common_chains(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& bias,
                                      const Tensor& cols_major) {
  return {
      {"silu(a) * b", [=] { return silu(a) * b; }, 2},
      {"gelu(a + bias) + c (a broadcast row)", [=] { return gelu(a + bias) + c; }, 3},
      {"((a * b) + c) * a - b", [=] { return ((a * b) + c) * a - b; }, 4},
      {"a transposed view read by the chain", [=] { return exp(cols_major) * a + b; }, 3},
  };
}

void check_fusion_cases(const std::vector<FusionCase>& cases, bool registers) {
  for (const FusionCase& k : cases) {
    INFO(k.name);
    const Replayed fused = record_and_replay(k.fn, true);
    const Replayed unfused = record_and_replay(k.fn, false);
    CHECK(same_bytes(fused.output(), fused.eager));
    CHECK(same_bytes(unfused.output(), unfused.eager));
    CHECK(same_bytes(fused.output(), unfused.output()));
    CHECK(unfused.program->fused_chains() == 0);
    CHECK(fused.program->fused_launches() >= k.min_fused);
    if (registers && k.min_fused > 0) CHECK(fused.program->bytes() < unfused.program->bytes());
    // Replayed again (the scratch and the arena reused): still the same.
    fused.program->replay();
    CHECK(same_bytes(fused.output(), fused.eager));
  }
}

}  // namespace tessel::testing
