#include "models/language_model.h"

#include "autograd/api.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "nn/autocast.h"

namespace tessel::models {

Tensor LanguageModel::forward(const Tensor& ids_in) {
  // The model is the root: nobody calls it through a parent, so its own
  // forward hooks run here (FSDP gathers the parameters outside the blocks).
  const Tensor ids = has_forward_hooks() ? run_forward_pre_hooks(ids_in) : ids_in;
  Tensor x = embed(ids);
  for (const auto& b : blocks()) x = (*b)(x);
  Tensor logits = head(x);
  return has_forward_hooks() ? run_forward_hooks(ids, logits) : logits;
}

Tensor LanguageModel::token_loss(const Tensor& logits, const Tensor& targets) const {
  const int64_t V = logits.size(-1);
  return cross_entropy(nn::cast_up(logits).reshape({-1, V}), targets.reshape({-1}));
}

Tensor LanguageModel::loss(const Tensor& logits, const Tensor& targets) {
  Tensor l = token_loss(logits, targets);
  Tensor aux = aux_loss();
  if (aux.defined() && is_training()) l = l + aux * config.aux_loss_coef;
  return l;
}

std::shared_ptr<LanguageModel> build_model(const ModelConfig& config) {
  if (config.arch == Arch::NanoGPT) return nn::make_model<GPT>(config);
  return nn::make_model<Llama>(config);
}

std::shared_ptr<LanguageModel> make_language_model(const ModelConfig& config, uint64_t seed) {
  auto m = build_model(config);
  m->reset_parameters(seed);
  return m;
}

}  // namespace tessel::models
