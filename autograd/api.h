#pragma once
// The whole differentiable API: #include "autograd/api.h".
#include "autograd/anomaly.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
// Every op family's header, autograd/ops/<family>.h (generated from the
// folder by autograd/BUILD, so a new family needs no line here).
#include "autograd/ops/all.h"
#include "runtime/tensor.h"
