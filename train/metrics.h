#pragma once
// What a run reports: a JSONL metrics file, the parameter hash that tells two
// runs apart (or proves them bit-identical), and a console progress bar.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace tessel::train {

// ---- metrics records ------------------------------------------------------------

struct StepMetrics {
  int64_t step = 0;
  std::optional<double> loss;
  std::optional<double> lr;
  std::optional<double> grad_norm;
  std::optional<double> tokens_per_s;
  std::string param_hash;  // empty: not written
  // Further numbers in order (eval_loss, moe_dropped_tokens, ...).
  std::vector<std::pair<std::string, double>> extras;

  // The value of an extra, if present.
  std::optional<double> extra(const std::string& name) const;
  // One JSON object on one line: {"step":..,"loss":..,"lr":..,"grad_norm":..,
  // "tokens_per_s":..,"param_hash":"..", extras...}; absent fields are
  // omitted, non-finite numbers are written as null.
  std::string to_json_line() const;
  static StepMetrics from_json_line(const std::string& line);
};

// Appends one line per record and flushes it, so a crashed run keeps every
// complete step and never a partial line (each record is one write).
class MetricsWriter {
 public:
  // Creates (truncates) the file; with append = true continues an existing one
  // (resume). The parent directory must exist.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const StepMetrics& m);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// All records of a metrics file (blank lines skipped). Throws tessel::Error
// naming the file and line of a record that does not parse.
std::vector<StepMetrics> read_metrics(const std::string& path);

// ---- parameter hash ---------------------------------------------------------------

// param_hash: a 64-bit hash of named tensors, as 16 lower-case hex digits.
//
// The tensors are taken in path order (sorted by name, bytewise), so the
// hash does not depend on the order they are passed in. For each one the
// byte stream
//   u64 len(path), path bytes, u64 len(dtype name), dtype name ("float32"),
//   u64 ndim, i64 dims..., u64 nbytes, the elements' bytes in row-major order
//   (as stored: little-endian, bf16/f16 as their 16 bits)
// is appended (integers little-endian), and the whole stream, zero-padded to
// a multiple of 8 bytes and followed by its byte length, is absorbed as
// 64-bit little-endian words w:  h <- mix64(h ^ w), from h = 0xcbf29ce484222325
// (mix64 is the splitmix64 finaliser of runtime/philox.h, a bijection).
// Each step is a bijection of h for a fixed word, so two streams of the same
// length that differ in any one word (e.g. one flipped bit of one
// parameter) always hash differently; the length prefixes make the stream
// encoding unambiguous. Views and non-contiguous tensors hash their logical
// values; tensors on another device are copied to the CPU; Meta tensors throw.
std::string param_hash(std::vector<std::pair<std::string, Tensor>> named);
uint64_t param_hash_u64(std::vector<std::pair<std::string, Tensor>> named);
std::string hash_hex(uint64_t h);
// Any vector of {name, tensor} records (nn::NamedTensor from named_parameters()).
template <class Named, class = decltype(std::declval<const Named&>().name),
          class = decltype(std::declval<const Named&>().tensor)>
std::string param_hash(const std::vector<Named>& named) {
  std::vector<std::pair<std::string, Tensor>> v;
  v.reserve(named.size());
  for (const auto& n : named) v.emplace_back(n.name, n.tensor);
  return param_hash(std::move(v));
}

// ---- progress bar --------------------------------------------------------------

// One status line for the console: step/total, loss, tokens/s and ETA.
// On a TTY the line is rewritten in place ('\r' + clear to end of line) at
// most every `min_interval_s`; otherwise a plain line is printed every
// `plain_every` steps (and for the first and the last step).
struct ProgressOptions {
  int width = 24;               // bar characters
  int64_t plain_every = 0;      // 0: total / 20 (at least 1)
  double min_interval_s = 0.1;  // TTY redraw limit
};

class ProgressBar {
 public:
  using Options = ProgressOptions;
  // tty: -1 detects isatty(fileno(out)), 0 plain, 1 TTY.
  ProgressBar(int64_t total_steps, std::FILE* out = stdout, int tty = -1, Options opts = {});
  ProgressBar(int64_t total_steps, std::FILE* out, int tty, Options opts, std::function<double()> clock_s);
  ~ProgressBar();

  // Reports step `step` (1..total) done.
  void update(int64_t step, double loss, double tokens_per_s);
  // Ends the TTY line with a newline (idempotent; the destructor calls it).
  void finish();
  // The text of the status line for a step (no '\r' or newline).
  std::string format(int64_t step, double loss, double tokens_per_s) const;
  bool is_tty() const { return tty_; }

 private:
  int64_t total_;
  std::FILE* out_;
  bool tty_;
  Options opts_;
  std::function<double()> clock_;
  double start_s_;
  double last_draw_s_ = -1e300;
  int64_t first_step_ = -1;  // first step reported (ETA counts from there)
  bool open_line_ = false;
};

// "1h02m03s", "4m05s", "12s".
std::string format_duration(double seconds);

}  // namespace tessel::train
