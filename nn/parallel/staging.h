#pragma once
// A ring of reusable flat buffers for collectives in flight.
//
// acquire() hands out the next slot round-robin, first finishing whatever
// still runs in it (wait, then its completion callback). A ring of k slots
// bounds the memory of communication to k buffers, however many buckets
// there are, and allocates nothing after construction. Because slots are
// reused in launch order, operations complete in launch order too (unless
// one is completed explicitly with complete()).
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/tensor.h"

namespace tessel::parallel {

class StagingRing {
 public:
  struct Slot {
    Tensor buffer;  // flat, `numel` elements
    comm::WorkPtr work;
    std::function<void()> on_done;  // runs once the work completed
    uint64_t launched = 0;          // launch sequence number (0: idle)
    bool busy() const { return launched != 0; }
  };

  StagingRing() = default;
  StagingRing(int slots, int64_t numel, DType dtype, Device device);

  // The next slot, idle (its previous operation completed). The caller
  // fills buffer, sets work and on_done.
  Slot& acquire();
  // Waits for a slot's operation and runs its callback (no-op when idle).
  void complete(Slot& s);
  // Completes every slot, oldest launch first.
  void complete_all();
  int64_t bytes() const;
  int64_t numel() const { return numel_; }

 private:
  std::vector<Slot> slots_;
  int64_t numel_ = 0;
  size_t next_ = 0;
  uint64_t launches_ = 0;
};

}  // namespace tessel::parallel
