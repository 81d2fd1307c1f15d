#pragma once
// tessel::Error and the checking macros. Every user-facing error names the op
// and the shapes/dtypes/devices involved; TESSEL_CHECK formats with fmt.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

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

// Thrown by an allocator that cannot serve a request (the device is full, or
// its memory limit: TESSEL_CPU_MEMORY_LIMIT, Allocator::set_limit). The op
// that asked is named on the way out: call() and the backward engine add it
// (the innermost op names it; outer ones pass the error on unchanged).
class OutOfMemoryError : public Error {
 public:
  struct Info {
    std::string device;       // "cpu", "cuda:0"
    int64_t requested = 0;    // bytes asked for
    int64_t in_use = 0;       // bytes held by tensors at the time
    int64_t peak = 0;         // the allocator's peak of in_use
    int64_t cached = 0;       // bytes freed by tensors but held for reuse
    int64_t limit = 0;        // 0: none
    std::string detail;       // what the device or the limit said
  };
  explicit OutOfMemoryError(Info info, std::string op = "", std::string during = "");
  const Info& info() const { return info_; }
  const std::string& op() const { return op_; }        // the innermost op that asked
  const std::string& during() const { return during_; }  // the backward node or optimizer step around it
  // This error with `op` named, unless an inner op already is.
  [[noreturn]] void rethrow_in(const char* op) const;
  // This error marked as raised during `phase` ("mul.bwd", "AdamW.step"),
  // unless it already is; the op is named by the ops inside.
  [[noreturn]] void rethrow_during(const std::string& phase) const;

 private:
  Info info_;
  std::string op_, during_;
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
