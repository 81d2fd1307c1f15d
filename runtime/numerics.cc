#include "runtime/numerics.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "runtime/error.h"

namespace tessel {
namespace numerics {
namespace {

bool valid(int v) { return v >= 1 && v <= 1024 && (v & (v - 1)) == 0; }

int initial_chunks() {
  if (const char* env = std::getenv("TESSEL_REDUCE_CHUNKS")) {
    int v = std::atoi(env);
    TESSEL_CHECK(valid(v), "TESSEL_REDUCE_CHUNKS", "must be a power of two in [1, 1024], got '{}'", env);
    return v;
  }
  return 16;
}

std::atomic<int>& chunks() {
  static std::atomic<int> v{initial_chunks()};
  return v;
}

// Per thread, like grad mode: ranks running as threads (the local backend)
// each set their own; TESSEL_BITWISE is every thread's default.
bool& bitwise_flag() {
  static const bool from_env = [] {
    const char* env = std::getenv("TESSEL_BITWISE");
    return env && env[0] == '1';
  }();
  thread_local bool on = from_env;
  return on;
}

}  // namespace

bool bitwise() { return bitwise_flag(); }
bool set_bitwise(bool on) {
  const bool prev = bitwise_flag();
  bitwise_flag() = on;
  return prev;
}

int reduction_chunks() { return chunks().load(std::memory_order_relaxed); }

int set_reduction_chunks(int v) {
  TESSEL_CHECK(valid(v), "set_reduction_chunks", "V must be a power of two in [1, 1024], got {}", v);
  return chunks().exchange(v);
}

GemmMode parse_gemm_mode(const char* text, const char* what) {
  const std::string t = text ? text : "";
  if (t == "bitwise") return GemmMode::Bitwise;
  if (t == "fast") return GemmMode::Fast;
  TESSEL_FAIL(what, "GEMM mode must be 'bitwise' or 'fast', got '{}'", t);
}

const char* gemm_mode_name(GemmMode mode) { return mode == GemmMode::Fast ? "fast" : "bitwise"; }

namespace {
std::atomic<GemmMode>& gemm_mode_var() {
  static std::atomic<GemmMode> m{[] {
    const char* env = std::getenv("TESSEL_GEMM");
    return env && *env ? parse_gemm_mode(env, "TESSEL_GEMM") : GemmMode::Bitwise;
  }()};
  return m;
}
}  // namespace

GemmMode gemm_mode() { return gemm_mode_var().load(std::memory_order_relaxed); }
GemmMode set_gemm_mode(GemmMode mode) { return gemm_mode_var().exchange(mode); }

}  // namespace numerics
}  // namespace tessel
