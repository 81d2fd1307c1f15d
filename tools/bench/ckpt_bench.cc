#include "tools/bench/ckpt_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "checkpoint/file_io.h"
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "dtensor/mesh.h"
#include "dtensor/ops.h"
#include "runtime/comm/comm.h"
#include "tools/bench/machine.h"

namespace tessel::tools {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The reference: one thread writes the bytes to one file sequentially
// (64 MiB writes), fsyncs, renames, fsyncs the directory — what a plain
// atomic copy costs; and reads them back sequentially.
double reference_write(const std::string& path, const char* buf, size_t n) {
  const auto t0 = Clock::now();
  {
    checkpoint::io::File f(path + ".tmp", O_WRONLY | O_CREAT | O_TRUNC, "bench");
    for (size_t off = 0; off < n; off += size_t(64) << 20)
      f.write_all(buf + off, std::min(size_t(64) << 20, n - off), "bench");
    f.fsync("bench");
    f.close("bench");
  }
  fs::rename(path + ".tmp", path);
  checkpoint::io::fsync_dir(fs::path(path).parent_path().string());
  return seconds_since(t0);
}

double reference_read(const std::string& path, char* buf, size_t n) {
  const auto t0 = Clock::now();
  checkpoint::io::File f(path, O_RDONLY, "bench");
  for (size_t off = 0; off < n; off += size_t(64) << 20)
    f.pread_all(buf + off, std::min(size_t(64) << 20, n - off), off, "bench", "data");
  return seconds_since(t0);
}

checkpoint::NamedTensors make_globals(int64_t size_mb) {
  const int64_t n_tensors = 16, cols = 1024;
  const int64_t rows = std::max<int64_t>(1, size_mb * (1 << 20) / (n_tensors * cols * 4));
  checkpoint::NamedTensors g;
  for (int64_t i = 0; i < n_tensors; ++i)
    g.emplace_back(fmt::format(FMT_STRING("layers.{}.weight"), i), rand({rows, cols}, PhiloxKey{1, uint64_t(i)}));
  return g;
}

}  // namespace

int run_ckpt_bench(const CkptBenchOptions& o, std::ostream& out) {
  BenchMachine machine = begin_bench(out);
  const std::string base = o.dir.empty() ? (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") : o.dir;
  const std::string root = base + fmt::format(FMT_STRING("/tessel-bench-ckpt-{}"), getpid());
  checkpoint::io::remove_tree(root);
  checkpoint::io::make_dir(root, "bench");
  const checkpoint::NamedTensors globals = make_globals(o.size_mb);
  uint64_t bytes = 0;
  for (const auto& [n, t] : globals) bytes += t.nbytes();
  out << fmt::format(FMT_STRING("bench ckpt: {} float32 tensors, {:.1f} MiB, saved from {} ranks (threads, Shard(0)), {} reps, "
                     "in {}\n"),
                     globals.size(), double(bytes) / (1 << 20), o.ranks, o.reps, root);

  std::vector<double> save_s, load_s, reshard_s, ref_w, ref_r, stage_s;
  std::unique_ptr<char[]> buf(new char[bytes]);
  std::memset(buf.get(), 1, bytes);
  // One Saver per rank for the whole run, as the trainer keeps one: its
  // staging buffer is allocated (and first touched) by the first async save
  // and reused by the later ones.
  std::vector<std::unique_ptr<checkpoint::Saver>> savers;
  for (int r = 0; r < o.ranks; ++r) savers.push_back(std::make_unique<checkpoint::Saver>());
  for (int rep = 0; rep < o.reps; ++rep) {
    const std::string dir = root + fmt::format(FMT_STRING("/step-{:08d}"), rep);
    const std::string ref = root + fmt::format(FMT_STRING("/reference-{}.bin"), rep);
    // Alternate who goes first: fsync timings depend on what else is dirty.
    if (rep % 2 == 1) {
      ref_w.push_back(reference_write(ref, buf.get(), bytes));
      ref_r.push_back(reference_read(ref, buf.get(), bytes));
    }
    double t_save = 0, t_load = 0, t_stage = 0;
    comm::run_local(o.ranks, [&](int rank) {
      MeshPtr mesh = Mesh::world({{"tp", o.ranks}});
      checkpoint::NamedTensors mine, targets;
      for (const auto& [n, g] : globals) {
        mine.emplace_back(n, distribute_tensor(g, mesh, {Shard(0)}));
        targets.emplace_back(n, zeros(g.shape(), mesh, {Shard(0)}));
      }
      comm::world()->barrier();
      auto t0 = Clock::now();
      checkpoint::Saver& saver = *savers[size_t(rank)];
      saver.save(dir, mine, {{"rep", rep}}, o.async);
      const double staged = seconds_since(t0);
      saver.wait();
      comm::world()->barrier();  // every rank's part written, rank 0 committed (sync: already)
      const double saved = seconds_since(t0);
      t0 = Clock::now();
      checkpoint::load(dir, targets);
      comm::world()->barrier();
      if (rank == 0) {
        t_save = saved;
        t_stage = staged;
        t_load = seconds_since(t0);
      }
    });
    save_s.push_back(t_save);
    stage_s.push_back(t_stage);
    load_s.push_back(t_load);
    // Resharded: the same checkpoint into whole tensors on one device.
    {
      checkpoint::NamedTensors whole;
      for (const auto& [n, g] : globals) whole.emplace_back(n, zeros(g.shape()));
      const auto t0 = Clock::now();
      checkpoint::load(dir, whole);
      reshard_s.push_back(seconds_since(t0));
    }
    if (rep % 2 == 0) {
      ref_w.push_back(reference_write(ref, buf.get(), bytes));
      ref_r.push_back(reference_read(ref, buf.get(), bytes));
    }
    checkpoint::io::remove_tree(dir);
    fs::remove(ref);
  }
  checkpoint::io::remove_tree(root);

  const double gb = double(bytes) / 1e9;
  const double s = median(save_s), l = median(load_s), r = median(reshard_s), w = median(ref_w), rd = median(ref_r);
  out << fmt::format(FMT_STRING("  {:<34} {:>9} {:>9}\n"), "", "seconds", "GB/s");
  out << fmt::format(FMT_STRING("  {:<34} {:>9.3f} {:>9.2f}\n"), "save (tessel, sync, fsync'ed)", s, gb / s);
  out << fmt::format(FMT_STRING("  {:<34} {:>9.3f} {:>9.2f}\n"), "write+fsync one file (reference)", w, gb / w);
  out << fmt::format(FMT_STRING("  {:<34} {:>9.3f} {:>9.2f}\n"), "load, same layout (tessel)", l, gb / l);
  out << fmt::format(FMT_STRING("  {:<34} {:>9.3f} {:>9.2f}\n"), "read one file (reference)", rd, gb / rd);
  out << fmt::format(FMT_STRING("  {:<34} {:>9.3f} {:>9.2f}\n"), "load resharded to 1 device", r, gb / r);
  if (o.async)
    out << fmt::format(FMT_STRING("  {:<34} {:>9.3f}\n"), "async save: training thread blocked", median(stage_s));
  out << fmt::format(FMT_STRING("  save speedup {:.2f}, load speedup {:.2f} (reference / tessel); resharded / same-layout load "
                     "{:.2f}\n"),
                     w / s, rd / l, r / l);
  nlohmann::ordered_json j;
  j["bench"] = "ckpt";
  j["ours_s"] = s + l;
  j["reference"] = "sequential write+fsync then read of the same bytes (one file, one thread)";
  j["reference_s"] = w + rd;
  j["speedup"] = (w + rd) / (s + l);
  j["bytes"] = bytes;
  j["ranks"] = o.ranks;
  j["save_s"] = s;
  j["save_gbps"] = gb / s;
  j["ref_write_s"] = w;
  j["save_speedup"] = w / s;
  j["load_s"] = l;
  j["load_gbps"] = gb / l;
  j["ref_read_s"] = rd;
  j["load_speedup"] = rd / l;
  j["reshard_load_s"] = r;
  j["reshard_vs_same_layout"] = r / l;
  if (o.async) j["async_blocked_s"] = median(stage_s);
  end_bench(machine);
  add_machine(j, machine);
  out << machine_summary(machine);
  out << j.dump() << "\n";
  return 0;
}

}  // namespace tessel::tools
