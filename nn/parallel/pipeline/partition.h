#pragma once
// How a chain of blocks is cut into S contiguous virtual stages (schedule.h):
// stage s runs blocks [first[s], first[s + 1]). Every stage gets at least one
// block, so a model needs n_blocks >= S = pp * V.
#include <cstdint>
#include <string>
#include <vector>

namespace tessel::parallel::pipeline {

struct Partition {
  std::vector<int64_t> first;  // S + 1 entries: first[0] = 0, first[S] = n_blocks
  int num_stages() const { return int(first.size()) - 1; }
  int64_t begin(int s) const { return first[size_t(s)]; }
  int64_t end(int s) const { return first[size_t(s) + 1]; }
  std::string str() const;  // "[0, 2) [2, 4)"
};

// By layer count: n / S blocks each; the first n % S stages take one more
// (the last stage already carries the head and the loss).
Partition partition_by_layers(int64_t n_blocks, int stages);

// By parameter count: minimises the largest stage, counting the embedding's
// parameters on stage 0 and the head's on stage S-1 (a tied matrix counts on
// both: both hold it); among equal optima the most even (smallest sum of
// squared stage sizes), then the earliest cut points.
Partition partition_by_params(const std::vector<int64_t>& block_params, int64_t embed_params, int64_t head_params,
                              int stages);

// "layers" | "params". `what` names the model in errors.
Partition make_partition(const std::string& method, const std::vector<int64_t>& block_params, int64_t embed_params,
                         int64_t head_params, int stages, const std::string& what);

}  // namespace tessel::parallel::pipeline
