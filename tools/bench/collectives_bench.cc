#include "tools/bench/collectives_bench.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/error.h"
#include "tools/bench/machine.h"

namespace tessel::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  std::string op;
  int64_t bytes = 0;
  double ours_s = 0, ref_s = 0;  // median seconds per operation
  double factor = 1;             // busbw = bytes / t * factor
};

std::string human(int64_t bytes) {
  char buf[32];
  if (bytes >= (1 << 20)) std::snprintf(buf, sizeof buf, "%lld MiB", (long long)(bytes >> 20));
  else std::snprintf(buf, sizeof buf, "%lld KiB", (long long)(bytes >> 10));
  return buf;
}

// Seconds per call of fn, as the slowest rank saw it, over k back-to-back calls.
double time_run(MPI_Comm ref, int k, const std::function<void()>& fn) {
  MPI_Barrier(ref);
  const auto t0 = Clock::now();
  for (int i = 0; i < k; ++i) fn();
  double t = std::chrono::duration<double>(Clock::now() - t0).count() / k;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, ref);
  return t;
}

void fill_small_ints(float* p, int64_t n, int rank) {
  for (int64_t i = 0; i < n; ++i) p[i] = float((rank + 1) * int(i % 7));
}

}  // namespace

int run_collectives_bench(const CollectivesBenchOptions& opts, std::ostream& out) {
  BenchMachine machine = begin_bench(out);
  auto comm = comm::world();
  const int n = comm->size(), me = comm->rank();
  MPI_Comm ref;
  MPI_Comm_dup(MPI_COMM_WORLD, &ref);

  const int64_t max_bytes = opts.quick ? std::min<int64_t>(opts.max_bytes, 1 << 20) : opts.max_bytes;
  const int reps = opts.quick ? 3 : opts.reps;
  std::vector<int64_t> sizes;
  for (int64_t b = opts.min_bytes; b <= max_bytes; b *= 4) sizes.push_back(b);
  const int64_t max_count = max_bytes / 4 + n;
  // Buffers allocated once and touched before timing; views per size.
  Tensor a = raw::empty({max_count}, DType::Float32), b = raw::empty({max_count}, DType::Float32);
  Tensor c = raw::empty({max_count}, DType::Float32);
  for (Tensor* t : {&a, &b, &c}) std::fill(t->data<float>(), t->data<float>() + max_count, 1.0f);

  std::vector<Row> rows;
  int mismatches = 0;
  auto want = [&](const char* op) { return opts.ops.find(op) != std::string::npos; };
  if (me == 0) {
    out << "tessel collectives (mpi backend, deterministic tree) vs raw MPI, " << n << " ranks, float32\n";
    out << "  op               size   ours us  ours busbw GB/s   MPI us  MPI busbw GB/s  ratio\n";
    out.flush();
  }
  for (int64_t bytes : sizes) {
    const int64_t count = std::max<int64_t>(n, (bytes / 4) / n * n);  // divisible by n
    const int64_t block = count / n;
    Tensor full_a = raw::narrow(a, 0, 0, count), full_b = raw::narrow(b, 0, 0, count);
    Tensor part_a = raw::narrow(a, 0, 0, block), part_c = raw::narrow(c, 0, 0, block);
    // Enough back-to-back calls per run that small sizes are not all clock noise.
    const int k = int(std::clamp<int64_t>((8 << 20) / bytes, 1, 500));

    struct Case {
      const char* op;
      double factor;
      std::function<void()> ours, reference;
      std::function<bool()> check;  // same values from both (small integers: exact)
    };
    std::vector<Case> cases;
    if (want("all_reduce")) {
      cases.push_back({"all_reduce", 2.0 * (n - 1) / n,
                       [&] { comm->all_reduce(full_a, comm::ReduceOp::Sum); },
                       [&] { MPI_Allreduce(MPI_IN_PLACE, full_b.raw_data(), int(count), MPI_FLOAT, MPI_SUM, ref); },
                       [&] {
                         fill_small_ints(full_a.data<float>(), count, me);
                         fill_small_ints(full_b.data<float>(), count, me);
                         comm->all_reduce(full_a, comm::ReduceOp::Sum);
                         MPI_Allreduce(MPI_IN_PLACE, full_b.raw_data(), int(count), MPI_FLOAT, MPI_SUM, ref);
                         return std::memcmp(full_a.raw_data(), full_b.raw_data(), full_a.nbytes()) == 0;
                       }});
    }
    if (want("all_gather")) {
      cases.push_back({"all_gather", double(n - 1) / n,
                       [&] { comm->all_gather(part_c, full_a); },
                       [&] { MPI_Allgather(part_c.raw_data(), int(block), MPI_FLOAT, full_b.raw_data(), int(block),
                                           MPI_FLOAT, ref); },
                       [&] {
                         fill_small_ints(part_c.data<float>(), block, me);
                         comm->all_gather(part_c, full_a);
                         MPI_Allgather(part_c.raw_data(), int(block), MPI_FLOAT, full_b.raw_data(), int(block),
                                       MPI_FLOAT, ref);
                         return std::memcmp(full_a.raw_data(), full_b.raw_data(), full_a.nbytes()) == 0;
                       }});
    }
    if (want("reduce_scatter")) {
      cases.push_back({"reduce_scatter", double(n - 1) / n,
                       [&] { comm->reduce_scatter(full_b, part_a, comm::ReduceOp::Sum); },
                       [&] { MPI_Reduce_scatter_block(full_b.raw_data(), part_c.raw_data(), int(block), MPI_FLOAT,
                                                      MPI_SUM, ref); },
                       [&] {
                         fill_small_ints(full_b.data<float>(), count, me);
                         comm->reduce_scatter(full_b, part_a, comm::ReduceOp::Sum);
                         MPI_Reduce_scatter_block(full_b.raw_data(), part_c.raw_data(), int(block), MPI_FLOAT,
                                                  MPI_SUM, ref);
                         return std::memcmp(part_a.raw_data(), part_c.raw_data(), part_a.nbytes()) == 0;
                       }});
    }
    for (Case& cs : cases) {
      int ok = cs.check() ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, ref);
      if (!ok) ++mismatches;
      for (int i = 0; i < opts.warmup; ++i) {
        time_run(ref, 1, cs.ours);
        time_run(ref, 1, cs.reference);
      }
      std::vector<double> ours, refs;
      for (int r = 0; r < reps; ++r) {  // interleaved, so both see the same machine
        ours.push_back(time_run(ref, k, cs.ours));
        refs.push_back(time_run(ref, k, cs.reference));
      }
      Row row{cs.op, bytes, median(ours), median(refs), cs.factor};
      rows.push_back(row);
      if (me == 0) {
        char line[200];
        const double gb = double(bytes) * row.factor / 1e9;
        std::snprintf(line, sizeof line, "  %-14s %8s %9.1f %16.2f %8.1f %15.2f %6.2f%s\n", cs.op, human(bytes).c_str(),
                      row.ours_s * 1e6, gb / row.ours_s, row.ref_s * 1e6, gb / row.ref_s, row.ref_s / row.ours_s,
                      ok ? "" : "  RESULT MISMATCH");
        out << line;
        out.flush();
      }
    }
  }

  // The summary: large sizes, or everything when none is large.
  const int64_t large = 1 << 20;
  bool any_large = false;
  for (const Row& r : rows) any_large = any_large || r.bytes >= large;
  double ours_s = 0, ref_s = 0;
  nlohmann::json per_op = nlohmann::json::object();
  std::vector<int64_t> summed_sizes;
  for (const Row& r : rows) {
    if (any_large && r.bytes < large) continue;
    ours_s += r.ours_s;
    ref_s += r.ref_s;
    auto& o = per_op[r.op];
    if (o.is_null()) o = {{"ours_s", 0.0}, {"reference_s", 0.0}};
    o["ours_s"] = o["ours_s"].get<double>() + r.ours_s;
    o["reference_s"] = o["reference_s"].get<double>() + r.ref_s;
    if (std::find(summed_sizes.begin(), summed_sizes.end(), r.bytes) == summed_sizes.end()) {
      summed_sizes.push_back(r.bytes);
    }
  }
  for (auto& [op, o] : per_op.items()) o["speedup"] = o["reference_s"].get<double>() / o["ours_s"].get<double>();
  nlohmann::json table = nlohmann::json::array();
  for (const Row& r : rows) {
    table.push_back({{"op", r.op},
                     {"bytes", r.bytes},
                     {"ours_s", r.ours_s},
                     {"reference_s", r.ref_s},
                     {"ours_busbw_gbs", double(r.bytes) * r.factor / r.ours_s / 1e9},
                     {"reference_busbw_gbs", double(r.bytes) * r.factor / r.ref_s / 1e9}});
  }
  if (me == 0) {
    std::ostringstream version;
#ifdef OMPI_MAJOR_VERSION
    version << "raw MPI (OpenMPI " << OMPI_MAJOR_VERSION << "." << OMPI_MINOR_VERSION << ")";
#else
    version << "raw MPI";
#endif
    std::vector<std::string> size_names;
    for (int64_t s : summed_sizes) size_names.push_back(human(s));
    nlohmann::json j;
    j["bench"] = "collectives";
    j["ours_s"] = ours_s;
    j["reference"] = version.str();
    j["reference_s"] = ref_s;
    j["speedup"] = ours_s > 0 ? ref_s / ours_s : 0.0;
    j["ranks"] = n;
    j["dtype"] = "float32";
    j["summed_sizes"] = size_names;
    j["per_op"] = per_op;
    j["reps"] = reps;
    // The per-call cross-rank argument check (one small all-gather); off with
    // TESSEL_COMM_CHECK=0.
    const char* check = std::getenv("TESSEL_COMM_CHECK");
    j["cross_rank_check"] = !(check && std::string(check) == "0");
    j["result_mismatches"] = mismatches;
    j["rows"] = table;
    end_bench(machine);
    add_machine(j, machine);
    out << machine_summary(machine);
    out << j.dump() << "\n";
    out.flush();
  }
  MPI_Comm_free(&ref);
  return mismatches == 0 ? 0 : 1;
}

}  // namespace tessel::tools
