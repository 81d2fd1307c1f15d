#pragma once
// The backward engine.
#include <vector>

#include "runtime/tensor.h"

namespace tessel {
namespace autograd {

// Accumulates d(roots)/d(leaf) into every leaf's .grad. `grads` holds one
// gradient per root (an undefined entry means ones, allowed for one-element
// roots only). Saved tensors are freed unless retain_graph.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {}, bool retain_graph = false);

// Returns d(outputs)/d(inputs) without touching any .grad (like
// torch.autograd.grad). An input no gradient reaches gets an undefined tensor.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

}  // namespace autograd
}  // namespace tessel
