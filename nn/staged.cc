#include "nn/staged.h"

#include "autograd/api.h"

namespace tessel::nn {

Tensor StagedModel::forward(const Tensor& input_in) {
  const Tensor input = has_forward_hooks() ? run_forward_pre_hooks(input_in) : input_in;
  Tensor x = embed(input);
  for (const auto& b : blocks()) x = (*b)(x);
  Tensor output = head(x);
  return has_forward_hooks() ? run_forward_hooks(input, output) : output;
}

Tensor StagedModel::aux_loss() const {
  Tensor total;
  for (size_t i = 0; i < blocks().size(); ++i) {
    Tensor a = block_aux_loss(i);
    if (!a.defined()) continue;
    total = total.defined() ? total + a : a;
  }
  return total;
}

Tensor StagedModel::loss(const Tensor& output, const Tensor& target) {
  Tensor l = stage_loss(output, target);
  Tensor aux = aux_loss();
  if (aux.defined() && is_training()) l = l + aux * aux_loss_coef();
  return l;
}

}  // namespace tessel::nn
