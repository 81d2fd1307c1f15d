#pragma once
// `tessel train --dump FILE`: every op's output hash in the forward and every
// backward node's gradient hashes, per step, as JSON lines (autograd/trace.h):
//   {"step":1,"i":0,"phase":"fwd","op":"embedding","k":0,"shape":[8,16,64],"dtype":"float32","hash":"..."}
// and, when --detect-anomaly stops the run, {"step":..,"i":..,"phase":"anomaly","message":"..."}.
// `tessel verify` lines two dumps up and names the first op and tensor that
// differ (docs/numerics.md "Localising a divergence").
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "autograd/trace.h"

namespace tessel::train {

class DumpRecorder final : public trace::Recorder {
 public:
  // Every rank records (full tensors are collectives); only `write` ranks open `path`.
  DumpRecorder(const std::string& path, bool write);
  ~DumpRecorder() override;
  void set_step(int64_t step) { step_ = step; }
  void record(const char* phase, const char* op, int index, const Tensor& full, uint64_t hash) override;
  // {"step", "i", "phase": "anomaly", "message"}: where --detect-anomaly
  // stopped this rank (written by the ranks that write).
  void anomaly(const std::string& message);

 private:
  std::FILE* f_ = nullptr;
  int64_t step_ = 0, seq_ = 0;
};

// Compares two metrics files line by line, or two dumps value by value: the
// first floating tensor of `a` (the reference, e.g. the one-device run) in
// execution order whose bits `b` never produced in that step and phase. Returns nullopt
// when they agree on every compared field, else a message naming the first
// step (and, for dumps, op and tensor) that differs. Metrics: every field but
// timings (tokens_per_s, *_s) is compared exactly.
std::optional<std::string> first_divergence(const std::string& a, const std::string& b);

}  // namespace tessel::train
