#include "nn/parallel/pipeline/partition.h"

#include <algorithm>
#include <limits>

#include "runtime/error.h"

namespace tessel::parallel::pipeline {
namespace {

constexpr const char* kOp = "pipeline partition";

void check_count(int64_t n_blocks, int stages) {
  TESSEL_CHECK(stages >= 1, kOp, "needs at least one stage, got {}", stages);
  TESSEL_CHECK(n_blocks >= stages, kOp,
               "{} blocks cannot fill {} pipeline stages (pp x virtual_stages): every stage needs at least one block",
               n_blocks, stages);
}

}  // namespace

std::string Partition::str() const {
  std::string s;
  for (int i = 0; i < num_stages(); ++i) s += fmt::format(FMT_STRING("{}[{}, {})"), i ? " " : "", begin(i), end(i));
  return s;
}

Partition partition_by_layers(int64_t n, int stages) {
  check_count(n, stages);
  Partition p;
  p.first.push_back(0);
  for (int s = 0; s < stages; ++s) p.first.push_back(p.first.back() + n / stages + (s < n % stages ? 1 : 0));
  return p;
}

Partition partition_by_params(const std::vector<int64_t>& blocks, int64_t embed, int64_t head, int stages) {
  const int64_t n = int64_t(blocks.size());
  check_count(n, stages);
  std::vector<int64_t> prefix(size_t(n) + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + blocks[size_t(i)];
  auto cost = [&](int s, int64_t i, int64_t j) {
    return prefix[size_t(j)] - prefix[size_t(i)] + (s == 0 ? embed : 0) + (s == stages - 1 ? head : 0);
  };
  // best[s][j]: stages 0..s covering blocks [0, j) with the smallest largest
  // stage, then the smallest sum of squared stage sizes (the most even).
  struct Cost {
    int64_t max = std::numeric_limits<int64_t>::max();
    double sumsq = 0;
    bool operator<(const Cost& o) const { return max != o.max ? max < o.max : sumsq < o.sumsq; }
  };
  std::vector<std::vector<Cost>> best(size_t(stages), std::vector<Cost>(size_t(n) + 1));
  std::vector<std::vector<int64_t>> cut(size_t(stages), std::vector<int64_t>(size_t(n) + 1, 0));
  for (int64_t j = 1; j <= n; ++j) {
    const double c = double(cost(0, 0, j));
    best[0][size_t(j)] = {cost(0, 0, j), c * c};
  }
  for (int s = 1; s < stages; ++s) {
    for (int64_t j = s + 1; j <= n; ++j) {
      for (int64_t i = s; i < j; ++i) {
        const Cost& prev = best[size_t(s) - 1][size_t(i)];
        if (prev.max == std::numeric_limits<int64_t>::max()) continue;
        const int64_t c = cost(s, i, j);
        const Cost cand{std::max(prev.max, c), prev.sumsq + double(c) * double(c)};
        if (cand < best[size_t(s)][size_t(j)]) best[size_t(s)][size_t(j)] = cand, cut[size_t(s)][size_t(j)] = i;
      }
    }
  }
  Partition p;
  p.first.assign(size_t(stages) + 1, 0);
  p.first[size_t(stages)] = n;
  for (int s = stages - 1; s > 0; --s) p.first[size_t(s)] = cut[size_t(s)][size_t(p.first[size_t(s) + 1])];
  return p;
}

Partition make_partition(const std::string& method, const std::vector<int64_t>& block_params, int64_t embed_params,
                         int64_t head_params, int stages, const std::string& what) {
  TESSEL_CHECK(method == "layers" || method == "params", kOp, "unknown split '{}' (layers | params)", method);
  TESSEL_CHECK(int64_t(block_params.size()) >= stages, kOp,
               "{}: every stage needs at least one block (use fewer pp ranks or virtual stages, or more layers)", what);
  if (method == "layers") return partition_by_layers(int64_t(block_params.size()), stages);
  return partition_by_params(block_params, embed_params, head_params, stages);
}

}  // namespace tessel::parallel::pipeline
