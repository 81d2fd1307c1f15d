#include "planner/cluster.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "autograd/api.h"
#include "kernels/gemm.h"
#include "models/language_model.h"
#include "runtime/comm/comm.h"
#include "runtime/cost.h"
#include "runtime/error.h"
#include "runtime/threadpool.h"

namespace tessel::planner {
namespace {

constexpr const char* kOp = "plan";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One core's float32 GEMM rate (tessel's kernel, fast mode's chunks), the
// best of a few 512^3 products.
double measure_gemm_flops() {
  const int64_t n = 512;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  kernels::cpu::GemmArgs g;
  g.M = g.N = g.K = n;
  g.A = a.data(), g.a_row_stride = n;
  g.B = b.data(), g.b_row_stride = n;
  g.C = c.data(), g.c_row_stride = n;
  const int threads = num_threads();
  set_num_threads(1);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::cpu::gemm_f32(g);
    best = std::min(best, seconds_since(t0));
  }
  set_num_threads(threads);
  return 2.0 * double(n) * n * n / best;
}

// One core's copy bandwidth (read + write bytes per second) over 256 MiB.
double measure_copy_bw() {
  const size_t bytes = size_t(256) << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * double(bytes) / best;
}

// Seconds per small op recorded for backward (dispatch, allocation, the
// autograd node and the engine's visit), on one thread.
double measure_op_overhead() {
  const int threads = num_threads();
  set_num_threads(1);
  Tensor x = zeros({16}).requires_grad_();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor y = x;
    for (int i = 0; i < 200; ++i) y = y * 1.0;
    sum(y).backward();
    best = std::min(best, seconds_since(t0) / 402.0);  // 200 ops + 200 nodes, the sum and its node
    x.zero_grad();
  }
  set_num_threads(threads);
  return best;
}

// A real forward and backward of LLaMA small (batch 4 x 128, one thread),
// timed (best of 3) against what its counts predict on `c`.
double measure_compute_scale(const Cluster& c) {
  const int threads = num_threads();
  set_num_threads(1);
  models::ModelConfig config = models::model_config("llama", "small");
  auto model = models::build_model(config);
  model->reset_parameters(1);
  model->train();
  Tensor ids = zeros({4, 128}, TensorOptions(DType::Int64));
  double best = 1e30;
  cost::Counts counts;
  for (int rep = 0; rep < 3; ++rep) {
    cost::CountScope counting;
    const auto t0 = std::chrono::steady_clock::now();
    model->loss(model->forward(ids), ids).backward();
    best = std::min(best, seconds_since(t0));
    counts = counting.counts();
    model->zero_grad();
  }
  set_num_threads(threads);
  const double predicted = double(counts.flops()) / c.flops_f32 + double(counts.ops) * c.op_overhead_s +
                           3.0 * double(counts.op_bytes) / c.memory_bw;
  return std::max(1.0, best / predicted);
}

// Collective bytes per second and per-call latency between two ranks of the
// local backend: all_reduce of 16 MiB (bandwidth) and of 4 bytes (latency),
// best of a few.
std::pair<double, double> measure_collectives() {
  double bw = 0, lat = 0;
  comm::run_local(2, [&](int rank) {
    Tensor big = zeros({int64_t(4) << 20}), tiny = zeros({1});
    double best_big = 1e30, best_tiny = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      comm::world()->all_reduce(big, comm::ReduceOp::Sum)->wait();
      best_big = std::min(best_big, seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) comm::world()->all_reduce(tiny, comm::ReduceOp::Sum)->wait();
      best_tiny = std::min(best_tiny, seconds_since(t0) / 20);
    }
    if (rank == 0) {
      // A ring all-reduce moves 2 (n-1)/n of the buffer per rank: 1x for n = 2.
      bw = double(big.nbytes()) / best_big;
      lat = best_tiny;
    }
  });
  return {bw, lat};
}

std::string cache_path() {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/tessel/cluster-cpu-v4.json";
}

}  // namespace

std::string Cluster::str() const {
  return fmt::format(FMT_STRING("{}: {} node(s) x {} devices, {:.1f} GiB each, {:.3g} GFLOP/s float32 / {:.3g} 16-bit "
                                "per device, collectives {:.3g} GB/s in a node / {:.3g} GB/s across{}"),
                     name, nodes, devices_per_node, memory_bytes / double(1 << 30), flops_f32 / 1e9, flops_16 / 1e9,
                     intra_bw / 1e9, inter_bw / 1e9, measured ? " (measured here)" : " (published peaks, assumed)");
}

nlohmann::json Cluster::to_json() const {
  return {{"name", name},           {"nodes", nodes},
          {"devices_per_node", devices_per_node}, {"memory_bytes", memory_bytes},
          {"flops_f32", flops_f32}, {"flops_16", flops_16},
          {"memory_bw", memory_bw}, {"intra_bw", intra_bw},
          {"inter_bw", inter_bw},   {"intra_latency_s", intra_latency_s},
          {"inter_latency_s", inter_latency_s}, {"op_overhead_s", op_overhead_s}, {"compute_scale", compute_scale},
          {"comm_overlaps", comm_overlaps}, {"measured", measured}, {"core_share", core_share}};
}

Cluster calibrate_cpu(bool force) {
  const std::string path = cache_path();
  if (!force && std::filesystem::exists(path)) {
    try {
      std::ifstream in(path);
      const auto j = nlohmann::json::parse(in);
      Cluster c;
      c.name = "cpu";
      c.devices_per_node = j.at("devices_per_node");
      c.memory_bytes = j.at("memory_bytes");
      c.flops_f32 = c.flops_16 = j.at("flops_f32");
      c.memory_bw = j.at("memory_bw");
      c.intra_bw = c.inter_bw = j.at("intra_bw");
      c.intra_latency_s = c.inter_latency_s = j.at("intra_latency_s");
      c.op_overhead_s = j.at("op_overhead_s");
      c.compute_scale = j.at("compute_scale");
      c.comm_overlaps = false;
      c.measured = true;
      return c;
    } catch (const std::exception&) {
      // A stale or broken cache is measured again.
    }
  }
  Cluster c;
  c.name = "cpu";
  c.devices_per_node = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
  const int64_t ram = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  c.memory_bytes = ram / c.devices_per_node;
  c.flops_f32 = c.flops_16 = measure_gemm_flops();  // 16-bit GEMMs widen to float32 on the CPU
  c.memory_bw = measure_copy_bw();
  // The backends move data through shared memory, on the cores that compute.
  const auto [bw, lat] = measure_collectives();
  c.intra_bw = c.inter_bw = bw;
  c.intra_latency_s = c.inter_latency_s = lat;
  c.op_overhead_s = measure_op_overhead();
  c.comm_overlaps = false;
  c.compute_scale = measure_compute_scale(c);
  c.measured = true;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << c.to_json().dump(2) << "\n";
  return c;
}

Cluster with_devices(Cluster c, int64_t devices) {
  TESSEL_CHECK(devices >= 1, kOp, "devices must be >= 1, got {}", devices);
  if (c.name == "cpu") {
    const int64_t cores = c.devices();
    if (devices > cores) {
      c.core_share = double(cores) / double(devices);
      c.memory_bytes = int64_t(double(c.memory_bytes) * c.core_share);
    }
    c.nodes = 1;
    c.devices_per_node = devices;
    return c;
  }
  if (devices <= c.devices_per_node) {
    c.nodes = 1;
    c.devices_per_node = devices;
    return c;
  }
  TESSEL_CHECK(devices % c.devices_per_node == 0, kOp,
               "{} devices on {} with {} devices per node: take at most one node's worth or whole nodes", devices,
               c.name, c.devices_per_node);
  c.nodes = devices / c.devices_per_node;
  return c;
}

Cluster cluster_preset(const std::string& name, int64_t nodes) {
  TESSEL_CHECK(nodes >= 1, kOp, "nodes must be >= 1, got {}", nodes);
  if (name == "cpu") {
    TESSEL_CHECK(nodes == 1, kOp, "the cpu preset is this one machine (nodes = 1), got nodes = {}", nodes);
    return calibrate_cpu();
  }
  Cluster c;
  c.name = name;
  c.nodes = nodes;
  c.devices_per_node = 8;
  if (name == "h100" || name == "h200") {
    c.memory_bytes = name == "h100" ? int64_t(80) * 1000 * 1000 * 1000 : int64_t(141) * 1000 * 1000 * 1000;
    c.flops_16 = 0.55 * 989e12;
    c.flops_f32 = 0.55 * 67e12;
    c.memory_bw = name == "h100" ? 3.35e12 : 4.8e12;
    c.intra_bw = 0.8 * 450e9;  // NVLink 4, per direction, what a ring reaches
    c.inter_bw = 0.9 * 50e9;   // 400 Gb/s per GPU
    c.intra_latency_s = 10e-6;
    c.inter_latency_s = 25e-6;
    c.op_overhead_s = 8e-6;  // a kernel launch and the host's dispatch
    return c;
  }
  TESSEL_FAIL(kOp, "unknown cluster preset '{}' (cpu, h100, h200)", name);
}

}  // namespace tessel::planner
