#include "checkpoint/save.h"

#include <fcntl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "autograd/api.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/plan.h"
#include "dtensor/redistribute.h"
#include "runtime/comm/comm.h"
#include <spdlog/spdlog.h>
#include "dtensor/mesh.h"

namespace tessel::checkpoint {
namespace {

constexpr const char* kOp = "checkpoint save";
namespace fs = std::filesystem;

int my_rank() { return comm::has_world() ? comm::world()->rank() : 0; }
int world_size() { return comm::has_world() ? comm::world()->size() : 1; }

// Every rank's string, in rank order (two all-gathers: lengths, then bytes packed in int64 words).
std::vector<std::string> all_gather_strings(const std::string& mine) {
  const int n = world_size();
  if (n == 1) return {mine};
  comm::CommPtr w = comm::world();
  Tensor len = raw::empty({1}, DType::Int64);
  len.data<int64_t>()[0] = int64_t(mine.size());
  Tensor lens = raw::empty({n}, DType::Int64);
  w->all_gather(len, lens);
  std::vector<int64_t> words(static_cast<size_t>(n));
  int64_t total = 0;
  for (int r = 0; r < n; ++r) total += words[size_t(r)] = (lens.data<int64_t>()[r] + 7) / 8;
  Tensor in = raw::empty({words[size_t(w->rank())]}, DType::Int64);
  std::memset(in.raw_data(), 0, size_t(in.nbytes()));
  std::memcpy(in.raw_data(), mine.data(), mine.size());
  Tensor out = raw::empty({total}, DType::Int64);
  w->all_gather_v(in, out, words);
  std::vector<std::string> all;
  const char* p = static_cast<const char*>(out.raw_data());
  for (int r = 0; r < n; ++r) {
    all.emplace_back(p, size_t(lens.data<int64_t>()[r]));
    p += words[size_t(r)] * 8;
  }
  return all;
}

std::string layout_of(const Tensor& t) {
  if (!t.is_distributed()) return "plain";
  return t.mesh()->str() + " " + t.placements().str();
}

// This rank's piece of `t` as a contiguous CPU tensor, and where it sits.
// Partial mesh dims are reduced first (collective over those dims).
std::pair<Tensor, Box> local_piece(const std::string& name, const Tensor& t) {
  TESSEL_CHECK(t.defined(), kOp, "tensor '{}' is undefined", name);
  TESSEL_CHECK(!t.device().is_meta(), kOp, "tensor '{}' is on the meta device (nothing to save)", name);
  Tensor local;
  Box box;
  if (!t.is_distributed()) {
    local = raw::alias(t);
    box.offset = Dims::filled(t.dim(), 0);
    box.size = t.shape();
  } else {
    const Mesh& mesh = *t.mesh();
    Placements p = t.placements();
    local = raw::local_of(t);
    if (p.any_partial()) {
      Placements reduced = p;
      for (int m = 0; m < reduced.size(); ++m)
        if (reduced[m].is_partial()) reduced[m] = Replicate();
      local = dtensor::redistribute_local(local, t.shape(), mesh, p, reduced);
      p = reduced;
    }
    const LocalGeometry g = local_geometry(t.shape(), mesh.shape(), p, mesh.coords());
    box.offset = g.offset;
    box.size = g.shape;
    TESSEL_CHECK(local.shape() == g.shape, kOp, "tensor '{}' ({}): the local piece is {} but the layout says {}", name,
                 layout_of(t), local.shape().str(), g.shape.str());
  }
  NoGradGuard ng;
  if (!local.device().is_cpu()) local = local.to(kCPU);
  if (!local.is_contiguous()) local = local.contiguous();
  return {local, box};
}

std::string manifest_name(int rank) { return fmt::format(FMT_STRING("data-{:05d}.json"), rank); }
std::string error_name(int rank) { return fmt::format(FMT_STRING("data-{:05d}.error"), rank); }

}  // namespace

struct Saver::Job {
  std::string dir, tmp;
  int rank = 0;
  SavePlan plan;
  struct Part {
    int tensor, chunk;
    const char* data;
    uint64_t bytes;
  };
  std::vector<Part> parts;
  std::vector<Tensor> keep_alive;  // sync: the pieces written from
  nlohmann::json state;
  SaveOptions opts;

  void stage(const char* s) const {
    if (opts.on_stage) opts.on_stage(s);
  }

  // This rank's data file, streamed block by block with its CRCs, then its manifest.
  void write_data() {
    const int fi = plan.file_of_rank[size_t(rank)];
    if (fi < 0) return;
    const FileMeta& fm = plan.meta.files[size_t(fi)];
    const std::string path = tmp + "/" + fm.name;
    const uint64_t B = plan.meta.block_bytes;
    const std::string& header = plan.headers[size_t(rank)];
    io::File f(path, O_WRONLY | O_CREAT | O_TRUNC, kOp);
    f.write_all(header.data(), header.size(), kOp);
    const uint32_t header_crc = crc32c(header.data(), header.size());
    uint32_t file_crc = header_crc;
    uint64_t written = header.size();
    nlohmann::json chunks = nlohmann::json::array();
    for (const Part& p : parts) {
      const ChunkMeta& c = plan.meta.tensors[size_t(p.tensor)].chunks[size_t(p.chunk)];
      TESSEL_CHECK(c.begin == written, kOp, "internal: chunk '{}' planned at byte {} but the file is at {}", c.key,
                   c.begin, written);
      std::vector<uint32_t> crcs;
      for (uint64_t off = 0; off < p.bytes; off += B) {
        const uint64_t n = std::min(B, p.bytes - off);
        const uint32_t crc = crc32c(p.data + off, size_t(n));
        crcs.push_back(crc);
        file_crc = crc32c_combine(file_crc, crc, n);
        f.write_all(p.data + off, size_t(n), kOp);
        if (off == 0 && &p == &parts.front()) stage("writing");  // tests: a kill lands mid-file
      }
      written += p.bytes;
      chunks.push_back({p.tensor, p.chunk, c.key, crcs});
    }
    TESSEL_CHECK(written == fm.bytes, kOp, "internal: '{}' has {} bytes, planned {}", path, written, fm.bytes);
    f.fsync(kOp);
    f.close(kOp);
    stage("data");
    const nlohmann::json manifest = {{"rank", rank},          {"file", fm.name},       {"bytes", written},
                                     {"header_crc32c", header_crc}, {"crc32c", file_crc}, {"chunks", chunks}};
    io::write_file_atomic(tmp + "/" + manifest_name(rank), manifest.dump(), kOp);
    stage("manifest");
  }

  // Rank 0: every writer's manifest -> metadata.json -> rename.
  void commit() {
    auto timeout = opts.commit_timeout.count() > 0 ? opts.commit_timeout : comm::default_timeout();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    CheckpointMeta& meta = plan.meta;
    for (FileMeta& fm : meta.files) {
      const std::string mpath = tmp + "/" + manifest_name(fm.rank), epath = tmp + "/" + error_name(fm.rank);
      // Poll often: a sync save returns only after the commit, so a long
      // pause here would be added to its time (a stat every 2 ms costs nothing).
      auto pause = std::chrono::milliseconds(1);
      while (!io::exists(mpath)) {
        if (io::exists(epath))
          TESSEL_FAIL(kOp, "'{}': rank {} failed to write its part: {}", dir, fm.rank, io::read_file(epath, kOp));
        TESSEL_CHECK(std::chrono::steady_clock::now() < deadline, kOp,
                     "'{}': rank {} did not finish writing '{}' within {} s (it failed or is stuck)", dir, fm.rank,
                     fm.name, timeout.count() / 1000.0);
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(2));
      }
      nlohmann::json m;
      try {
        m = nlohmann::json::parse(io::read_file(mpath, kOp));
        TESSEL_CHECK(m.at("file").get<std::string>() == fm.name && m.at("bytes").get<uint64_t>() == fm.bytes, kOp,
                     "'{}': rank {} wrote {} ({} bytes), the plan says {} ({} bytes)", dir, fm.rank,
                     m.at("file").dump(), m.at("bytes").dump(), fm.name, fm.bytes);
        fm.header_crc = m.at("header_crc32c").get<uint32_t>();
        fm.crc = m.at("crc32c").get<uint32_t>();
        for (const auto& c : m.at("chunks")) {
          ChunkMeta& ch = meta.tensors.at(c.at(0).get<size_t>()).chunks.at(c.at(1).get<size_t>());
          TESSEL_CHECK(ch.key == c.at(2).get<std::string>(), kOp, "'{}': rank {} wrote chunk '{}' where the plan has '{}'",
                       dir, fm.rank, c.at(2).dump(), ch.key);
          ch.crc = c.at(3).get<std::vector<uint32_t>>();
        }
      } catch (const nlohmann::json::exception& e) {
        TESSEL_FAIL(kOp, "'{}': the checksums of rank {} ('{}') do not parse: {}", dir, fm.rank, mpath, e.what());
      } catch (const std::out_of_range& e) {
        TESSEL_FAIL(kOp, "'{}': the checksums of rank {} ('{}') name unknown chunks", dir, fm.rank, mpath);
      }
    }
    meta.state = state;
    io::write_file_atomic(tmp + "/" + kMetadataFile, metadata_to_json(meta), kOp);
    stage("metadata");
    for (const FileMeta& fm : meta.files) std::remove((tmp + "/" + manifest_name(fm.rank)).c_str());
    io::fsync_dir(tmp);
    io::replace_dir(tmp, dir, kOp);
    stage("committed");
    if (opts.after_commit) opts.after_commit(dir);
  }

  void run() {
    try {
      write_data();
    } catch (const std::exception& e) {
      // Tell rank 0 at once instead of letting it wait for the timeout.
      try {
        io::write_file_atomic(tmp + "/" + error_name(rank), e.what(), kOp);
      } catch (...) {
      }
      throw;
    }
    if (rank == 0) commit();
  }
};

Saver::Saver() = default;

Saver::~Saver() {
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::warn("checkpoint: a pending save failed: {}", e.what());
  }
}

void Saver::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void Saver::save(const std::string& dir_in, const NamedTensors& tensors, const nlohmann::json& state, bool async,
                 const SaveOptions& opts) {
  wait();
  TESSEL_CHECK(!dir_in.empty(), kOp, "needs a directory");
  TESSEL_CHECK(opts.block_bytes >= 4096 && (opts.block_bytes & (opts.block_bytes - 1)) == 0, kOp,
               "block_bytes must be a power of two >= 4096, got {}", opts.block_bytes);
  TESSEL_CHECK(state.is_object(), kOp, "the state must be a JSON object, got {}", state.dump());
  auto job = std::make_shared<Job>();
  job->dir = fs::path(dir_in).lexically_normal().string();
  if (!job->dir.empty() && job->dir.back() == '/') job->dir.pop_back();
  job->tmp = job->dir + ".tmp";
  job->rank = my_rank();
  job->state = state;
  job->opts = opts;

  // Same order on every rank: Partial reductions are collectives.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors[a].first < tensors[b].first; });
  std::map<std::string, Tensor> pieces;
  std::vector<PieceInfo> infos;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    TESSEL_CHECK(!name.empty(), kOp, "a tensor has an empty name");
    TESSEL_CHECK(!pieces.count(name), kOp, "two tensors are named '{}'", name);
    auto [local, box] = local_piece(name, t);
    pieces[name] = local;
    infos.push_back({name, t.dtype(), t.shape(), box, layout_of(t)});
  }

  // Rank 0 prepares the directory before anyone can get past the all-gather.
  if (job->rank == 0) {
    const std::string parent = fs::path(job->dir).parent_path().string();
    if (!parent.empty()) io::make_dir(parent, kOp);
    io::remove_tree(job->tmp);
    io::make_dir(job->tmp, kOp);
  }
  std::vector<std::vector<PieceInfo>> all;
  const std::vector<std::string> gathered = all_gather_strings(pieces_to_json(infos));
  for (size_t r = 0; r < gathered.size(); ++r) all.push_back(pieces_from_json(gathered[r], int(r)));
  job->plan = make_save_plan(all, opts.block_bytes);

  // This rank's chunks: the data straight from the pieces (sync) or from the staging copy (async).
  uint64_t total = 0;
  for (auto [ti, ci] : job->plan.writes[size_t(job->rank)]) {
    const TensorMeta& t = job->plan.meta.tensors[size_t(ti)];
    total += chunk_bytes(t.chunks[size_t(ci)], t.dtype);
  }
  if (async && total > staging_bytes_) {
    staging_.reset(new char[total]);  // uninitialised: every byte is overwritten below
    staging_bytes_ = total;
  }
  uint64_t at = 0;
  for (auto [ti, ci] : job->plan.writes[size_t(job->rank)]) {
    const TensorMeta& t = job->plan.meta.tensors[size_t(ti)];
    const Tensor& piece = pieces.at(t.name);
    const uint64_t n = chunk_bytes(t.chunks[size_t(ci)], t.dtype);
    TESSEL_CHECK(piece.nbytes() == n, kOp, "internal: piece of '{}' has {} bytes, its chunk {}", t.name,
                 piece.nbytes(), n);
    const char* src = static_cast<const char*>(piece.raw_data());
    if (async) {
      std::memcpy(staging_.get() + at, src, size_t(n));
      src = staging_.get() + at;
    } else {
      job->keep_alive.push_back(piece);
    }
    job->parts.push_back({ti, ci, src, n});
    at += n;
  }

  if (async) {
    thread_ = std::thread([this, job] {
      try {
        job->run();
      } catch (...) {
        error_ = std::current_exception();
      }
    });
    return;
  }
  std::exception_ptr err;
  try {
    job->run();
  } catch (...) {
    err = std::current_exception();
  }
  // Everyone returns after the commit, and fails together.
  if (world_size() > 1) {
    Tensor flag = raw::empty({1}, DType::Int32);
    flag.data<int32_t>()[0] = err ? 1 : 0;
    comm::world()->all_reduce(flag, comm::ReduceOp::Max);
    if (!err && flag.data<int32_t>()[0] != 0)
      TESSEL_FAIL(kOp, "'{}': another rank failed to write its part (its error says why)", job->dir);
  }
  if (err) std::rethrow_exception(err);
}

void save(const std::string& dir, const NamedTensors& tensors, const nlohmann::json& state,
          const SaveOptions& options) {
  Saver s;
  s.save(dir, tensors, state, /*async=*/false, options);
}

}  // namespace tessel::checkpoint
