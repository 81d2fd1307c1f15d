#pragma once
// The message of the tessel::Error a function throws, for CHECK_THAT(..., Contains(...)).
#include <functional>
#include <string>

#include "runtime/error.h"

namespace tessel::testing {

// What fn throws as tessel::Error, or "(no error)" when it returns.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace tessel::testing
