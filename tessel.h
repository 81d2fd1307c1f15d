#pragma once
// tessel: the one header a program that uses tessel includes.
//
//   #include "tessel.h"
//   using namespace tessel;
//
// (Bazel: deps = ["@tessel//:tessel"], docs/build.md.) It brings:
//   tensors and differentiable ops         autograd/api.h, dtensor/ops.h
//   meshes, collectives, numerics knobs    dtensor/mesh.h, runtime/comm/comm.h, runtime/numerics.h
//   modules, layers, optimizers, schedules nn/nn.h
//   parallel plans                         nn/parallel/plan.h
//   the training API                       run/run.h (tessel::parallelize, tessel::Run),
//                                          run/checkpoint.h (save, load, Checkpoints),
//                                          run/launch.h (tessel::launch)
// Also in the //:tessel target, included on their own (their namespace
// tessel::train would clash with a function of yours named train):
//   text generation                        #include "train/sample.h" (tessel::train::generate_batch;
//                                          nn::KVCache serves any model built from nn::Attention)
//   the auto-planner                       #include "planner/planner.h" (tessel::planner::plan for the
//                                          shipped model families; docs/plan.md)
// docs/your_model.md walks through a model of one's own on every layout.
// tessel's headers are C++17, and its numerics contract needs its compile
// flags: a workspace of one's own copies the `build` lines of tessel's
// .bazelrc (docs/build.md, "Using tessel from your own program").
#if __cplusplus < 201703L
#error "tessel needs C++17 and its numerics flags: copy the build lines of tessel's .bazelrc into your workspace's .bazelrc (docs/build.md)"
#endif
#include "autograd/api.h"
#include "dtensor/mesh.h"
#include "dtensor/ops.h"
#include "nn/nn.h"
#include "nn/parallel/derive.h"
#include "nn/parallel/plan.h"
#include "run/checkpoint.h"
#include "run/launch.h"
#include "run/run.h"
#include "runtime/comm/comm.h"
#include "runtime/numerics.h"
