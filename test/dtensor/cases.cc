// The distributed op cases (see cases.h).
#include "test/dtensor/cases.h"

#include <cstdio>
#include <cstdlib>
#include <random>

#include "autograd/api.h"
#include "test/util/dist.h"
#include "test/util/util.h"

namespace tessel::testing {

Tensor Distributor::operator()(const Tensor& t, bool allow_partial) const {
  if (!mesh) return t;
  return distribute_tensor(t, mesh, random_placements(*gen, mesh->ndim(), t.dim(), allow_partial));
}

namespace {

std::string compare(const std::string& what, const Tensor& got, const Tensor& want, bool bitwise) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype())
    return what + ": got " + got.desc() + ", want " + want.desc();
  bool ok = bitwise ? bitwise_equal(got, want) : allclose(got.to(DType::Float64), want.to(DType::Float64), 2e-5, 2e-5);
  if (ok) return "";
  if (getenv("TESSEL_DEBUG_CASES")) {
    Tensor a = got.to(DType::Float64).contiguous(), b = want.to(DType::Float64).contiguous();
    for (int64_t i = 0; i < a.numel(); ++i) {
      double x = a.data<double>()[i], y = b.data<double>()[i];
      if (x != y) fprintf(stderr, "  [%lld] got %a want %a\n", (long long)i, x, y);
    }
  }
  return what + (bitwise ? " differs bitwise" : " differs") + " (max |diff| " +
         std::to_string(max_abs_diff(got.to(DType::Float64), want.to(DType::Float64))) + ")";
}

// A loss that touches every floating output with fixed random weights.
Tensor weighted_loss(const std::vector<Tensor>& outs, uint64_t seed) {
  Tensor loss;
  for (size_t j = 0; j < outs.size(); ++j) {
    if (!outs[j].defined() || !outs[j].requires_grad()) continue;
    Tensor w = uniform(outs[j].shape(), seed + 17 * j);
    Tensor l = sum(outs[j] * w);
    loss = loss.defined() ? loss + l : l;
  }
  return loss;
}

std::string run_case_impl(const OpCase& c_in, const MeshPtr& mesh, uint64_t seed, bool all_bitwise) {
  OpCase c = c_in;
  if (c.random_shapes) c.shapes = c.random_shapes(seed);
  // Reference: one device.
  std::vector<Tensor> ref_in;
  for (size_t i = 0; i < c.shapes.size(); ++i) ref_in.push_back(uniform(c.shapes[i], seed + i).requires_grad_(c.grad));
  std::vector<Tensor> ref_out = c.fn(ref_in, Distributor{});
  std::vector<Tensor> ref_grad;
  Tensor ref_loss = c.grad ? weighted_loss(ref_out, seed) : Tensor();
  if (ref_loss.defined()) {
    ref_loss.backward();
    for (auto& t : ref_in) ref_grad.push_back(t.grad());
  }

  // Distributed.
  std::mt19937_64 gen(seed * 7919 + 1);  // the same on every rank
  std::vector<Tensor> din;
  std::vector<Placements> placements;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    Placements p = random_placements(gen, mesh->ndim(), c.shapes[i].size(), c.partial);
    placements.push_back(p);
    Tensor x = distribute_tensor(uniform(c.shapes[i], seed + i), mesh, p);
    if (c.grad) x.requires_grad_(true);
    din.push_back(x);
  }
  std::vector<Tensor> out = c.fn(din, Distributor{mesh, &gen});
  std::string where = " [placements";
  for (auto& p : placements) where += " " + p.str();
  where += "]";
  if (out.size() != ref_out.size()) return "output count differs" + where;
  for (size_t j = 0; j < out.size(); ++j) {
    if (!out[j].is_distributed()) return "output " + std::to_string(j) + " is not distributed" + where;
    std::string r = compare("output " + std::to_string(j) + " " + out[j].placements().str(), full_tensor(out[j]),
                            ref_out[j], c.bitwise || all_bitwise);
    if (!r.empty()) return r + where;
  }
  if (ref_loss.defined()) {
    Tensor loss = weighted_loss(out, seed);
    loss.backward();
    for (size_t i = 0; i < din.size(); ++i) {
      Tensor g = din[i].grad();
      if (!ref_grad[i].defined()) continue;
      if (!g.defined()) return "no gradient for input " + std::to_string(i) + where;
      if (g.placements() != placements[i])
        return "gradient of input " + std::to_string(i) + " has placements " + g.placements().str() + where;
      std::string r = compare("gradient of input " + std::to_string(i), full_tensor(g), ref_grad[i], all_bitwise);
      if (!r.empty()) return r + where;
    }
  }
  return "";
}

std::vector<Tensor> one(Tensor t) { return {std::move(t)}; }

// Sizes in [1, 9] drawn from a seed.
struct Sizes {
  std::mt19937_64 gen;
  explicit Sizes(uint64_t seed) : gen(seed * 2654435761u + 7) {}
  int64_t operator()() { return int64_t(gen() % 9) + 1; }
};

}  // namespace

std::string run_op_case(const OpCase& c, const MeshPtr& mesh, uint64_t seed, bool all_bitwise) {
  return run_case_impl(c, mesh, seed, all_bitwise);
}

std::vector<OpGroup> dtensor_op_groups() {
  std::vector<OpGroup> groups;
  {
    OpGroup grp{"pointwise ops with broadcasting", {}};
    auto& g = grp.cases;
    g.push_back(OpCase{"add bias", {{5, 7}, {7}}, [](auto& x, auto&) { return one(x[0] + x[1]); }, true});
    g.push_back(OpCase{"sub", {{3, 5, 2}, {5, 1}}, [](auto& x, auto&) { return one(x[0] - x[1]); }, true});
    g.push_back(OpCase{"mul", {{6, 5}, {6, 5}}, [](auto& x, auto&) { return one(x[0] * x[1]); }, true});
    g.push_back(OpCase{"div", {{4, 3}, {3}}, [](auto& x, auto&) { return one(x[0] / (x[1] * x[1] + 1.0)); }, true});
    g.push_back(OpCase{"scalar ops", {{7, 3}}, [](auto& x, auto&) { return one((x[0] + 1.5) * 2.0 - 0.25); }, true});
    g.push_back(OpCase{"unary", {{5, 6}}, [](auto& x, auto&) { return one(gelu(x[0]) + exp(x[0]) * tanh(x[0]) - neg(x[0])); },
                true});
    g.push_back(OpCase{"maximum", {{5, 3}, {5, 3}}, [](auto& x, auto&) { return one(maximum(x[0], x[1])); }, true});
    g.push_back(OpCase{"where and compare", {{6, 4}, {6, 4}},
                [](auto& x, auto&) { return one(where(gt(x[0], x[1]), x[0] * 2.0, x[1])); }, true});
    g.push_back(OpCase{"masked_fill", {{5, 5}}, [](auto& x, auto&) { return one(masked_fill(x[0], lt(x[0], 0.0), 7.0)); },
                true});
    g.push_back(OpCase{"cast", {{4, 6}}, [](auto& x, auto&) { return one(x[0].to(DType::BFloat16).to(DType::Float32)); },
                true});
    g.push_back(OpCase{"dropout", {{6, 5}},
                [](auto& x, auto&) { return one(dropout(x[0], 0.4, PhiloxKey{7, 99})); }, true});
    g.push_back(OpCase{"swiglu", {{5, 4}, {5, 4}}, [](auto& x, auto&) { return one(swiglu(x[0], x[1])); }, true});
    groups.push_back(std::move(grp));
  }
  {
    OpGroup grp{"reductions (sum, mean, var, amax, argmax)", {}};
    auto& g = grp.cases;
    g.push_back(OpCase{"sum all", {{5, 6}}, [](auto& x, auto&) { return one(sum(x[0])); }});
    g.push_back(OpCase{"sum dim", {{5, 6, 3}}, [](auto& x, auto&) { return one(sum(x[0], {1})); }});
    g.push_back(OpCase{"sum keepdim", {{5, 6}}, [](auto& x, auto&) { return one(sum(x[0], {0}, true)); }});
    g.push_back(OpCase{"mean", {{7, 4}}, [](auto& x, auto&) { return one(mean(x[0], {-1})); }});
    g.push_back(OpCase{"var", {{5, 6}}, [](auto& x, auto&) { return one(var(x[0], {0})); }});
    g.push_back(OpCase{"amax", {{6, 5}}, [](auto& x, auto&) { return one(amax(x[0], {1})); }, true});
    g.push_back(OpCase{"amax no grad", {{6, 5}}, [](auto& x, auto&) {
                  NoGradGuard ng;
                  return one(amax(x[0], {0}));
                }, true, false});
    g.push_back(OpCase{"argmax", {{5, 7}}, [](auto& x, auto&) { return one(argmax(x[0], 1)); }, true, false, false});
    groups.push_back(std::move(grp));
  }
  {
    OpGroup grp{"matmul: batch, rows, columns and the contracted dim sharded", {}};
    auto& g = grp.cases;
    g.push_back(OpCase{"2-D", {{5, 6}, {6, 7}}, [](auto& x, auto&) { return one(matmul(x[0], x[1])); }});
    g.push_back(OpCase{"3-D x 2-D weight", {{3, 5, 6}, {6, 4}}, [](auto& x, auto&) { return one(matmul(x[0], x[1])); }});
    g.push_back(OpCase{"linear", {{4, 3, 6}, {5, 6}, {5}}, [](auto& x, auto&) { return one(linear(x[0], x[1], x[2])); }});
    g.push_back(OpCase{"batched 4-D", {{2, 3, 5, 4}, {2, 3, 4, 6}}, [](auto& x, auto&) { return one(matmul(x[0], x[1])); }});
    g.push_back(OpCase{"broadcast batch", {{3, 5, 4}, {4, 6}}, [](auto& x, auto&) { return one(bmm(x[0], x[1].expand({3, 4, 6}))); }});
    groups.push_back(std::move(grp));
  }
  {
    OpGroup grp{"softmax, log_softmax and norms, including over sharded dims", {}};
    auto& g = grp.cases;
    g.push_back(OpCase{"softmax last", {{5, 7}}, [](auto& x, auto&) { return one(softmax(x[0], -1)); }});
    g.push_back(OpCase{"softmax dim 0", {{6, 3}}, [](auto& x, auto&) { return one(softmax(x[0], 0)); }});
    g.push_back(OpCase{"log_softmax", {{4, 9}}, [](auto& x, auto&) { return one(log_softmax(x[0], 1)); }});
    g.push_back(OpCase{"layer_norm", {{3, 4, 6}, {6}, {6}},
                [](auto& x, auto&) { return one(layer_norm(x[0], {6}, x[1], x[2])); }});
    g.push_back(OpCase{"rms_norm", {{5, 8}, {8}}, [](auto& x, auto&) { return one(rms_norm(x[0], {8}, x[1])); }});
    groups.push_back(std::move(grp));
  }
  {
    OpGroup grp{"views and reshapes of sharded dims", {}};
    auto& g = grp.cases;
    g.push_back(OpCase{"transpose", {{5, 3}}, [](auto& x, auto&) { return one(x[0].t() * 1.0); }, true});
    g.push_back(OpCase{"permute", {{2, 3, 5}}, [](auto& x, auto&) { return one(x[0].permute({2, 0, 1}) * 1.0); }, true});
    g.push_back(OpCase{"reshape merge", {{4, 3, 2}}, [](auto& x, auto&) { return one(x[0].reshape({12, 2}) * 1.0); }, true});
    g.push_back(OpCase{"reshape split", {{8, 6}}, [](auto& x, auto&) { return one(x[0].reshape({8, 2, 3}) * 1.0); }, true});
    g.push_back(OpCase{"flatten", {{3, 4, 5}}, [](auto& x, auto&) { return one(x[0].flatten(1) * 1.0); }, true});
    g.push_back(OpCase{"slice", {{7, 4}}, [](auto& x, auto&) { return one(x[0].narrow(0, 2, 3) * 1.0); }, true});
    g.push_back(OpCase{"select", {{5, 6}}, [](auto& x, auto&) { return one(x[0].select(1, 4) * 1.0); }, true});
    g.push_back(OpCase{"unsqueeze/squeeze", {{5, 1, 3}},
                [](auto& x, auto&) { return one(x[0].squeeze(1).unsqueeze(0) * 1.0); }, true});
    g.push_back(OpCase{"expand", {{1, 5}}, [](auto& x, auto&) { return one(x[0].expand({4, 5}) * 1.0); }, true});
    g.push_back(OpCase{"contiguous clone", {{5, 3}}, [](auto& x, auto&) { return one(x[0].t().contiguous().clone()); }, true});
    groups.push_back(std::move(grp));
  }
  {
    OpGroup grp{"cat, stack, split, chunk", {}};
    auto& g = grp.cases;
    g.push_back(OpCase{"cat", {{3, 4}, {3, 2}}, [](auto& x, auto&) { return one(cat({x[0], x[1]}, 1)); }, true});
    g.push_back(OpCase{"cat dim 0", {{3, 4}, {5, 4}}, [](auto& x, auto&) { return one(cat({x[0], x[1]}, 0)); }, true});
    g.push_back(OpCase{"stack", {{3, 4}, {3, 4}}, [](auto& x, auto&) { return one(stack({x[0], x[1]}, 1)); }, true});
    g.push_back(OpCase{"split", {{7, 3}}, [](auto& x, auto&) { return split(x[0], 3, 0); }, true});
    g.push_back(OpCase{"chunk", {{4, 7}}, [](auto& x, auto&) { return chunk(x[0], 3, 1); }, true});
    groups.push_back(std::move(grp));
  }
  {
    OpGroup grp{"embedding (vocabulary-parallel too), gather, index ops", {}};
    auto& g = grp.cases;
    g.push_back(OpCase{"embedding", {{9, 4}}, [](auto& x, auto& d) {
                  Tensor ids = d(randint({3, 5}, 5, 0, 9));
                  return one(embedding(x[0], ids));
                }, true});
    g.push_back(OpCase{"gather", {{5, 6}}, [](auto& x, auto& d) {
                  Tensor idx = d(randint({5, 3}, 6, 0, 6));
                  return one(gather(x[0], 1, idx));
                }, true});
    g.push_back(OpCase{"index_select", {{6, 4}}, [](auto& x, auto& d) {
                  Tensor idx = d(randint({5}, 8, 0, 6));
                  return one(index_select(x[0], 0, idx));
                }, true});
    g.push_back(OpCase{"scatter_add", {{5, 4}, {3, 4}}, [](auto& x, auto& d) {
                  Tensor idx = d(randint({3, 4}, 9, 0, 5));
                  return one(scatter_add(x[0], 0, idx, x[1]));
                }});
    g.push_back(OpCase{"index_add", {{5, 4}, {3, 4}}, [](auto& x, auto& d) {
                  Tensor idx = d(tensor(std::vector<int64_t>{4, 0, 2}));
                  return one(index_add(x[0], 0, idx, x[1]));
                }});
    g.push_back(OpCase{"one_hot", {{2}}, [](auto&, auto& d) {
                  Tensor ids = d(randint({4, 3}, 11, 0, 6));
                  return one(one_hot(ids, 6));
                }, true, false, false});
    groups.push_back(std::move(grp));
  }
  {
    OpGroup grp{"cross-entropy (vocabulary-parallel, token-parallel, ignore_index, smoothing)", {}};
    auto& g = grp.cases;
    g.push_back(OpCase{"cross_entropy mean", {{6, 9}}, [](auto& x, auto& d) {
                  Tensor t = d(randint({6}, 3, 0, 9));
                  return one(cross_entropy(x[0], t));
                }});
    g.push_back(OpCase{"cross_entropy 3-D, ignore_index", {{2, 5, 7}}, [](auto& x, auto& d) {
                  Tensor t = randint({2, 5}, 4, 0, 7);
                  t = where(ne(t, Scalar(int64_t(3))), t, Scalar(int64_t(-100)));
                  return one(cross_entropy(x[0], d(t)));
                }});
    g.push_back(OpCase{"cross_entropy none + smoothing", {{5, 8}}, [](auto& x, auto& d) {
                  Tensor t = d(randint({5}, 6, 0, 8));
                  return one(cross_entropy(x[0], t, -100, "none", 0.1));
                }});
    g.push_back(OpCase{"nll_loss sum", {{6, 5}}, [](auto& x, auto& d) {
                  Tensor t = d(randint({6}, 7, 0, 5));
                  return one(nll_loss(log_softmax(x[0], 1), t, -100, "sum"));
                }});
    groups.push_back(std::move(grp));
  }
  {
    OpGroup grp{"triangles, rotary embeddings, sort/topk", {}};
    auto& g = grp.cases;
    g.push_back(OpCase{"tril", {{5, 6}}, [](auto& x, auto&) { return one(tril(x[0], 1)); }, true});
    g.push_back(OpCase{"triu 3-D", {{2, 5, 5}}, [](auto& x, auto&) { return one(triu(x[0], -1)); }, true});
    g.push_back(OpCase{"rotary", {{2, 6, 3, 4}}, [](auto& x, auto&) {
                  auto [c, s] = rope_cache(8, 4);
                  return one(apply_rotary(x[0], c, s, 1));
                }, true});
    g.push_back(OpCase{"sort", {{5, 6}}, [](auto& x, auto&) {
                  auto [v, i] = sort(x[0], 1);
                  return std::vector<Tensor>{v, i};
                }, true});
    g.push_back(OpCase{"topk", {{6, 5}}, [](auto& x, auto&) {
                  auto [v, i] = topk(x[0], 2, 0);
                  return std::vector<Tensor>{v, i};
                }, true});
    groups.push_back(std::move(grp));
  }
  {
    OpGroup grp{"attention with sharded heads (causal, GQA)", {}};
    auto& g = grp.cases;
    g.push_back(OpCase{"sdpa causal", {{2, 4, 5, 3}, {2, 4, 5, 3}, {2, 4, 5, 3}}, [](auto& x, auto&) {
                  AttentionOptions o;
                  o.causal = true;
                  return one(scaled_dot_product_attention(x[0], x[1], x[2], o));
                }});
    g.push_back(OpCase{"sdpa GQA", {{2, 4, 5, 3}, {2, 2, 5, 3}, {2, 2, 5, 3}}, [](auto& x, auto&) {
                  AttentionOptions o;
                  o.causal = true;
                  return one(scaled_dot_product_attention(x[0], x[1], x[2], o));
                }});
    groups.push_back(std::move(grp));
  }
  {
    OpGroup grp{"random shapes", {}};
    auto& g = grp.cases;
    auto rs = [](std::function<std::vector<Dims>(Sizes&)> f) {
      return [f](uint64_t seed) {
        Sizes s(seed);
        return f(s);
      };
    };
    OpCase c;
    c = {"add broadcast", {}, [](auto& x, auto&) { return one(x[0] + x[1]); }, true};
    c.random_shapes = rs([](Sizes& s) {
      int64_t a = s(), b = s(), k = s();
      return std::vector<Dims>{{a, b, k}, {b, k}};
    });
    g.push_back(c);
    c = {"matmul", {}, [](auto& x, auto&) { return one(matmul(x[0], x[1])); }};
    c.random_shapes = rs([](Sizes& s) {
      int64_t b = s(), m = s(), k = s(), n = s();
      return std::vector<Dims>{{b, m, k}, {k, n}};
    });
    g.push_back(c);
    c = {"sum dims 0, 2", {}, [](auto& x, auto&) { return one(sum(x[0], {0, 2})); }};
    c.random_shapes = rs([](Sizes& s) { return std::vector<Dims>{{s(), s(), s()}}; });
    g.push_back(c);
    c = {"softmax", {}, [](auto& x, auto&) { return one(softmax(x[0], -1)); }};
    c.random_shapes = rs([](Sizes& s) { return std::vector<Dims>{{s(), s()}}; });
    g.push_back(c);
    c = {"layer_norm", {}, [](auto& x, auto&) { return one(layer_norm(x[0], {x[0].size(-1)}, x[1], x[2])); }};
    c.random_shapes = rs([](Sizes& s) {
      int64_t a = s(), b = s(), k = s() + 1;
      return std::vector<Dims>{{a, b, k}, {k}, {k}};
    });
    g.push_back(c);
    c = {"reshape", {}, [](auto& x, auto&) { return one(x[0].reshape({-1}) * 2.0); }, true};
    c.random_shapes = rs([](Sizes& s) { return std::vector<Dims>{{s(), s(), s()}}; });
    g.push_back(c);
    c = {"cross_entropy", {}, [](auto& x, auto& d) {
           Tensor t = d(testing::randint({x[0].size(0)}, 3, 0, x[0].size(1)));
           return one(cross_entropy(x[0], t));
         }};
    c.random_shapes = rs([](Sizes& s) { return std::vector<Dims>{{s(), s() + 1}}; });
    g.push_back(c);
    groups.push_back(std::move(grp));
  }
  return groups;
}

}  // namespace tessel::testing
