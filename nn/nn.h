#pragma once
// The whole nn API: #include "nn/nn.h".
#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/autocast.h"
#include "nn/container.h"
#include "nn/context.h"
#include "nn/dropout.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/module.h"
#include "nn/moe.h"
#include "nn/norm.h"
#include "nn/staged.h"
