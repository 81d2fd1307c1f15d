#pragma once
// A distributed checkpoint's table of contents: `metadata.json`, written last
// (it is the commit record) next to the data files. docs/checkpoint.md.
//
//   {"format": "tessel-checkpoint", "version": 1, "block_bytes": 1048576,
//    "world_size": 4, "state": {...},                  // small JSON state (step, rng, loader, ...)
//    "files": [{"name": "data-00000.safetensors", "rank": 0, "bytes": N,
//               "header_bytes": H, "header_crc32c": C, "crc32c": C}, ...],
//    "tensors": {"model.wte.weight": {"dtype": "F32", "shape": [256, 64],
//                                     "layout": "(dp=2, tp=2) [R, S(0)]",
//                 "chunks": [{"offsets": [0, 0], "sizes": [128, 64], "file": 0,
//                             "key": "model.wte.weight@0,0", "begin": 1024,
//                             "crc32c": [C, ...]}, ...]}, ...}}
//
// A tensor is stored as chunks (boxes of the global tensor) that tile it
// exactly: no overlap, no gap (empty chunks are not stored). Each chunk is
// one tensor of a safetensors file (`key`), whose data starts at absolute
// byte `begin`; `crc32c` has one CRC per block_bytes of the chunk's data (the
// last block short), so a reader verifies exactly the blocks it reads. A
// file's `crc32c` covers the whole file, `header_crc32c` its first
// header_bytes bytes (length field + JSON header).
//
// parse_metadata trusts nothing (it is fuzzed): every field is type-checked,
// every chunk must lie inside its tensor and its file, chunks must tile
// their tensor, file names must be plain names. Errors name the source, the
// tensor and the field.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/box.h"
#include "runtime/dtype.h"
#include "runtime/shape.h"

namespace tessel::checkpoint {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kFormatName = "tessel-checkpoint";
inline constexpr const char* kMetadataFile = "metadata.json";

struct ChunkMeta {
  Box box;                     // where the chunk sits in the global tensor
  int file = 0;                // index into CheckpointMeta::files
  std::string key;             // its name inside that safetensors file
  uint64_t begin = 0;          // absolute byte offset of its data in the file
  std::vector<uint32_t> crc;   // crc32c per block of its data
};

struct TensorMeta {
  std::string name;
  DType dtype = DType::Float32;
  Dims shape;
  std::string layout;  // how it was laid out when saved (informational): "(dp=2) [S(0)]", "plain"
  std::vector<ChunkMeta> chunks;
  uint64_t nbytes() const { return uint64_t(numel_of(shape)) * itemsize(dtype); }
};

struct FileMeta {
  std::string name;
  int rank = 0;  // the rank that wrote it
  uint64_t bytes = 0;
  uint64_t header_bytes = 0;
  uint32_t header_crc = 0;
  uint32_t crc = 0;
};

struct CheckpointMeta {
  int version = kFormatVersion;
  uint64_t block_bytes = 1 << 20;
  int world_size = 1;
  nlohmann::json state = nlohmann::json::object();
  std::vector<FileMeta> files;
  std::vector<TensorMeta> tensors;  // sorted by name

  // The tensor called `name`, or null.
  const TensorMeta* find(const std::string& name) const;
  uint64_t total_tensor_bytes() const;  // sum of global tensor sizes
  uint64_t total_file_bytes() const;
};

// Bytes of a chunk's data and its number of CRC blocks.
uint64_t chunk_bytes(const ChunkMeta& c, DType dtype);
uint64_t num_blocks(uint64_t bytes, uint64_t block_bytes);

std::string metadata_to_json(const CheckpointMeta& meta);
CheckpointMeta parse_metadata(std::string_view text, const std::string& source);

// Checks that `chunks` tile a tensor of `shape` (inside it, no overlap, no
// gap); errors name `what` (e.g. "'ckpt/metadata.json': tensor 'w'").
void check_tiling(const std::vector<Box>& chunks, const Dims& shape, const std::string& what);

// A plain file name (no '/', not "." or "..", printable, short): what the
// metadata may name as a data file.
bool is_plain_file_name(const std::string& name);

}  // namespace tessel::checkpoint
