#pragma once
// Op tracing: the hash of every op's outputs in the forward and of every
// backward node's input gradients, in execution order (`tessel train --dump`,
// `tessel verify`; docs/numerics.md "Localising a divergence").
//
// A distributed tensor is hashed as its full (global) tensor, so the trace of
// an N-device run lines up with the one-device run's entry for entry. Getting
// the full tensor is a collective: every rank of the mesh must trace (they run
// the same ops in the same order); only the recorder decides what to write.
// Layout plumbing (redistribute, to_local, from_local, distribute_tensor) is
// not traced: it changes where values live, not what they are.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace tessel::trace {

class Recorder {
 public:
  virtual ~Recorder() = default;
  // phase: "fwd" (outputs of op) or "bwd" (gradients for the inputs of op's node).
  virtual void record(const char* phase, const char* op, int index, const Tensor& full, uint64_t hash) = 0;
};

// This thread's recorder (nullptr: tracing off, the default).
Recorder* current();

// Installs a recorder on this thread for a scope.
class Scope {
 public:
  explicit Scope(Recorder* r);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Recorder* prev_;
};

// Hooks for call() and the engine (only reached when current() != nullptr).
void forward_output(const char* op, int index, const Tensor& t);
void backward_grads(const char* node, const std::vector<Tensor>& grads);

// 64-bit FNV-1a over the dtype and the values in row-major order (a
// distributed tensor: its full tensor, a collective).
uint64_t tensor_hash(const Tensor& t);
std::string hex(uint64_t h);

}  // namespace tessel::trace
