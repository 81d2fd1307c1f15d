#include "nn/parallel/staging.h"

#include <algorithm>

namespace tessel::parallel {

StagingRing::StagingRing(int slots, int64_t numel, DType dtype, Device device) : numel_(numel) {
  TESSEL_CHECK(slots > 0, "StagingRing", "needs at least one slot, got {}", slots);
  slots_.resize(size_t(slots));
  for (Slot& s : slots_) s.buffer = raw::empty({numel}, dtype, device);
}

StagingRing::Slot& StagingRing::acquire() {
  TESSEL_CHECK(!slots_.empty(), "StagingRing", "acquire() on an empty ring");
  Slot& s = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  complete(s);
  s.launched = ++launches_;
  return s;
}

void StagingRing::complete(Slot& s) {
  if (!s.busy()) return;
  // Mark idle first: a callback that throws leaves no half-finished slot behind.
  comm::WorkPtr work = std::move(s.work);
  std::function<void()> done = std::move(s.on_done);
  s.work = nullptr;
  s.on_done = nullptr;
  s.launched = 0;
  if (work) work->wait();
  if (done) done();
}

void StagingRing::complete_all() {
  std::vector<Slot*> busy;
  for (Slot& s : slots_)
    if (s.busy()) busy.push_back(&s);
  std::sort(busy.begin(), busy.end(), [](const Slot* a, const Slot* b) { return a->launched < b->launched; });
  for (Slot* s : busy) complete(*s);
}

int64_t StagingRing::bytes() const {
  int64_t n = 0;
  for (const Slot& s : slots_) n += int64_t(s.buffer.nbytes());
  return n;
}

}  // namespace tessel::parallel
