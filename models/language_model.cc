#include "models/language_model.h"

#include "autograd/api.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "nn/autocast.h"

namespace tessel::models {

Tensor LanguageModel::token_loss(const Tensor& logits, const Tensor& targets) const {
  const int64_t V = logits.size(-1);
  return cross_entropy(nn::cast_up(logits).reshape({-1, V}), targets.reshape({-1}));
}

Tensor LanguageModel::example_input() const {
  return empty({1, 1}, TensorOptions(DType::Int64).with_device(kMeta));
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

std::shared_ptr<LanguageModel> make_language_model(const ModelConfig& config, uint64_t seed, Device device) {
  std::shared_ptr<LanguageModel> m;
  {
    nn::ConstructionScope meta(kMeta);
    m = build_model(config);
  }
  m->materialize(device);
  m->reset_parameters(seed);
  return m;
}

}  // namespace tessel::models
