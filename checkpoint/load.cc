#include "checkpoint/load.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "autograd/api.h"
#include "checkpoint/crc32c.h"
#include "dtensor/mesh.h"

namespace tessel::checkpoint {
namespace {

constexpr const char* kOp = "checkpoint load";
constexpr uint64_t kSpanBytes = uint64_t(16) << 20;  // largest single read of the block path

}  // namespace

struct CheckpointReader::OpenFile {
  io::File file;
  bool header_checked = false;
};

CheckpointMeta read_metadata(const std::string& dir) {
  const std::string path = dir + "/" + kMetadataFile;
  TESSEL_CHECK(io::is_dir(dir), kOp, "'{}' is not a directory", dir);
  TESSEL_CHECK(io::exists(path), kOp, "'{}' is not a complete checkpoint: it has no {}", dir, kMetadataFile);
  return parse_metadata(io::read_file(path, kOp), path);
}

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)), meta_(read_metadata(dir_)) {
  files_.resize(meta_.files.size());
  // A tensor in each file, for messages about the file.
  std::vector<std::string> holds(meta_.files.size());
  std::vector<uint64_t> ends(meta_.files.size(), 0);
  for (const TensorMeta& t : meta_.tensors)
    for (const ChunkMeta& c : t.chunks) {
      if (holds[size_t(c.file)].empty()) holds[size_t(c.file)] = t.name;
      ends[size_t(c.file)] = std::max(ends[size_t(c.file)], c.begin + chunk_bytes(c, t.dtype));
    }
  for (size_t i = 0; i < meta_.files.size(); ++i) {
    const FileMeta& f = meta_.files[i];
    const std::string path = dir_ + "/" + f.name;
    struct stat st {};
    TESSEL_CHECK(::stat(path.c_str(), &st) == 0, kOp, "checkpoint '{}': file '{}' is missing (it holds tensor '{}')",
                 dir_, f.name, holds[i]);
    const uint64_t size = uint64_t(st.st_size);
    if (size < f.bytes) {
      // Name the first tensor that no longer fits.
      std::string victim = "its header";
      uint64_t first = UINT64_MAX;
      for (const TensorMeta& t : meta_.tensors)
        for (const ChunkMeta& c : t.chunks)
          if (size_t(c.file) == i && c.begin + chunk_bytes(c, t.dtype) > size && c.begin < first) {
            first = c.begin;
            victim = "tensor '" + t.name + "'";
          }
      TESSEL_FAIL(kOp, "checkpoint '{}': file '{}' is {} bytes but {} says {}: it is truncated ({} is cut off)", dir_,
                  f.name, size, kMetadataFile, f.bytes, victim);
    }
    TESSEL_CHECK(size == f.bytes, kOp, "checkpoint '{}': file '{}' is {} bytes but {} says {}: it was changed", dir_,
                 f.name, size, kMetadataFile, f.bytes);
  }
}

CheckpointReader::~CheckpointReader() = default;

char* CheckpointReader::scratch(size_t n) {
  if (n > scratch_bytes_) {
    scratch_.reset(new char[n]);
    scratch_bytes_ = n;
  }
  return scratch_.get();
}

// Opens a data file once: its header must pass its CRC, parse, and agree with
// every chunk the metadata places in it.
CheckpointReader::OpenFile& CheckpointReader::file(int index) {
  std::unique_ptr<OpenFile>& slot = files_[size_t(index)];
  if (slot && slot->header_checked) return *slot;
  const FileMeta& f = meta_.files[size_t(index)];
  const std::string path = dir_ + "/" + f.name;
  slot = std::make_unique<OpenFile>();
  slot->file = io::File(path, O_RDONLY, kOp);
  const uint64_t size = slot->file.size(kOp);
  TESSEL_CHECK(size == f.bytes, kOp, "checkpoint '{}': file '{}' is {} bytes but {} says {}", dir_, f.name, size,
               kMetadataFile, f.bytes);
  std::string header(size_t(f.header_bytes), '\0');
  slot->file.pread_all(header.data(), header.size(), 0, kOp, "its header");
  bytes_read_ += header.size();
  const uint32_t crc = crc32c(header.data(), header.size());
  TESSEL_CHECK(crc == f.header_crc, kOp,
               "checkpoint '{}': the header of file '{}' has crc32c {:08x} but {} says {:08x}: it is corrupted", dir_,
               f.name, crc, kMetadataFile, f.header_crc);
  const SafetensorsHeader h = parse_safetensors_header(header, size, path);
  TESSEL_CHECK(h.data_start == f.header_bytes, kOp, "checkpoint '{}': file '{}' has a {}-byte header, {} says {}",
               dir_, f.name, h.data_start, kMetadataFile, f.header_bytes);
  for (const TensorMeta& t : meta_.tensors)
    for (const ChunkMeta& c : t.chunks) {
      if (c.file != index) continue;
      const SafetensorsEntry* e = h.find(c.key);
      TESSEL_CHECK(e != nullptr, kOp, "checkpoint '{}': file '{}' has no entry '{}' (tensor '{}')", dir_, f.name,
                   c.key, t.name);
      TESSEL_CHECK(e->dtype == t.dtype && e->shape == c.box.size && e->begin == c.begin, kOp,
                   "checkpoint '{}': file '{}': entry '{}' is {} {} at byte {}, but {} says tensor '{}' has {} {} "
                   "there at byte {}",
                   dir_, f.name, c.key, dtype_name(e->dtype), e->shape.str(), e->begin, kMetadataFile, t.name,
                   dtype_name(t.dtype), c.box.size.str(), c.begin);
    }
  slot->header_checked = true;
  return *slot;
}

std::string CheckpointReader::where(const TensorMeta& t, size_t chunk) const {
  const ChunkMeta& c = t.chunks[chunk];
  return fmt::format(FMT_STRING("checkpoint '{}': file '{}', tensor '{}' (chunk at {} of size {})"), dir_,
                     meta_.files[size_t(c.file)].name, t.name, c.box.offset.str(), c.box.size.str());
}

void CheckpointReader::verify_block(const TensorMeta& t, size_t chunk, uint64_t block, const char* data,
                                    uint64_t n) const {
  const ChunkMeta& c = t.chunks[chunk];
  const uint32_t crc = crc32c(data, size_t(n));
  if (crc != c.crc[size_t(block)]) {
    const uint64_t at = c.begin + block * meta_.block_bytes;
    TESSEL_FAIL(kOp, "{}: bytes [{}, {}) of the file have crc32c {:08x} but {} says {:08x}: the file is corrupted",
                where(t, chunk), at, at + n, crc, kMetadataFile, c.crc[size_t(block)]);
  }
}

void CheckpointReader::read(const TensorMeta& t, const Box& box, void* dst_v) {
  char* dst = static_cast<char*>(dst_v);
  const uint64_t item = itemsize(t.dtype), B = meta_.block_bytes;
  for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
    const ChunkMeta& c = t.chunks[ci];
    Box region;
    if (!intersect(c.box, box, &region)) continue;
    const uint64_t nbytes = chunk_bytes(c, t.dtype);
    runs_.clear();
    for_each_run(c.box, box, region, [&](int64_t s, int64_t d, int64_t n) {
      runs_.push_back({uint64_t(s) * item, uint64_t(d) * item, uint64_t(n) * item});
    });
    OpenFile& f = file(c.file);
    if (runs_.size() == 1 && runs_[0].bytes == nbytes) {
      // The whole chunk lands contiguously: read it in place, verify it there.
      char* out = dst + runs_[0].dst;
      f.file.pread_all(out, size_t(nbytes), c.begin, kOp, "tensor '" + t.name + "'");
      bytes_read_ += nbytes;
      for (uint64_t b = 0, off = 0; off < nbytes; ++b, off += B) verify_block(t, ci, b, out + off, std::min(B, nbytes - off));
      continue;
    }
    // Otherwise read the CRC blocks the runs touch (spans of consecutive
    // blocks, at most kSpanBytes at a time), verify them, copy the runs out.
    const uint64_t nblk = num_blocks(nbytes, B);
    needed_.assign(size_t(nblk), 0);
    for (const Run& r : runs_)
      for (uint64_t b = r.src / B; b <= (r.src + r.bytes - 1) / B; ++b) needed_[size_t(b)] = 1;
    const uint64_t span_blocks = std::max<uint64_t>(1, kSpanBytes / B);
    char* buf = scratch(size_t(std::min(nbytes, span_blocks * B)));
    size_t ri = 0;
    for (uint64_t b = 0; b < nblk;) {
      if (!needed_[size_t(b)]) {
        ++b;
        continue;
      }
      uint64_t e = b + 1;
      while (e < nblk && needed_[size_t(e)] && e - b < span_blocks) ++e;
      const uint64_t lo = b * B, hi = std::min(e * B, nbytes);
      f.file.pread_all(buf, size_t(hi - lo), c.begin + lo, kOp, "tensor '" + t.name + "'");
      bytes_read_ += hi - lo;
      for (uint64_t k = b; k < e; ++k)
        verify_block(t, ci, k, buf + (k - b) * B, std::min(B, nbytes - k * B));
      while (ri < runs_.size() && runs_[ri].src + runs_[ri].bytes <= lo) ++ri;
      for (size_t k = ri; k < runs_.size() && runs_[k].src < hi; ++k) {
        const Run& r = runs_[k];
        const uint64_t s = std::max(r.src, lo), x = std::min(r.src + r.bytes, hi);
        std::memcpy(dst + r.dst + (s - r.src), buf + (s - lo), size_t(x - s));
      }
      b = e;
    }
  }
}

void CheckpointReader::verify_all() {
  for (size_t i = 0; i < meta_.files.size(); ++i) {
    const FileMeta& fm = meta_.files[i];
    OpenFile& f = file(int(i));  // header CRC and entries
    uint32_t crc = 0;
    char* buf = scratch(size_t(kSpanBytes));
    for (uint64_t off = 0; off < fm.bytes; off += kSpanBytes) {
      const uint64_t n = std::min(kSpanBytes, fm.bytes - off);
      f.file.pread_all(buf, size_t(n), off, kOp, "the whole file");
      bytes_read_ += n;
      crc = crc32c_extend(crc, buf, size_t(n));
    }
    if (crc == fm.crc) continue;
    // Find the tensor: every block of every chunk in this file.
    for (const TensorMeta& t : meta_.tensors)
      for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
        const ChunkMeta& c = t.chunks[ci];
        if (size_t(c.file) != i) continue;
        const uint64_t nbytes = chunk_bytes(c, t.dtype);
        for (uint64_t off = 0, b = 0; off < nbytes; off += meta_.block_bytes, ++b) {
          const uint64_t n = std::min(meta_.block_bytes, nbytes - off);
          f.file.pread_all(buf, size_t(n), c.begin + off, kOp, "tensor '" + t.name + "'");
          verify_block(t, ci, b, buf, n);
        }
      }
    TESSEL_FAIL(kOp, "checkpoint '{}': file '{}' has crc32c {:08x} but {} says {:08x}: it is corrupted outside the "
                "tensor data (padding)", dir_, fm.name, crc, kMetadataFile, fm.crc);
  }
}

LoadResult load(const std::string& dir, const NamedTensors& targets, const LoadOptions& options) {
  CheckpointReader reader(dir);
  return load(reader, targets, options);
}

LoadResult load(CheckpointReader& reader, const NamedTensors& targets, const LoadOptions& options) {
  LoadResult result;
  const uint64_t before = reader.bytes_read();
  const CheckpointMeta& meta = reader.meta();
  // Check everything first: nothing is written unless every target fits.
  std::vector<const TensorMeta*> found(targets.size(), nullptr);
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto& [name, t] = targets[i];
    TESSEL_CHECK(t.defined(), kOp, "target '{}' is undefined", name);
    found[i] = meta.find(name);
    if (!found[i]) {
      TESSEL_CHECK(options.allow_missing, kOp, "checkpoint '{}' has no tensor '{}' ({} tensors)", reader.dir(), name,
                   meta.tensors.size());
      result.missing.push_back(name);
      continue;
    }
    const TensorMeta& m = *found[i];
    TESSEL_CHECK(m.dtype == t.dtype() && m.shape == t.shape(), kOp,
                 "checkpoint '{}': tensor '{}' is {} {} but the target is {} {}", reader.dir(), name,
                 dtype_name(m.dtype), m.shape.str(), dtype_name(t.dtype()), t.shape().str());
  }
  NoGradGuard ng;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!found[i]) continue;
    const Tensor& t = targets[i].second;
    const Tensor& local = raw::local_of(t);
    const auto [box, zero] = local_piece(t);
    if (local.numel() == 0) continue;
    if (zero) {
      Tensor(local).zero_();
    } else if (local.device().is_cpu() && local.is_contiguous()) {
      reader.read(*found[i], box, local.raw_data());
    } else {
      Tensor tmp = raw::empty(box.size, t.dtype(), kCPU);
      reader.read(*found[i], box, tmp.raw_data());
      Tensor(local).copy_(tmp);
    }
    local.bump_version();
  }
  result.state = meta.state;
  result.bytes_read = reader.bytes_read() - before;
  return result;
}

LocalPiece local_piece(const Tensor& t) {
  LocalPiece p;
  if (!t.is_distributed()) {
    p.box = Box{Dims::filled(t.dim(), 0), t.shape()};
    return p;
  }
  const Mesh& mesh = *t.mesh();
  const LocalGeometry g = local_geometry(t.shape(), mesh.shape(), t.placements(), mesh.coords());
  p.box = Box{g.offset, g.shape};
  for (int d = 0; d < mesh.ndim(); ++d) p.zero = p.zero || (t.placements()[d].is_partial() && mesh.coordinate(d) != 0);
  return p;
}

Tensor read_tensor(CheckpointReader& reader, const std::string& name) {
  const TensorMeta* m = reader.meta().find(name);
  TESSEL_CHECK(m != nullptr, kOp, "checkpoint '{}' has no tensor '{}'", reader.dir(), name);
  Tensor out = raw::empty(m->shape, m->dtype, kCPU);
  if (out.numel() > 0) reader.read(*m, Box{Dims::filled(m->shape.size(), 0), m->shape}, out.raw_data());
  return out;
}

}  // namespace tessel::checkpoint
