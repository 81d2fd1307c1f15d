#include "nn/staged.h"

#include "autograd/api.h"
#include "autograd/grad_mode.h"
#include "runtime/error.h"

namespace tessel::nn {

Tensor StagedModel::forward(const Tensor& input_in) {
  const Tensor input = has_forward_hooks() ? run_forward_pre_hooks(input_in) : input_in;
  Tensor x = embed(input);
  for (const auto& b : blocks()) x = (*b)(x);
  Tensor output = head(x);
  return has_forward_hooks() ? run_forward_hooks(input, output) : output;
}

Tensor StagedModel::recorded_block_aux_loss(size_t i) const {
  Tensor a = block_aux_loss(i);
  TESSEL_CHECK(!a.defined() || !blocks()[i]->recompute() || !GradMode::is_enabled() || a.requires_grad(),
               "recompute",
               "block {} ('{}') of {} runs under recompute = full and produced an auxiliary loss: recorded nowhere, "
               "it would train without its gradient. Use recompute = selective, or a model without the auxiliary "
               "loss (aux_loss_coef = 0 does not remove it)",
               i, blocks()[i]->path(), type_name());
  TESSEL_CHECK(!a.defined() || !blocks()[i]->compiled(), "compile_modules",
               "block {} ('{}') of {} is compiled (mixed mode) and produced an auxiliary loss: a replay does not "
               "run the block's forward, so the loss would be a stale tensor whose graph the block's node does not "
               "carry. Compile the attention layers (compile_modules = attention) instead",
               i, blocks()[i]->path(), type_name());
  return a;
}

Tensor StagedModel::aux_loss() const {
  Tensor total;
  for (size_t i = 0; i < blocks().size(); ++i) {
    Tensor a = recorded_block_aux_loss(i);
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
