#include "runtime/logging.h"

#include <mutex>
#include <unordered_set>

namespace tessel {

bool first_time(const std::string& key) {
  static std::mutex mu;
  static std::unordered_set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  return seen.insert(key).second;
}

}  // namespace tessel
