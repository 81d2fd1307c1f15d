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
//                        optimizer's hyper-parameters and param groups (paths),
//                        and the paths that got no gradient (unused experts)
// test/conformance/reference.py rebuilds the model in PyTorch from these and
// compares. Dropout is 0, so nothing random happens after initialisation.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "checkpoint/safetensors.h"
#include "models/language_model.h"
#include "nn/optim.h"

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

nlohmann::json config_json(const models::ModelConfig& c) {
  return {{"arch", models::arch_name(c.arch)}, {"name", c.name},
          {"vocab_size", c.vocab_size},        {"max_seq_len", c.max_seq_len},
          {"n_layer", c.n_layer},              {"dim", c.dim},
          {"n_head", c.n_head},                {"n_kv_head", c.n_kv_head},
          {"hidden", c.hidden},                {"norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},        {"dropout", c.dropout},
          {"tie_embeddings", c.tie_embeddings}, {"bias", c.bias},
          {"num_experts", c.num_experts},      {"top_k", c.top_k},
          {"aux_loss_coef", c.aux_loss_coef}};
}

checkpoint::NamedTensors to_pairs(const std::vector<nn::NamedTensor>& v, const std::string& prefix = "") {
  checkpoint::NamedTensors out;
  for (const auto& nt : v) out.emplace_back(prefix + nt.name, nt.tensor.detach());
  return out;
}

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

  // Parameters before any update, in registration order.
  std::vector<nn::NamedTensor> params = model->named_parameters();
  checkpoint::save_safetensors(path("weights.safetensors"), to_pairs(params), {{"model", o.model}, {"config", o.config}});

  // A fixed batch: next-token targets of one random token stream.
  Tensor stream = randint(0, mc.vocab_size, {o.batch, o.seq + 1}, PhiloxKey{o.seed, stream_for("conformance.batch")});
  Tensor ids = stream.slice(1, 0, o.seq).contiguous();
  Tensor targets = stream.slice(1, 1, o.seq + 1).contiguous();
  checkpoint::save_safetensors(path("batch.safetensors"), {{"ids", ids}, {"targets", targets}});

  nn::AdamWOptions ao;
  ao.lr = o.lr;
  ao.betas = {o.beta1, o.beta2};
  ao.eps = o.eps;
  ao.weight_decay = o.weight_decay;
  std::vector<nn::ParamGroup> groups = nn::default_param_groups(*model, o.weight_decay);
  nn::AdamW opt(groups, ao);

  checkpoint::NamedTensors out;
  std::vector<float> losses;
  nlohmann::json no_grad = nlohmann::json::array();
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

  nlohmann::json groups_json = nlohmann::json::array();
  for (const auto& g : groups) {
    nlohmann::json names = nlohmann::json::array();
    for (const auto& p : g.params) names.push_back(p.name);
    groups_json.push_back({{"name", g.name}, {"weight_decay", g.weight_decay.value_or(o.weight_decay)}, {"params", names}});
  }
  nlohmann::json meta = {
      {"model", o.model},
      {"config", config_json(mc)},
      {"seed", o.seed},
      {"batch", o.batch},
      {"seq", o.seq},
      {"steps", o.steps},
      {"adamw", {{"lr", o.lr}, {"betas", {o.beta1, o.beta2}}, {"eps", o.eps}, {"weight_decay", o.weight_decay}}},
      {"param_groups", groups_json},
      {"params", [&] {
         nlohmann::json a = nlohmann::json::array();
         for (const auto& nt : params) a.push_back(nt.name);
         return a;
       }()},
      {"no_grad", no_grad},
  };
  std::ofstream(path("meta.json")) << meta.dump(2) << "\n";
  std::printf("tessel conformance export: %s -> %s (%zu parameters, loss %.6f -> %.6f after %lld AdamW steps)\n",
              mc.describe().c_str(), o.out.c_str(), params.size(), double(losses.front()), double(losses.back()),
              (long long)o.steps);
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
