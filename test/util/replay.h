#pragma once
// Recording a function as a compile-mode program and replaying it, for the
// fusion tests (test_capture_fusion, test_capture_fusion_device).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/capture.h"
#include "runtime/tensor.h"

namespace tessel::testing {

// The same dtype, shape and bytes (NaN payloads included).
bool same_bytes(const Tensor& a, const Tensor& b);

struct Replayed {
  std::unique_ptr<capture::Program> program;
  Tensor eager;                 // what the recorded (eager) run computed
  capture::OutputLayout where;  // the output's buffer
  // The output of the program's last replay. (A temporary: a view held
  // past the next replay keeps its values, and that replay writes new memory.)
  Tensor output() const { return program->output(where); }
};

// Records `fn()` without gradients (with or without fusion) and replays it once.
Replayed record_and_replay(const std::function<Tensor()>& fn, bool fuse);

// A function whose recording has elementwise chains: at least `min_fused`
// launches in them (0: nothing may be fused).
struct FusionCase {
  std::string name;
  std::function<Tensor()> fn;
  int64_t min_fused = 0;
};
// The chains both fusion paths are checked on (tile by tile, and as one
// device kernel), over [R, C] tensors a, b, c, a [C] bias and an [R, C]
// transposed view: a plain chain, a broadcast row, a longer chain, a
// strided read.
std::vector<FusionCase> common_chains(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& bias,
                                      const Tensor& cols_major);
// For each case (Catch2 checks): recorded with and without fusion, both
// replays give the eager bytes, fused and unfused agree, and again at a
// second replay; with `registers` (a device's chains) a fused program also
// takes fewer bytes (its intermediates never go to memory).
void check_fusion_cases(const std::vector<FusionCase>& cases, bool registers);

}  // namespace tessel::testing
