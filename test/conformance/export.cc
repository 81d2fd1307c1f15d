// conformance export: tessel's side of the PyTorch conformance suite.
//
//   export --model llama --config tiny --seed 1 --out DIR
//
// writes into DIR
//   weights.safetensors  the initial parameters, by tessel path (float32)
//   batch.safetensors    ids, targets: int64 [B, T]
//   tessel.safetensors   logits [B, T, V], loss (0-d; cross-entropy plus the
//                        MoE aux loss term), aux_loss (Mixtral), "grad.<path>"
//                        for every parameter that got a gradient, and
//                        adamw_losses [steps]: the loss before each of `steps`
//                        AdamW updates on the same batch
//   meta.json            the resolved model config, the batch shape, the
//                        optimizer's hyper-parameters and param groups (paths)
// (weights, batch and meta.json: tools/bench/torch_reference.h)
// test/conformance/reference.py rebuilds the model in PyTorch from these and
// compares. Dropout is 0, so nothing random happens after initialisation.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "checkpoint/safetensors.h"
#include "models/language_model.h"
#include "nn/optim.h"
#include "tools/bench/torch_reference.h"

using namespace tessel;

namespace {

struct Options {
  std::string model = "nanogpt";
  std::string config = "tiny";
  uint64_t seed = 1;
  int64_t batch = 4;
  int64_t seq = 32;
  int64_t steps = 10;
  std::string out;
  // AdamW: the Python side reads these from meta.json.
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

int run(const Options& o) {
  models::ModelConfig mc = models::model_config(o.model, o.config);
  mc.dropout = 0.0;
  mc = mc.resolved();
  TESSEL_CHECK(o.seq <= mc.max_seq_len, "conformance export", "seq {} exceeds the context {} of {} config '{}'", o.seq,
               mc.max_seq_len, o.model, o.config);
  auto model = models::make_language_model(mc, o.seed);
  model->train();
  std::filesystem::create_directories(o.out);
  const auto path = [&](const char* name) { return (std::filesystem::path(o.out) / name).string(); };

  // A fixed batch: next-token targets of one random token stream.
  Tensor stream = randint(0, mc.vocab_size, {o.batch, o.seq + 1}, PhiloxKey{o.seed, stream_for("conformance.batch")});
  Tensor ids = stream.slice(1, 0, o.seq).contiguous();
  Tensor targets = stream.slice(1, 1, o.seq + 1).contiguous();
  // Parameters before any update, in registration order.
  std::vector<nn::NamedTensor> params = model->named_parameters();

  nn::AdamWOptions ao;
  ao.lr = o.lr;
  ao.betas = {o.beta1, o.beta2};
  ao.eps = o.eps;
  ao.weight_decay = o.weight_decay;
  std::vector<nn::ParamGroup> groups = nn::default_param_groups(*model, o.weight_decay);
  nn::AdamW opt(groups, ao);
  // The inputs of the reference, before any update.
  nlohmann::json meta = {{"model", o.model}, {"seed", o.seed}, {"steps", o.steps}, {"adamw", tools::adamw_json(ao)},
                         {"param_groups", tools::param_groups_json(groups, o.weight_decay)}};
  tools::write_reference_inputs(o.out, *model, ids, targets, meta);

  checkpoint::NamedTensors out;
  std::vector<float> losses;
  std::vector<std::string> no_grad;  // unused experts (the reference must agree)
  for (int64_t step = 0; step < o.steps; ++step) {
    opt.zero_grad();
    Tensor logits = model->forward(ids);
    Tensor loss = model->loss(logits, targets);
    loss.backward();
    losses.push_back(loss.item<float>());
    if (step == 0) {  // the first step's outputs and gradients, before any update
      out.emplace_back("logits", logits.detach());
      out.emplace_back("loss", loss.detach());
      if (Tensor aux = model->aux_loss(); aux.defined()) out.emplace_back("aux_loss", aux.detach());
      for (const auto& nt : params) {
        Tensor g = nt.tensor.grad();
        if (g.defined()) out.emplace_back("grad." + nt.name, g.clone());
        else no_grad.push_back(nt.name);
      }
    }
    opt.step();
  }
  out.emplace_back("adamw_losses", tensor(losses, Dims{int64_t(losses.size())}));
  checkpoint::save_safetensors(path("tessel.safetensors"), out);

  std::printf("tessel conformance export: %s -> %s (%zu parameters, loss %.6f -> %.6f after %lld AdamW steps)\n",
              mc.describe().c_str(), o.out.c_str(), params.size(), double(losses.front()), double(losses.back()),
              (long long)o.steps);
  if (!no_grad.empty()) std::printf("  no gradient in step 1 (idle experts): %s\n", fmt::format(FMT_STRING("{}"), fmt::join(no_grad, ", ")).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"tessel conformance export: weights, batch, logits, loss, gradients and AdamW losses"};
  app.add_option("--model", o.model, "nanogpt | llama | mixtral");
  app.add_option("--config", o.config, "named config (tiny, small, ...)");
  app.add_option("--seed", o.seed, "initialisation and batch seed");
  app.add_option("--batch", o.batch, "sequences per batch");
  app.add_option("--seq", o.seq, "tokens per sequence");
  app.add_option("--steps", o.steps, "AdamW steps");
  app.add_option("--lr", o.lr, "AdamW learning rate");
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay of the 'decay' group");
  app.add_option("--out", o.out, "output folder")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const Error& e) {
    std::fprintf(stderr, "export: error: %s\n", e.what());
    return 1;
  }
}
