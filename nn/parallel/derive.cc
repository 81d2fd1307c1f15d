#include "nn/parallel/derive.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <regex>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "autograd/api.h"
#include "autograd/autograd_meta.h"
#include "autograd/graph_info.h"
#include "autograd/grad_mode.h"
#include "nn/container.h"
#include "nn/moe.h"
#include "runtime/error.h"

namespace tessel::parallel {
namespace {

constexpr const char* kOp = "derive_plan";

// ---- the traced graph ------------------------------------------------------------------------

enum class InKind { None, Param, Node, Leaf };  // no gradient; a parameter; an op's output; another leaf

struct In {
  InKind kind = InKind::None;
  int node = -1;   // InKind::Node: producer
  uint32_t nr = 0; // which of its outputs
  int param = -1;  // InKind::Param
  Dims shape;
};

struct GNode {
  Node* node = nullptr;
  std::string name;
  std::vector<In> in;
  std::vector<Dims> out_shape;  // from the consumers' input metadata (empty: unused)
  std::vector<std::vector<std::pair<int, int>>> consumers;  // per output: (node, input index)
};

struct Graph {
  std::vector<GNode> nodes;  // in recording order (producers before consumers)
  int root = -1;
  uint32_t root_nr = 0;
};

Graph read_graph(const Tensor& out, const std::unordered_map<const TensorImpl*, int>& param_of) {
  const Edge root = gradient_edge(out);
  TESSEL_CHECK(root.valid() && dynamic_cast<AccumulateGrad*>(root.fn.get()) == nullptr, kOp,
               "the traced forward returned {}, which no parameter reaches: return the loss (or an output that "
               "depends on the parameters)",
               out.desc());
  std::vector<Node*> order, stack{root.fn.get()};
  std::set<Node*> seen;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    TESSEL_CHECK(std::string(n->name()) != "recompute", kOp,
                 "the traced forward recomputes a block (nn/recompute.h): its ops are not recorded; derive the plan "
                 "before turning recomputation on");
    order.push_back(n);
    for (const Edge& e : n->next_edges)
      if (e.fn && dynamic_cast<AccumulateGrad*>(e.fn.get()) == nullptr) stack.push_back(e.fn.get());
  }
  std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return a->seq < b->seq; });
  Graph g;
  std::unordered_map<Node*, int> index;
  for (Node* n : order) {
    index[n] = int(g.nodes.size());
    GNode gn;
    gn.node = n;
    gn.name = n->name();
    gn.out_shape.resize(n->num_outputs);
    gn.consumers.resize(n->num_outputs);
    g.nodes.push_back(std::move(gn));
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node* n = g.nodes[i].node;
    for (size_t j = 0; j < n->next_edges.size(); ++j) {
      const Edge& e = n->next_edges[j];
      In in;
      if (j < n->input_meta.size()) in.shape = n->input_meta[j].shape;
      if (!e.fn) {
        in.kind = InKind::None;
      } else if (auto* acc = dynamic_cast<AccumulateGrad*>(e.fn.get())) {
        auto it = param_of.find(acc->leaf.get());
        in.kind = it == param_of.end() ? InKind::Leaf : InKind::Param;
        if (it != param_of.end()) in.param = it->second;
      } else {
        in.kind = InKind::Node;
        in.node = index.at(e.fn.get());
        in.nr = e.input_nr;
        GNode& p = g.nodes[size_t(in.node)];
        if (in.nr < p.out_shape.size()) {
          p.out_shape[in.nr] = in.shape;
          p.consumers[in.nr].emplace_back(int(i), int(j));
        }
      }
      g.nodes[i].in.push_back(std::move(in));
    }
  }
  g.root = index.at(root.fn.get());
  g.root_nr = root.input_nr;
  if (g.root_nr < g.nodes[size_t(g.root)].out_shape.size()) g.nodes[size_t(g.root)].out_shape[g.root_nr] = out.shape();
  return g;
}

// ---- Linear-like uses of a parameter -------------------------------------------------------------

// A product x W with a 2-D parameter: which dim of W is its output features
// (sharded by a column-parallel layer) and which its input features (row).
struct WeightUse {
  int param = -1;
  int col_dim = 0, row_dim = 1;
  int bias = -1;  // linear's own bias parameter, sharded with the output features
};

std::optional<WeightUse> weight_use(const Graph& g, const GNode& n, const std::vector<Dims>& param_shape) {
  if (n.in.size() < 2 || n.in[0].shape.size() < 1) return std::nullopt;
  const In& w = n.in[1];
  if (n.name == "linear" && w.kind == InKind::Param && param_shape[size_t(w.param)].size() == 2) {
    WeightUse u{w.param, 0, 1, -1};
    if (n.in.size() > 2 && n.in[2].kind == InKind::Param) u.bias = n.in[2].param;
    return u;
  }
  if (n.name != "matmul") return std::nullopt;
  if (w.kind == InKind::Param && param_shape[size_t(w.param)].size() == 2) return WeightUse{w.param, 1, 0, -1};
  if (w.kind == InKind::Node) {  // x W^T: the weight through a transpose
    const GNode& v = g.nodes[size_t(w.node)];
    const std::optional<ViewInfo> info = view_info(*v.node);
    if (info && info->kind == ViewInfo::Kind::Transpose && info->in_shape.size() == 2 && v.in.size() == 1 &&
        v.in[0].kind == InKind::Param)
      return WeightUse{v.in[0].param, 0, 1, -1};
  }
  return std::nullopt;
}

// ---- components: the values a column-parallel output reaches ------------------------------------

struct Component {
  int parent;
  bool failed = false;
  std::string why;                 // the first reason it failed
  std::vector<int> sources, sinks; // weight-use nodes: column, row
  int64_t vocab = -1;              // reaches cross_entropy's scores: the class count
  std::vector<std::pair<int, int>> params;  // other parameters sharded with it: (param, dim)
};

struct Label {
  int comp = -1;
  int dim = -1;
};

const std::set<std::string>& elementwise_names() {
  static const std::set<std::string> s = {
      "neg", "abs", "sign", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu",
      "gelu", "gelu_erf", "silu", "square", "reciprocal", "erf", "floor", "ceil", "round", "dropout", "to", "clone",
      "add", "sub", "mul", "div", "maximum", "minimum", "pow", "where", "softplus"};
  return s;
}

// Reshape: where the shard of input dim d lands (the groups of equal products
// the view's own sharding rule uses, autograd/tensor_methods.cc), if it stays one contiguous
// cut (it must be the first non-1 dim of its group of equal products).
int reshape_dim(const Dims& I, const Dims& O, int d) {
  if (numel_of(I) == 0) return -1;
  int i = 0, j = 0;
  while (i < I.size() || j < O.size()) {
    const int i0 = i, j0 = j;
    int64_t pi = 1, pj = 1;
    if (i < I.size()) pi *= I[i++];
    if (j < O.size()) pj *= O[j++];
    while (pi != pj) {
      if (pi < pj) {
        if (i >= I.size()) return -1;
        pi *= I[i++];
      } else {
        if (j >= O.size()) return -1;
        pj *= O[j++];
      }
    }
    if (d < i0 || d >= i) continue;
    if (i - i0 == 1 && j - j0 == 1) return j0;
    int i1 = i0, j1 = j0;
    while (i1 + 1 < i && I[i1] == 1) ++i1;
    while (j1 + 1 < j && O[j1] == 1) ++j1;
    if (d != i1 || j1 >= j || O[j1] <= 1) return -1;
    return (I[d] % O[j1] == 0 || O[j1] % I[d] == 0) ? j1 : -1;
  }
  return -1;
}

int view_dim(const ViewInfo& v, const Dims& out, int d) {
  const int n = v.in_shape.size();
  switch (v.kind) {
    case ViewInfo::Kind::Reshape: return reshape_dim(v.in_shape, v.shape, d);
    case ViewInfo::Kind::Transpose: return d == v.dim ? int(v.dim2) : d == v.dim2 ? int(v.dim) : d;
    case ViewInfo::Kind::Permute:
      for (int i = 0; i < v.shape.size(); ++i)
        if (v.shape[i] == d) return i;
      return -1;
    case ViewInfo::Kind::Unsqueeze: return d + (v.dim <= d ? 1 : 0);
    case ViewInfo::Kind::Squeeze: return v.dim < n && v.in_shape[int(v.dim)] == 1 && v.dim < d ? d - 1 : d;
    case ViewInfo::Kind::Slice: return v.dim == d ? -1 : d;
    case ViewInfo::Kind::Select: return v.dim == d ? -1 : v.dim < d ? d - 1 : d;
    case ViewInfo::Kind::Expand: {
      const int lead = out.size() - n;
      return lead >= 0 && out.size() > d + lead && out[d + lead] == v.in_shape[d] ? d + lead : -1;
    }
  }
  return -1;
}

class Deriver {
 public:
  Deriver(const Graph& g, std::vector<std::string> param_names, std::vector<Dims> param_shapes)
      : g_(g), names_(std::move(param_names)), shapes_(std::move(param_shapes)) {}

  void run() {
    labels_.resize(g_.nodes.size());
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      labels_[i].resize(g_.nodes[i].out_shape.size());
      visit(int(i));
    }
    const Label& r = labels_[size_t(g_.root)][g_.root_nr];
    if (r.comp >= 0) fail(r.comp, "is the traced output itself");
  }

  int find(int c) {
    while (comps_[size_t(c)].parent != c) c = comps_[size_t(c)].parent = comps_[size_t(comps_[size_t(c)].parent)].parent;
    return c;
  }
  const Component& comp(int c) { return comps_[size_t(find(c))]; }
  const std::vector<Component>& comps() const { return comps_; }
  const std::map<int, WeightUse>& uses() const { return uses_; }
  const std::map<int, int>& source_comp() const { return source_comp_; }
  const std::map<int, int>& sink_comp() const { return sink_comp_; }

 private:
  int make(int source) {
    Component c;
    c.parent = int(comps_.size());
    c.sources.push_back(source);
    comps_.push_back(c);
    source_comp_[source] = c.parent;
    return c.parent;
  }
  int merge(int a, int b) {
    a = find(a), b = find(b);
    if (a == b) return a;
    if (a > b) std::swap(a, b);
    Component& A = comps_[size_t(a)];
    Component& B = comps_[size_t(b)];
    B.parent = a;
    if (B.failed && !A.failed) A.failed = true, A.why = B.why;
    A.sources.insert(A.sources.end(), B.sources.begin(), B.sources.end());
    A.sinks.insert(A.sinks.end(), B.sinks.begin(), B.sinks.end());
    A.params.insert(A.params.end(), B.params.begin(), B.params.end());
    if (A.vocab < 0) A.vocab = B.vocab;
    return a;
  }
  void fail(int c, const std::string& why) {
    Component& C = comps_[size_t(find(c))];
    if (!C.failed) C.failed = true, C.why = why;
  }
  std::string where(const GNode& n) const {
    return fmt::format(FMT_STRING("{} {}"), n.name, n.out_shape.empty() ? Dims{} : n.out_shape[0]);
  }

  void visit(int i) {
    const GNode& n = g_.nodes[size_t(i)];
    std::vector<std::pair<int, Label>> lab;  // labelled inputs: (input index, label)
    for (size_t j = 0; j < n.in.size(); ++j) {
      const In& in = n.in[j];
      if (in.kind != InKind::Node) continue;
      const Label& l = labels_[size_t(in.node)][in.nr];
      if (l.comp >= 0) lab.emplace_back(int(j), Label{find(l.comp), l.dim});
    }
    if (std::optional<WeightUse> u = weight_use(g_, n, shapes_)) {
      uses_[i] = *u;
      bool sink = false;
      for (auto& [j, l] : lab) {
        if (j == 0 && l.dim == n.in[0].shape.size() - 1 && !comps_[size_t(find(l.comp))].failed) {
          Component& c = comps_[size_t(find(l.comp))];
          c.sinks.push_back(i);
          sink_comp_[i] = l.comp;
          sink = true;
        } else {
          fail(l.comp, fmt::format(FMT_STRING("reaches {} on a dim it does not contract"), where(n)));
        }
      }
      // A row-parallel layer's output is a pending sum: it starts nothing.
      if (!sink && n.out_shape.size() == 1 && n.out_shape[0].size() >= 1)
        labels_[size_t(i)][0] = Label{make(i), int(n.out_shape[0].size()) - 1};
      return;
    }
    if (lab.empty()) return;
    int c = lab[0].second.comp;
    for (auto& [j, l] : lab) c = merge(c, l.comp);
    if (comps_[size_t(c)].failed) return;
    std::string why;
    const int d = out_dim(n, lab, c, why);
    if (d == -2) return;  // a sink (cross_entropy)
    if (d < 0) {
      fail(c, why.empty() ? fmt::format(FMT_STRING("reaches {}"), where(n)) : why);
      return;
    }
    labels_[size_t(i)][0] = Label{c, d};
  }

  // The output dim the shard lands on; -1: not per feature (why says what);
  // -2: the value ends here as vocabulary-sharded scores.
  int out_dim(const GNode& n, const std::vector<std::pair<int, Label>>& lab, int c, std::string& why) {
    if (n.out_shape.size() != 1) return -1;
    const Dims& out = n.out_shape[0];
    const int on = out.size();
    auto in_dims = [&](int j) { return int(n.in[size_t(j)].shape.size()); };
    if (elementwise_names().count(n.name)) {
      int od = -1;
      for (auto& [j, l] : lab) {
        const int a = l.dim + on - in_dims(j);
        if (od >= 0 && a != od) return -1;
        od = a;
      }
      for (size_t j = 0; j < n.in.size(); ++j) {
        const In& in = n.in[j];
        if (in.kind == InKind::Node && labels_[size_t(in.node)][in.nr].comp < 0) {
          why = fmt::format(FMT_STRING("is combined by {} with a value of all features"), where(n));
          return -1;
        }
        if (in.kind == InKind::Leaf) return -1;
        if (in.kind == InKind::Param) {  // a bias or scale: sharded with the features it meets
          const int pd = od - (on - int(in.shape.size()));
          if (pd >= 0 && in.shape[pd] > 1) comps_[size_t(c)].params.emplace_back(in.param, pd);
        }
      }
      return od;
    }
    const int d = lab[0].second.dim;
    if (n.name == "view") {
      if (lab.size() != 1) return -1;
      std::optional<ViewInfo> v = view_info(*n.node);
      return v ? view_dim(*v, out, d) : -1;
    }
    if (n.name == "apply_rotary") return lab.size() == 1 && lab[0].first == 0 && d < in_dims(0) - 1 ? d : -1;
    if (n.name == "scaled_dot_product_attention") {
      // q, k, v sharded alike on a dim before (T, D): heads.
      if (n.in.size() < 3) return -1;
      for (int j = 0; j < 3; ++j) {
        const In& in = n.in[size_t(j)];
        if (in.kind != InKind::Node || labels_[size_t(in.node)][in.nr].dim != d) return -1;
      }
      return d < in_dims(0) - 2 ? d : -1;
    }
    if (n.name == "layer_norm" || n.name == "rms_norm") {
      // Over its trailing dims (a weight's shape, else one): per head when the shard is before them.
      const int k = n.in.size() > 1 && n.in[1].kind != InKind::None ? int(n.in[1].shape.size()) : 1;
      if (lab.size() != 1 || lab[0].first != 0 || d >= in_dims(0) - k) {
        why = fmt::format(FMT_STRING("reaches {}, which normalises over the sharded features"), where(n));
        return -1;
      }
      return d;
    }
    if (n.name == "cross_entropy" && lab.size() == 1 && lab[0].first == 0 && d == in_dims(0) - 1) {
      comps_[size_t(c)].vocab = n.in[0].shape[d];
      return -2;
    }
    return -1;
  }

  const Graph& g_;
  std::vector<std::string> names_;
  std::vector<Dims> shapes_;
  std::vector<Component> comps_;
  std::vector<std::vector<Label>> labels_;
  std::map<int, WeightUse> uses_;
  std::map<int, int> source_comp_, sink_comp_;
};

// ---- from per-path placements to regex rules -------------------------------------------------------

std::string escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (std::string("\\^$.|?*+()[]{}").find(ch) != std::string::npos) o += '\\';
    o += ch;
  }
  return o;
}

std::vector<std::string> split_path(const std::string& p) {
  std::vector<std::string> parts;
  size_t s = 0;
  while (true) {
    const size_t e = p.find('.', s);
    parts.push_back(p.substr(s, e == std::string::npos ? std::string::npos : e - s));
    if (e == std::string::npos) break;
    s = e + 1;
  }
  return parts;
}

bool is_index(const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; }

// Regex for each component (indices generalised to \d+), joined with "\.".
std::string join_parts(const std::vector<std::string>& parts) {
  std::string o;
  for (size_t i = 0; i < parts.size(); ++i) o += (i ? "\\." : "") + parts[i];
  return o;
}

// Rules matching exactly the paths of `chosen` (path -> value) among `all`
// paths: indices generalised where every path the pattern matches has the
// same value, then paths differing in one component merged into an
// alternation. `key` says when two values are the same.
template <class V>
std::vector<std::pair<std::string, V>> compress(const std::vector<std::pair<std::string, V>>& chosen,
                                                const std::vector<std::string>& all,
                                                const std::function<std::string(const V&)>& key) {
  std::map<std::string, std::string> value_of;  // path -> key
  for (auto& [p, v] : chosen) value_of[p] = key(v);
  // 1. generalise indices.
  std::vector<std::pair<std::vector<std::string>, V>> rules;  // components (regex), value
  std::set<std::string> done;
  for (auto& [p, v] : chosen) {
    std::vector<std::string> gen, exact;
    for (const std::string& c : split_path(p)) {
      gen.push_back(is_index(c) ? "\\d+" : escape(c));
      exact.push_back(escape(c));
    }
    const std::string pattern = join_parts(gen);
    if (done.count(pattern)) continue;
    const std::regex re = compile_regex(pattern);
    bool uniform = true;
    for (const std::string& q : all) {
      if (!std::regex_match(q, re)) continue;
      auto it = value_of.find(q);
      if (it == value_of.end() || it->second != key(v)) uniform = false;
    }
    if (uniform) {
      done.insert(pattern);
      rules.emplace_back(gen, v);
    } else {
      rules.emplace_back(exact, v);
    }
  }
  // 2. merge rules equal but for one component (the last that differs), same value.
  bool merged = true;
  while (merged) {
    merged = false;
    for (size_t a = 0; a < rules.size() && !merged; ++a) {
      // Only names under one parent merge (attn.(wq|wk|wv)), never top-level ones.
      for (int k = int(rules[a].first.size()) - 1; k >= 1 && !merged; --k) {
        std::vector<size_t> group{a};
        for (size_t b = a + 1; b < rules.size(); ++b) {
          if (rules[b].first.size() != rules[a].first.size() || key(rules[b].second) != key(rules[a].second)) continue;
          bool same = true;
          for (size_t i = 0; i < rules[a].first.size(); ++i)
            if (int(i) != k && rules[b].first[i] != rules[a].first[i]) same = false;
          if (same && rules[b].first[size_t(k)] != rules[a].first[size_t(k)]) group.push_back(b);
        }
        if (group.size() < 2) continue;
        std::vector<std::string> alts;
        for (size_t b : group) {
          std::string c = rules[b].first[size_t(k)];
          if (c.size() > 2 && c.front() == '(' && c.back() == ')') c = c.substr(1, c.size() - 2);
          alts.push_back(c);
        }
        rules[a].first[size_t(k)] = "(" + fmt::format(FMT_STRING("{}"), fmt::join(alts, "|")) + ")";
        for (size_t r = group.size(); r-- > 1;) rules.erase(rules.begin() + long(group[r]));
        merged = true;
      }
    }
  }
  std::vector<std::pair<std::string, V>> out;
  for (auto& [parts, v] : rules) out.emplace_back(join_parts(parts), v);
  return out;
}

std::string module_of(const std::string& param_path) {
  const size_t dot = param_path.rfind('.');
  return dot == std::string::npos ? std::string() : param_path.substr(0, dot);
}

// "layers.3.attn.wq" -> "layers.N.attn.wq": a report line per pattern, not per layer.
std::string generic(const std::string& path) {
  std::vector<std::string> parts = split_path(path);
  for (auto& p : parts)
    if (is_index(p)) p = "N";
  std::string o;
  for (size_t i = 0; i < parts.size(); ++i) o += (i ? "." : "") + parts[i];
  return o;
}

// Parameters of `model` swapped for Meta stand-ins that require grad, for the
// trace; the originals go back when this ends (also on an exception).
class MetaStandIns {
 public:
  explicit MetaStandIns(nn::Module& model) {
    for (auto& [path, slot] : model.parameter_slots()) {
      Tensor& t = *slot->tensor;
      TESSEL_CHECK(t.defined() && !t.is_distributed(), kOp,
                   "parameter '{}' is {}: derive the plan before laying the model out", path, t.defined() ? t.desc() : "undefined");
      saved_.emplace_back(&t, t);
      t = empty(t.shape(), TensorOptions(t.dtype()).with_device(kMeta)).requires_grad_(true);
      params.emplace_back(path, t);
    }
    for (auto& [path, slot] : model.buffer_slots()) {
      Tensor& t = *slot->tensor;
      if (!t.defined() || t.device().is_meta()) continue;
      TESSEL_CHECK(!t.is_distributed(), kOp, "buffer '{}' is {}: derive the plan before laying the model out", path,
                   t.desc());
      saved_.emplace_back(&t, t);
      t = empty(t.shape(), TensorOptions(t.dtype()).with_device(kMeta));
    }
  }
  ~MetaStandIns() {
    for (auto& [slot, t] : saved_) *slot = t;
  }
  MetaStandIns(const MetaStandIns&) = delete;
  MetaStandIns& operator=(const MetaStandIns&) = delete;
  std::vector<std::pair<std::string, Tensor>> params;

 private:
  std::vector<std::pair<Tensor*, Tensor>> saved_;
};

// Module paths that are blocks: the items of a ModuleList.
std::set<std::string> block_paths(nn::Module& model) {
  std::set<std::string> blocks;
  for (auto& [path, m] : model.named_modules()) {
    if (dynamic_cast<nn::ModuleList*>(m) == nullptr) continue;
    for (auto& [name, child] : m->named_children()) blocks.insert(path.empty() ? name : path + "." + name);
  }
  return blocks;
}

}  // namespace

std::string DeriveReport::str() const {
  std::string s;
  for (const auto& f : found) s += "  " + f + "\n";
  for (const auto& r : replicated) s += "  replicated: " + r + "\n";
  return s;
}

ParallelPlan derive_plan(nn::Module& model, const std::function<Tensor()>& forward, const DeriveOptions& options,
                         DeriveReport* report) {
  TESSEL_CHECK(forward != nullptr, kOp, "needs a forward to trace");
  DeriveReport local_report;
  DeriveReport& rep = report ? *report : local_report;
  rep = DeriveReport{};

  // ---- trace one forward on Meta ---------------------------------------------------------------------
  std::vector<std::string> names;
  std::vector<Dims> shapes;
  std::unordered_map<const TensorImpl*, int> param_of;
  Graph g;
  Tensor out;  // holds the recorded graph (g points into it) until the plan is made
  {
    MetaStandIns meta(model);
    for (auto& [path, t] : meta.params) {
      param_of[t.impl_ptr().get()] = int(names.size());
      names.push_back(path);
      shapes.push_back(t.shape());
    }
    EnableGradGuard grad;
    try {
      out = forward();
    } catch (const Error& e) {
      TESSEL_FAIL(kOp, "tracing the model's forward on Meta failed (inputs must be Meta tensors): {}", e.what());
    }
    TESSEL_CHECK(out.defined(), kOp, "the traced forward returned an undefined tensor");
    g = read_graph(out, param_of);
  }
  // The trace was not one of the model's forwards: it leaves no state behind.
  for (nn::MoE* m : nn::moe_layers(model)) m->forget_last_forward();

  Deriver d(g, names, shapes);
  d.run();

  // ---- placements per parameter ------------------------------------------------------------------------
  std::map<int, std::set<int>> votes;  // param -> dims asked for
  std::map<std::string, int> replicated_lines;  // parameters left replicated, with why (report lines)
  std::map<int, std::vector<std::string>> voters;
  auto vote = [&](int param, int dim, const std::string& why) {
    votes[param].insert(dim);
    voters[param].push_back(why);
  };
  std::set<int64_t> vocabs;
  std::map<std::string, int> found_lines;  // generic line -> count
  std::set<int> done;
  for (size_t c = 0; c < d.comps().size(); ++c) {
    const Component& comp = d.comp(int(c));
    const int root = d.find(int(c));
    if (done.count(root)) continue;
    done.insert(root);
    if (comp.failed || (comp.sinks.empty() && comp.vocab < 0)) continue;
    std::vector<std::string> cols, rows;
    for (int s : comp.sources) {
      const WeightUse& u = d.uses().at(s);
      vote(u.param, u.col_dim, "column");
      if (u.bias >= 0) vote(u.bias, 0, "column bias");
      cols.push_back(generic(module_of(names[size_t(u.param)])));
    }
    for (auto& [p, dim] : comp.params) vote(p, dim, "with a column layer");
    for (int s : comp.sinks) {
      const WeightUse& u = d.uses().at(s);
      vote(u.param, u.row_dim, "row");
      rows.push_back(generic(module_of(names[size_t(u.param)])));
    }
    if (comp.vocab >= 0) vocabs.insert(comp.vocab);
    std::sort(cols.begin(), cols.end());
    cols.erase(std::unique(cols.begin(), cols.end()), cols.end());
    std::string line = fmt::format(FMT_STRING("column {}"), fmt::join(cols, ", "));
    if (!rows.empty()) line += fmt::format(FMT_STRING(" -> row {}"), fmt::join(rows, ", "));
    if (comp.vocab >= 0) line += fmt::format(FMT_STRING(" -> cross_entropy (vocabulary {} sharded)"), comp.vocab);
    ++found_lines[line];
  }
  // Embeddings of a vocabulary the loss shards. A table with as many rows
  // as the vocabulary can also be a position embedding (NanoGPT small: 256
  // tokens of context, 256 of vocabulary); its lookups are shared by the
  // batch ([T] or [1, T] positions), so its output is smaller than the token
  // embedding's [B, T, C]: per vocabulary, only the largest outputs count.
  std::map<int64_t, int64_t> largest;  // vocabulary -> the largest lookup output (elements)
  std::vector<std::pair<int, int64_t>> lookups;  // (param, output elements)
  for (const GNode& n : g.nodes) {
    if (n.name != "embedding" || n.in.empty() || n.in[0].kind != InKind::Param) continue;
    const int p = n.in[0].param;
    if (shapes[size_t(p)].size() != 2 || !vocabs.count(shapes[size_t(p)][0]) || n.out_shape.empty()) continue;
    const int64_t elements = numel_of(n.out_shape[0]);
    lookups.emplace_back(p, elements);
    int64_t& l = largest[shapes[size_t(p)][0]];
    l = std::max(l, elements);
  }
  std::vector<std::string> token_embeddings;
  for (auto& [p, elements] : lookups) {
    const std::string module = module_of(names[size_t(p)]);
    if (elements < largest[shapes[size_t(p)][0]]) {
      ++replicated_lines[fmt::format(FMT_STRING("{}: a table of the vocabulary's size whose lookups the batch shares "
                                                "(positions, not tokens)"),
                                     generic(module))];
      continue;
    }
    if (std::find(token_embeddings.begin(), token_embeddings.end(), module) != token_embeddings.end()) continue;
    vote(p, 0, "vocabulary parallel");
    token_embeddings.push_back(module);
    ++found_lines[fmt::format(FMT_STRING("vocabulary-parallel embedding {}"), generic(module))];
  }
  for (auto& [line, count] : found_lines) rep.found.push_back(count > 1 ? fmt::format(FMT_STRING("{} (x{})"), line, count) : line);

  std::vector<std::pair<std::string, DimLayout>> chosen;
  for (auto& [p, dims] : votes) {
    if (dims.size() == 1) {
      chosen.emplace_back(names[size_t(p)], DimLayout{{{options.tp, Shard(*dims.begin())}}});
    } else {
      ++replicated_lines[fmt::format(FMT_STRING("{}: its uses ask for different layouts ({})"),
                                     generic(names[size_t(p)]), fmt::join(voters[p], ", "))];
    }
  }
  // Linear layers that fit no pattern, with what their output met.
  for (auto& [node, u] : d.uses()) {
    if (votes.count(u.param)) continue;
    std::string why = "its output reaches no other Linear or loss through per-feature ops";
    if (auto it = d.source_comp().find(node); it != d.source_comp().end() && d.comp(it->second).failed)
      why = "its output " + d.comp(it->second).why;
    ++replicated_lines[fmt::format(FMT_STRING("{}: {}"), generic(module_of(names[size_t(u.param)])), why)];
  }
  // Parameters the trace never reached get no rule of their own (a rule for
  // their siblings may still match them): say so.
  std::vector<bool> reached(names.size(), false);
  for (const GNode& n : g.nodes)
    for (const In& in : n.in)
      if (in.kind == InKind::Param) reached[size_t(in.param)] = true;
  for (size_t p = 0; p < names.size(); ++p)
    if (!reached[p])
      ++replicated_lines[fmt::format(FMT_STRING("{}: not reached by the traced forward (give it more tokens?)"),
                                     generic(names[p]))];
  for (auto& [line, count] : replicated_lines)
    rep.replicated.push_back(count > 1 ? fmt::format(FMT_STRING("{} (x{})"), line, count) : line);
  // Original parameter order (the rules read top to bottom as the model does).
  std::map<std::string, size_t> order;
  for (size_t i = 0; i < names.size(); ++i) order[names[i]] = i;
  std::sort(chosen.begin(), chosen.end(), [&](auto& a, auto& b) { return order[a.first] < order[b.first]; });

  ParallelPlan plan;
  plan.name = options.name;
  const std::function<std::string(const DimLayout&)> layout_key = [](const DimLayout& l) { return l.str(); };
  for (auto& [re, layout] : compress<DimLayout>(chosen, names, layout_key)) plan.params.push_back({re, layout});

  // ---- experts ---------------------------------------------------------------------------------------
  std::vector<std::string> module_names;
  for (auto& [path, m] : model.named_modules()) module_names.push_back(path);
  std::vector<std::pair<std::string, std::string>> moe;
  for (auto& [path, m] : model.named_modules())
    if (dynamic_cast<nn::MoE*>(m) != nullptr) moe.emplace_back(path, options.ep);
  const std::function<std::string(const std::string&)> same = [](const std::string& s) { return s; };
  for (auto& [re, dim] : compress<std::string>(moe, module_names, same)) plan.experts.push_back({re, dim});
  if (!moe.empty())
    rep.found.push_back(fmt::format(FMT_STRING("experts of {} MoE layer(s) over {}"), moe.size(), options.ep));

  // ---- sequence parallelism ------------------------------------------------------------------------------
  if (options.sequence_parallel) {
    TESSEL_CHECK(token_embeddings.size() == 1, kOp,
                 "sequence parallelism needs one token embedding sharing the loss's vocabulary; found {} ({})",
                 token_embeddings.size(), fmt::join(token_embeddings, ", "));
    // The residual stream: the embedding's output.
    for (const GNode& n : g.nodes)
      if (n.name == "embedding" && n.in[0].kind == InKind::Param &&
          module_of(names[size_t(n.in[0].param)]) == token_embeddings[0])
        TESSEL_CHECK(!n.out_shape.empty() && n.out_shape[0].size() == 3, kOp,
                     "sequence parallelism shards a [B, T, C] residual stream along T; '{}' gives {}",
                     token_embeddings[0], n.out_shape.empty() ? Dims{} : n.out_shape[0]);
    // The norm before the LM head: what produces the head's input.
    std::string final_norm;
    for (size_t c = 0; c < d.comps().size(); ++c) {
      const Component& comp = d.comp(int(c));
      if (comp.failed || comp.vocab < 0) continue;
      for (int s : comp.sources) {
        const In& x = g.nodes[size_t(s)].in[0];
        if (x.kind != InKind::Node) continue;
        const GNode& prod = g.nodes[size_t(x.node)];
        for (const In& in : prod.in)
          if (in.kind == InKind::Param) final_norm = module_of(names[size_t(in.param)]);
        TESSEL_CHECK(prod.name == "layer_norm" || prod.name == "rms_norm", kOp,
                     "sequence parallelism gathers the sequence at the norm before the LM head; the head's input "
                     "comes from {}",
                     prod.name);
      }
    }
    TESSEL_CHECK(!final_norm.empty(), kOp, "sequence parallelism: found no norm with a weight before the LM head");
    // Sublayers: the child of a block holding each column/row pair.
    const std::set<std::string> blocks = block_paths(model);
    std::vector<std::pair<std::string, int>> sublayers, gathers, scatters;
    std::set<std::string> seen;
    for (size_t c = 0; c < d.comps().size(); ++c) {
      const Component& comp = d.comp(int(c));
      if (comp.failed || comp.sinks.empty()) continue;
      std::vector<std::string> common;
      bool first = true;
      for (const std::vector<int>* list : {&comp.sources, &comp.sinks}) {
        for (int s : *list) {
          std::vector<std::string> parts = split_path(module_of(names[size_t(d.uses().at(s).param)]));
          if (first) {
            common = parts, first = false;
            continue;
          }
          size_t k = 0;
          while (k < common.size() && k < parts.size() && common[k] == parts[k]) ++k;
          common.resize(k);
        }
      }
      std::string sub;
      for (size_t k = 0; k + 1 < common.size(); ++k) {
        std::string prefix;
        for (size_t i = 0; i <= k; ++i) prefix += (i ? "." : "") + common[i];
        if (blocks.count(prefix)) {
          sub = prefix + "." + common[k + 1];
          break;
        }
      }
      if (!sub.empty()) {
        if (seen.insert(sub).second) sublayers.emplace_back(sub, 0);
        continue;
      }
      // No sublayer holds the pair alone (its Linears are the block's own
      // children, or it is in no block): the column layers gather their
      // input and the row layers scatter their output themselves. Same
      // values; two column layers sharing an input gather it twice.
      for (int src : comp.sources) {
        const std::string m = module_of(names[size_t(d.uses().at(src).param)]);
        if (seen.insert(m).second) gathers.emplace_back(m, 0);
      }
      for (int snk : comp.sinks) {
        const std::string m = module_of(names[size_t(d.uses().at(snk).param)]);
        if (seen.insert(m).second) scatters.emplace_back(m, 0);
      }
    }
    const std::function<std::string(const int&)> nokey = [](const int&) { return std::string(); };
    const DimLayout seq{{{options.tp, Shard(1)}}}, whole{{{options.tp, Replicate()}}};
    plan.modules.push_back({escape(token_embeddings[0]), {}, seq});
    for (auto& [re, unused] : compress<int>(sublayers, module_names, nokey)) plan.modules.push_back({re, whole, seq});
    for (auto& [re, unused] : compress<int>(gathers, module_names, nokey)) plan.modules.push_back({re, whole, {}});
    for (auto& [re, unused] : compress<int>(scatters, module_names, nokey)) plan.modules.push_back({re, {}, seq});
    plan.modules.push_back({escape(final_norm), {}, whole});
    std::string line = fmt::format(FMT_STRING("sequence parallel: {} -> {} sublayer(s)"), token_embeddings[0],
                                   sublayers.size());
    if (!gathers.empty())
      line += fmt::format(FMT_STRING(", {} column layer(s) gathering and {} row layer(s) scattering themselves"),
                          gathers.size(), scatters.size());
    rep.found.push_back(line + " -> " + final_norm);
  }
  return plan;
}

ParallelPlan derive_plan(nn::StagedModel& model, const DeriveOptions& options, DeriveReport* report) {
  const Tensor example = model.example_input();
  TESSEL_CHECK(example.defined() && example.dim() >= 1, kOp, "'{}': example_input() gives no tensor to trace with",
               model.type_name());
  Dims shape = example.shape();
  // Two sequences, and enough tokens that every expert of an MoE layer gets
  // one under the balanced routing of a Meta trace (nn::routing_choice).
  int64_t batch = 2;
  const int64_t tokens_per_sequence = std::max<int64_t>(1, numel_of(shape) / std::max<int64_t>(1, shape[0]));
  for (nn::MoE* m : nn::moe_layers(model))
    batch = std::max(batch, (m->config.num_experts + m->config.top_k * tokens_per_sequence - 1) /
                                (m->config.top_k * tokens_per_sequence));
  shape[0] = batch;
  const Tensor ids = empty(shape, TensorOptions(example.dtype()).with_device(kMeta));
  return derive_plan(
      model, [&] { return model.loss(model.forward(ids), ids); }, options, report);
}

std::string plan_layout(const ParallelPlan& plan, const nn::Module& model) {
  std::string s;
  std::vector<std::regex> pre, mre, ere;
  for (const ParamRule& r : plan.params) pre.push_back(compile_regex(r.match));
  for (const ModuleRule& r : plan.modules) mre.push_back(compile_regex(r.match));
  for (const ExpertRule& r : plan.experts) ere.push_back(compile_regex(r.match));
  for (auto& [path, slot] : model.parameter_slots()) {
    for (size_t i = 0; i < pre.size(); ++i) {
      if (!std::regex_match(path, pre[i])) continue;
      bool replicated = true;  // a rule that keeps everything replicated lays nothing out
      for (const auto& [dim, p] : plan.params[i].layout.dims) replicated = replicated && p.is_replicate();
      if (!replicated) s += fmt::format(FMT_STRING("param {} {}\n"), path, plan.params[i].layout.str());
      break;
    }
  }
  for (auto& [path, m] : model.named_modules()) {
    for (size_t i = 0; i < mre.size(); ++i)
      if (std::regex_match(path, mre[i]))
        s += fmt::format(FMT_STRING("module {} input {} output {}\n"), path, plan.modules[i].input.str(),
                         plan.modules[i].output.str());
    for (size_t i = 0; i < ere.size(); ++i)
      if (std::regex_match(path, ere[i])) s += fmt::format(FMT_STRING("experts {} over {}\n"), path, plan.experts[i].dim);
  }
  s += "data " + plan.data.str() + "\n";
  return s;
}

}  // namespace tessel::parallel
