#include "checkpoint/plan.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "runtime/error.h"

namespace tessel::checkpoint {
namespace {

constexpr const char* kOp = "checkpoint save";

struct BoxLess {
  bool operator()(const Box& a, const Box& b) const {
    auto key = [](const Box& x) {
      return std::make_pair(std::vector<int64_t>(x.offset.begin(), x.offset.end()),
                            std::vector<int64_t>(x.size.begin(), x.size.end()));
    };
    return key(a) < key(b);
  }
};

struct TensorPlan {
  PieceInfo info;  // from the first rank that reported it
  int first_rank = 0;
  std::map<Box, std::vector<int>, BoxLess> holders;  // distinct non-empty boxes -> ranks, ascending
};

}  // namespace

std::string data_file_name(int rank) { return fmt::format(FMT_STRING("data-{:05d}.safetensors"), rank); }

std::string chunk_key(const std::string& name, const Box& box, const Dims& shape) {
  if (box.size == shape) return name;
  return fmt::format(FMT_STRING("{}@{}"), name, fmt::join(box.offset.begin(), box.offset.end(), ","));
}

SavePlan make_save_plan(const std::vector<std::vector<PieceInfo>>& pieces, uint64_t block_bytes) {
  const int world = int(pieces.size());
  std::map<std::string, TensorPlan> tensors;
  for (int r = 0; r < world; ++r) {
    for (const PieceInfo& p : pieces[size_t(r)]) {
      auto [it, fresh] = tensors.try_emplace(p.name);
      TensorPlan& tp = it->second;
      if (fresh) {
        tp.info = p;
        tp.first_rank = r;
      } else {
        TESSEL_CHECK(tp.info.dtype == p.dtype && tp.info.shape == p.shape, kOp,
                     "tensor '{}' is {} {} on rank {} but {} {} on rank {}", p.name, dtype_name(tp.info.dtype),
                     tp.info.shape.str(), tp.first_rank, dtype_name(p.dtype), p.shape.str(), r);
      }
      if (p.box.numel() > 0) {
        std::vector<int>& h = tp.holders[p.box];
        if (h.empty() || h.back() != r) h.push_back(r);
      }
    }
  }

  SavePlan plan;
  plan.meta.world_size = world;
  plan.meta.block_bytes = block_bytes;
  struct Candidate {
    uint64_t bytes;
    int tensor, chunk;
    const std::vector<int>* holders;
  };
  std::vector<Candidate> cands;
  for (auto& [name, tp] : tensors) {
    TensorMeta t;
    t.name = name;
    t.dtype = tp.info.dtype;
    t.shape = tp.info.shape;
    t.layout = tp.info.layout;
    std::vector<Box> boxes;
    for (auto& [box, ranks] : tp.holders) {
      ChunkMeta c;
      c.box = box;
      c.key = chunk_key(name, box, t.shape);
      cands.push_back({uint64_t(box.numel()) * itemsize(t.dtype), int(plan.meta.tensors.size()), int(t.chunks.size()),
                       &ranks});
      t.chunks.push_back(std::move(c));
      boxes.push_back(box);
    }
    check_tiling(boxes, t.shape, fmt::format(FMT_STRING("the pieces of tensor '{}' ({})"), name, t.layout));
    plan.meta.tensors.push_back(std::move(t));
  }

  // Largest chunks first, each to its least-loaded holder.
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) { return a.bytes > b.bytes; });
  std::vector<uint64_t> load(size_t(world), 0);
  plan.writes.assign(size_t(world), {});
  for (const Candidate& c : cands) {
    int best = c.holders->front();
    for (int r : *c.holders)
      if (load[size_t(r)] < load[size_t(best)]) best = r;
    load[size_t(best)] += c.bytes;
    plan.writes[size_t(best)].emplace_back(c.tensor, c.chunk);
  }

  // One file per writing rank; chunks in (tensor, chunk) order, laid out as safetensors does.
  plan.file_of_rank.assign(size_t(world), -1);
  plan.headers.assign(size_t(world), {});
  for (int r = 0; r < world; ++r) {
    auto& w = plan.writes[size_t(r)];
    if (w.empty()) continue;
    std::sort(w.begin(), w.end());
    std::vector<TensorSpec> specs;
    for (auto [ti, ci] : w) {
      const TensorMeta& t = plan.meta.tensors[size_t(ti)];
      specs.push_back({t.chunks[size_t(ci)].key, t.dtype, t.chunks[size_t(ci)].box.size});
    }
    SafetensorsLayout L = safetensors_layout(specs, {{"format", kFormatName}});
    // Writers stream chunks in data order.
    std::vector<std::pair<int, int>> ordered;
    for (size_t i : L.order) ordered.push_back(w[i]);
    for (size_t i = 0; i < w.size(); ++i) {
      ChunkMeta& c = plan.meta.tensors[size_t(w[i].first)].chunks[size_t(w[i].second)];
      c.file = int(plan.meta.files.size());
      c.begin = L.begin[i];
    }
    w = std::move(ordered);
    FileMeta f;
    f.name = data_file_name(r);
    f.rank = r;
    f.bytes = L.file_size;
    f.header_bytes = L.header.size();
    plan.file_of_rank[size_t(r)] = int(plan.meta.files.size());
    plan.meta.files.push_back(f);
    plan.headers[size_t(r)] = std::move(L.header);
  }
  return plan;
}

std::string pieces_to_json(const std::vector<PieceInfo>& pieces) {
  nlohmann::json a = nlohmann::json::array();
  for (const PieceInfo& p : pieces) {
    a.push_back({p.name, int(p.dtype), std::vector<int64_t>(p.shape.begin(), p.shape.end()),
                 std::vector<int64_t>(p.box.offset.begin(), p.box.offset.end()),
                 std::vector<int64_t>(p.box.size.begin(), p.box.size.end()), p.layout});
  }
  return a.dump();
}

std::vector<PieceInfo> pieces_from_json(const std::string& text, int rank) {
  std::vector<PieceInfo> out;
  try {
    for (const auto& e : nlohmann::json::parse(text)) {
      PieceInfo p;
      p.name = e.at(0).get<std::string>();
      p.dtype = DType(e.at(1).get<int>());
      p.shape = Dims(e.at(2).get<std::vector<int64_t>>());
      p.box.offset = Dims(e.at(3).get<std::vector<int64_t>>());
      p.box.size = Dims(e.at(4).get<std::vector<int64_t>>());
      p.layout = e.at(5).get<std::string>();
      out.push_back(std::move(p));
    }
  } catch (const nlohmann::json::exception& e) {
    TESSEL_FAIL(kOp, "the piece list of rank {} does not parse: {}", rank, e.what());
  }
  return out;
}

}  // namespace tessel::checkpoint
