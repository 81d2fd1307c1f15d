// tessel's side of the Hugging Face interop check (test/conformance/hf.sh):
//
//   hf_export export --model M --out DIR
//     builds M's tiny config from a seed, writes DIR/hf (config.json + sharded
//     HF-named safetensors with an index, checkpoint/hf.h), DIR/batch.safetensors
//     (ids) and DIR/tessel_logits.safetensors; transformers loads DIR/hf and
//     must compute the same logits.
//   hf_export import --dir DIR
//     builds a model from DIR/hf_back/config.json (written by transformers'
//     save_pretrained from its own random weights), loads those weights by HF
//     names and writes DIR/tessel_back_logits.safetensors for the same batch.
//   hf_export logits --from DIR --batch FILE --out FILE
//     loads DIR as `tessel generate --from` does (a Hugging Face folder, a
//     tessel checkpoint or a run folder; train/trainer/pretrained.h) and writes
//     its logits for the batch's ids (generate.sh's round trip).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "autograd/api.h"
#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "models/config.h"
#include "models/language_model.h"
#include "nn/module.h"
#include "runtime/philox.h"
#include "train/trainer/pretrained.h"

using namespace tessel;

namespace {

nn::NamedTensor as_named(const std::pair<std::string, Tensor>& p) { return {p.first, p.second}; }

Tensor logits_of(models::LanguageModel& model, const Tensor& ids) {
  NoGradGuard ng;
  model.eval();
  return model.forward(ids).contiguous();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessel <-> Hugging Face weights (conformance)"};
  app.require_subcommand(1);
  std::string model_name = "nanogpt", config = "tiny", out, dir;
  uint64_t seed = 3, shard_bytes = 64 << 10;
  CLI::App* ex = app.add_subcommand("export", "tessel -> HF");
  ex->add_option("--model", model_name);
  ex->add_option("--config", config);
  ex->add_option("--seed", seed);
  ex->add_option("--shard-bytes", shard_bytes, "max bytes per safetensors shard (small: several shards)");
  ex->add_option("--out", out)->required();
  CLI::App* im = app.add_subcommand("import", "HF -> tessel");
  im->add_option("--dir", dir)->required();
  std::string batch;
  CLI::App* lo = app.add_subcommand("logits", "a saved model's logits for a batch");
  lo->add_option("--from", dir)->required();
  lo->add_option("--batch", batch)->required();
  lo->add_option("--out", out)->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (*lo) {
      const train::Pretrained p = train::find_pretrained(dir);
      std::shared_ptr<models::LanguageModel> model;
      {
        nn::ConstructionScope meta(kMeta);
        model = models::build_model(p.model);
      }
      auto run = parallelize(model, adamw({}));
      train::load_pretrained_weights(p, run);
      const Tensor ids = checkpoint::load_safetensors(batch).at("ids");
      checkpoint::save_safetensors(out, {{"logits", logits_of(run.model(), ids)}});
      std::printf("hf_export: logits of %s %s -> %s\n", p.kind_name(), p.path.c_str(), out.c_str());
    } else if (*ex) {
      models::ModelConfig mc = models::model_config(model_name, config);
      mc.dropout = 0;
      auto model = models::make_language_model(mc, seed);
      Tensor ids = randint(0, mc.vocab_size, {2, 16}, PhiloxKey{seed, stream_for("hf.batch")});
      checkpoint::NamedTensors params;
      for (const auto& nt : model->named_parameters()) params.emplace_back(nt.name, nt.tensor.detach());
      checkpoint::save_hf(out + "/hf", mc, checkpoint::to_hf(mc, params), shard_bytes);
      checkpoint::save_safetensors(out + "/batch.safetensors", {{"ids", ids}});
      checkpoint::save_safetensors(out + "/tessel_logits.safetensors", {{"logits", logits_of(*model, ids)}});
      std::printf("hf_export: %s '%s' -> %s/hf\n", model_name.c_str(), config.c_str(), out.c_str());
    } else {
      const models::ModelConfig mc = checkpoint::model_config_from_hf(checkpoint::load_hf_config(dir + "/hf_back"));
      auto model = models::make_language_model(mc, 0);
      std::vector<nn::NamedTensor> state;
      for (const auto& p : checkpoint::from_hf(mc, checkpoint::load_hf_tensors(dir + "/hf_back")))
        state.push_back(as_named(p));
      model->load_state_dict(state);
      const Tensor ids = checkpoint::load_safetensors(dir + "/batch.safetensors").at("ids");
      checkpoint::save_safetensors(dir + "/tessel_back_logits.safetensors", {{"logits", logits_of(*model, ids)}});
      std::printf("hf_export: %s/hf_back (%s) -> tessel logits\n", dir.c_str(), models::arch_name(mc.arch));
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "hf_export: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
