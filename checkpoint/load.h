#pragma once
// Loading a distributed checkpoint into any layout (docs/design.md §5; docs/checkpoint.md).
//
//   auto r = checkpoint::load("run/checkpoints/step-00000100", targets);   // targets: name -> tensor
//
// Every target is filled in place: a plain tensor with the whole global
// tensor, a distributed one with its local piece under its own mesh and
// placements (Partial: coordinate 0 gets the value, the others zeros). For a
// piece, the reader intersects its box with the chunks on disk and reads only
// the byte ranges it needs (rounded out to CRC blocks, which it verifies),
// straight into the piece when a chunk lands contiguously in it. Not
// collective: each rank reads what it needs, so any world size and nD layout
// loads any checkpoint.
//
// Errors name the checkpoint, the file and the tensor: a missing or
// truncated file, a header or block that fails its CRC, a target whose dtype
// or shape differs from the saved tensor.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"

namespace tessel::checkpoint {

// dir/metadata.json, parsed and validated.
CheckpointMeta read_metadata(const std::string& dir);

class CheckpointReader {
 public:
  // Reads metadata.json and checks every listed file's size (a missing or
  // truncated file fails here, naming the file and a tensor in it).
  explicit CheckpointReader(std::string dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const CheckpointMeta& meta() const { return meta_; }
  const std::string& dir() const { return dir_; }

  // Fills `dst`, a row-major buffer of t's dtype holding the box `box` of
  // tensor t (inside its shape), from the chunks that intersect it.
  void read(const TensorMeta& t, const Box& box, void* dst);
  // Bytes read from data files so far (headers and CRC block rounding included).
  uint64_t bytes_read() const { return bytes_read_; }

  // Reads every byte of every file: whole-file CRCs, headers, every block.
  // Throws at the first mismatch, naming the file and (for data) the tensor.
  void verify_all();

 private:
  struct OpenFile;
  OpenFile& file(int index);
  std::string where(const TensorMeta& t, size_t chunk) const;
  void verify_block(const TensorMeta& t, size_t chunk, uint64_t block, const char* data, uint64_t n) const;
  char* scratch(size_t n);

  std::string dir_;
  CheckpointMeta meta_;
  std::vector<std::unique_ptr<OpenFile>> files_;
  std::unique_ptr<char[]> scratch_;
  size_t scratch_bytes_ = 0;
  struct Run {
    uint64_t src, dst, bytes;
  };
  std::vector<Run> runs_;         // reused across reads
  std::vector<uint8_t> needed_;   // blocks of a chunk that a read touches
  uint64_t bytes_read_ = 0;
};

struct LoadOptions {
  // Targets without a tensor in the checkpoint are left unchanged and listed
  // in LoadResult::missing (otherwise an error naming them).
  bool allow_missing = false;
};

struct LoadResult {
  nlohmann::json state;               // what save() was given
  std::vector<std::string> missing;   // allow_missing: targets not in the checkpoint
  uint64_t bytes_read = 0;            // by this rank
};

// Where a load target's local piece sits in the global tensor: its box, and
// whether this rank holds a Partial coordinate other than 0 (it gets zeros,
// not the value). A plain tensor is its whole box. Shared by every loader
// that fills targets in place (this one, checkpoint/hf_reader.h).
struct LocalPiece {
  Box box;
  bool zero = false;
};
LocalPiece local_piece(const Tensor& target);

LoadResult load(const std::string& dir, const NamedTensors& targets, const LoadOptions& options = {});
// The same with an open reader (several loads from one checkpoint).
LoadResult load(CheckpointReader& reader, const NamedTensors& targets, const LoadOptions& options = {});

// Reads whole global tensors as plain CPU tensors (tools: inspect, convert).
Tensor read_tensor(CheckpointReader& reader, const std::string& name);

}  // namespace tessel::checkpoint
