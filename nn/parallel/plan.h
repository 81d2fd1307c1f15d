#pragma once
// Parallel plans: how a model is laid out on a mesh, as plain data (docs/design.md
// §6, veScale-style). Model code never changes; a plan says
//
//   params:  regex on parameter paths -> placements per mesh dim name
//            (first matching rule wins; unmatched parameters are replicated);
//   modules: regex on module paths -> the layout a module's input is
//            redistributed to before its forward, and its output after
//            (every matching rule applies, in order);
//   data:    the layout of the token ids [B, T] (default: dp and ep ->
//            Shard(0): expert-parallel ranks take part of the batch too);
//   experts: regex on module paths of nn::MoE layers -> the mesh dim their
//            experts are spread over (expert parallelism, nn/parallel/
//            expert_parallel.h); ignored on a mesh without that dim.
//
// Placements are keyed by mesh dim *name* ("tp", "dp", ...), so one plan
// serves every mesh: dims a plan names that the mesh lacks are ignored, and
// mesh dims a rule does not name keep their current placement (inputs and
// outputs) or are Replicate (parameters).
//
// JSON form (load with ParallelPlan::from_json / from_file):
//   {"name": "llama-tp",
//    "params":  [{"match": "layers\\.\\d+\\.attn\\.w[qkv]\\.weight", "tp": "S(0)"}, ...],
//    "modules": [{"match": "layers\\.\\d+\\.attn", "input": {"tp": "R"}, "output": {"tp": "S(1)"}}],
//    "experts": [{"match": "layers\\.\\d+\\.ffn", "dim": "ep"}],
//    "data":    {"dp": "S(0)", "ep": "S(0)"}}
// Placement strings: "R", "S(d)", "P" (Partial(sum); module layouts only).
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/mesh.h"
#include "dtensor/placement.h"

namespace tessel::parallel {

// Placements for some mesh dims, by name.
struct DimLayout {
  std::vector<std::pair<std::string, Placement>> dims;
  bool empty() const { return dims.empty(); }
  // On `mesh`: the named dims take their placement, the others keep `base`'s.
  Placements on(const Mesh& mesh, const Placements& base) const;
  std::string str() const;  // "{tp: S(0), dp: R}"
};

struct ParamRule {
  std::string match;
  DimLayout layout;
  std::string hint;  // what made the rule, for the error when it matches nothing ("" for a rule written as is)
};

struct ModuleRule {
  std::string match;
  DimLayout input, output;  // empty: leave as is
};

struct ExpertRule {
  std::string match;  // MoE module paths
  std::string dim;    // mesh dim name, e.g. "ep"
};

struct ParallelPlan {
  std::string name;
  std::vector<ParamRule> params;
  std::vector<ModuleRule> modules;
  std::vector<ExpertRule> experts;
  DimLayout data{{{"dp", Shard(0)}, {"ep", Shard(0)}, {"cp", Shard(1)}}};

  static ParallelPlan from_json(const std::string& text, const std::string& source = "plan");
  static ParallelPlan from_file(const std::string& path);
  std::string to_json() const;

  // Megatron's tensor parallelism for the nn::Linear modules whose path
  // matches `linear` (a regex), over mesh dim `dim`:
  //   column: the weight [out, in] sharded by output rows (Shard(0)), and the
  //           bias with it: each rank computes a slice of the outputs;
  //   row:    the weight sharded by input columns (Shard(1)), the bias
  //           replicated: each rank's partial product is summed over `dim`.
  // A column layer followed by a row layer (an MLP's up and down
  // projections, attention's q/k/v and output) communicates once:
  //   plan.column_parallel("blocks\\.\\d+\\.fc1").row_parallel("blocks\\.\\d+\\.fc2");
  ParallelPlan& column_parallel(const std::string& linear, bool bias = true, const std::string& dim = "tp");
  ParallelPlan& row_parallel(const std::string& linear, const std::string& dim = "tp");
  // A vocabulary-parallel nn::Embedding (its weight [V, C] sharded by rows):
  // each rank looks up the ids of its vocabulary slice, the outputs are
  // summed over `dim`. With a column-parallel LM head of the same vocabulary
  // the loss never gathers the logits.
  ParallelPlan& vocabulary_parallel(const std::string& embedding, const std::string& dim = "tp");
  // Megatron's sequence parallelism over `dim`: the residual stream between
  // the sublayers is sharded along the sequence (dim 1 of [B, T, C]), so
  // norms, dropout and residual adds run on 1/tp of the tokens. The modules
  // matching `embedding` produce the sharded stream; each sublayer matching
  // `sublayers` (its column/row-parallel linears inside) gathers its input
  // (all-gather) and scatters its pending-sum output (reduce-scatter); the
  // module matching `final_norm` gives the whole sequence back.
  ParallelPlan& sequence_parallel(const std::string& sublayers, const std::string& embedding,
                                  const std::string& final_norm, const std::string& dim = "tp");
};

Placement parse_placement(const std::string& s, const std::string& where);

// The plans that ship with tessel, by model family: "nanogpt", "llama",
// "mixtral" (Megatron tensor parallel over "tp": column-parallel q/k/v and
// up/gate/fc, row-parallel o/down/proj, vocabulary-parallel embedding and LM
// head; with sequence_parallel the residual stream between blocks is sharded
// along the sequence over "tp", norms and dropout run on sequence shards),
// and "none" (everything replicated, data parallel only). "mixtral" also
// spreads every layer's experts over "ep" (expert parallelism).
ParallelPlan builtin_plan(const std::string& name, bool sequence_parallel = false);
std::vector<std::string> builtin_plan_names();

// A plan by name (builtin) or, if `spec` names a file (ends in .json), loaded from it.
ParallelPlan load_plan(const std::string& spec, bool sequence_parallel = false);

// std::regex(pattern), one construction at a time in the process: libstdc++'s
// regex compiler fills the locale's shared ctype<char>::narrow cache without
// synchronization (a data race ThreadSanitizer reports), and parallelize()
// and Run build a plan's regexes on every rank thread at once. Matching with
// the compiled regex needs no lock. Each pattern is compiled once per process
// (the planner lays the same plan out on thousands of simulated ranks).
// Throws std::regex_error.
std::regex compile_regex(const std::string& pattern);

}  // namespace tessel::parallel
