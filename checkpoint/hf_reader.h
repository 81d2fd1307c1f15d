#pragma once
// Reading a Hugging Face model folder piece by piece: every rank reads the
// headers, then only the bytes of the parameter pieces it holds, so a model
// larger than one rank's memory never exists whole on a rank.
//
//   HfFolderReader reader(dir);                        // config.json, index, every shard's header
//   HfLoadResult r = load_hf(reader, config, targets); // targets: tessel name -> tensor
//
// A target is filled as checkpoint::load fills one (checkpoint/load.h): a
// plain tensor with the whole parameter, a distributed one with its local
// piece (Partial: coordinate 0 gets the value, the others zeros). A piece is
// a box of the tessel parameter; through the parameter's HfView
// (checkpoint/hf.h) it is a box of one file tensor (transposed for GPT-2's
// Conv1D weights, offset inside a fused q|k|v or gate|up), and the reader
// preads that box's rows and nothing else. Values are converted to the
// target's dtype after the read (a bf16 file into float32 parameters).
//
// Before anything is written every target must have a tensor of its shape,
// and every tensor of the folder must map to a parameter of the model (the
// checks of from_hf), with errors naming the tensor, file and folder; an
// index naming a missing shard, a shard that lacks a tensor the index puts
// there, or a shard-named file (model-0000i-of-0000n.safetensors) the index
// does not list (a leftover of another save) is an error naming them.
//
// count_only: nothing is read or written, the bytes the reads would take are
// counted, and targets may be Meta tensors (their placements are all it
// needs): the per-rank bytes of a model too large to build, like LLaMA-7B.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/box.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "models/config.h"

namespace tessel::checkpoint {

class HfFolderReader {
 public:
  // Reads model.safetensors.index.json (or takes model.safetensors alone) and
  // the header of every shard it names.
  explicit HfFolderReader(std::string dir);
  ~HfFolderReader();
  HfFolderReader(const HfFolderReader&) = delete;
  HfFolderReader& operator=(const HfFolderReader&) = delete;

  const std::string& dir() const { return dir_; }
  // Every tensor of the folder (names, dtypes, shapes), by name.
  const std::vector<TensorSpec>& tensors() const { return specs_; }
  // Sum of the tensors' bytes (what reading everything costs, headers aside).
  uint64_t tensor_bytes() const { return tensor_bytes_; }

  // Reads the box `box` of file tensor `name` into dst (row-major, the
  // tensor's dtype); dst null counts the bytes without reading.
  void read(const std::string& name, const Box& box, void* dst);
  // Bytes read (or counted) so far: the headers, then the reads' data.
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct Shard;
  struct Entry {
    size_t shard = 0;
    SafetensorsEntry entry;  // begin/end are absolute offsets in the shard
  };
  std::string dir_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::map<std::string, Entry> entries_;
  std::vector<TensorSpec> specs_;
  uint64_t tensor_bytes_ = 0;
  uint64_t bytes_read_ = 0;
};

struct HfLoadOptions {
  bool count_only = false;  // above
};

struct HfLoadResult {
  size_t tensors = 0;       // targets filled (or counted)
  uint64_t bytes_read = 0;  // by this call: data only (the reader's bytes_read() adds the headers)
};

// Fills targets (tessel parameter paths; any subset of the model's, e.g. the
// ones a pipeline stage holds) from the folder, read as `config`'s model.
HfLoadResult load_hf(HfFolderReader& reader, const models::ModelConfig& config, const NamedTensors& targets,
                     const HfLoadOptions& options = {});

}  // namespace tessel::checkpoint
