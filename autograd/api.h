#pragma once
// The whole differentiable API: #include "autograd/api.h".
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/factory.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/unary.h"
#include "autograd/ops/softmax.h"
#include "autograd/ops/norm.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/rope.h"
#include "runtime/tensor.h"
