#pragma once
// Differentiable elementwise arithmetic with broadcasting and type promotion,
// comparisons, logical ops and where. Unary math lives in ops/unary.h.
#include "runtime/tensor.h"

namespace tessel {

// Arithmetic: inputs broadcast (numpy rules); the result dtype is
// promote_types(a, b) (div and pow of integers give float32).
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);  // NaN propagates; ties split the gradient
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);
Tensor pow(const Tensor& a, Scalar exponent);  // exact special cases for 0, 1, 2, 0.5, -1
Tensor rsub(const Tensor& a, Scalar b);        // b - a
// a + alpha * b (alpha applied as a separate multiply).
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha);

// Comparisons (bool result, not differentiable).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, Scalar b);
Tensor ne(const Tensor& a, Scalar b);
Tensor lt(const Tensor& a, Scalar b);
Tensor le(const Tensor& a, Scalar b);
Tensor gt(const Tensor& a, Scalar b);
Tensor ge(const Tensor& a, Scalar b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);

// cond ? a : b with broadcasting; differentiable in a and b.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
// x with value written where mask is true (mask broadcasts to x).
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);

// Sums `grad` over the dimensions that broadcasting expanded from `shape`
// (the backward of broadcasting), in the canonical order.
Tensor sum_to(const Tensor& grad, const Dims& shape, int chunks = 0);  // chunks: see sum_chunks

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator-(const Tensor& a);

}  // namespace tessel
