#include "dtensor/ops.h"

#include "autograd/autograd_meta.h"
#include "autograd/ops/factory.h"
#include "autograd/ops/random.h"
#include "dtensor/dist_call.h"
#include "dtensor/redistribute.h"
#include "dtensor/sharding.h"
#include "runtime/comm/comm.h"

namespace tessel {
namespace {

Placements all_replicate(const Mesh& mesh) { return Placements::replicated(mesh.ndim()); }

// A node with one input whose backward is a function of the gradient alone.
template <class Fn>
struct LambdaNode final : Node {
  const char* name_;
  Fn fn;
  LambdaNode(const char* n, Fn f) : name_(n), fn(std::move(f)) {}
  const char* name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {fn(grads[0])};
  }
};

template <class Fn>
void record(const char* name, const Tensor& input, const Tensor& out, Fn fn) {
  if (!GradMode::is_enabled() || !input.requires_grad()) return;
  auto node = std::make_shared<LambdaNode<Fn>>(name, std::move(fn));
  std::vector<const Tensor*> ins{&input};
  detail::connect(*node, ins);
  detail::set_history(out, node, 0);
}

// `g` (a gradient: distributed, or plain meaning the full value) as the local
// piece under `to` of a tensor of `shape`.
Tensor grad_piece(const Tensor& g, const Mesh& mesh, const Dims& shape, const Placements& to) {
  if (!g.is_distributed()) return dtensor::redistribute_local(g, shape, mesh, all_replicate(mesh), to);
  return dtensor::redistribute_local(g.dist().local, shape, mesh, g.placements(), to);
}

// The placements in which a rank's piece receives its gradient: Partial pieces
// each get the whole gradient (Replicate); shards and replicas keep theirs.
Placements piece_grad_placements(const Placements& p) {
  Placements out = p;
  for (int m = 0; m < out.size(); ++m)
    if (out[m].is_partial()) out[m] = Replicate();
  return out;
}

Tensor full_to_local(const Tensor& full, const MeshPtr& mesh, const Placements& placements) {
  return dtensor::redistribute_local(full, full.shape(), *mesh, all_replicate(*mesh), placements);
}

}  // namespace

Tensor distribute_tensor(const Tensor& full, const MeshPtr& mesh, const Placements& placements) {
  const char* op = "distribute_tensor";
  TESSEL_CHECK(mesh != nullptr, op, "needs a mesh");
  TESSEL_CHECK(full.defined(), op, "needs a defined tensor");
  TESSEL_CHECK(!full.is_distributed(), op, "{} is already distributed (use redistribute)", full.desc());
  dtensor::check_placements(op, *mesh, placements, full.dim());
  Tensor local = full_to_local(raw::alias(full), mesh, placements);
  Tensor out = raw::make_distributed(local, mesh, placements, full.shape());
  record(op, full, out, [mesh, shape = full.shape()](const Tensor& g) {
    return grad_piece(g, *mesh, shape, all_replicate(*mesh));
  });
  return out;
}

Tensor from_local(const Tensor& local, const MeshPtr& mesh, const Placements& placements,
                  const std::optional<Dims>& global_shape) {
  const char* op = "from_local";
  TESSEL_CHECK(mesh != nullptr, op, "needs a mesh");
  TESSEL_CHECK(local.defined() && !local.is_distributed(), op, "needs a plain local tensor, got {}", local.desc());
  dtensor::check_placements(op, *mesh, placements, local.dim());
  Dims shape;
  if (global_shape) {
    shape = *global_shape;
    TESSEL_CHECK(shape.size() == local.dim(), op, "global shape {} has a different rank than the local piece {}",
                 shape, local.desc());
  } else {
    // Sum the piece sizes of each sharded dim over its mesh group, innermost
    // mesh dim first (nested shards).
    shape = local.shape();
    for (int m = mesh->ndim() - 1; m >= 0; --m) {
      if (!placements[m].is_shard() || mesh->size(m) == 1) continue;
      const int d = placements[m].dim;
      Tensor n = raw::empty(Dims{1}, DType::Int64, kCPU);
      n.data<int64_t>()[0] = shape[d];
      mesh->comm(m)->all_reduce(n, comm::ReduceOp::Sum)->wait();
      shape[d] = n.data<int64_t>()[0];
    }
  }
  LocalGeometry g = local_geometry(shape, mesh->shape(), placements, mesh->coords());
  TESSEL_CHECK(g.shape == local.shape(), op,
               "local piece {} on rank {} does not match global shape {} with placements {} on mesh {} (expected "
               "{}: shards follow ceil-division, last pieces short or empty)",
               local.desc(), mesh->my_rank(), shape, placements, mesh->str(), g.shape);
  Tensor out = raw::make_distributed(raw::alias(local), mesh, placements, shape);
  record(op, local, out, [mesh, shape, placements](const Tensor& gr) {
    return grad_piece(gr, *mesh, shape, piece_grad_placements(placements));
  });
  return out;
}

Tensor to_local(const Tensor& t, const std::optional<Placements>& grad_placements) {
  TESSEL_CHECK(t.is_distributed(), "to_local", "{} is not distributed", t.desc());
  Tensor out = raw::alias(t.dist().local);
  Placements gp = grad_placements ? *grad_placements : t.placements();
  dtensor::check_placements("to_local", *t.mesh(), gp, t.dim());
  record("to_local", t, out, [mesh = t.mesh(), gp, shape = t.shape()](const Tensor& g) {
    return raw::make_distributed(g, mesh, gp, shape);
  });
  return out;
}

Tensor redistribute(const Tensor& t, const Placements& placements) {
  TESSEL_CHECK(t.is_distributed(), "redistribute", "{} is not distributed (use distribute_tensor)", t.desc());
  if (t.placements() == placements) return t;
  const Mesh& mesh = *t.mesh();
  Tensor local = dtensor::redistribute_local(t.dist().local, t.shape(), mesh, t.placements(), placements);
  Tensor out = raw::make_distributed(local, t.mesh(), placements, t.shape());
  // The global value is unchanged: the gradient passes through as it is, and
  // whoever consumes it converts it to the placements it needs (the dual).
  record("redistribute", t, out, [](const Tensor& g) { return g; });
  return out;
}

Tensor full_tensor(const Tensor& t) {
  if (!t.is_distributed()) return t;
  const Placements r = all_replicate(*t.mesh());
  return to_local(redistribute(t, r), r);
}

void set_grad_placements(const Tensor& t, const std::optional<Placements>& placements) {
  const char* op = "set_grad_placements";
  TESSEL_CHECK(t.is_distributed(), op, "{} is not distributed", t.desc());
  // (Clearing needs no gradient: a parameter frozen since it was set is cleared too.)
  TESSEL_CHECK(t.is_leaf() && (t.requires_grad() || !placements), op, "needs a leaf that requires grad, got {}",
               t.desc());
  if (placements) {
    dtensor::check_placements(op, *t.mesh(), *placements, t.dim());
    for (int m = 0; m < placements->size(); ++m) {
      const Placement want = (*placements)[m], own = t.placements()[m];
      TESSEL_CHECK(want == own || (want.is_partial_sum() && own.is_replicate()), op,
                   "mesh dim '{}': a gradient of {} (placements {}) can be kept as {} or Partial(sum), not {}",
                   t.mesh()->name(m), t.desc(), t.placements(), own.str(), want.str());
    }
  }
  ensure_autograd_meta(t).grad_placements = placements;
}

GlobalBlock local_random_block(const Tensor& t) {
  TESSEL_CHECK(t.is_distributed(), "local_random_block", "{} is not distributed", t.desc());
  return local_geometry(t.shape(), t.mesh()->shape(), t.placements(), t.mesh()->coords()).block(t.shape());
}

namespace {

template <class Make>
Tensor make_on_mesh(const char* op, const Dims& shape, const MeshPtr& mesh, const Placements& placements,
                    TensorOptions opts, bool partial_ok, Make make) {
  TESSEL_CHECK(mesh != nullptr, op, "needs a mesh");
  dtensor::check_placements(op, *mesh, placements, shape.size());
  TESSEL_CHECK(partial_ok || !placements.any_partial(), op,
               "Partial placements {} are only meaningful for zeros/empty (mesh {})", placements, mesh->str());
  LocalGeometry g = local_geometry(shape, mesh->shape(), placements, mesh->coords());
  TensorOptions local_opts = opts;
  local_opts.requires_grad = false;
  Tensor local = make(g.shape, g.block(shape), local_opts);
  Tensor out = raw::make_distributed(local, mesh, placements, shape);
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}

}  // namespace

Tensor empty(const Dims& shape, const MeshPtr& mesh, const Placements& placements, TensorOptions opts) {
  return make_on_mesh("empty", shape, mesh, placements, opts, true,
                      [](const Dims& s, const GlobalBlock&, TensorOptions o) { return empty(s, o); });
}
Tensor zeros(const Dims& shape, const MeshPtr& mesh, const Placements& placements, TensorOptions opts) {
  return make_on_mesh("zeros", shape, mesh, placements, opts, true,
                      [](const Dims& s, const GlobalBlock&, TensorOptions o) { return zeros(s, o); });
}
Tensor ones(const Dims& shape, const MeshPtr& mesh, const Placements& placements, TensorOptions opts) {
  return make_on_mesh("ones", shape, mesh, placements, opts, false,
                      [](const Dims& s, const GlobalBlock&, TensorOptions o) { return ones(s, o); });
}
Tensor full(const Dims& shape, Scalar value, const MeshPtr& mesh, const Placements& placements, TensorOptions opts) {
  return make_on_mesh("full", shape, mesh, placements, opts, false,
                      [&](const Dims& s, const GlobalBlock&, TensorOptions o) { return full(s, value, o); });
}
Tensor rand(const Dims& shape, PhiloxKey key, const MeshPtr& mesh, const Placements& placements, TensorOptions opts) {
  return make_on_mesh("rand", shape, mesh, placements, opts, false,
                      [&](const Dims& s, const GlobalBlock& b, TensorOptions o) { return rand(s, key, o, b); });
}
Tensor randn(const Dims& shape, PhiloxKey key, const MeshPtr& mesh, const Placements& placements,
             TensorOptions opts) {
  return make_on_mesh("randn", shape, mesh, placements, opts, false,
                      [&](const Dims& s, const GlobalBlock& b, TensorOptions o) { return randn(s, key, o, b); });
}
Tensor randint(int64_t low, int64_t high, const Dims& shape, PhiloxKey key, const MeshPtr& mesh,
               const Placements& placements, TensorOptions opts) {
  return make_on_mesh("randint", shape, mesh, placements, opts, false,
                      [&](const Dims& s, const GlobalBlock& b, TensorOptions o) {
                        return randint(low, high, s, key, o, b);
                      });
}
Tensor bernoulli(const Dims& shape, double p, PhiloxKey key, const MeshPtr& mesh, const Placements& placements,
                 TensorOptions opts) {
  return make_on_mesh("bernoulli", shape, mesh, placements, opts, false,
                      [&](const Dims& s, const GlobalBlock& b, TensorOptions o) {
                        return bernoulli(s, p, key, o, b);
                      });
}

namespace {
// item(), to_vector() and printing of distributed tensors read the full tensor.
Tensor full_for_reading(const Tensor& t) {
  NoGradGuard ng;
  return full_tensor(t);
}
struct InstallHook {
  InstallHook() { set_full_tensor_hook(&full_for_reading); }
} g_install_hook;
}  // namespace

}  // namespace tessel
