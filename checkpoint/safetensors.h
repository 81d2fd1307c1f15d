#pragma once
// The safetensors file format (https://github.com/huggingface/safetensors):
//
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   JSON object, UTF-8, padded with spaces:
//               {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//                "__metadata__": {"key": "value", ...}}          (optional, strings only)
//   rest      the data buffer; offsets are relative to its start, little-endian, row-major
//
// dtypes: F64 F32 F16 BF16 I64 I32 BOOL (tessel's; others are refused by name).
//
// The reader trusts nothing (it is fuzzed): the header length must fit the
// file and be at most 100 MB; the JSON must parse, be an object, have no
// duplicate keys; every entry must have exactly dtype/shape/data_offsets with
// the right types; shapes at most 8 dims of non-negative sizes without
// overflow; end - begin == numel * itemsize; the tensors must tile the data
// buffer exactly (sorted by offset: no overlap, no hole, nothing after the
// last) as the reference implementation demands; BOOL bytes must be 0 or 1.
// Every error is a tessel::Error naming the file and, where there is one, the
// tensor.
//
// The writer pads the header with spaces to a multiple of 8 and lays tensors
// out by decreasing item size (stable otherwise), so every tensor's data is
// aligned to its item size; it writes atomically (checkpoint/atomic_write.h).
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace tessel::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct SafetensorsFile {
  NamedTensors tensors;  // CPU, contiguous, in data-offset order
  std::map<std::string, std::string> metadata;

  bool contains(const std::string& name) const;
  // The tensor called `name`; throws naming the file and the tensor otherwise.
  const Tensor& at(const std::string& name) const;
  std::string source;  // file name, for errors
};

// "F32" <-> DType::Float32, ...; unknown names throw naming `where`.
const char* safetensors_dtype_name(DType dtype);
DType safetensors_dtype(const std::string& name, const std::string& where);

// The header of a file holding tensors of these names, dtypes and shapes, as
// the writer lays it out: `header` (length field + padded JSON) is the file's
// first bytes, tensor i's data starts at absolute offset begin[i], and the
// file has file_size bytes. Writers that stream their data (checkpoint/save)
// write header then the tensors in `order`.
struct TensorSpec {
  std::string name;
  DType dtype;
  Dims shape;
};
struct SafetensorsLayout {
  std::string header;
  std::vector<size_t> order;    // spec indices in data order
  std::vector<uint64_t> begin;  // by spec index
  uint64_t file_size = 0;
};
SafetensorsLayout safetensors_layout(const std::vector<TensorSpec>& specs,
                                     const std::map<std::string, std::string>& metadata = {});

// The bytes of a safetensors file. Tensors may have any strides (they are
// gathered in row-major order) but must be on the CPU; names must be unique,
// non-empty and not "__metadata__".
std::string serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});
// Writes serialize_safetensors(...) to `path` atomically.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// One tensor of a file's header; begin/end are absolute file offsets.
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Dims shape;
  uint64_t begin = 0, end = 0;
};
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // by offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length
  const SafetensorsEntry* find(const std::string& name) const;  // null if absent
};

// The header length N from a file's first 8 bytes, checked against the
// file's size and the 100 MB limit (read 8 + N bytes next).
uint64_t safetensors_header_length(std::string_view prefix, uint64_t file_size, const std::string& source);
// Validates the header alone (`prefix` holds at least the first 8 + N bytes
// of a file of `file_size` bytes) with every check of parse_safetensors but
// the BOOL values: readers that fetch byte ranges (checkpoint/reader.h) use it.
SafetensorsHeader parse_safetensors_header(std::string_view prefix, uint64_t file_size, const std::string& source);

// Parses and validates file bytes; `source` names the file in errors.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& source = "<memory>");
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace tessel::checkpoint
