#pragma once
// Logging through spdlog. log_once() prints a message the first time its key is seen.
#include <spdlog/spdlog.h>

#include <string>

namespace tessel {

// Returns true the first time `key` is passed in this process.
bool first_time(const std::string& key);

template <class... Args>
void log_once(const std::string& key, spdlog::format_string_t<Args...> fmt, Args&&... args) {
  if (first_time(key)) spdlog::info(fmt, std::forward<Args>(args)...);
}

}  // namespace tessel
