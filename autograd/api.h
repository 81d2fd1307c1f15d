#pragma once
// The whole differentiable API: #include "autograd/api.h".
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/factory.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/unary.h"
#include "runtime/tensor.h"
#include "autograd/ops/random.h"
#include "autograd/ops/init.h"
