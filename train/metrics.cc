#include "train/metrics.h"

#include "dtensor/ops.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "autograd/api.h"
#include "runtime/error.h"
#include "runtime/philox.h"

namespace tessel::train {

// ---- StepMetrics ------------------------------------------------------------------

std::optional<double> StepMetrics::extra(const std::string& name) const {
  for (const auto& [k, v] : extras)
    if (k == name) return v;
  return std::nullopt;
}

std::string StepMetrics::to_json_line() const {
  nlohmann::ordered_json j;
  auto num = [&](const char* key, double v) {
    if (std::isfinite(v)) j[key] = v;
    else j[key] = nullptr;
  };
  j["step"] = step;
  if (loss) num("loss", *loss);
  if (lr) num("lr", *lr);
  if (grad_norm) num("grad_norm", *grad_norm);
  if (tokens_per_s) num("tokens_per_s", *tokens_per_s);
  if (!param_hash.empty()) j["param_hash"] = param_hash;
  for (const auto& [k, v] : extras) num(k.c_str(), v);
  return j.dump();
}

StepMetrics StepMetrics::from_json_line(const std::string& line) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(line);  // throws nlohmann exceptions
  TESSEL_CHECK(j.is_object(), "metrics", "expected a JSON object, got {}", j.type_name());
  StepMetrics m;
  m.step = j.at("step").get<int64_t>();
  auto number = [](const nlohmann::ordered_json& v) -> double {
    return v.is_null() ? std::nan("") : v.get<double>();
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "step") continue;
    if (k == "param_hash") m.param_hash = it.value().get<std::string>();
    else if (k == "loss") m.loss = number(it.value());
    else if (k == "lr") m.lr = number(it.value());
    else if (k == "grad_norm") m.grad_norm = number(it.value());
    else if (k == "tokens_per_s") m.tokens_per_s = number(it.value());
    else if (it.value().is_number() || it.value().is_null()) m.extras.emplace_back(k, number(it.value()));
  }
  return m;
}

// ---- MetricsWriter ------------------------------------------------------------------

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  file_ = std::fopen(path.c_str(), append ? "ab" : "wb");
  TESSEL_CHECK(file_ != nullptr, "metrics", "cannot open '{}' for writing: {}", path, std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const StepMetrics& m) {
  const std::string line = m.to_json_line() + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  TESSEL_CHECK(ok, "metrics", "writing '{}' failed: {}", path_, std::strerror(errno));
}

std::vector<StepMetrics> read_metrics(const std::string& path) {
  std::ifstream in(path);
  TESSEL_CHECK(in.good(), "metrics", "cannot read '{}': {}", path, std::strerror(errno));
  std::vector<StepMetrics> out;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back(StepMetrics::from_json_line(line));
    } catch (const nlohmann::json::exception& e) {
      TESSEL_FAIL("metrics", "{}:{}: not a metrics record: {}", path, line_no, e.what());
    } catch (const Error& e) {
      TESSEL_FAIL("metrics", "{}:{}: {}", path, line_no, e.what());
    }
  }
  return out;
}

// ---- param_hash ------------------------------------------------------------------------

namespace {

// Absorbs a byte stream as 64-bit little-endian words: h <- mix64(h ^ w).
class WordHasher {
 public:
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    length_ += n;
    while (n > 0 && fill_ > 0) {  // complete a pending word
      pending_ |= uint64_t(*p++) << (8 * fill_);
      fill_ = (fill_ + 1) & 7;
      --n;
      if (fill_ == 0) absorb(pending_), pending_ = 0;
    }
    for (; n >= 8; n -= 8, p += 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);  // x86-64 is little-endian
      absorb(w);
    }
    for (; n > 0; --n) {
      pending_ |= uint64_t(*p++) << (8 * fill_);
      ++fill_;
    }
  }
  void u64(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = uint8_t(v >> (8 * i));
    bytes(b, 8);
  }
  void str(const std::string& s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  uint64_t finish() {
    const uint64_t total = length_;
    if (fill_ > 0) absorb(pending_);  // zero-padded
    absorb(total);
    return h_;
  }

 private:
  void absorb(uint64_t w) { h_ = mix64(h_ ^ w); }
  uint64_t h_ = 0xcbf29ce484222325ull;
  uint64_t pending_ = 0;
  int fill_ = 0;
  uint64_t length_ = 0;
};

}  // namespace

std::string hash_hex(uint64_t h) { return fmt::format(FMT_STRING("{:016x}"), h); }

uint64_t param_hash_u64(std::vector<std::pair<std::string, Tensor>> named) {
  std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < named.size(); ++i) {
    TESSEL_CHECK(named[i].first != named[i - 1].first, "param_hash", "duplicate tensor name '{}'", named[i].first);
  }
  NoGradGuard no_grad;
  WordHasher h;
  for (const auto& [name, t] : named) {
    TESSEL_CHECK(t.defined(), "param_hash", "tensor '{}' is undefined", name);
    TESSEL_CHECK(t.device().type != DeviceType::Meta, "param_hash", "tensor '{}' is a Meta tensor (no values): {}",
                 name, t.desc());
    // A distributed tensor hashes its full value (collective: every rank hashes).
    Tensor full = t.is_distributed() ? full_tensor(t.detach()) : t;
    Tensor c = full.device().type == DeviceType::CPU ? full : full.detach().to(kCPU);
    if (!c.is_contiguous()) c = c.detach().contiguous();
    h.str(name);
    h.str(dtype_name(c.dtype()));
    h.u64(uint64_t(c.dim()));
    for (int64_t d : c.shape()) h.u64(uint64_t(d));
    h.u64(uint64_t(c.nbytes()));
    if (c.numel() > 0) h.bytes(c.raw_data(), c.nbytes());
  }
  return h.finish();
}

std::string param_hash(std::vector<std::pair<std::string, Tensor>> named) {
  return hash_hex(param_hash_u64(std::move(named)));
}

// ---- progress bar -----------------------------------------------------------------------

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = int64_t(std::llround(seconds));
  const int64_t h = s / 3600, m = (s / 60) % 60;
  s %= 60;
  if (h > 0) return fmt::format(FMT_STRING("{}h{:02d}m{:02d}s"), h, m, s);
  if (m > 0) return fmt::format(FMT_STRING("{}m{:02d}s"), m, s);
  return fmt::format(FMT_STRING("{}s"), s);
}

namespace {
double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::string format_rate(double tokens_per_s) {
  if (!std::isfinite(tokens_per_s)) return "?";
  if (tokens_per_s >= 1e6) return fmt::format(FMT_STRING("{:.2f}M"), tokens_per_s / 1e6);
  if (tokens_per_s >= 1e4) return fmt::format(FMT_STRING("{:.1f}k"), tokens_per_s / 1e3);
  return fmt::format(FMT_STRING("{:.0f}"), tokens_per_s);
}
}  // namespace

ProgressBar::ProgressBar(int64_t total_steps, std::FILE* out, int tty, Options opts)
    : ProgressBar(total_steps, out, tty, opts, steady_seconds) {}

ProgressBar::ProgressBar(int64_t total_steps, std::FILE* out, int tty, Options opts, std::function<double()> clock_s)
    : total_(std::max<int64_t>(total_steps, 1)), out_(out), opts_(opts), clock_(std::move(clock_s)) {
  tty_ = tty < 0 ? ::isatty(::fileno(out_)) != 0 : tty != 0;
  if (opts_.plain_every <= 0) opts_.plain_every = std::max<int64_t>(1, total_ / 20);
  start_s_ = clock_();
}

ProgressBar::~ProgressBar() { finish(); }

std::string ProgressBar::format(int64_t step, double loss, double tokens_per_s) const {
  const double frac = std::clamp(double(step) / double(total_), 0.0, 1.0);
  const double elapsed = clock_() - start_s_;
  const int64_t done = first_step_ < 0 ? 1 : step - first_step_ + 1;
  const double eta = done > 0 ? elapsed / double(done) * double(total_ - step) : NAN;
  const int digits = int(std::to_string(total_).size());
  std::string line;
  if (tty_) {
    const int filled = int(frac * opts_.width);
    line = "[" + std::string(size_t(filled), '#') + std::string(size_t(opts_.width - filled), '.') + "] ";
  }
  line += fmt::format(FMT_STRING("step {:>{}}/{} ({:3.0f}%)  loss {:.4f}  {} tok/s  ETA {}"), step, digits, total_,
                      frac * 100.0, loss, format_rate(tokens_per_s), step >= total_ ? "0s" : format_duration(eta));
  return line;
}

void ProgressBar::update(int64_t step, double loss, double tokens_per_s) {
  if (first_step_ < 0) first_step_ = step;
  const bool last = step >= total_;
  if (tty_) {
    const double now = clock_();
    if (!last && now - last_draw_s_ < opts_.min_interval_s) return;
    last_draw_s_ = now;
    std::fprintf(out_, "\r%s\x1b[K", format(step, loss, tokens_per_s).c_str());
    open_line_ = true;
  } else {
    if (!(step == first_step_ || last || step % opts_.plain_every == 0)) return;
    std::fprintf(out_, "%s\n", format(step, loss, tokens_per_s).c_str());
  }
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (open_line_) {
    std::fputc('\n', out_);
    std::fflush(out_);
    open_line_ = false;
  }
}

}  // namespace tessel::train
