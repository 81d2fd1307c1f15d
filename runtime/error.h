#pragma once
// tessel::Error and the checking macros. Every user-facing error names the op
// and the shapes/dtypes/devices involved; TESSEL_CHECK formats with fmt.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace tessel {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Thrown by a collective that could not complete (names rank and op).
class CommError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void throw_error(const std::string& msg);

}  // namespace tessel

// TESSEL_FORMAT("format {}", args...): fmt::format with the format string
// checked at compile time (a placeholder without its argument, or an
// argument fmt cannot format, is a compile error rather than a runtime
// "argument not found" in place of the message). The format must be a
// string literal.
#define TESSEL_FORMAT(fmt_literal, ...) ::fmt::format(FMT_STRING(fmt_literal), ##__VA_ARGS__)

// TESSEL_CHECK(cond, "op", "format {}", args...): throws tessel::Error("op: message").
#define TESSEL_CHECK(cond, op, ...)                                                  \
  do {                                                                               \
    if (__builtin_expect(!(cond), 0)) {                                              \
      ::tessel::throw_error(std::string(op) + ": " + TESSEL_FORMAT(__VA_ARGS__));    \
    }                                                                                \
  } while (0)

#define TESSEL_FAIL(op, ...) ::tessel::throw_error(std::string(op) + ": " + TESSEL_FORMAT(__VA_ARGS__))

// Internal invariants (a failure is a tessel bug, not a user error).
#define TESSEL_ASSERT(cond)                                                                    \
  do {                                                                                         \
    if (__builtin_expect(!(cond), 0)) {                                                        \
      ::tessel::throw_error(::fmt::format(FMT_STRING("internal error: {} ({}:{})"), #cond, __FILE__, __LINE__)); \
    }                                                                                          \
  } while (0)
