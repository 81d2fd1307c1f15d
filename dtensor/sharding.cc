#include "dtensor/sharding.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "runtime/numerics.h"

namespace tessel::dtensor {

ShardingPlan replicate(const ShardingContext& ctx) {
  ShardingPlan p;
  const Placements r = Placements::replicated(ctx.mesh_ndim());
  p.in.assign(ctx.in.size(), r);
  p.out.assign(ctx.out.size(), r);
  return p;
}

ShardingPlan pointwise(const ShardingContext& ctx, std::initializer_list<uint32_t> linear_sets) {
  const Dims& oshape = ctx.out[0].shape;
  const int on = oshape.size();
  const int ni = int(ctx.in.size());
  ShardingPlan plan;
  plan.in.resize(size_t(ni));
  plan.out.resize(1);
  // Output dim of input i's dim di, or -1 when that dim broadcasts.
  auto out_dim = [&](int i, int di) {
    const TensorSpec& s = ctx.in[size_t(i)];
    int od = di + (on - s.dim());
    return (s.shape[di] == oshape[od] || oshape[od] == 1) ? od : -1;
  };
  for (int m = 0; m < ctx.mesh_ndim(); ++m) {
    // 1. A shard to follow: from the largest input sharding a non-broadcast dim.
    // Its placement is copied (dim adjusted), so ShardOn stays ShardOn.
    int od = -1;
    int64_t best = -1;
    Placement follow;
    for (int i = 0; i < ni; ++i) {
      const TensorSpec& s = ctx.in[size_t(i)];
      if (!s.defined || !s.placements[m].is_shard()) continue;
      int o = out_dim(i, s.placements[m].dim);
      if (o < 0) continue;
      int64_t n = numel_of(s.shape);
      if (n > best) best = n, od = o, follow = s.placements[m];
    }
    if (od >= 0) {
      for (int i = 0; i < ni; ++i) {
        const TensorSpec& s = ctx.in[size_t(i)];
        if (!s.defined) {
          plan.in[size_t(i)].push_back(Replicate());
          continue;
        }
        int di = od - (on - s.dim());
        bool has = di >= 0 && s.shape[di] == oshape[od];
        Placement p = follow;
        p.dim = int8_t(di);
        plan.in[size_t(i)].push_back(has ? p : Replicate());
      }
      follow.dim = int8_t(od);
      plan.out[0].push_back(follow);
      continue;
    }
    // 2. Partial inputs of a linear op.
    uint32_t partial = 0;
    for (int i = 0; i < ni; ++i) {
      const TensorSpec& s = ctx.in[size_t(i)];
      if (s.defined && s.placements[m].is_partial_sum()) partial |= 1u << i;
    }
    bool keep = false;
    if (partial) {
      for (uint32_t set : linear_sets) {
        uint32_t defined = 0;
        for (int i = 0; i < ni; ++i)
          if (ctx.in[size_t(i)].defined) defined |= 1u << i;
        if ((set & defined) == partial) keep = true;
      }
    }
    for (int i = 0; i < ni; ++i)
      plan.in[size_t(i)].push_back(keep && (partial >> i & 1u) ? Partial() : Replicate());
    plan.out[0].push_back(keep ? Partial() : Replicate());
  }
  return plan;
}

ShardingPlan pointwise_exact(const ShardingContext& ctx, std::initializer_list<uint32_t> linear_sets, bool exact) {
  if (numerics::bitwise() && !exact) return pointwise(ctx);
  return pointwise(ctx, linear_sets);
}

int local_chunks(const Dims& shape, const Placements& p, const Mesh& mesh, const std::vector<int>& all_dims, int v) {
  // Reduced dims of size 1 change no element's place in the flattened order
  // (a micro-batch of one sequence cut along time is a contiguous run).
  std::vector<int> dims;
  for (int d : all_dims)
    if (shape[d] != 1) dims.push_back(d);
  if (dims.empty()) return v;
  // The mesh dims that cut a reduced dim (index into `dims`), in mesh order.
  struct Cut {
    int m, i;
  };
  std::vector<Cut> cuts;
  for (int m = 0; m < p.size(); ++m) {
    if (!p[m].is_shard() || mesh.size(m) == 1) continue;
    for (size_t i = 0; i < dims.size(); ++i)
      if (p[m].dim == dims[i]) cuts.push_back({m, int(i)});
  }
  if (cuts.empty()) return v;
  int64_t w = 1;
  for (const Cut& c : cuts) w *= mesh.size(c.m);
  if (w > v || v % w != 0) return 0;
  const size_t nd = dims.size();
  std::vector<int64_t> unit(nd, 1);  // flattened stride of each reduced dim
  for (size_t i = nd - 1; i-- > 0;) unit[i] = unit[i + 1] * shape[dims[i + 1]];
  const int64_t n = shape[dims[0]] * unit[0];
  // Every piece, in nested order (outer mesh dim major), as [start, length)
  // per reduced dim; then as one run [off, off + len) of the flattened order,
  // which it must be: the dims before some j of length 1, those after it
  // whole (a cut on d0 alone; or, with every outer reduced dim cut down to
  // single indices, a cut inside one of them -- one sequence per rank cut
  // along time). The runs must tile [0, n) in that order, as the
  // collectives' rank-order tree combines them.
  struct Box {
    std::vector<int64_t> start, len;
  };
  std::vector<Box> boxes{{std::vector<int64_t>(nd, 0), std::vector<int64_t>(nd)}};
  for (size_t i = 0; i < nd; ++i) boxes[0].len[i] = shape[dims[i]];
  for (const Cut& c : cuts) {
    std::vector<Box> next;
    for (const Box& b : boxes)
      for (int64_t x = 0; x < mesh.size(c.m); ++x) {
        Box piece = b;
        const Range r = chunk_range(b.len[size_t(c.i)], mesh.size(c.m), x);
        piece.start[size_t(c.i)] += r.begin;
        piece.len[size_t(c.i)] = r.size();
        next.push_back(std::move(piece));
      }
    boxes = std::move(next);
  }
  struct Piece {
    int64_t off, len;  // flattened
  };
  std::vector<Piece> pieces;
  int64_t end = 0;
  for (const Box& b : boxes) {
    int64_t len = 1, off = 0;
    for (size_t i = 0; i < nd; ++i) len *= b.len[i], off += b.start[i] * unit[i];
    if (len == 0) {
      pieces.push_back({end, 0});
      continue;
    }
    size_t j = 0;
    while (j < nd && b.len[j] == 1) ++j;
    for (size_t i = j + 1; i < nd; ++i)
      if (b.len[i] != shape[dims[i]]) return 0;  // not one run of the flattened order
    if (off != end) return 0;                      // the runs out of the collectives' order
    pieces.push_back({off, len});
    end = off + len;
  }
  if (end != n) return 0;
  // Piece i must own global chunks [i*k, (i+1)*k) with its own k-chunk
  // geometry. k = V/W is the plain case; a smaller power of two k works when
  // every global chunk from W*k on is empty (a short reduction, n < V...):
  // the pieces then finish the subtree of the first W*k chunks, and the rest
  // of the tree only adds +0 subtrees, which change no value (a canonical sum
  // is never -0: every lane starts at +0).
  for (int k = int(v / w); k >= 1; k /= 2) {
    if (k < v / w && numerics::chunk_begin(n, v, int(w) * k) != n) break;
    bool ok = true;
    for (size_t i = 0; i < pieces.size() && ok; ++i) {
      const int64_t off = pieces[i].off, len = pieces[i].len;
      for (int j = 0; j < k && ok; ++j) {
        const int g = int(i) * k + j;
        ok = off + numerics::chunk_begin(len, k, j) == numerics::chunk_begin(n, v, g) &&
             off + numerics::chunk_end(len, k, j) == numerics::chunk_end(n, v, g);
      }
    }
    if (ok) return k;
  }
  if (std::getenv("TESSEL_DEBUG_CHUNKS")) {
    std::string d;
    for (int x : dims) d += std::to_string(x) + ",";
    std::fprintf(stderr, "local_chunks: not exact: shape %s dims {%s} placements %s V %d\n", fmt::format(FMT_STRING("{}"), shape).c_str(),
                 d.c_str(), p.str().c_str(), v);
  }
  return 0;
}

std::vector<int> pointwise_backward_chunks(const ShardingContext& ctx, ShardingPlan& plan) {
  const int v = numerics::reduction_chunks();
  const Dims& oshape = ctx.out[0].shape;
  const int on = oshape.size(), ni = int(ctx.in.size());
  std::vector<int> chunks(static_cast<size_t>(ni), v);
  for (int guard = 0; guard <= ctx.mesh_ndim(); ++guard) {
    int bad = -1;
    for (int i = 0; i < ni && bad < 0; ++i) {
      const TensorSpec& s = ctx.in[size_t(i)];
      chunks[size_t(i)] = v;
      if (!s.defined || !is_floating(s.dtype)) continue;
      std::vector<int> reduced;
      for (int od = 0; od < on; ++od) {
        const int di = od - (on - s.dim());
        if (di < 0 || (s.shape[di] == 1 && oshape[od] != 1)) reduced.push_back(od);
      }
      const int k = local_chunks(oshape, plan.out[0], *ctx.mesh, reduced, v);
      if (k > 0) {
        chunks[size_t(i)] = k;
        continue;
      }
      for (int m = 0; m < ctx.mesh_ndim() && bad < 0; ++m)
        for (int od : reduced)
          if (plan.out[0][m].is_shard(od)) bad = m;
    }
    if (bad < 0) return chunks;
    for (auto& p : plan.in) p[bad] = Replicate();
    plan.out[0][bad] = Replicate();
  }
  TESSEL_FAIL(ctx.op, "internal error: no exact layout for the backward reductions");
}

namespace {

// Einsum letters as small ids: 'a'-'z' 0-25, 'A'-'Z' 26-51; the dims "..."
// stands for are 52 + j, j counted from the innermost, so that they line up
// from the right across operands. A uint64_t is a set of ids.
constexpr int kEllipsisId = 52;
static_assert(kEllipsisId + kMaxDims <= 64, "einsum letter ids must fit a 64-bit set");
// The rule runs on every distributed call of its op (docs/distributed.md,
// "Dispatch overhead"): the spec is parsed and bound into fixed arrays, and
// strings are only built for an error.
constexpr int kMaxEinsumInputs = 8;

int letter_id(char c) {
  if (c >= 'a' && c <= 'z') return c - 'a';
  if (c >= 'A' && c <= 'Z') return 26 + (c - 'A');
  return -1;
}

std::string letter_name(int id) {
  if (id < 26) return std::string(1, char('a' + id));
  if (id < kEllipsisId) return std::string(1, char('A' + id - 26));
  return TESSEL_FORMAT("...[-{}]", id - kEllipsisId + 1);  // the j-th "..." dim from the inside
}

// One operand of a parsed spec: where it is in the text, whether it opens
// with "...", and the ids of its letters.
struct SpecOperand {
  int begin = 0, end = 0;  // [begin, end) in the spec
  bool ellipsis = false;
  int n = 0;
  int8_t ids[kMaxDims] = {};
};

struct ParsedSpec {
  SpecOperand in[kMaxEinsumInputs];
  int ni = 0;
  SpecOperand out;
};

std::string operand_text(const char* spec, const SpecOperand& o) {
  return std::string(spec + o.begin, size_t(o.end - o.begin));
}

ParsedSpec parse_spec(const char* spec, const char* op) {
  TESSEL_CHECK(spec != nullptr, op, "einsum spec is null");
  auto fail = [&](const std::string& why) { TESSEL_FAIL(op, "einsum spec \"{}\": {}", spec, why); };
  const char* arrow = std::strstr(spec, "->");
  if (arrow == nullptr || std::strstr(arrow + 2, "->") != nullptr)
    fail("needs exactly one \"->\" between the inputs and the output, e.g. \"mk,kn->mn\"");
  const int lhs_end = int(arrow - spec);
  // Reads o's letters; returns them as a set.
  auto read = [&](SpecOperand& o, int index) -> uint64_t {
    auto what = [&] {
      return (index < 0 ? std::string("the output") : "input " + std::to_string(index)) + " \"" +
             operand_text(spec, o) + "\"";
    };
    int c = o.begin;
    if (o.end - c >= 3 && std::strncmp(spec + c, "...", 3) == 0) o.ellipsis = true, c += 3;
    uint64_t seen = 0;
    for (; c < o.end; ++c) {
      const char ch = spec[c];
      if (ch == '.') fail(what() + ": \"...\" may only open an operand (leading batch dims)");
      const int id = letter_id(ch);
      if (id < 0) fail(what() + ": '" + std::string(1, ch) + "' is not a letter (a-z, A-Z)");
      if (seen >> id & 1u) fail(what() + ": letter '" + std::string(1, ch) + "' repeats (no diagonals)");
      if (o.n == kMaxDims) fail(what() + ": more letters than a tensor has dims");
      seen |= uint64_t(1) << id;
      o.ids[o.n++] = int8_t(id);
    }
    return seen;
  };
  ParsedSpec ps;
  uint64_t in_letters = 0;
  bool in_ellipsis = false;
  for (int begin = 0;;) {
    int end = begin;
    while (end < lhs_end && spec[end] != ',') ++end;
    if (ps.ni == kMaxEinsumInputs) fail(TESSEL_FORMAT("more than {} inputs", kMaxEinsumInputs));
    SpecOperand& o = ps.in[ps.ni];
    o.begin = begin, o.end = end;
    in_letters |= read(o, ps.ni);
    in_ellipsis = in_ellipsis || o.ellipsis;
    ++ps.ni;
    if (end == lhs_end) break;
    begin = end + 1;
  }
  ps.out.begin = lhs_end + 2;
  ps.out.end = int(std::strlen(spec));
  const uint64_t out_letters = read(ps.out, -1);
  if (out_letters & ~in_letters) {
    int id = 0;
    while (!((out_letters & ~in_letters) >> id & 1u)) ++id;
    fail("output letter '" + letter_name(id) + "' is in no input");
  }
  if (in_ellipsis != ps.out.ellipsis)
    fail(in_ellipsis ? "an input has \"...\" but the output does not (batch dims are kept, not summed)"
                     : "the output has \"...\" but no input does");
  return ps;
}

// One operand bound to its tensor: the letter id of each dim ("..."
// expanded), and the set of letters it has at full size (a size-1 dim that
// broadcasts does not count).
struct Bound {
  int n = 0;
  int8_t ids[kMaxDims] = {};
  uint64_t has = 0;
  int pos(int id) const {
    for (int d = 0; d < n; ++d)
      if (ids[d] == id) return d;
    return -1;
  }
};

struct BoundSpec {
  Bound ops[kMaxEinsumInputs + 1];  // 0 the output, 1 + i input i
  int64_t size[64];                 // per letter id
};

// The spec bound to ctx's shapes; throws naming the op, the spec and the shapes.
BoundSpec bind_einsum(const ShardingContext& ctx, const char* spec) {
  const ParsedSpec ps = parse_spec(spec, ctx.op);
  const int ni = int(ctx.in.size());
  auto shapes = [&] {
    std::string s;
    for (const TensorSpec& t : ctx.in) s += TESSEL_FORMAT("{}{}", s.empty() ? "" : " x ", t.shape);
    return s;
  };
  TESSEL_CHECK(ps.ni == ni && ctx.out.size() == 1, ctx.op,
               "einsum spec \"{}\" has {} input(s) and one output; the op has {} and {}", spec, ps.ni, ni,
               ctx.out.size());
  BoundSpec b;
  std::fill(b.size, b.size + 64, int64_t(1));
  int in_batch = 0;  // the most leading dims any input's "..." stands for
  for (int k = 1; k <= ni + 1; ++k) {  // the inputs, then the output
    const int o = k % (ni + 1);
    const SpecOperand& so = o == 0 ? ps.out : ps.in[o - 1];
    const TensorSpec& t = o == 0 ? ctx.out[0] : ctx.in[size_t(o - 1)];
    TESSEL_CHECK(o == 0 || t.defined, ctx.op, "einsum spec \"{}\": input {} is undefined", spec, o - 1);
    const int batch = t.dim() - so.n;
    TESSEL_CHECK(so.ellipsis ? batch >= 0 : batch == 0, ctx.op,
                 "einsum spec \"{}\" does not fit operands {}: {} \"{}\" names {} dim(s){} but has shape {}", spec,
                 shapes(), o == 0 ? std::string("the output") : TESSEL_FORMAT("input {}", o - 1),
                 operand_text(spec, so), so.n, so.ellipsis ? " after \"...\"" : "", t.shape);
    Bound& bd = b.ops[o];
    for (int j = batch - 1; j >= 0; --j) bd.ids[bd.n++] = int8_t(kEllipsisId + j);
    for (int c = 0; c < so.n; ++c) bd.ids[bd.n++] = so.ids[c];
    if (o > 0) in_batch = std::max(in_batch, batch);
  }
  // Letter sizes: the one size other than 1 that the inputs give it (else 1).
  for (int o = 1; o <= ni; ++o) {
    const Dims& shape = ctx.in[size_t(o - 1)].shape;
    for (int d = 0; d < b.ops[o].n; ++d) {
      const int id = b.ops[o].ids[d];
      const int64_t n = shape[d];
      TESSEL_CHECK(n == 1 || b.size[id] == 1 || b.size[id] == n, ctx.op,
                   "einsum spec \"{}\" does not fit operands {}: letter {} has sizes {} and {}", spec, shapes(),
                   letter_name(id), b.size[id], n);
      if (n != 1) b.size[id] = n;
    }
  }
  uint64_t in_has = 0;
  for (int o = 0; o <= ni; ++o) {
    const Dims& shape = o == 0 ? ctx.out[0].shape : ctx.in[size_t(o - 1)].shape;
    for (int d = 0; d < b.ops[o].n; ++d)
      if (shape[d] == b.size[b.ops[o].ids[d]]) b.ops[o].has |= uint64_t(1) << b.ops[o].ids[d];
    if (o > 0) in_has |= b.ops[o].has;
  }
  // The output: as many leading dims as the inputs have, each letter the size they give it.
  const Dims& oshape = ctx.out[0].shape;
  bool out_ok = !ps.out.ellipsis || b.ops[0].n - ps.out.n == in_batch;
  for (int d = 0; d < b.ops[0].n; ++d)
    out_ok = out_ok && (in_has >> b.ops[0].ids[d] & 1u) && oshape[d] == b.size[b.ops[0].ids[d]];
  TESSEL_CHECK(out_ok, ctx.op, "einsum spec \"{}\" does not fit operands {}: the output has shape {}", spec, shapes(),
               oshape);
  return b;
}

}  // namespace

EinsumSpec parse_einsum(const char* spec, const char* op) {
  const ParsedSpec ps = parse_spec(spec, op);
  EinsumSpec es;
  for (int i = 0; i < ps.ni; ++i) es.in.push_back(operand_text(spec, ps.in[i]));
  es.out = operand_text(spec, ps.out);
  return es;
}

ShardingPlan einsum(const ShardingContext& ctx, const char* spec, std::vector<int>* chunks) {
  const BoundSpec b = bind_einsum(ctx, spec);
  const int ni = int(ctx.in.size()), nd = ctx.mesh_ndim();
  const bool bitwise = numerics::bitwise();
  const Bound& out = b.ops[0];
  uint64_t out_ids = 0;
  for (int d = 0; d < out.n; ++d) out_ids |= uint64_t(1) << out.ids[d];
  // The letters a mesh dim may shard, in preference order: the output's, then the contracted ones.
  int letters[64];
  int nl = 0;
  uint64_t listed = 0;
  for (int o = 0; o <= ni; ++o)
    for (int d = 0; d < b.ops[o].n; ++d) {
      const int id = b.ops[o].ids[d];
      if (b.size[id] <= 1 || (listed >> id & 1u) || (o > 0 && (out_ids >> id & 1u))) continue;
      listed |= uint64_t(1) << id;
      letters[nl++] = id;
    }
  int64_t numel[kMaxEinsumInputs];
  for (int i = 0; i < ni; ++i) numel[i] = numel_of(ctx.in[size_t(i)].shape);

  // One plan: per mesh dim the cheapest candidate not banned there (banned: a set of letter ids per mesh dim).
  auto choose = [&](const uint64_t* banned) {
    ShardingPlan plan;
    plan.in.resize(size_t(ni));
    plan.out.resize(1);
    Placement cand[kMaxEinsumInputs], best[kMaxEinsumInputs];
    for (int m = 0; m < nd; ++m) {
      auto cost = [&] {
        int64_t k = 0;
        for (int i = 0; i < ni; ++i) {
          const Placement& cur = ctx.in[size_t(i)].placements[m];
          if (!(cur == cand[i] || (cur.is_replicate() && cand[i].is_shard()))) k += numel[i];
        }
        return k;
      };
      std::fill(cand, cand + ni, Replicate());
      std::fill(best, best + ni, Replicate());
      Placement best_out = Replicate();
      int64_t best_cost = cost();
      auto consider = [&](Placement o) {
        const int64_t k = cost();
        if (k < best_cost) best_cost = k, best_out = o, std::copy(cand, cand + ni, best);
      };
      for (int l = 0; l < nl; ++l) {
        const int id = letters[l];
        if (banned[m] >> id & 1u) continue;
        for (int i = 0; i < ni; ++i) {
          const Bound& in = b.ops[1 + i];
          cand[i] = (in.has >> id & 1u) ? Shard(in.pos(id)) : Replicate();
        }
        consider((out_ids >> id & 1u) ? Shard(out.pos(id)) : Partial());
      }
      if (!bitwise) {
        for (int i = 0; i < ni; ++i) {
          if (!ctx.in[size_t(i)].placements[m].is_partial_sum()) continue;
          std::fill(cand, cand + ni, Replicate());
          cand[i] = Partial();
          consider(Partial());
        }
      }
      for (int i = 0; i < ni; ++i) plan.in[size_t(i)].push_back(best[i]);
      plan.out[0].push_back(best_out);
    }
    return plan;
  };

  uint64_t banned[kMaxMeshDims] = {};
  if (!bitwise) {
    if (chunks) chunks->clear();
    return choose(banned);
  }
  // The canonical reductions: target 0 the output (the forward), 1 + i input
  // i's gradient; each over the letters the target lacks, flattened in the
  // order of the first other operand (the output first) holding them all.
  struct Reduction {
    int target, holder;
    std::vector<int> dims;  // the holder's dims
  };
  std::vector<Reduction> reductions;
  for (int t = 0; t <= (ctx.grad ? ni : 0); ++t) {
    uint64_t summed = 0;
    for (int o = 0; o <= ni; ++o)
      if (o != t) summed |= b.ops[o].has;
    summed &= ~b.ops[t].has;
    int holder = -1;
    for (int o = 0; o <= ni && holder < 0; ++o)
      if (o != t && (b.ops[o].has & summed) == summed) holder = o;
    TESSEL_CHECK(holder >= 0, ctx.op,
                 "einsum spec \"{}\": bitwise mode needs one operand holding every letter that {} sums over "
                 "(its canonical order); none does",
                 spec, t == 0 ? std::string("the forward") : TESSEL_FORMAT("input {}'s gradient", t - 1));
    Reduction r{t, holder, {}};
    for (int d = 0; d < b.ops[holder].n; ++d)
      if (summed >> b.ops[holder].ids[d] & 1u) r.dims.push_back(d);
    reductions.push_back(std::move(r));
  }
  const int v = numerics::reduction_chunks();
  for (;;) {
    ShardingPlan plan = choose(banned);
    std::vector<int> counts(static_cast<size_t>(ni + 1), 0);
    bool exact = true;
    for (const Reduction& r : reductions) {
      const Placements& p = r.holder == 0 ? plan.out[0] : plan.in[size_t(r.holder - 1)];
      const Dims& shape = r.holder == 0 ? ctx.out[0].shape : ctx.in[size_t(r.holder - 1)].shape;
      const int k = local_chunks(shape, p, *ctx.mesh, r.dims, v);
      if (k > 0) {
        counts[size_t(r.target)] = k;
        continue;
      }
      // Drop the first shard (mesh dim order) of a summed letter, and choose again.
      int bad_m = -1, bad_id = -1;
      for (int m = 0; m < nd && bad_m < 0; ++m)
        for (int d : r.dims)
          if (p[m].is_shard(d)) {
            bad_m = m, bad_id = b.ops[r.holder].ids[d];
            break;
          }
      TESSEL_ASSERT(bad_m >= 0 && !(banned[bad_m] >> bad_id & 1u));
      banned[bad_m] |= uint64_t(1) << bad_id;
      exact = false;
      break;
    }
    if (exact) {
      if (chunks) *chunks = std::move(counts);
      return plan;
    }
  }
}

Placements map_dims(const Placements& in, const int* dim_map, Placement vanished) {
  Placements out;
  for (const Placement& p : in) {
    if (!p.is_shard()) {
      out.push_back(p);
    } else {
      Placement q = p;  // keeps a ShardOn's owner
      q.dim = int8_t(dim_map[p.dim]);
      out.push_back(q.dim >= 0 ? q : vanished);
    }
  }
  return out;
}

Placements unshard(const Placements& p, std::initializer_list<int> dims, bool partial) {
  Placements out = p;
  for (int m = 0; m < out.size(); ++m) {
    if (partial && out[m].is_partial()) out[m] = Replicate();
    for (int d : dims)
      if (out[m].is_shard(d)) out[m] = Replicate();
  }
  return out;
}

Placement dual(const Placement& p, const char* op) {
  if (p.is_shard()) return p;
  if (p.is_replicate()) return Partial();
  TESSEL_CHECK(p.is_partial_sum(), op,
               "cannot differentiate through a {} output (only Partial(sum) has a gradient placement)", p.str());
  return Replicate();
}

}  // namespace tessel::dtensor
