#include "nn/linear.h"

#include <cmath>

#include "autograd/api.h"
#include "nn/autocast.h"

namespace tessel::nn {

Linear::Linear(int64_t in, int64_t out, bool with_bias) : UnaryModule("Linear"), in_features(in), out_features(out) {
  TESSEL_CHECK(in > 0 && out > 0, "Linear", "in_features and out_features must be positive, got in_features={}, "
               "out_features={}", in, out);
  param("weight", weight, {out, in}, init::kaiming_uniform(std::sqrt(5.0)));
  if (with_bias) param("bias", bias, {out}, init::uniform_fan_in(in));
}

Tensor Linear::forward(const Tensor& x) {
  TESSEL_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "Linear",
               "'{}' expects input [..., {}] (in_features), got {}", path(), in_features, x.desc());
  return linear(cast_to_compute(x), cast_to_compute(weight), cast_to_compute(bias));
}

std::string Linear::extra_repr() const {
  return fmt::format(FMT_STRING("in_features={}, out_features={}, bias={}"), in_features, out_features, bias.defined());
}

Embedding::Embedding(int64_t num, int64_t dim, InitFn init)
    : UnaryModule("Embedding"), num_embeddings(num), embedding_dim(dim) {
  TESSEL_CHECK(num > 0 && dim > 0, "Embedding",
               "num_embeddings and embedding_dim must be positive, got num_embeddings={}, embedding_dim={}", num, dim);
  param("weight", weight, {num, dim}, init ? std::move(init) : init::normal(0.0, 1.0));
}

Tensor Embedding::forward(const Tensor& ids) { return embedding(weight, ids); }

std::string Embedding::extra_repr() const {
  return fmt::format(FMT_STRING("num_embeddings={}, embedding_dim={}"), num_embeddings, embedding_dim);
}

}  // namespace tessel::nn
