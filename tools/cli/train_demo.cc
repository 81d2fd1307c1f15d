// `tessel train`: a small byte-level language model trained on real text.
//
// The model is an MLP over the previous `context` bytes (embedding, GELU
// hidden layer, logits over 256 bytes), trained with AdamW. The corpus is the
// Debian `fortunes` package (installed by ./tessel). Batches are drawn with
// Philox from (seed, step), so a run is reproducible bit for bit.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "autograd/api.h"
#include "runtime/threadpool.h"
#include "tools/cli/commands.h"

namespace tessel::cli {
namespace {

struct DemoOptions {
  int steps = 300;
  int batch = 64;
  int context = 8;
  int embed = 32;
  int hidden = 512;
  double lr = 3e-3;
  uint64_t seed = 1;
  std::string data = "/usr/share/games/fortunes";
  int log_every = 25;
};

std::string read_corpus(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  TESSEL_CHECK(fs::exists(path), "train", "data path '{}' does not exist (install the 'fortunes' package or pass --data)",
               path);
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path)) {
      if (!e.is_regular_file()) continue;
      auto ext = e.path().extension().string();
      if (ext == ".dat" || ext == ".u8") continue;  // index files and UTF-8 duplicates
      files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  TESSEL_CHECK(text.size() > 10000, "train", "corpus at '{}' is too small ({} bytes)", path, text.size());
  return text;
}

// Entropy (nats) of the byte unigram distribution of `text`.
double unigram_entropy(const std::string& text) {
  std::vector<double> count(256, 0.0);
  for (unsigned char c : text) count[c] += 1;
  double h = 0, n = double(text.size());
  for (double c : count)
    if (c > 0) h -= c / n * std::log(c / n);
  return h;
}

struct Batch {
  Tensor context;  // [B, C] int64
  Tensor target;   // [B] int64
};

Batch make_batch(const Tensor& tokens, int64_t lo, int64_t hi, int batch, int context, PhiloxKey key) {
  Tensor starts = randint(lo, hi - context - 1, {batch}, key);
  std::vector<int64_t> ctx, tgt;
  auto s = starts.to_vector<int64_t>();
  const int64_t* tok = tokens.data<int64_t>();
  for (int64_t b : s) {
    for (int c = 0; c < context; ++c) ctx.push_back(tok[b + c]);
    tgt.push_back(tok[b + context]);
  }
  return {tensor(ctx, {batch, context}), tensor(tgt)};
}

struct Model {
  Tensor emb, w1, b1, w2, b2;
  std::vector<Tensor> params() const { return {emb, w1, b1, w2, b2}; }
  Tensor logits(const Tensor& ctx) const {
    Tensor x = embedding(emb, ctx).flatten(1);  // [B, C*E]
    return linear(gelu(linear(x, w1, b1)), w2, b2);
  }
};

int run_demo(const DemoOptions& o) {
  std::string text = read_corpus(o.data);
  std::vector<int64_t> ids(text.begin(), text.end());
  for (auto& v : ids) v &= 0xff;
  Tensor tokens = tensor(ids);
  const int64_t n = tokens.numel(), split = n * 9 / 10;
  std::printf("tessel train (demo): byte-level MLP language model\n");
  std::printf("  corpus %s: %lld bytes (train %lld, held-out %lld)\n", o.data.c_str(), (long long)n,
              (long long)split, (long long)(n - split));

  Model m;
  const int in = o.context * o.embed;
  auto key = [&](const char* name) { return PhiloxKey{o.seed, stream_for(name)}; };
  m.emb = normal_(empty({256, o.embed}), key("emb"), 0.0, 1.0).requires_grad_();
  m.w1 = kaiming_uniform_(empty({o.hidden, in}), key("w1"), std::sqrt(5.0)).requires_grad_();
  m.b1 = zeros({o.hidden}).requires_grad_();
  m.w2 = kaiming_uniform_(empty({256, o.hidden}), key("w2"), std::sqrt(5.0)).requires_grad_();
  m.b2 = zeros({256}).requires_grad_();
  int64_t nparams = 0;
  for (auto& p : m.params()) nparams += p.numel();
  std::printf("  %lld parameters, context %d bytes, batch %d, %d steps, %d threads\n", (long long)nparams, o.context,
              o.batch, o.steps, num_threads());

  // AdamW state.
  const double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, wd = 0.01;
  std::vector<Tensor> m1, m2;
  for (auto& p : m.params()) {
    m1.push_back(zeros_like(p));
    m2.push_back(zeros_like(p));
  }

  auto t0 = std::chrono::steady_clock::now();
  for (int step = 1; step <= o.steps; ++step) {
    Batch b = make_batch(tokens, 0, split, o.batch, o.context, PhiloxKey{o.seed, stream_for("batch", {uint64_t(step)})});
    Tensor loss = cross_entropy(m.logits(b.context), b.target);
    for (auto& p : m.params()) p.zero_grad();
    loss.backward();
    {
      NoGradGuard ng;
      const double lr = o.lr * std::min(1.0, step / 20.0);  // short warmup
      const double c1 = 1 - std::pow(beta1, step), c2 = 1 - std::pow(beta2, step);
      auto ps = m.params();
      for (size_t i = 0; i < ps.size(); ++i) {
        Tensor g = ps[i].grad();
        m1[i].mul_(beta1).add_(g, 1 - beta1);
        m2[i].mul_(beta2).add_(square(g), 1 - beta2);
        Tensor update = div(div(m1[i], c1), add(sqrt(div(m2[i], c2)), eps));
        if (ps[i].dim() == 2) ps[i].mul_(1 - lr * wd);
        ps[i].sub_(update, lr);
      }
    }
    if (step % o.log_every == 0 || step == 1 || step == o.steps) {
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("  step %4d  loss %.4f  %.0f tokens/s\n", step, loss.item<float>(), step * o.batch / secs);
      std::fflush(stdout);
    }
  }

  // Held-out evaluation.
  NoGradGuard ng;
  double total = 0;
  const int eval_batches = 20;
  for (int i = 0; i < eval_batches; ++i) {
    Batch b = make_batch(tokens, split, n, 256, o.context, PhiloxKey{o.seed, stream_for("eval", {uint64_t(i)})});
    total += cross_entropy(m.logits(b.context), b.target).item<float>();
  }
  double held = total / eval_batches, h = unigram_entropy(text);
  std::printf("  held-out loss %.4f nats/byte; byte unigram entropy %.4f nats/byte (%s)\n", held, h,
              held < h ? "the model beats the unigram baseline" : "not yet below the unigram baseline");
  return 0;
}

}  // namespace

void register_train(CLI::App& app) {
  static DemoOptions o;
  CLI::App* cmd = add_command(app, "train", "Train the demo byte-level language model on the fortunes corpus",
                              [] { return run_demo(o); });
  cmd->add_option("--steps", o.steps, "training steps")->check(CLI::PositiveNumber);
  cmd->add_option("--batch", o.batch, "sequences per step")->check(CLI::PositiveNumber);
  cmd->add_option("--lr", o.lr, "peak learning rate")->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o.seed, "seed for initialisation and batches");
  cmd->add_option("--data", o.data, "a text file or a folder of text files");
  cmd->add_option("--log-every", o.log_every, "print every N steps")->check(CLI::PositiveNumber);
}

}  // namespace tessel::cli
