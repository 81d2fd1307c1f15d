#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/atomic_write.h"
#include "runtime/error.h"

namespace tessel::checkpoint {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors stores little-endian data; tessel assumes a "
                                                         "little-endian host");

namespace {

constexpr const char* kOp = "safetensors";
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypes[] = {
    {DType::Float64, "F64"}, {DType::Float32, "F32"}, {DType::Float16, "F16"}, {DType::BFloat16, "BF16"},
    {DType::Int64, "I64"},   {DType::Int32, "I32"},   {DType::Bool, "BOOL"},
};

// Copies t's elements in row-major order to dst (t on the CPU, any strides).
void gather_bytes(const Tensor& t, char* dst) {
  const size_t item = t.itemsize();
  const char* base = static_cast<const char*>(t.raw_data());
  if (t.numel() == 0) return;
  if (t.is_contiguous()) {
    std::memcpy(dst, base, t.nbytes());
    return;
  }
  const Dims& shape = t.shape();
  const Dims& strides = t.strides();
  const int nd = shape.size();
  // Walk every index but the last with an odometer; copy the last dim as a run.
  const int64_t inner = shape[nd - 1], inner_stride = strides[nd - 1];
  std::vector<int64_t> idx(size_t(std::max(nd - 1, 0)), 0);
  const int64_t rows = t.numel() / inner;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int d = 0; d < nd - 1; ++d) off += idx[size_t(d)] * strides[d];
    if (inner_stride == 1) {
      std::memcpy(dst, base + off * int64_t(item), size_t(inner) * item);
      dst += size_t(inner) * item;
    } else {
      for (int64_t j = 0; j < inner; ++j, dst += item) std::memcpy(dst, base + (off + j * inner_stride) * int64_t(item), item);
    }
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[size_t(d)] < shape[d]) break;
      idx[size_t(d)] = 0;
    }
  }
}

void check_name(const std::string& name, std::set<std::string>& seen) {
  TESSEL_CHECK(!name.empty(), kOp, "tensor names must be non-empty");
  TESSEL_CHECK(name != kMetadataKey, kOp, "'{}' is reserved for the metadata and cannot name a tensor", kMetadataKey);
  TESSEL_CHECK(seen.insert(name).second, kOp, "two tensors are named '{}'", name);
}

struct Layout {
  std::string header;                 // 8-byte length + padded JSON
  std::vector<size_t> order;          // tensor indices in data order
  std::vector<std::string> gathered;  // row-major bytes of non-contiguous tensors (by position in order)
};

Layout make_layout(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    TESSEL_CHECK(t.defined(), kOp, "tensor '{}' is undefined", name);
    TESSEL_CHECK(t.device().is_cpu(), kOp, "tensor '{}' is {}; copy it to the CPU before saving", name, t.desc());
    specs.push_back({name, t.dtype(), t.shape()});
  }
  SafetensorsLayout sl = safetensors_layout(specs, metadata);
  Layout L;
  L.header = std::move(sl.header);
  L.order = std::move(sl.order);
  return L;
}

// The pieces of the file, in order (views into `L` and the tensors).
std::vector<std::string_view> file_parts(const NamedTensors& tensors, Layout& L) {
  std::vector<std::string_view> parts{L.header};
  L.gathered.reserve(L.order.size());
  for (size_t i : L.order) {
    const Tensor& t = tensors[i].second;
    if (t.nbytes() == 0) continue;
    if (t.is_contiguous()) {
      parts.emplace_back(static_cast<const char*>(t.raw_data()), t.nbytes());
    } else {
      L.gathered.emplace_back(t.nbytes(), '\0');
      gather_bytes(t, L.gathered.back().data());
      parts.emplace_back(L.gathered.back());
    }
  }
  return parts;
}

// ---- reading ------------------------------------------------------------------------------

struct Entry {
  std::string name;
  DType dtype;
  Dims shape;
  uint64_t begin, end;
};

// Rejects duplicate keys in any object (nlohmann would keep the last silently).
struct DuplicateKeyCheck {
  const std::string* source;
  std::vector<std::set<std::string>> open;
  bool operator()(int /*depth*/, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) open.emplace_back();
    else if (ev == E::object_end && !open.empty()) open.pop_back();
    else if (ev == E::key && !open.empty()) {
      const std::string k = parsed.get<std::string>();
      TESSEL_CHECK(open.back().insert(k).second, kOp, "'{}': the header has the key '{}' twice", *source, k);
    }
    return true;
  }
};

uint64_t get_unsigned(const nlohmann::json& v, const std::string& src, const std::string& name, const char* field) {
  TESSEL_CHECK(v.is_number_unsigned(), kOp, "'{}': tensor '{}': {} must hold non-negative integers, got {}", src, name,
               field, v.dump());
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& src, const std::string& name, const nlohmann::json& e) {
  TESSEL_CHECK(!name.empty(), kOp, "'{}': a tensor has an empty name", src);
  TESSEL_CHECK(e.is_object(), kOp, "'{}': tensor '{}': the entry must be an object, got {}", src, name, e.dump());
  for (const auto& [k, v] : e.items()) {
    TESSEL_CHECK(k == "dtype" || k == "shape" || k == "data_offsets", kOp,
                 "'{}': tensor '{}': unexpected field '{}' (expected dtype, shape, data_offsets)", src, name, k);
  }
  for (const char* k : {"dtype", "shape", "data_offsets"})
    TESSEL_CHECK(e.contains(k), kOp, "'{}': tensor '{}': missing field '{}'", src, name, k);
  Entry out;
  out.name = name;
  const auto& dt = e["dtype"];
  TESSEL_CHECK(dt.is_string(), kOp, "'{}': tensor '{}': dtype must be a string, got {}", src, name, dt.dump());
  out.dtype = safetensors_dtype(dt.get<std::string>(), "'" + src + "': tensor '" + name + "'");

  const auto& shape = e["shape"];
  TESSEL_CHECK(shape.is_array(), kOp, "'{}': tensor '{}': shape must be an array, got {}", src, name, shape.dump());
  TESSEL_CHECK(shape.size() <= size_t(kMaxDims), kOp, "'{}': tensor '{}': shape {} has more than {} dims", src, name,
               shape.dump(), kMaxDims);
  uint64_t numel = 1;
  for (const auto& s : shape) {
    const uint64_t v = get_unsigned(s, src, name, "shape");
    TESSEL_CHECK(v <= uint64_t(INT64_MAX) && !__builtin_mul_overflow(numel, v, &numel), kOp,
                 "'{}': tensor '{}': shape {} has too many elements", src, name, shape.dump());
    out.shape.push_back(int64_t(v));
  }
  uint64_t nbytes = 0;
  TESSEL_CHECK(!__builtin_mul_overflow(numel, uint64_t(itemsize(out.dtype)), &nbytes) && nbytes <= uint64_t(INT64_MAX),
               kOp, "'{}': tensor '{}': shape {} has too many elements", src, name, shape.dump());

  const auto& off = e["data_offsets"];
  TESSEL_CHECK(off.is_array() && off.size() == 2, kOp, "'{}': tensor '{}': data_offsets must be [begin, end], got {}",
               src, name, off.dump());
  out.begin = get_unsigned(off[0], src, name, "data_offsets");
  out.end = get_unsigned(off[1], src, name, "data_offsets");
  TESSEL_CHECK(out.begin <= out.end, kOp, "'{}': tensor '{}': data_offsets [{}, {}] end before they begin", src, name,
               out.begin, out.end);
  TESSEL_CHECK(out.end - out.begin == nbytes, kOp,
               "'{}': tensor '{}': data_offsets [{}, {}] span {} bytes but {} {} needs {} bytes", src, name, out.begin,
               out.end, out.end - out.begin, dt.get<std::string>(), shape.dump(), nbytes);
  return out;
}

std::map<std::string, std::string> parse_metadata(const std::string& src, const nlohmann::json& m) {
  TESSEL_CHECK(m.is_object(), kOp, "'{}': {} must be an object of strings, got {}", src, kMetadataKey, m.dump());
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : m.items()) {
    TESSEL_CHECK(v.is_string(), kOp, "'{}': {} value of '{}' must be a string, got {}", src, kMetadataKey, k,
                 v.dump());
    out[k] = v.get<std::string>();
  }
  return out;
}

}  // namespace

SafetensorsLayout safetensors_layout(const std::vector<TensorSpec>& specs,
                                     const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const auto& s : specs) check_name(s.name, seen);
  SafetensorsLayout L;
  L.order.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) L.order[i] = i;
  // Larger items first: every tensor then starts at a multiple of its item size.
  std::stable_sort(L.order.begin(), L.order.end(),
                   [&](size_t a, size_t b) { return itemsize(specs[a].dtype) > itemsize(specs[b].dtype); });

  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h[kMetadataKey] = m;
  }
  std::vector<uint64_t> rel(specs.size());
  uint64_t offset = 0;
  for (size_t i : L.order) {
    const TensorSpec& t = specs[i];
    const uint64_t nbytes = uint64_t(numel_of(t.shape)) * itemsize(t.dtype);
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = safetensors_dtype_name(t.dtype);
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int64_t s : t.shape) shape.push_back(uint64_t(s));
    e["shape"] = shape;
    e["data_offsets"] = {offset, offset + nbytes};
    rel[i] = offset;
    offset += nbytes;
    h[t.name] = e;
  }
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  L.header.resize(8);
  uint64_t n = json.size();
  std::memcpy(L.header.data(), &n, 8);
  L.header += json;
  L.begin.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) L.begin[i] = L.header.size() + rel[i];
  L.file_size = L.header.size() + offset;
  return L;
}

const char* safetensors_dtype_name(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  TESSEL_FAIL(kOp, "dtype {} has no safetensors name", dtype_name(dtype));
}

DType safetensors_dtype(const std::string& name, const std::string& where) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  TESSEL_FAIL(kOp, "{}: dtype '{}' is not supported (tessel reads F64, F32, F16, BF16, I64, I32, BOOL)", where, name);
}

bool SafetensorsFile::contains(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return true;
  return false;
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  TESSEL_FAIL(kOp, "'{}' has no tensor '{}' ({} tensors)", source, name, tensors.size());
}

std::string serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  Layout L = make_layout(tensors, metadata);
  std::string out;
  for (std::string_view p : file_parts(tensors, L)) out.append(p);
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  Layout L = make_layout(tensors, metadata);
  write_file_atomic(path, file_parts(tensors, L), "safetensors save");
}

uint64_t safetensors_header_length(std::string_view prefix, uint64_t file_size, const std::string& src) {
  TESSEL_CHECK(file_size >= 8 && prefix.size() >= 8, kOp, "'{}' is {} bytes long, too short for the 8-byte header length",
               src, file_size);
  uint64_t n = 0;
  std::memcpy(&n, prefix.data(), 8);
  TESSEL_CHECK(n <= kMaxHeaderBytes, kOp, "'{}': header length {} exceeds the limit of {} bytes", src, n,
               kMaxHeaderBytes);
  TESSEL_CHECK(n <= file_size - 8, kOp, "'{}': header length {} exceeds the {} bytes after the length field", src, n,
               file_size - 8);
  return n;
}

SafetensorsHeader parse_safetensors_header(std::string_view prefix, uint64_t file_size, const std::string& src) {
  const uint64_t n = safetensors_header_length(prefix, file_size, src);
  TESSEL_CHECK(prefix.size() >= 8 + n, kOp, "'{}': {} header bytes given, the header needs {}", src, prefix.size(),
               8 + n);
  const std::string_view text = prefix.substr(8, size_t(n));
  TESSEL_CHECK(!text.empty() && text[0] == '{', kOp, "'{}': the header must be a JSON object starting with '{{'", src);

  nlohmann::json h;
  try {
    h = nlohmann::json::parse(text.begin(), text.end(), DuplicateKeyCheck{&src, {}});
  } catch (const nlohmann::json::exception& e) {
    TESSEL_FAIL(kOp, "'{}': the header is not valid JSON: {}", src, e.what());
  }
  TESSEL_CHECK(h.is_object(), kOp, "'{}': the header must be a JSON object", src);

  SafetensorsHeader out;
  out.data_start = 8 + n;
  std::vector<Entry> entries;
  for (const auto& [key, value] : h.items()) {
    if (key == kMetadataKey) out.metadata = parse_metadata(src, value);
    else entries.push_back(parse_entry(src, key, value));
  }

  // The tensors must tile the data buffer: sorted by offset, each begins where the previous ended.
  const uint64_t data_size = file_size - out.data_start;
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    TESSEL_CHECK(e.end <= data_size, kOp,
                 "'{}': tensor '{}': data_offsets [{}, {}] lie outside the data buffer of {} bytes", src, e.name,
                 e.begin, e.end, data_size);
    TESSEL_CHECK(e.begin >= pos, kOp, "'{}': tensor '{}' (bytes [{}, {})) overlaps tensor '{}' (ends at {})", src,
                 e.name, e.begin, e.end, prev ? prev->name : "", pos);
    TESSEL_CHECK(e.begin == pos, kOp, "'{}': tensor '{}' starts at {}, leaving a hole of {} bytes after {}", src,
                 e.name, e.begin, e.begin - pos, prev ? "tensor '" + prev->name + "'" : "the header");
    pos = e.end;
    prev = &e;
  }
  TESSEL_CHECK(pos == data_size, kOp, "'{}': the data buffer has {} bytes but the tensors cover only {}", src,
               data_size, pos);
  out.entries.reserve(entries.size());
  for (Entry& e : entries)
    out.entries.push_back({std::move(e.name), e.dtype, std::move(e.shape), out.data_start + e.begin,
                           out.data_start + e.end});
  return out;
}

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const auto& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& src) {
  SafetensorsHeader h = parse_safetensors_header(bytes, bytes.size(), src);
  SafetensorsFile out;
  out.source = src;
  out.metadata = std::move(h.metadata);
  for (const SafetensorsEntry& e : h.entries) {
    Tensor t = raw::empty(e.shape, e.dtype, kCPU);
    const char* p = bytes.data() + e.begin;
    const size_t nb = size_t(e.end - e.begin);
    if (e.dtype == DType::Bool) {
      for (size_t i = 0; i < nb; ++i)
        TESSEL_CHECK(uint8_t(p[i]) <= 1, kOp, "'{}': tensor '{}': BOOL element {} is {} (must be 0 or 1)", src, e.name,
                     i, int(uint8_t(p[i])));
    }
    if (nb > 0) std::memcpy(t.raw_data(), p, nb);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

SafetensorsFile load_safetensors(const std::string& path) {
  return parse_safetensors(read_whole_file(path, "safetensors load"), path);
}

}  // namespace tessel::checkpoint
