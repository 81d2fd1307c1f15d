// `tessel info`: what this build and machine offer.
#include <cstdio>
#include <thread>

#include "runtime/device.h"
#include "runtime/numerics.h"
#include "runtime/threadpool.h"
#include "tools/cli/commands.h"

namespace tessel::cli {

void register_info(CLI::App& app) {
  add_command(app, "info", "Show build and machine information", [] {
    std::printf("tessel\n");
#ifdef TESSEL_WITH_CUDA
    std::printf("  cuda:            built with CUDA, %d device(s) visible\n", cuda_device_count());
#else
    std::printf("  cuda:            not built (CPU-only build)\n");
#endif
    std::printf("  cpu threads:     %d (TESSEL_THREADS)\n", num_threads());
    std::printf("  avx512f:         %s\n", __builtin_cpu_supports("avx512f") ? "yes" : "no");
    std::printf("  reduce chunks V: %d (TESSEL_REDUCE_CHUNKS)\n", numerics::reduction_chunks());
    return 0;
  });
}

}  // namespace tessel::cli
