// A program in a Bazel workspace of its own that depends on tessel through
// local_repository (docs/build.md): a linear classifier trained on one device
// and on dp=2, with the same loop; in bitwise mode both end with the same bits.
#include <cstdio>

#include "tessel.h"
using namespace tessel;

struct Linear2 : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  Linear2() : nn::Module("Linear2") { fc = child("fc", std::make_shared<nn::Linear>(8, 3)); }
  Tensor loss(const Tensor& x, const Tensor& y) { return cross_entropy((*fc)(x), y); }
};

std::string train(int ranks) {
  std::string hash;
  launch(ranks, [&](int rank) {
    auto model = nn::make_model<Linear2>();
    model->reset_parameters(1);
    MeshPtr mesh = ranks > 1 ? Mesh::world({{"dp", ranks}}) : nullptr;
    auto run = parallelize(model, mesh, parallel::builtin_plan("none"), adamw({0.1}));
    for (int64_t step = 0; step < 10; ++step) {
      Tensor x = randn({16, 8}, PhiloxKey{1, stream_for("x", {uint64_t(step)})});
      Tensor y = argmax(x.narrow(1, 0, 3), 1);
      run.model().loss(run.input(x), run.input(y)).backward();
      run.step_optimizer();
    }
    const std::string h = run.param_hash();
    if (rank == 0) hash = h;
  });
  return hash;
}

// The same training through forward_backward, eager or compiled
// (RunOptions::compile, docs/compile.md): the same bits.
std::string train_forward_backward(bool compile) {
  auto model = nn::make_model<Linear2>();
  model->reset_parameters(1);
  RunOptions o;
  o.compile = compile;
  auto run = parallelize(model, adamw({0.1}), o);
  for (int64_t step = 0; step < 10; ++step) {
    Tensor x = randn({16, 8}, PhiloxKey{1, stream_for("x", {uint64_t(step)})});
    run.forward_backward(x, argmax(x.narrow(1, 0, 3), 1));
    run.step_optimizer();
  }
  if (compile && run.compile_stats().replays != 7) return "not replayed: " + run.compile_stats().refused;
  return run.param_hash();
}

int main() {
  numerics::BitwiseGuard bitwise(true);
  const std::string one = train(1), dp = train(2);
  std::printf("one device %s, dp=2 %s: %s\n", one.c_str(), dp.c_str(), one == dp ? "same bits" : "DIFFERENT");
  const std::string eager = train_forward_backward(false), compiled = train_forward_backward(true);
  std::printf("forward_backward eager %s, compiled %s: %s\n", eager.c_str(), compiled.c_str(),
              eager == compiled ? "same bits" : "DIFFERENT");
  return one == dp && eager == compiled ? 0 : 1;
}
