#pragma once
// What the planner knows of the machines: devices, memory, speeds.
//
// Presets (cluster_preset):
//   cpu    this machine, one rank per core: GEMM FLOP/s and memory bandwidth
//          measured by calibrate_cpu() (a few seconds, stored in
//          ~/.cache/tessel/cluster-cpu.json and reused; --calibrate redoes
//          it), collectives through shared memory at half the copy
//          bandwidth, memory = the machine's RAM shared by its cores;
//   h100   nodes of 8 H100 SXM (80 GB; bf16 989 TFLOP/s dense, float32 67;
//          NVLink 4 at 450 GB/s per direction; one 400 Gb/s InfiniBand NIC
//          per GPU), at 55% of peak for GEMMs;
//   h200   the same with 141 GB.
// Published peaks are assumptions, not measurements: a plan for a GPU
// cluster says so (docs/plan.md).
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/dtype.h"

namespace tessel::planner {

struct Cluster {
  std::string name;
  int64_t nodes = 1, devices_per_node = 1;
  int64_t memory_bytes = 0;      // per device
  double flops_f32 = 0;          // achievable GEMM FLOP/s per device, float32 compute
  double flops_16 = 0;           // bfloat16 / float16 compute
  double memory_bw = 0;          // bytes/s per device (optimizer, elementwise passes)
  double intra_bw = 0, inter_bw = 0;            // collective bytes/s per device inside a node / across nodes
  double intra_latency_s = 0, inter_latency_s = 0;  // per collective call
  double op_overhead_s = 0;      // per op call or backward node (dispatch, allocation, launch)
  // Measured step time / the time the counts above predict, for a real
  // forward and backward of a small LLaMA here (cpu; 1 for the GPU presets):
  // what the counts miss (GEMM shapes below the peak, cache misses, ...).
  double compute_scale = 1.0;
  // Whether collectives overlap compute (GPUs: copy engines and NVLink; the
  // CPU: the cores that compute also copy, so no).
  bool comm_overlaps = true;
  bool measured = false;         // calibrated here, not published numbers
  // The share of a core each device has when all of them compute: 1, or
  // cores / devices for cpu ranks that outnumber the cores (with_devices).
  // The speeds above are a device's alone; the planner bounds a step by the
  // CPU time its ranks ask for over the cores: a rank idle in a pipeline
  // bubble gives part of its core to the others (planner.cc, kWaitingCpu).
  double core_share = 1.0;

  int64_t devices() const { return nodes * devices_per_node; }
  double flops(DType compute) const { return compute == DType::Float32 ? flops_f32 : flops_16; }
  std::string str() const;
  nlohmann::json to_json() const;
};

// "cpu" | "h100" | "h200" with `nodes` nodes (cpu: one); anything else is an
// error naming the presets.
Cluster cluster_preset(const std::string& name, int64_t nodes = 1);
// This machine, measured (or read back from the cache unless `force`).
Cluster calibrate_cpu(bool force = false);

// `cluster` cut or grown to `devices` devices. GPU presets: at most one
// node's worth (one node of `devices`) or whole nodes; anything else is an
// error naming the node size. cpu: `devices` ranks on this machine's cores;
// with more ranks than cores (MPI oversubscribed, as `tessel launch -n 4`
// does on 2 cores) they share the cores (core_share = cores / devices) and
// each has that share of the memory.
Cluster with_devices(Cluster cluster, int64_t devices);

}  // namespace tessel::planner
