#pragma once
// A fixed pool of worker threads and parallel_for.
//
// Determinism rule (docs/design.md §4 levels 2-3): kernels only ever partition work
// over *independent* outputs, so the thread count and the split never change
// a result. parallel_for splits [0, n) into contiguous ranges; nested calls
// from inside a worker run inline.
#include <cstdint>

#include "runtime/function_ref.h"

namespace tessel {

// Threads used by kernels: TESSEL_THREADS, else the hardware concurrency.
int num_threads();
void set_num_threads(int n);

// Calls fn(begin, end) on disjoint ranges covering [0, n), each at least
// `grain` long (but the last), in parallel; returns when all are done.
// Exceptions thrown by fn are rethrown here (the first one).
void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn);

// True inside a parallel_for body (nested parallelism runs inline).
bool in_parallel_region();

}  // namespace tessel
