#pragma once
// `tessel bench ckpt`: distributed checkpoint save and load throughput
// against a plain sequential copy of the same bytes in the same run, and a
// resharded load against the same-layout load (docs/checkpoint.md).
#include <cstdint>
#include <ostream>
#include <string>

namespace tessel::tools {

struct CkptBenchOptions {
  int64_t size_mb = 256;  // tensor data saved (float32, 16 tensors)
  int ranks = 2;          // ranks as threads; tensors Shard(0) over them
  int reps = 5;           // timed repetitions (median; the order of tessel and reference alternates)
  std::string dir;        // scratch folder (default: $TMPDIR or /tmp)
  bool async = false;     // time async saves to staging (the training thread's cost)
};

int run_ckpt_bench(const CkptBenchOptions& o, std::ostream& out);

}  // namespace tessel::tools
