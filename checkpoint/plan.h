#pragma once
// Who writes what (pure, no I/O, no communication): from every rank's list of
// the pieces it holds, the checkpoint's chunks and their writers.
//
// - Replicas are deduplicated: a box of a tensor held by several ranks
//   (Replicate placements, plain tensors on every rank) is one chunk,
//   written once.
// - The work is spread: chunks are assigned largest first, each to the
//   holder with the fewest bytes assigned so far (ties: the lowest rank), so
//   a replicated model is written by all its data-parallel replicas together.
// - Every rank computes the same plan from the same gathered input.
#include <string>
#include <vector>

#include "checkpoint/metadata.h"

namespace tessel::checkpoint {

// One local piece as a rank reports it.
struct PieceInfo {
  std::string name;
  DType dtype = DType::Float32;
  Dims shape;        // global
  Box box;           // this rank's piece (possibly empty)
  std::string layout;
};

struct SavePlan {
  // Tensors (sorted by name) with their chunks: box, file and key filled;
  // begin and CRCs are filled by the writers. Files: one per writing rank,
  // bytes/header_bytes filled, checksums by the writers.
  CheckpointMeta meta;
  // For each rank: the chunks it writes, as (tensor index, chunk index), in file order.
  std::vector<std::vector<std::pair<int, int>>> writes;
  // For each rank: its file's index in meta.files (-1 if it writes nothing).
  std::vector<int> file_of_rank;
  // For each rank: its file's header bytes (empty if it writes nothing).
  std::vector<std::string> headers;
};

// pieces[r] = rank r's pieces. Throws when ranks disagree on a tensor's dtype
// or shape, or when the pieces of a tensor do not cover it exactly.
SavePlan make_save_plan(const std::vector<std::vector<PieceInfo>>& pieces, uint64_t block_bytes);

// "data-00003.safetensors"
std::string data_file_name(int rank);
// The key of a chunk in its file: the tensor's name when the chunk is the
// whole tensor (a one-rank checkpoint's files are then plain safetensors
// files by name), "name@o0,o1,..." otherwise.
std::string chunk_key(const std::string& name, const Box& box, const Dims& shape);

// Serialisation of one rank's pieces for the all-gather.
std::string pieces_to_json(const std::vector<PieceInfo>& pieces);
std::vector<PieceInfo> pieces_from_json(const std::string& text, int rank);

}  // namespace tessel::checkpoint
