#pragma once
// Checks of the collectives that run on one rank of any backend.
//
// Every rank calls the same check (SPMD). Inputs are generated from
// (seed, rank), so each rank can rebuild every other rank's input and compute
// the expected result itself, with a reference reduction tree written here
// independently of runtime/comm. Checks return failure descriptions instead
// of using Catch2 macros, because the local backend runs ranks as threads and
// Catch2 is not thread-safe; the test then REQUIREs that the list is empty.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/tensor.h"

namespace tessel::testing::comm_checks {

using Failures = std::vector<std::string>;

// Deterministic values for (seed) of `dtype`: floats spread over many binades
// with both signs (so the order of a sum matters), some ±0 and repeated
// values (ties for max/min), NaNs only when `with_nan`; integers large enough
// for sums to wrap; bools 0/1.
Tensor make_input(DType dtype, int64_t numel, uint64_t seed, bool with_nan = false);
uint64_t mix(uint64_t a, uint64_t b);

// The expected reduction of `contrib` (in rank order): per element the
// balanced tree for (w = 1; w < n; w *= 2) for (i = 0; i + w < n; i += 2w),
// 16-bit floats in float32 rounded once, avg = sum / n.
Tensor reference_reduce(const std::vector<Tensor>& contrib, comm::ReduceOp op);

// "" when a and b have the same dtype, element count and bits; else where they differ.
std::string compare_bits(const Tensor& got, const Tensor& expected);

// The dtypes and ops a reduction accepts.
std::vector<DType> all_dtypes();
std::vector<comm::ReduceOp> ops_for(DType dtype);

// Sizes for a world of n ranks: empty, smaller than n, uneven, larger.
std::vector<int64_t> test_sizes(int n, uint64_t seed);

void all_reduce_cases(comm::Communicator& c, Failures& f, uint64_t seed);
void reduce_scatter_cases(comm::Communicator& c, Failures& f, uint64_t seed);
void all_gather_cases(comm::Communicator& c, Failures& f, uint64_t seed);
void all_to_all_cases(comm::Communicator& c, Failures& f, uint64_t seed);
void broadcast_cases(comm::Communicator& c, Failures& f, uint64_t seed);
// Ring of send/recv (async send, and async receive posted first), in-order delivery.
void p2p_cases(comm::Communicator& c, Failures& f, uint64_t seed);
// Several async collectives in flight, waited for in reverse order; is_completed after wait.
void async_cases(comm::Communicator& c, Failures& f, uint64_t seed);
// The world as a rows x cols grid (size() must be rows*cols): row and column
// sub-communicators, their ranks and names, and reductions over each.
void grid_cases(comm::Communicator& world, int rows, int cols, Failures& f, uint64_t seed);

}  // namespace tessel::testing::comm_checks
