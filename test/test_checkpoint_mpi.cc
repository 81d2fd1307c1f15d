// Checkpoints on the MPI backend (ranks as processes, `mpirun -np 4` via
// test/mpi_test.sh): save on (dp=2, tp=2) — sync and async — and load on
// nested shards, a 1-D mesh of 4 and whole tensors in every process; values
// bitwise equal. The processes share the folder as separate machines would
// share a file system.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>

#include "autograd/api.h"
#include "checkpoint/load.h"
#include "checkpoint/manager.h"
#include "checkpoint/save.h"
#include "dtensor/ops.h"
#include "runtime/comm/comm.h"
#include "test/checkpoint/layouts.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::checkpoint;

namespace {

std::string shared_root() {
  comm::init_mpi();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string root = std::string(tmp ? tmp : "/tmp") + "/tessel_ckpt_mpi";
  if (comm::world()->rank() == 0) {
    std::filesystem::remove_all(root);
    std::filesystem::create_directories(root);
  }
  comm::world()->barrier();
  return root;
}

std::string compare(const NamedTensors& got, const NamedTensors& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    Tensor g = got[i].second.is_distributed() ? full_tensor(got[i].second) : got[i].second;
    if (!testing::bitwise_equal(g, want[i].second)) return "tensor '" + want[i].first + "' differs";
  }
  return "";
}

}  // namespace

TEST_CASE("checkpoint mpi: save on (dp=2, tp=2), load on other layouts", "[checkpoint][mpi]") {
  const std::string root = shared_root();
  REQUIRE(comm::world()->size() == 4);
  const NamedTensors globals = testing::ckpt_tensors();
  testing::CkptLayout tp4{"tp4", {{"tp", 4}}, [](size_t, int nd, DType) {
                            return nd == 0 ? Placements{Replicate()} : Placements{Shard(0)};
                          }};
  for (const bool async : {false, true}) {
    INFO((async ? "async" : "sync"));
    const std::string dir = step_dir(root, async ? 2 : 1);
    {
      Saver saver;
      saver.save(dir, testing::lay_out(testing::ckpt_layout("dp2xtp2"), globals, false), {{"async", async}}, async);
      saver.wait();
    }
    comm::world()->barrier();
    if (async) {  // rank 0 commits on its writer thread; wait() on rank 0 covers it
      Tensor flag = raw::empty({1}, DType::Int32);
      flag.data<int32_t>()[0] = latest_checkpoint(root) && latest_checkpoint(root)->step == 2;
      comm::world()->broadcast(flag, 0);
      REQUIRE(flag.data<int32_t>()[0] == 1);
    }
    for (const testing::CkptLayout* to :
         {&testing::ckpt_layout("nested2x2"), static_cast<const testing::CkptLayout*>(&tp4), &testing::ckpt_layout("dp2xtp2"), &testing::ckpt_layout("single")}) {
      INFO("load on " << to->name);
      NamedTensors targets = testing::lay_out(*to, globals, true);
      const LoadResult r = load(dir, targets);
      CHECK(r.state["async"] == async);
      CHECK(compare(targets, globals) == "");
    }
  }
  const CheckpointMeta m = read_metadata(step_dir(root, 1));
  CHECK(m.world_size == 4);
  uint64_t unique = 0, data = 0;
  for (const auto& [n, t] : globals) unique += t.nbytes();
  for (const auto& f : m.files) data += f.bytes - f.header_bytes;
  CHECK(data == unique);  // dp replicas written once
}
