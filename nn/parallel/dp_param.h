#pragma once
// One parameter under a data-parallel strategy (nn/parallel/data_parallel.h).
#include <string>
#include <vector>

#include "nn/parallel/dp_shard.h"
#include "runtime/tensor.h"

namespace tessel::parallel {

struct DpParam {
  std::string path;            // first registered path
  std::vector<Tensor*> slots;  // the module members holding it (several when tied)
  // The leaf the model's autograd reaches: the full parameter (DDP, ZeRO-1/2)
  // or its dp shard (FSDP, which swaps gathered copies into the slots
  // around each unit's forward).
  Tensor param;
  // What the optimizer updates and clipping reads; its .grad holds the
  // reduced gradient after finish(): the parameter itself (DDP, FSDP) or a
  // distributed view of this rank's chunk of it (ZeRO-1/2).
  Tensor shard;
  DpShard geo;
};

}  // namespace tessel::parallel
