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
    const bool on = env && env[0] == '1';
    if (on) check_no_contraction("TESSEL_BITWISE=1");
    return on;
  }();
  thread_local bool on = from_env;
  return on;
}

}  // namespace

bool bitwise() { return bitwise_flag(); }
bool set_bitwise(bool on) {
  if (on) check_no_contraction("bitwise mode");
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

namespace {
// Compiled with tessel's flags; out of line so the product is not folded.
[[gnu::noinline]] float library_mul_add(float a, float b, float c) { return a * b + c; }
}  // namespace

bool fuses_multiply_add(float (*mul_add)(float, float, float)) {
  // a * b = 1 + 2^-11 + 2^-24 exactly; rounded to float it is 1 + 2^-11 (a
  // tie, to even), so a * b + c is 0 without fusion and 2^-24 with it.
  volatile float a = 1.0f + 0x1p-12f, b = 1.0f + 0x1p-12f, c = -(1.0f + 0x1p-11f);
  return mul_add(a, b, c) != 0.0f;
}

void check_no_contraction(const char* who) {
  static const bool fused = fuses_multiply_add(&library_mul_add);
  TESSEL_CHECK(!fused, who,
               "tessel was compiled with floating-point contraction (a * b + c fused into one FMA: GCC's default "
               "-ffp-contract=fast with an FMA target such as -march=x86-64-v3 or native), so its arithmetic is not "
               "the numerics contract's and runs would not agree bit for bit. Build with -ffp-contract=off "
               "(tessel's .bazelrc; docs/build.md)");
}

Settings current_settings() { return Settings{bitwise(), reduction_chunks(), gemm_mode()}; }

void apply_settings(const Settings& s) {
  set_bitwise(s.bitwise);
  set_reduction_chunks(s.reduction_chunks);
  set_gemm_mode(s.gemm);
}

// bit 0: bitwise; bit 1: GEMM fast; bits 2..5: log2 V; bit 31 set so that a
// zero (an old peer, or a field never filled) never passes for "all off".
uint32_t encode_settings(const Settings& s) {
  uint32_t log2v = 0;
  while ((1 << log2v) < s.reduction_chunks) ++log2v;
  return (1u << 31) | (s.bitwise ? 1u : 0u) | (s.gemm == GemmMode::Fast ? 2u : 0u) | (log2v << 2);
}

Settings decode_settings(uint32_t bits) {
  Settings s;
  s.bitwise = (bits & 1u) != 0;
  s.gemm = (bits & 2u) ? GemmMode::Fast : GemmMode::Bitwise;
  s.reduction_chunks = 1 << ((bits >> 2) & 15u);
  return s;
}

std::string describe_settings(const Settings& s) {
  return std::string("bitwise mode ") + (s.bitwise ? "on" : "off") + ", V = " + std::to_string(s.reduction_chunks) +
         ", GEMM " + gemm_mode_name(s.gemm);
}

}  // namespace numerics
}  // namespace tessel
