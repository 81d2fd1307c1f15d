#include "checkpoint/metadata.h"

#include <algorithm>
#include <set>

#include "checkpoint/safetensors.h"
#include "runtime/error.h"

namespace tessel::checkpoint {
namespace {

constexpr const char* kOp = "checkpoint metadata";
constexpr size_t kMaxChunksPerTensor = 1 << 16;  // the tiling check is quadratic in it
using json = nlohmann::json;

// Rejects duplicate keys in any object (nlohmann would keep the last silently).
struct DuplicateKeyCheck {
  const std::string* source;
  std::vector<std::set<std::string>> open;
  bool operator()(int /*depth*/, json::parse_event_t ev, json& parsed) {
    using E = json::parse_event_t;
    if (ev == E::object_start) open.emplace_back();
    else if (ev == E::object_end && !open.empty()) open.pop_back();
    else if (ev == E::key && !open.empty()) {
      const std::string k = parsed.get<std::string>();
      TESSEL_CHECK(open.back().insert(k).second, kOp, "'{}': the key '{}' appears twice in one object", *source, k);
    }
    return true;
  }
};

// Field access that names where a bad value sits.
struct Reader {
  const std::string& src;
  std::string where;  // "tensor 'w': chunk 2"

  std::string at() const { return where.empty() ? "'" + src + "'" : "'" + src + "': " + where; }

  void exact_keys(const json& o, std::initializer_list<const char*> keys) const {
    TESSEL_CHECK(o.is_object(), kOp, "{}: expected an object, got {}", at(), o.dump());
    for (const auto& [k, v] : o.items()) {
      bool known = false;
      for (const char* key : keys) known = known || k == key;
      TESSEL_CHECK(known, kOp, "{}: unexpected field '{}'", at(), k);
    }
    for (const char* key : keys) TESSEL_CHECK(o.contains(key), kOp, "{}: missing field '{}'", at(), key);
  }
  uint64_t u64(const json& v, const char* field) const {
    TESSEL_CHECK(v.is_number_unsigned(), kOp, "{}: '{}' must be a non-negative integer, got {}", at(), field,
                 v.dump());
    return v.get<uint64_t>();
  }
  int64_t i64(const json& v, const char* field) const {
    const uint64_t u = u64(v, field);
    TESSEL_CHECK(u <= uint64_t(INT64_MAX), kOp, "{}: '{}' is too large ({})", at(), field, u);
    return int64_t(u);
  }
  uint32_t u32(const json& v, const char* field) const {
    const uint64_t u = u64(v, field);
    TESSEL_CHECK(u <= 0xffffffffu, kOp, "{}: '{}' must fit 32 bits, got {}", at(), field, u);
    return uint32_t(u);
  }
  std::string str(const json& v, const char* field) const {
    TESSEL_CHECK(v.is_string(), kOp, "{}: '{}' must be a string, got {}", at(), field, v.dump());
    return v.get<std::string>();
  }
  Dims dims(const json& v, const char* field, int expect_ndim = -1) const {
    TESSEL_CHECK(v.is_array(), kOp, "{}: '{}' must be an array, got {}", at(), field, v.dump());
    TESSEL_CHECK(v.size() <= size_t(kMaxDims), kOp, "{}: '{}' has more than {} dims", at(), field, kMaxDims);
    TESSEL_CHECK(expect_ndim < 0 || int(v.size()) == expect_ndim, kOp, "{}: '{}' has {} entries, the tensor {} dims",
                 at(), field, v.size(), expect_ndim);
    Dims d;
    for (const auto& e : v) d.push_back(i64(e, field));
    return d;
  }
};

std::string dims_str(const Dims& d) { return d.str(); }

}  // namespace

const TensorMeta* CheckpointMeta::find(const std::string& name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorMeta& t, const std::string& n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

uint64_t CheckpointMeta::total_tensor_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors) n += t.nbytes();
  return n;
}

uint64_t CheckpointMeta::total_file_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files) n += f.bytes;
  return n;
}

uint64_t chunk_bytes(const ChunkMeta& c, DType dtype) { return uint64_t(c.box.numel()) * itemsize(dtype); }

uint64_t num_blocks(uint64_t bytes, uint64_t block_bytes) { return (bytes + block_bytes - 1) / block_bytes; }

bool is_plain_file_name(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (unsigned char c : name)
    if (c == '/' || c < 0x20 || c == 0x7f) return false;
  return true;
}

void check_tiling(const std::vector<Box>& chunks, const Dims& shape, const std::string& what) {
  TESSEL_CHECK(chunks.size() <= kMaxChunksPerTensor, kOp, "{}: {} chunks (at most {} supported)", what,
               chunks.size(), kMaxChunksPerTensor);
  uint64_t covered = 0;
  for (const Box& b : chunks) {
    TESSEL_CHECK(b.offset.size() == shape.size() && b.size.size() == shape.size(), kOp,
                 "{}: a chunk at {} of size {} does not have the tensor's {} dims", what, dims_str(b.offset),
                 dims_str(b.size), shape.size());
    uint64_t v = 1;
    for (int d = 0; d < shape.size(); ++d) {
      TESSEL_CHECK(b.size[d] > 0 && b.offset[d] <= shape[d] && b.size[d] <= shape[d] - b.offset[d], kOp,
                   "{}: chunk at {} of size {} lies outside the tensor's shape {}", what, dims_str(b.offset),
                   dims_str(b.size), dims_str(shape));
      v *= uint64_t(b.size[d]);  // bounded by the shape's numel, checked by the caller
    }
    covered += v;
  }
  for (size_t i = 0; i < chunks.size(); ++i)
    for (size_t j = i + 1; j < chunks.size(); ++j) {
      Box x;
      TESSEL_CHECK(!intersect(chunks[i], chunks[j], &x), kOp, "{}: chunks at {} and {} overlap", what,
                   dims_str(chunks[i].offset), dims_str(chunks[j].offset));
    }
  const uint64_t numel = uint64_t(numel_of(shape));
  TESSEL_CHECK(covered == numel, kOp, "{}: the chunks cover {} of its {} elements", what, covered, numel);
}

std::string metadata_to_json(const CheckpointMeta& m) {
  nlohmann::ordered_json j;
  j["format"] = kFormatName;
  j["version"] = m.version;
  j["block_bytes"] = m.block_bytes;
  j["world_size"] = m.world_size;
  j["state"] = m.state;
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const FileMeta& f : m.files) {
    files.push_back({{"name", f.name},
                     {"rank", f.rank},
                     {"bytes", f.bytes},
                     {"header_bytes", f.header_bytes},
                     {"header_crc32c", f.header_crc},
                     {"crc32c", f.crc}});
  }
  j["files"] = files;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (const TensorMeta& t : m.tensors) {
    nlohmann::ordered_json e;
    e["dtype"] = safetensors_dtype_name(t.dtype);
    e["shape"] = std::vector<int64_t>(t.shape.begin(), t.shape.end());
    e["layout"] = t.layout;
    nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
    for (const ChunkMeta& c : t.chunks) {
      chunks.push_back({{"offsets", std::vector<int64_t>(c.box.offset.begin(), c.box.offset.end())},
                        {"sizes", std::vector<int64_t>(c.box.size.begin(), c.box.size.end())},
                        {"file", c.file},
                        {"key", c.key},
                        {"begin", c.begin},
                        {"crc32c", c.crc}});
    }
    e["chunks"] = chunks;
    tensors[t.name] = e;
  }
  j["tensors"] = tensors;
  return j.dump(1) + "\n";
}

CheckpointMeta parse_metadata(std::string_view text, const std::string& src) {
  json j;
  try {
    j = json::parse(text.begin(), text.end(), DuplicateKeyCheck{&src, {}});
  } catch (const json::exception& e) {
    TESSEL_FAIL(kOp, "'{}' is not valid JSON (truncated or corrupted?): {}", src, e.what());
  }
  Reader r{src, ""};
  r.exact_keys(j, {"format", "version", "block_bytes", "world_size", "state", "files", "tensors"});
  TESSEL_CHECK(r.str(j["format"], "format") == kFormatName, kOp, "'{}': format is '{}', expected '{}'", src,
               j["format"].get<std::string>(), kFormatName);
  CheckpointMeta m;
  TESSEL_CHECK(r.u64(j["version"], "version") == uint64_t(kFormatVersion), kOp,
               "'{}': version {} is not supported (this build reads version {})", src, j["version"].dump(),
               kFormatVersion);
  m.block_bytes = r.u64(j["block_bytes"], "block_bytes");
  TESSEL_CHECK(m.block_bytes >= 4096 && m.block_bytes <= (uint64_t(1) << 30) &&
                   (m.block_bytes & (m.block_bytes - 1)) == 0,
               kOp, "'{}': block_bytes must be a power of two in [4096, 2^30], got {}", src, m.block_bytes);
  const uint64_t world = r.u64(j["world_size"], "world_size");
  TESSEL_CHECK(world >= 1 && world <= (1u << 20), kOp, "'{}': world_size must be in [1, 2^20], got {}", src, world);
  m.world_size = int(world);
  TESSEL_CHECK(j["state"].is_object(), kOp, "'{}': state must be an object, got {}", src, j["state"].dump());
  m.state = j["state"];

  const json& files = j["files"];
  TESSEL_CHECK(files.is_array(), kOp, "'{}': files must be an array", src);
  std::set<std::string> file_names;
  for (size_t i = 0; i < files.size(); ++i) {
    Reader fr{src, fmt::format(FMT_STRING("files[{}]"), i)};
    fr.exact_keys(files[i], {"name", "rank", "bytes", "header_bytes", "header_crc32c", "crc32c"});
    FileMeta f;
    f.name = fr.str(files[i]["name"], "name");
    TESSEL_CHECK(is_plain_file_name(f.name), kOp, "{}: '{}' is not a plain file name", fr.at(), f.name);
    TESSEL_CHECK(file_names.insert(f.name).second, kOp, "{}: the file '{}' is listed twice", fr.at(), f.name);
    const uint64_t rank = fr.u64(files[i]["rank"], "rank");
    TESSEL_CHECK(rank < world, kOp, "{}: rank {} is outside the world of {}", fr.at(), rank, world);
    f.rank = int(rank);
    f.bytes = fr.u64(files[i]["bytes"], "bytes");
    f.header_bytes = fr.u64(files[i]["header_bytes"], "header_bytes");
    TESSEL_CHECK(f.header_bytes >= 8 && f.header_bytes <= f.bytes, kOp,
                 "{}: header_bytes {} must be in [8, bytes = {}]", fr.at(), f.header_bytes, f.bytes);
    f.header_crc = fr.u32(files[i]["header_crc32c"], "header_crc32c");
    f.crc = fr.u32(files[i]["crc32c"], "crc32c");
    m.files.push_back(std::move(f));
  }

  const json& tensors = j["tensors"];
  TESSEL_CHECK(tensors.is_object(), kOp, "'{}': tensors must be an object", src);
  for (const auto& [name, e] : tensors.items()) {
    Reader tr{src, "tensor '" + name + "'"};
    TESSEL_CHECK(!name.empty(), kOp, "'{}': a tensor has an empty name", src);
    tr.exact_keys(e, {"dtype", "shape", "layout", "chunks"});
    TensorMeta t;
    t.name = name;
    t.dtype = safetensors_dtype(tr.str(e["dtype"], "dtype"), tr.at());
    t.shape = tr.dims(e["shape"], "shape");
    uint64_t numel = 1;
    for (int64_t s : t.shape)
      TESSEL_CHECK(!__builtin_mul_overflow(numel, uint64_t(s), &numel) && numel <= uint64_t(INT64_MAX) / 8, kOp,
                   "{}: shape {} has too many elements", tr.at(), dims_str(t.shape));
    t.layout = tr.str(e["layout"], "layout");
    const json& chunks = e["chunks"];
    TESSEL_CHECK(chunks.is_array(), kOp, "{}: chunks must be an array", tr.at());
    TESSEL_CHECK(chunks.size() <= kMaxChunksPerTensor, kOp, "{}: {} chunks (at most {} supported)", tr.at(),
                 chunks.size(), kMaxChunksPerTensor);
    std::vector<Box> boxes;
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      Reader cr{src, fmt::format(FMT_STRING("tensor '{}': chunk {}"), name, ci)};
      const json& c = chunks[ci];
      cr.exact_keys(c, {"offsets", "sizes", "file", "key", "begin", "crc32c"});
      ChunkMeta ch;
      ch.box.offset = cr.dims(c["offsets"], "offsets", t.shape.size());
      ch.box.size = cr.dims(c["sizes"], "sizes", t.shape.size());
      const uint64_t file = cr.u64(c["file"], "file");
      TESSEL_CHECK(file < m.files.size(), kOp, "{}: file index {} but {} files are listed", cr.at(), file,
                   m.files.size());
      ch.file = int(file);
      ch.key = cr.str(c["key"], "key");
      TESSEL_CHECK(!ch.key.empty(), kOp, "{}: empty key", cr.at());
      ch.begin = cr.u64(c["begin"], "begin");
      boxes.push_back(ch.box);
      const json& crc = c["crc32c"];
      TESSEL_CHECK(crc.is_array(), kOp, "{}: crc32c must be an array", cr.at());
      for (const auto& v : crc) ch.crc.push_back(cr.u32(v, "crc32c"));
      t.chunks.push_back(std::move(ch));
    }
    check_tiling(boxes, t.shape, "'" + src + "': tensor '" + name + "'");
    // Sizes are now bounded by the shape: the byte counts below cannot overflow.
    for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
      const ChunkMeta& ch = t.chunks[ci];
      const FileMeta& f = m.files[size_t(ch.file)];
      const uint64_t nb = chunk_bytes(ch, t.dtype);
      TESSEL_CHECK(ch.begin >= f.header_bytes && ch.begin <= f.bytes && nb <= f.bytes - ch.begin, kOp,
                   "'{}': tensor '{}': chunk {} (bytes [{}, +{})) lies outside the data of '{}' ([{}, {}))", src,
                   name, ci, ch.begin, nb, f.name, f.header_bytes, f.bytes);
      TESSEL_CHECK(ch.crc.size() == num_blocks(nb, m.block_bytes), kOp,
                   "'{}': tensor '{}': chunk {} has {} bytes, so {} block CRCs, but lists {}", src, name, ci, nb,
                   num_blocks(nb, m.block_bytes), ch.crc.size());
    }
    m.tensors.push_back(std::move(t));
  }
  std::sort(m.tensors.begin(), m.tensors.end(), [](const TensorMeta& a, const TensorMeta& b) { return a.name < b.name; });
  return m;
}

}  // namespace tessel::checkpoint
