#pragma once
// Anomaly detection: find the op that produced the first non-finite value
// (inf or NaN). `tessel train --detect-anomaly`, RunOptions::detect_anomaly,
// or anomaly::Guard around any code in C++.
//
// While it is on (this thread), every op's outputs in the forward, every
// backward node's gradients and every parameter an optimizer updates are
// counted for non-finite elements (kernels/nonfinite.h, one read pass per
// tensor). The first tensor that holds one stops the run with an
// AnomalyError naming the step and rank, the op (or "<op>.bwd", or the
// optimizer and parameter), the module path it ran in, the op's inputs with
// their shapes, dtypes and placements, and which of them were already
// non-finite (then the value came from outside any op: a parameter, a
// buffer, the caller's data). A distributed tensor is checked piece by
// piece: the rank that holds the bad element stops; the others stop at their
// next collective (TESSEL_COMM_TIMEOUT) with an error naming that rank.
//
// Off (the default) it costs one thread-local load per op.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "runtime/tensor.h"

namespace tessel::anomaly {

class AnomalyError : public Error {
 public:
  using Error::Error;
};

// Whether detection is on for this thread.
bool enabled();

// Turns detection on (or off) for this thread for a scope.
class Guard {
 public:
  explicit Guard(bool on = true);
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  bool prev_;
};

// The training step named in messages (-1: none). tessel::Run sets it.
void set_step(int64_t step);
int64_t step();

// The module being run (nn::UnaryModule::operator() opens one when
// detection is on): messages name the innermost module's path.
class ModuleScope {
 public:
  explicit ModuleScope(const std::string& path);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
};
// The innermost open module's path ("" outside any; "<root>" for the root module).
std::string module_path();

// Non-finite elements of t (a distributed tensor: of this rank's piece; not
// a collective). t: floating, any device; undefined or non-floating: 0.
int64_t count_nonfinite(const Tensor& t);

// Hooks (only called when enabled()): throw AnomalyError on a non-finite element.
// call(): an op's inputs and outputs, `module` the path it ran in.
void check_forward(const char* op, const std::vector<const Tensor*>& inputs, const std::vector<const Tensor*>& outputs);
// The engine: the gradients a node produced for its inputs, from the
// gradients of its outputs; `module`: where its forward ran.
void check_backward(const char* node, const std::string& module, const std::vector<Tensor>& grad_outputs,
                    const std::vector<Tensor>& grad_inputs);
// An optimizer, after updating `path`: the parameter; `before` says which of
// its gradient and state buffers held non-finite values before the update.
void check_update(const std::string& optimizer, const std::string& path, const Tensor& param,
                  const std::vector<std::pair<std::string, int64_t>>& nonfinite_before);

}  // namespace tessel::anomaly
