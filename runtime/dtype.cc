#include "runtime/dtype.h"

#include "runtime/error.h"

namespace tessel {

size_t itemsize(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Float32: return 4;
    case DType::Float64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "bool") return DType::Bool;
  if (n == "int32" || n == "int") return DType::Int32;
  if (n == "int64" || n == "long") return DType::Int64;
  if (n == "float16" || n == "fp16" || n == "half") return DType::Float16;
  if (n == "bfloat16" || n == "bf16") return DType::BFloat16;
  if (n == "float32" || n == "fp32" || n == "float") return DType::Float32;
  if (n == "float64" || n == "fp64" || n == "double") return DType::Float64;
  TESSEL_FAIL("dtype", "unknown dtype name '{}' (expected bool, int32, int64, float16, bfloat16, float32 or float64)", n);
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (is_half(a) && is_half(b)) return DType::Float32;  // float16 + bfloat16
  return a > b ? a : b;  // enum order is the promotion lattice otherwise
}

void throw_unsupported_dtype(const char* op, DType t, const char* accepted) {
  TESSEL_FAIL(op, "dtype {} is not supported (accepted: {})", dtype_name(t), accepted);
}

void throw_error(const std::string& msg) { throw Error(msg); }

namespace {

std::string bytes_str(int64_t b) {
  const double d = double(b);
  if (b >= (int64_t(1) << 30)) return fmt::format(FMT_STRING("{:.2f} GiB"), d / double(1 << 30));
  if (b >= (int64_t(1) << 20)) return fmt::format(FMT_STRING("{:.2f} MiB"), d / double(1 << 20));
  if (b >= (int64_t(1) << 10)) return fmt::format(FMT_STRING("{:.2f} KiB"), d / double(1 << 10));
  return fmt::format(FMT_STRING("{} B"), b);
}

std::string oom_message(const OutOfMemoryError::Info& i, const std::string& op, const std::string& during) {
  std::string where = op.empty() ? "" : " in op '" + op + "'";
  if (!during.empty()) where += (op.empty() ? " in '" : " during '") + during + "'";
  std::string m = fmt::format(FMT_STRING("out of memory{} on {}: asked for {} ({} bytes); tensors hold {} (peak {}), {} "
                                         "more is cached for reuse"),
                              where, i.device, bytes_str(i.requested), i.requested,
                              bytes_str(i.in_use), bytes_str(i.peak), bytes_str(i.cached));
  if (i.limit > 0) m += fmt::format(FMT_STRING(", limit {}"), bytes_str(i.limit));
  if (!i.detail.empty()) m += " (" + i.detail + ")";
  m += ". Where a rank's memory goes (parameters, gradients, optimizer state, communication buffers) is what "
       "`tessel train` prints at start (tessel::Run::memory()); a smaller batch, more micro-batches, more "
       "sharding (--zero 3; tp or pp over more devices) or a higher limit lowers it";
  return m;
}

}  // namespace

OutOfMemoryError::OutOfMemoryError(Info info, std::string op, std::string during)
    : Error(oom_message(info, op, during)), info_(std::move(info)), op_(std::move(op)), during_(std::move(during)) {}

void OutOfMemoryError::rethrow_in(const char* op) const {
  if (!op_.empty()) throw *this;
  throw OutOfMemoryError(info_, op, during_);
}

void OutOfMemoryError::rethrow_during(const std::string& phase) const {
  if (!during_.empty()) throw *this;
  throw OutOfMemoryError(info_, op_, phase);
}

}  // namespace tessel
