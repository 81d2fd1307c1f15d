#pragma once
// What an op's backward is told: which inputs need a gradient.
#include <cstddef>
#include <utility>
#include <vector>

namespace tessel {

class GradContext {
 public:
  explicit GradContext(std::vector<bool> needs) : needs_(std::move(needs)) {}
  bool needs(size_t i) const { return i < needs_.size() && needs_[i]; }
  size_t size() const { return needs_.size(); }

 private:
  std::vector<bool> needs_;
};

}  // namespace tessel
