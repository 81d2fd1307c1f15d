#pragma once
// What one micro-batch's forward and backward cost each rank of a layout,
// measured by running it on the Meta device (no memory, no kernels, no
// communication) with the counters of runtime/cost.h: the FLOPs of every
// GEMM and attention, the bytes of every redistribution (tensor, sequence,
// context and expert parallel), and the memory the real step would hold at
// its peak (parameters, gradients, saved activations and transients, each
// storage rounded as the CPU allocator rounds it).
//
// Only the dims that cut a micro-batch's work are simulated (tp, cp, ep: one
// thread per rank); data and pipeline parallelism, ZeRO and the optimizer
// are composed on top by the planner (planner/planner.h), which also scales
// a 1-block and a 2-block run to any depth: a model's cost is its embedding
// and head plus n_layer blocks, so per-block costs come out exact and
// planning a 126-layer model costs what a 2-layer one does.
#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/mesh.h"
#include "models/config.h"
#include "nn/recompute.h"
#include "runtime/cost.h"

namespace tessel::planner {

// The part of a layout a micro-batch sees on one rank.
struct ShardLayout {
  int64_t tp = 1, cp = 1, ep = 1;
  bool sequence_parallel = false;
  nn::Recompute recompute = nn::Recompute::None;
  bool bitwise = false;
  int64_t batch = 1;    // sequences in this rank's micro-batch
  int64_t seq_len = 0;  // tokens per sequence (cut over cp)
  DType compute = DType::Float32;  // the forward's autocast dtype (parameters stay float32)
  std::string str() const;
};

// The mesh a shard layout's ranks form: {cp, ep, tp}, size-1 dims left out
// (empty: one rank).
std::vector<Mesh::DimSpec> mesh_dims(const ShardLayout& l);

struct RankCost {
  int64_t flops = 0;          // GEMM + attention, forward and backward (and the replays of recomputation)
  int64_t gemm_flops = 0, attention_flops = 0;
  int64_t ops = 0, op_bytes = 0;  // op calls and backward nodes, and their outputs' bytes
  int64_t param_bytes = 0;    // this rank's pieces of the parameters
  int64_t peak_bytes = 0;     // the most alive at once: parameters, gradients, activations, transients
  std::map<std::string, int64_t> comm_bytes;  // per collective kind
  std::map<std::string, int64_t> comm_calls;
  int64_t total_comm_bytes() const;
};

// Each rank's cost of one micro-batch of `model` (any n_layer) under `l`,
// for the model family's built-in plan. Throws what the layout's own checks
// throw when it cannot run (a tp that does not divide the heads, ...).
std::vector<RankCost> simulate(const models::ModelConfig& model, const ShardLayout& l);

// The same as embedding + head (`base`) and one block (`block`), from a
// 1-block and a 2-block run (the largest rank of each): cost(n blocks) =
// base + n x block, for every field.
struct ModelCost {
  RankCost base, block;
  RankCost at(int64_t blocks) const;
};
ModelCost simulate_per_block(const models::ModelConfig& model, const ShardLayout& l);

}  // namespace tessel::planner
