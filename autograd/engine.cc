#include "autograd/engine.h"

#include "autograd/anomaly.h"
#include "autograd/trace.h"

#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/autograd_meta.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/factory.h"
#include "dtensor/ops.h"
#include "dtensor/sharding.h"
#include "runtime/cost.h"
#include "runtime/numerics.h"
#include "runtime/profile.h"

namespace tessel {

// ---- grad mode ------------------------------------------------------------
namespace {
thread_local bool t_grad_enabled = true;
std::atomic<uint64_t> g_seq{0};
std::atomic<int> g_hook_handle{0};
}  // namespace

bool GradMode::is_enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool e) { t_grad_enabled = e; }

uint64_t next_node_seq() { return g_seq.fetch_add(1, std::memory_order_relaxed); }
int next_hook_handle() { return g_hook_handle.fetch_add(1, std::memory_order_relaxed) + 1; }

Node::Node() : seq(next_node_seq()) {}

// ---- saved tensors ----------------------------------------------------------
SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  tensor_ = raw::alias(t);
  version_ = t.device().is_meta() ? 0 : t.version();
}

const Tensor& SavedTensor::get() const {
  if (released_) {
    throw SavedTensorError(
        "saved tensors were freed by an earlier backward; call backward(..., retain_graph=true) the first time");
  }
  if (tensor_.defined() && tensor_.storage() && tensor_.storage()->released()) {
    throw SavedTensorError(fmt::format(
        FMT_STRING("a tensor saved for backward ({}) lives in storage that was released (FSDP frees gathered parameters "
        "after a module's forward; they must be gathered again before its backward runs)"),
        tensor_.desc()));
  }
  if (tensor_.defined() && tensor_.storage() && tensor_.version() != version_) {
    throw SavedTensorError(fmt::format(
        FMT_STRING("a tensor saved for backward ({}) was modified by an in-place operation (version {} when saved, now {})"),
        tensor_.desc(), version_, tensor_.version()));
  }
  return tensor_;
}

// ---- autograd meta ---------------------------------------------------------
AutogradMeta* autograd_meta(const Tensor& t) { return t.impl()->autograd.get(); }

AutogradMeta& ensure_autograd_meta(const Tensor& t) {
  auto& m = t.impl()->autograd;
  if (!m) m = std::make_shared<AutogradMeta>();
  return *m;
}

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = t.defined() ? autograd_meta(t) : nullptr;
  if (!m || !m->requires_grad) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  std::shared_ptr<Node> acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    m->grad_accumulator = acc;
  }
  return {acc, 0};
}

namespace {
// Backward functions and their kernels take a gradient shaped like the
// tensor it belongs to and on its device -- the engine checks that where a
// gradient comes from outside the graph (a hook, the caller of backward()),
// once, instead of every kernel re-checking its operands -- and in its dtype
// (converted). `g` stands for the gradient of `like`; `what` says where g
// came from and what may differ.
Tensor conformed_gradient(const char* op, const char* what, Tensor g, const Tensor& like) {
  TESSEL_CHECK(g.shape() == like.shape() && g.device() == like.device(), op,
               "{} {} for the gradient of {}; it must have that shape and device", what, g.desc(), like.desc());
  if (g.dtype() != like.dtype()) g = g.to(like.dtype());
  return g;
}

// What a gradient hook returned in place of g (undefined: keep g).
Tensor hook_result(const char* hook, const Tensor& g, const Tensor& r) {
  if (!r.defined()) return g;
  return conformed_gradient(hook, "returned (a hook may change the values, not the shape or the device)", r, g);
}
}  // namespace

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> l) : leaf(std::move(l)) {
  input_meta.push_back({leaf->shape, leaf->dtype, leaf->device});
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor g = std::move(grads[0]);
  if (!g.defined()) return {};
  Tensor var(leaf);
  AutogradMeta& m = ensure_autograd_meta(var);
  for (auto& h : m.hooks) g = hook_result("a hook on a leaf's gradient", g, h.fn(g));
  if (g.dtype() != leaf->dtype) g = g.to(leaf->dtype);
  if (leaf->dist) {  // gradients come out with the placements of their parameters (or the ones the leaf asks for)
    const Placements& target = m.grad_placements ? *m.grad_placements : var.placements();
    if (!g.is_distributed()) g = distribute_tensor(g, var.mesh(), target);
    else if (g.placements() != target) g = redistribute(g, target);
  }
  if (!m.grad.defined()) {
    // Take the incoming buffer when nobody else can see it; copy otherwise.
    // (A distributed tensor and its local piece share one storage.)
    const Tensor& piece = raw::local_of(g);
    const long owners = g.is_distributed() ? 2 : 1;
    bool sole = g.impl_ptr().use_count() == 1 && g.storage().use_count() == owners && piece.is_contiguous() &&
                g.shape() == leaf->shape && (!g.is_distributed() || piece.impl_ptr().use_count() == 1);
    m.grad = sole ? g : g.clone();
  } else {
    m.grad.add_(g);
  }
  for (auto& h : m.post_accumulate_hooks) h.fn(var);
  return {};
}

// ---- recording helpers -------------------------------------------------------
namespace detail {

void connect(Node& node, const std::vector<const Tensor*>& inputs) {
  node.next_edges.reserve(inputs.size());
  node.input_meta.reserve(inputs.size());
  for (const Tensor* t : inputs) {
    if (t->defined()) {
      node.next_edges.push_back(gradient_edge(*t));
      node.input_meta.push_back({t->shape(), t->dtype(), t->device()});
    } else {
      node.next_edges.push_back({});
      node.input_meta.push_back({});
    }
  }
}

void set_history(const Tensor& out, const std::shared_ptr<Node>& node, uint32_t output_nr) {
  if (!out.defined() || !is_floating(out.dtype())) return;
  AutogradMeta& m = ensure_autograd_meta(out);
  m.requires_grad = true;
  m.grad_fn = node;
  m.output_nr = output_nr;
}

std::vector<bool> needs_from_edges(const Node& node) {
  std::vector<bool> needs(node.next_edges.size());
  for (size_t i = 0; i < needs.size(); ++i) needs[i] = node.next_edges[i].valid();
  return needs;
}

void rethrow_saved_error(const char* op, const SavedTensorError& e) {
  throw SavedTensorError(std::string("backward of ") + op + ": " + e.what());
}

}  // namespace detail

// ---- the engine ------------------------------------------------------------------
namespace {

struct Capture {
  Node* node;
  uint32_t output_nr;
  size_t slot;
};

struct ReadyOrder {
  bool operator()(const Node* a, const Node* b) const { return a->seq < b->seq; }  // max-heap on seq
};

// Two gradients of one tensor in different layouts meet in the cheaper one: a
// Replicate piece joins a Partial(sum) one by zeroing off the root (no
// communication); other differences use the first one's layout.
Tensor sum_gradients(const Tensor& a, const Tensor& b) {
  if (!a.is_distributed() || !b.is_distributed()) return add(a, b);
  if (numerics::bitwise()) {  // one device adds the finished gradients: reduce both first
    const Placements r = dtensor::unshard(a.placements(), {}, true);
    return add(redistribute(a, r), redistribute(b, dtensor::unshard(b.placements(), {}, true)));
  }
  if (a.placements() == b.placements()) return add(a, b);
  Placements target = a.placements();
  for (int m = 0; m < target.size(); ++m) {
    const Placement pa = a.placements()[m], pb = b.placements()[m];
    if ((pa.is_partial_sum() && pb.is_replicate()) || (pa.is_replicate() && pb.is_partial_sum()))
      target[m] = numerics::bitwise() ? Replicate() : Partial();  // bitwise: reduce first, then add as one device does
  }
  return add(redistribute(a, target), redistribute(b, target));
}

void accumulate_into(std::vector<Tensor>& buffer, uint32_t nr, Tensor g) {
  if (!buffer[nr].defined()) {
    buffer[nr] = std::move(g);
  } else {
    buffer[nr] = sum_gradients(buffer[nr], g);
  }
}

Tensor checked_gradient(const Node& node, size_t i, Tensor g) {
  const InputMeta& meta = node.input_meta[i];
  if (g.shape() != meta.shape) {
    TESSEL_FAIL(std::string("backward of ") + node.name(),
                "gradient for input {} has shape {} but the input had shape {}", i, g.shape(), meta.shape);
  }
  if (g.dtype() != meta.dtype && is_floating(meta.dtype)) g = g.to(meta.dtype);
  return g;
}

// Runs the graph from `roots` (edges with their gradients). With captures,
// gradients arriving at the captured (node, output) slots are returned and
// leaves are left untouched.
std::vector<Tensor> execute(const std::vector<Edge>& roots, std::vector<Tensor> root_grads, bool retain_graph,
                            const std::vector<Capture>* captures, size_t num_captures) {
  NoGradGuard no_grad;
  std::unordered_map<Node*, std::shared_ptr<Node>> alive;
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  for (const Edge& e : roots) {
    if (e.fn && alive.emplace(e.fn.get(), e.fn).second) stack.push_back(e.fn.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      ++deps[e.fn.get()];
      if (alive.emplace(e.fn.get(), e.fn).second) stack.push_back(e.fn.get());
    }
  }

  // With captures (autograd::grad), only the nodes that lead to a captured
  // gradient run: a node past an input -- the input's own grad_fn, when the
  // input is not a leaf -- is not part of this computation (it may be a
  // node with side effects, like FSDP's gather node, which reduce-scatters:
  // it belongs to the enclosing backward). Nothing reaches a node that does
  // not run, so its dependency counts need no care.
  std::unordered_set<Node*> runs;
  std::unordered_set<const Node*> captured_nodes;
  if (captures) {
    for (const Capture& c : *captures) captured_nodes.insert(c.node);
    std::unordered_set<const Node*> leads = captured_nodes;  // to a captured gradient (captured, or leads to one)
    // Post-order over the graph: a node is decided after every node it feeds.
    std::unordered_set<Node*> seen;
    std::vector<std::pair<Node*, size_t>> path;
    for (const Edge& e : roots)
      if (e.fn && seen.insert(e.fn.get()).second) path.emplace_back(e.fn.get(), 0);
    while (!path.empty()) {
      Node* n = path.back().first;
      const size_t i = path.back().second;
      if (i < n->next_edges.size()) {
        ++path.back().second;
        Node* next = n->next_edges[i].fn.get();
        if (next && seen.insert(next).second) path.emplace_back(next, 0);
        continue;
      }
      path.pop_back();
      bool feeds = false;
      for (const Edge& e : n->next_edges) feeds = feeds || (e.fn && leads.count(e.fn.get()));
      if (feeds) {
        runs.insert(n);
        leads.insert(n);
      }
    }
  }

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Edge& e = roots[i];
    if (!e.fn) continue;
    auto& buf = buffers[e.fn.get()];
    buf.resize(e.fn->num_outputs);
    accumulate_into(buf, e.input_nr, root_grads[i]);
  }

  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
  for (const Edge& e : roots) {
    Node* n = e.fn.get();
    if (n && deps[n] == 0) {
      deps[n] = -1;  // queued
      ready.push(n);
    }
  }

  std::vector<Tensor> captured(num_captures);
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[node]);
    buffers.erase(node);
    grads.resize(node->num_outputs);

    // (Under captures a node that does not run sees its hooks only if its
    // gradient is captured: they may change the gradient handed out.)
    const bool run = !captures || runs.count(node) != 0;  // an accumulator feeds nothing: never runs under captures
    const bool hooks = run || captured_nodes.count(node) != 0;
    for (auto& h : node->pre_hooks) {
      if (!hooks) break;
      if (h.output_nr < grads.size() && grads[h.output_nr].defined()) {
        Tensor& g = grads[h.output_nr];
        g = hook_result("a hook on a gradient", g, h.fn(g));
      }
    }
    if (captures) {
      for (const Capture& c : *captures)
        if (c.node == node && grads[c.output_nr].defined()) captured[c.slot] = grads[c.output_nr];
    }

    bool any = false;
    for (auto& g : grads) any = any || g.defined();
    std::vector<Tensor> outs;
    bool is_accumulator = dynamic_cast<AccumulateGrad*>(node) != nullptr;
    if (any && run) {
      std::vector<Tensor> grads_in;  // anomaly detection names the incoming gradients
      if (TESSEL_UNLIKELY(anomaly::enabled()) && !is_accumulator) grads_in = grads;
      {
        profile::Timer timer(node->name(), ".bwd");
        try {
          outs = node->apply(std::move(grads));
        } catch (const OutOfMemoryError& e) {
          e.rethrow_during(std::string(node->name()) + ".bwd");
        }
      }
      if (TESSEL_UNLIKELY(cost::active() != nullptr) && !is_accumulator) {
        int64_t bytes = 0;
        for (const Tensor& t : outs) bytes += t.defined() ? int64_t(raw::local_of(t).nbytes()) : 0;
        cost::add_op(bytes);
      }
      if (TESSEL_UNLIKELY(anomaly::enabled()) && !is_accumulator)
        anomaly::check_backward(node->name(), node->forward_module, grads_in, outs);
      if (TESSEL_UNLIKELY(trace::current() != nullptr) && !is_accumulator) trace::backward_grads(node->name(), outs);
    }
    if (!retain_graph && run) node->release_saved();
    if (!is_accumulator && !outs.empty() && outs.size() != node->next_edges.size()) {
      TESSEL_FAIL(std::string("backward of ") + node->name(), "returned {} gradients for {} inputs", outs.size(),
                  node->next_edges.size());
    }
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.fn) continue;
      if (i < outs.size() && outs[i].defined()) {
        auto& buf = buffers[e.fn.get()];
        buf.resize(e.fn->num_outputs);
        accumulate_into(buf, e.input_nr, checked_gradient(*node, i, std::move(outs[i])));
      }
      int& d = deps[e.fn.get()];
      if (--d == 0) {
        d = -1;
        ready.push(e.fn.get());
      }
    }
  }
  return captured;
}

std::vector<Tensor> root_gradients(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                   const char* op) {
  TESSEL_CHECK(grads.empty() || grads.size() == roots.size(), op, "got {} gradients for {} outputs", grads.size(),
               roots.size());
  std::vector<Tensor> out;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    TESSEL_CHECK(r.defined(), op, "output {} is undefined", i);
    TESSEL_CHECK(r.requires_grad(), op,
                 "output {} ({}) does not require grad and has no grad_fn (was it computed under no_grad, or "
                 "from tensors that don't require grad?)",
                 i, r.desc());
    Tensor g = grads.empty() ? Tensor() : grads[i];
    if (!g.defined()) {
      TESSEL_CHECK(r.numel() == 1, op,
                   "a gradient can be implied only for one-element outputs; output {} is {}, pass its gradient",
                   i, r.desc());
      g = ones_like(r);
    } else {
      g = conformed_gradient(op, TESSEL_FORMAT("gradient given for output {}:", i).c_str(), g, r);
    }
    out.push_back(g);
  }
  return out;
}

}  // namespace

namespace autograd {

namespace {
// Per thread: ranks running as threads each have their own backward passes.
std::vector<std::pair<int, std::function<void()>>>& backward_observers() {
  thread_local std::vector<std::pair<int, std::function<void()>>> v;
  return v;
}
}  // namespace

int add_backward_observer(std::function<void()> fn) {
  const int h = next_hook_handle();
  backward_observers().emplace_back(h, std::move(fn));
  return h;
}

void remove_backward_observer(int handle) {
  auto& v = backward_observers();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].first == handle) {
      v.erase(v.begin() + std::ptrdiff_t(i));
      return;
    }
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  if (!backward_observers().empty()) {
    const auto observers = backward_observers();  // an observer may add or remove observers
    for (const auto& [handle, fn] : observers) fn();
  }
  std::vector<Tensor> g = root_gradients(roots, grads, "backward");
  std::vector<Edge> edges;
  for (const Tensor& r : roots) edges.push_back(gradient_edge(r));
  execute(edges, std::move(g), retain_graph, nullptr, 0);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  std::vector<Tensor> g = root_gradients(outputs, grad_outputs, "autograd::grad");
  std::vector<Edge> edges;
  for (const Tensor& r : outputs) edges.push_back(gradient_edge(r));
  std::vector<Capture> caps;
  std::vector<std::shared_ptr<Node>> keep;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Edge e = gradient_edge(inputs[i]);
    TESSEL_CHECK(e.valid(), "autograd::grad", "input {} ({}) does not require grad", i, inputs[i].desc());
    keep.push_back(e.fn);
    caps.push_back({e.fn.get(), e.input_nr, i});
  }
  return execute(edges, std::move(g), retain_graph, &caps, inputs.size());
}

}  // namespace autograd
}  // namespace tessel
