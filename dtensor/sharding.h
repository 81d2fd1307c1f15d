#pragma once
// Sharding propagation (docs/design.md §2): the vocabulary an op's rule
// speaks. The rule itself lives in the op struct, next to its backward
// (docs/design.md §1, §6), not in a registry.
//
// An op struct (autograd/function.h) may define
//
//   ShardingPlan sharding(const ShardingContext& ctx);
//
// A member named `sharding` with any other signature is a compile error
// (dtensor/dist_call.h), not an op that silently loses its rule.
//
// ctx describes the global inputs (shape, dtype, placements; plain tensors
// count as Replicate) and the global outputs (shape, dtype, from running the
// op on Meta tensors). The rule returns the placements it needs its inputs in
// (the dispatcher redistributes them, differentiably) and the placements of
// its outputs, and may rewrite the op's attributes for the local pieces
// (a reshape's target shape, a dropout block's offset, a triangle's diagonal).
// The op's forward then runs unchanged on the local pieces. Ops without a
// rule run on fully replicated inputs (logged once): slow, never wrong.
//
// Gradients: the backward runs on local pieces too. Gradient placements are
// the duals of the forward's (Shard(d) <-> Shard(d), Replicate <-> Partial(sum));
// on a mesh dim where every input and output is Replicate, gradients pass
// through as they come (Replicate or Partial). Rules must not emit
// Partial(max/min) outputs when gradients are needed (ctx.grad).
#include <initializer_list>
#include <string>
#include <vector>

#include "dtensor/mesh.h"
#include "runtime/tensor.h"

namespace tessel {

struct TensorSpec {
  bool defined = false;
  bool distributed = false;
  Dims shape;
  DType dtype = DType::Float32;
  Placements placements;  // one per mesh dim (Replicate for plain tensors)
  int dim() const { return shape.size(); }
};

struct ShardingContext {
  const char* op = "";
  const Mesh* mesh = nullptr;
  std::vector<TensorSpec> in;   // the flattened tensor arguments, in order
  std::vector<TensorSpec> out;  // global outputs (placements unset)
  bool grad = false;            // autograd records this call

  int mesh_ndim() const { return mesh->ndim(); }
  // The local geometry of a global `shape` under `p` on this rank.
  LocalGeometry local(const Dims& shape, const Placements& p) const {
    return local_geometry(shape, mesh->shape(), p, mesh->coords());
  }
};

struct ShardingPlan {
  std::vector<Placements> in;   // required placements, one per input (ignored for undefined inputs)
  std::vector<Placements> out;  // one per output
};

namespace dtensor {

// Everything Replicate (the fallback).
ShardingPlan replicate(const ShardingContext& ctx);

// Pointwise ops with numpy broadcasting (one output, shaped like ctx.out[0]).
// Per mesh dim: a Shard of a non-broadcast dim of any input (the largest such
// input wins) shards the output and every input that has that dim; inputs
// that broadcast along it are Replicate. Without shards, Partial(sum) inputs
// survive if the set of Partial inputs is one of `linear_sets` (bit i = input i)
// — e.g. {0b11} for add, {0b01, 0b10} for mul, {0b01} for div — and the
// output is Partial(sum); otherwise they are all-reduced first.
ShardingPlan pointwise(const ShardingContext& ctx, std::initializer_list<uint32_t> linear_sets = {});

// Einsum-style ops: one output, a sum of products of the inputs, described
// by a spec of single-letter dims per operand, e.g. "mk,kn->mn" (matmul),
// "bmk,bkn->bmn" (bmm), "...mk,...kn->...mn" (matmul with leading batch dims
// and a shared 2-D right operand). Numpy's einsum syntax, restricted to:
//   - letters a-z, A-Z; each at most once per operand (no diagonals);
//   - "..." only at the start of an operand: the leading dims the letters do
//     not name, lined up from the right across operands (an operand with
//     fewer of them lacks the outer ones, so a shared weight "kn" — or
//     "...kn" with no leading dims — is Replicate where "...mk" shards a
//     batch dim); the output has "..." exactly when an input does;
//   - every output letter appears in an input; a letter has one size in all
//     operands, except that a size-1 input dim broadcasts (that input lacks
//     the letter).
// Malformed specs throw, naming the op and the spec.
struct EinsumSpec {
  std::vector<std::string> in;  // per input, its letters as written ("..." included)
  std::string out;
};
EinsumSpec parse_einsum(const char* spec, const char* op = "einsum");

// The sharding rule of an einsum-style op (ctx.in: the spec's inputs, all
// defined; ctx.out: its one output). Per mesh dim, the candidates are, in
// this order:
//   1. each output letter (output order): Shard of it in every operand that
//      has it, Replicate in the others;
//   2. each contracted letter (in no output dim; first-appearance order):
//      Shard of it in every input that has it; the output is Partial(sum);
//   3. outside bitwise mode, each input that is Partial(sum) now: it stays
//      Partial, the others are Replicate, the output is Partial(sum) (the op
//      is linear in each input);
//   4. Replicate everywhere.
// Letters of size <= 1 are not candidates. The cheapest candidate wins, cost
// = the elements of the inputs that a collective must move to reach it (an
// input already in place, or a Replicate one sliced into a Shard, costs
// nothing); a candidate must be strictly cheaper than replicating, and ties
// go to the earlier one. So sharded inputs are followed, a contraction over
// a sharded letter leaves a pending sum, and the larger input's layout wins
// when the inputs disagree.
//
// Bitwise mode: no Partial input (the products do not commute with the
// pending sum), and the op's canonical reductions must stay exact: the
// forward sums over the contracted letters and input i's gradient over the
// letters input i lacks, each flattened in the order of the first operand
// holding them all (the output first for a gradient; the op's kernels must
// reduce in that order — MatmulOp's do). A mesh dim whose shard of such a
// letter makes a reduction inexact (local_chunks == 0) drops that candidate
// and the choice is made again. If `chunks` is given it receives, in bitwise
// mode, the local chunk counts: [0] the forward's, [1 + i] input i's
// gradient's (0 when ctx.grad is false: no backward); outside bitwise mode
// it is left empty. The 16-bit pending sums a plan may leave are DistCall's
// business (the op's exact_widened), not this rule's.
ShardingPlan einsum(const ShardingContext& ctx, const char* spec, std::vector<int>* chunks = nullptr);

// Output placements for an op that maps input dims to output dims one to one
// (dim_map[i] = output dim of input dim i, or -1 if the dim disappears):
// Shard(i) -> Shard(dim_map[i]); a shard of a vanished dim becomes `vanished`
// (e.g. Partial(sum) for a reduction) and must be legal for the caller.
Placements map_dims(const Placements& in, const int* dim_map, Placement vanished);

// Placements with every shard of tensor dim d (and, if `partial`, every
// Partial) turned into Replicate.
Placements unshard(const Placements& p, std::initializer_list<int> dims, bool partial = true);

// Bitwise mode (numerics::bitwise()): the local chunk count of a canonical
// reduction over `dims` (flattened row-major, as the kernels do) of a tensor
// with `shape` laid out by `p`, when V chunks are used globally. Reduced
// dims of size 1 are left out first (they move no element in the flattened
// order: one sequence cut along time is a contiguous run).
//   - no mesh dim cuts a reduced dim: V;
//   - the cuts all fall on the outermost reduced dim, W (the product of the
//     cutting mesh dims' sizes) divides V, and every piece is a whole run of
//     the global chunks: V / W — each piece computes its subtree and the
//     rank-order reduction of the collectives finishes the same tree;
//   - a short reduction (the global chunks from W*k on are all empty): the
//     largest power of two k < V / W for which the pieces own runs of k
//     chunks (the rest of the tree adds +0 subtrees, which change nothing);
//   - otherwise 0: not exact (the caller gathers the reduced dims instead).
int local_chunks(const Dims& shape, const Placements& p, const Mesh& mesh, const std::vector<int>& dims, int v);

// In bitwise mode, Partial(sum) may only flow through ops whose arithmetic
// commutes exactly with the pending sum (views, selections, negation, exact
// casts); `pointwise` then keeps Partial only if `exact` is set.
ShardingPlan pointwise_exact(const ShardingContext& ctx, std::initializer_list<uint32_t> linear_sets, bool exact);

// Bitwise mode, pointwise ops with broadcasting: the backward reduces each
// input's gradient over the output dims the input broadcasts along (sum_to).
// Returns, per input, the local chunk count of that reduction under `plan`
// (V where it is not sharded); a mesh dim whose shard would make one of them
// inexact is replicated in `plan` first.
std::vector<int> pointwise_backward_chunks(const ShardingContext& ctx, ShardingPlan& plan);

// Gradient placements (see above): dual(Shard(d)) = Shard(d), dual(R) =
// Partial(sum), dual(Partial(sum)) = R; Partial(max/min) has none (throws,
// naming the op).
Placement dual(const Placement& p, const char* op);

}  // namespace dtensor
}  // namespace tessel
