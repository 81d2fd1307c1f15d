// The NCCL backend. Without a GPU (or in a CPU-only build) it checks that
// init_nccl() fails with a clear message and skips the rest. With a GPU: the
// reduction kernel over ranks equals the CPU reference tree bit for bit, for
// 1..9 simulated ranks; under `mpirun -np <GPUs>` the collectives of the NCCL
// world are checked against the same reference.
#include <catch2/catch.hpp>

#include <cstring>

#include "runtime/comm/comm.h"
#include "runtime/device.h"
#include "test/comm/checks.h"
#include "test/skip.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/comm/nccl_tree.h"
#endif

using namespace tessel;
using namespace tessel::comm;
namespace cc = tessel::testing::comm_checks;

TEST_CASE("comm nccl: init_nccl without a GPU is a clear error", "[comm][nccl]") {
  if (cuda_available()) TESSEL_SKIP("a GPU is present");
  try {
    init_nccl();
    FAIL("init_nccl succeeded without a GPU");
  } catch (const Error& e) {
    const std::string m = e.what();
    INFO(m);
    REQUIRE(m.rfind("init_nccl: ", 0) == 0);
#ifdef TESSEL_WITH_CUDA
    REQUIRE(m.find("no CUDA device is visible") != std::string::npos);
#else
    REQUIRE(m.find("CPU-only build") != std::string::npos);
#endif
  }
}

#ifdef TESSEL_WITH_CUDA
namespace {

void* to_device(const void* host, size_t bytes) {
  void* d = nullptr;
  REQUIRE(cudaMalloc(&d, bytes + 1) == cudaSuccess);
  if (bytes > 0) REQUIRE(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  return d;
}

}  // namespace

TEST_CASE("comm nccl: the GPU tree over ranks equals the CPU reference bit for bit", "[comm][nccl]") {
  if (!cuda_available()) TESSEL_SKIP("no GPU");
  for (DType dt : cc::all_dtypes()) {
    for (ReduceOp op : cc::ops_for(dt)) {
      for (int n = 1; n <= 9; ++n) {
        const int64_t len = 3001;
        const int own_rank = n / 2;
        std::vector<Tensor> contrib;
        for (int r = 0; r < n; ++r) contrib.push_back(cc::make_input(dt, len, cc::mix(uint64_t(n), uint64_t(r)), true));
        // The received blocks as the backend lays them out (own slot unused).
        const size_t isz = itemsize(dt), block = size_t(len) * isz;
        std::vector<char> received(size_t(n) * block);
        for (int r = 0; r < n; ++r) {
          if (r != own_rank) std::memcpy(received.data() + size_t(r) * block, contrib[size_t(r)].raw_data(), block);
        }
        void* d_recv = to_device(received.data(), received.size());
        void* d_own = to_device(contrib[size_t(own_rank)].raw_data(), block);
        const char* err = nccl_detail::launch_rank_tree(dt, int(op), d_recv, d_own, own_rank, n, len, d_own, nullptr);
        REQUIRE(err == nullptr);
        Tensor got = raw::empty({len}, dt);
        REQUIRE(cudaMemcpy(got.raw_data(), d_own, block, cudaMemcpyDeviceToHost) == cudaSuccess);
        cudaFree(d_recv);
        cudaFree(d_own);
        INFO(dtype_name(dt) << " " << reduce_op_name(op) << " n=" << n);
        REQUIRE(cc::compare_bits(got, cc::reference_reduce(contrib, op)) == "");
      }
    }
  }
}

TEST_CASE("comm nccl: collectives of the NCCL world (under mpirun)", "[comm][nccl]") {
  if (!cuda_available()) TESSEL_SKIP("no GPU");
  if (!is_mpi_launch()) TESSEL_SKIP("run under `mpirun -np <number of GPUs>` for the NCCL world checks");
  init_nccl();
  Communicator& w = *world();
  REQUIRE(std::string(w.backend()) == "nccl");
  int device = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  const Device gpu(DeviceType::CUDA, device);
  auto upload = [&](const Tensor& h) {
    Tensor d = raw::empty(h.shape(), h.dtype(), gpu);
    if (h.nbytes()) REQUIRE(cudaMemcpy(d.raw_data(), h.raw_data(), h.nbytes(), cudaMemcpyHostToDevice) == cudaSuccess);
    return d;
  };
  auto download = [&](const Tensor& d) {
    Tensor h = raw::empty(d.shape(), d.dtype());
    if (d.nbytes()) REQUIRE(cudaMemcpy(h.raw_data(), d.raw_data(), d.nbytes(), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  };
  const int n = w.size(), me = w.rank();
  for (DType dt : cc::all_dtypes()) {
    for (ReduceOp op : cc::ops_for(dt)) {
      for (int64_t numel : cc::test_sizes(n, 7)) {
        const uint64_t cs = cc::mix(uint64_t(dt) * 7 + uint64_t(op), uint64_t(numel));
        Tensor t = upload(cc::make_input(dt, numel, cc::mix(cs, uint64_t(me)), true));
        w.all_reduce(t, op);
        std::vector<Tensor> contrib;
        for (int r = 0; r < n; ++r) contrib.push_back(cc::make_input(dt, numel, cc::mix(cs, uint64_t(r)), true));
        INFO("all_reduce " << dtype_name(dt) << " " << reduce_op_name(op) << " numel=" << numel);
        REQUIRE(cc::compare_bits(download(t), cc::reference_reduce(contrib, op)) == "");
      }
    }
    // all_gather of uneven and even sizes.
    for (int64_t m : {int64_t(0), int64_t(5)}) {
      Tensor in = upload(cc::make_input(dt, m, cc::mix(99, uint64_t(me))));
      Tensor out = raw::empty({m * n}, dt, gpu);
      w.all_gather(in, out);
      Tensor h = download(out);
      for (int r = 0; r < n; ++r) {
        Tensor part = raw::narrow(h, 0, r * m, m);  // a contiguous view
        REQUIRE(cc::compare_bits(part, cc::make_input(dt, m, cc::mix(99, uint64_t(r)))) == "");
      }
    }
  }
  w.barrier();
}
#endif
