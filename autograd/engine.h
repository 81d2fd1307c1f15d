#pragma once
// The backward engine.
#include <functional>
#include <vector>

#include "runtime/tensor.h"

namespace tessel {
namespace autograd {

// Accumulates d(roots)/d(leaf) into every leaf's .grad. `grads` holds one
// gradient per root (an undefined entry means ones, allowed for one-element
// roots only). Saved tensors are freed unless retain_graph.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {}, bool retain_graph = false);

// Observers of this thread's backward() calls: `fn` runs at the start of
// every autograd::backward() / Tensor::backward() on the registering thread,
// before any node runs (not for autograd::grad, which touches no .grad).
// Data parallelism learns from it that a backward pass -- a micro-batch --
// begins (run/run.h counts micro-batches with it); an observer may throw to
// refuse the backward. Returns a handle for remove_backward_observer.
int add_backward_observer(std::function<void()> fn);
void remove_backward_observer(int handle);

// Returns d(outputs)/d(inputs) without touching any .grad (like
// torch.autograd.grad). An input no gradient reaches gets an undefined tensor.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

}  // namespace autograd
}  // namespace tessel
