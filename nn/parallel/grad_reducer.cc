#include "nn/parallel/grad_reducer.h"

#include <algorithm>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "kernels/elementwise.h"
#include "runtime/capture.h"
#include "runtime/numerics.h"

namespace tessel::parallel {
namespace {
constexpr const char* kOp = "data parallel";
}  // namespace

GradReducer::GradReducer(std::vector<DpParam*> params, Mode mode, int64_t bucket_bytes)
    : params_(std::move(params)), mode_(mode) {
  TESSEL_CHECK(!params_.empty(), kOp, "no parameter to reduce");
  const DpShard& g0 = params_[0]->geo;
  comm_ = params_[0]->param.mesh()->comm(g0.dp);
  TESSEL_CHECK(comm_ != nullptr, kOp, "the dp dim of mesh {} has size 1: nothing to reduce",
               params_[0]->param.mesh()->str());
  const Device dev = params_[0]->param.device();

  // Buckets in reverse registration order, up to bucket_bytes each.
  std::vector<std::vector<size_t>> groups;
  int64_t bytes = 0;
  for (size_t i = params_.size(); i-- > 0;) {
    const int64_t b = numel_of(params_[i]->geo.full_local) * int64_t(sizeof(float));
    if (groups.empty() || bucket_bytes == 0 || bytes + b > bucket_bytes) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += b;
  }

  buckets_.resize(groups.size());
  for (size_t bi = 0; bi < groups.size(); ++bi) {
    Bucket& bk = buckets_[bi];
    bk.members = groups[bi];
    if (mode_ == Mode::AllReduce) {
      int64_t n = 0;
      for (size_t i : bk.members) n += numel_of(params_[i]->geo.full_local);
      bk.flat = raw::empty({n + int64_t(bk.members.size())}, DType::Float32, dev);
      int64_t at = 0;
      for (size_t i : bk.members) {
        const Dims& s = params_[i]->geo.full_local;
        bk.views.push_back(raw::as_strided(bk.flat, s, contiguous_strides(s), at));
        at += numel_of(s);
      }
      for (size_t k = 0; k < bk.members.size(); ++k) bk.flags.push_back(raw::narrow(bk.flat, 0, at + int64_t(k), 1));
    } else {
      std::vector<const DpShard*> geos;
      for (size_t i : bk.members) geos.push_back(&params_[i]->geo);
      bk.rs = std::make_unique<ReduceScatterBucket>(geos, comm_, dev);
      slot_numel_ = std::max(slot_numel_, bk.rs->slot_numel());
    }
  }

  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    for (size_t k = 0; k < buckets_[bi].members.size(); ++k) {
      DpParam& p = *params_[buckets_[bi].members[k]];
      TESSEL_CHECK(p.param.dtype() == DType::Float32, kOp, "parameter '{}' is {}; buckets hold float32 gradients",
                   p.path, p.param.desc());
      set_grad_placements(p.param, p.geo.pending);
      hook_handles_.push_back(
          p.param.register_post_accumulate_grad_hook([this, bi, k](const Tensor&) { on_grad(bi, k); }));
    }
  }
}

void GradReducer::set_ring(StagingRing* ring) {
  TESSEL_CHECK(ring != nullptr && ring->numel() >= slot_numel_, kOp, "the staging ring needs slots of {} elements",
               slot_numel_);
  ring_ = ring;
}

GradReducer::~GradReducer() {
  // Normally nothing is in flight (finish() waited); a destructor must not throw.
  for (Bucket& b : buckets_) {
    try {
      if (b.work) b.work->wait();
    } catch (const std::exception&) {
    }
  }
  size_t h = 0;
  for (Bucket& b : buckets_) {
    for (size_t i : b.members) {
      DpParam& p = *params_[i];
      try {
        p.param.remove_hook(hook_handles_[h++]);
        set_grad_placements(p.param, std::nullopt);
      } catch (const std::exception&) {  // a destructor must not throw
      }
    }
  }
}

void GradReducer::begin_micro_batch(bool last) {
  NoGradGuard ng;
  if (micro_ > 0 && last_ && mode_ == Mode::AllReduce)
    TESSEL_FAIL(kOp, "begin_micro_batch after the step's last micro-batch: call finish() before the next step");
  const Device dev = params_[0]->param.device();
  if (micro_ == 0) per_micro_ = mode_ == Mode::AllReduce && numerics::bitwise();
  const bool per_micro = per_micro_;
  if (micro_ == 0) {
    if (mode_ == Mode::AllReduce) {
      // Zeroed gradient views: AccumulateGrad adds into the buckets directly.
      for (Bucket& b : buckets_) {
        kernels::fill(dev, b.flat, Scalar(0.0));
        for (size_t k = 0; k < b.members.size(); ++k) {
          DpParam& p = *params_[b.members[k]];
          p.param.set_grad(raw::make_distributed(b.views[k], p.param.mesh(), p.geo.pending, p.geo.global));
        }
      }
    } else {
      for (Bucket& b : buckets_) b.rs->reset();
    }
  } else if (mode_ == Mode::ReduceScatter) {
    while (next_ < buckets_.size()) launch(buckets_[next_++]);  // buckets a parameter without gradient held back
  } else if (per_micro) {
    // Bitwise mode: one device adds each micro-batch's finished gradient to
    // the sum of the earlier ones, so each micro-batch is all-reduced on its
    // own and added to `acc` (x + y is exact whatever the order of its two
    // operands; a deferred all-reduce of local sums would not be).
    while (next_ < buckets_.size()) launch(buckets_[next_++]);
    for (Bucket& b : buckets_) {
      b.work->wait();
      b.work = nullptr;
      if (!b.acc.defined()) b.acc = raw::empty(b.flat.shape(), b.flat.dtype(), b.flat.device());
      if (micro_ == 1) kernels::copy(dev, b.flat, b.acc);
      else kernels::binary(dev, kernels::BinaryOp::Add, b.acc, b.flat, b.acc);
      kernels::fill(dev, b.flat, Scalar(0.0));
    }
  }
  for (Bucket& b : buckets_) {
    b.ready = 0;
    b.launched = false;
  }
  next_ = 0;
  sync_ = mode_ == Mode::ReduceScatter || last || per_micro;
  last_ = last;
  ++micro_;
}

void GradReducer::on_grad(size_t bucket, size_t k) {
  Bucket& b = buckets_[bucket];
  if (mode_ == Mode::AllReduce) kernels::fill(b.flags[k].device(), b.flags[k], Scalar(1.0));
  if (!sync_ || micro_ == 0) return;  // micro_ == 0: a backward outside begin_micro_batch/finish
  if (++b.ready == int(b.members.size())) launch_ready();
}

void GradReducer::launch_ready() {
  while (next_ < buckets_.size() && buckets_[next_].ready == int(buckets_[next_].members.size()))
    launch(buckets_[next_++]);
}

void GradReducer::launch(Bucket& b) {
  NoGradGuard ng;
  b.launched = true;
  if (mode_ == Mode::AllReduce) {
    b.work = comm_->all_reduce(b.flat, comm::ReduceOp::Sum, /*async=*/true);
    return;
  }
  std::vector<Tensor> grads(b.members.size());
  for (size_t k = 0; k < b.members.size(); ++k) {
    const Tensor g = params_[b.members[k]]->param.grad();
    if (g.defined()) grads[k] = raw::local_of(g);
  }
  TESSEL_CHECK(ring_ != nullptr, kOp, "reduce-scatter buckets need a staging ring (set_ring)");
  b.rs->launch(*ring_, grads);
  for (size_t i : b.members) params_[i]->param.zero_grad();  // the full gradient is freed here
}

void GradReducer::finish() {
  TESSEL_CHECK(micro_ > 0, kOp, "finish() without begin_micro_batch(): call it before each backward");
  NoGradGuard ng;
  while (next_ < buckets_.size()) launch(buckets_[next_++]);
  if (mode_ == Mode::AllReduce) {
    for (Bucket& b : buckets_) {
      b.work->wait();
      b.work = nullptr;
      if (micro_ > 1 && per_micro_) kernels::binary(b.flat.device(), kernels::BinaryOp::Add, b.acc, b.flat, b.flat);
    }
    install_all_reduced();
  } else {
    ring_->complete_all();
    install_reduce_scattered();
  }
  micro_ = 0;
  sync_ = false;
  last_ = false;
}

void GradReducer::install_all_reduced() {
  for (Bucket& b : buckets_) {
    for (size_t k = 0; k < b.members.size(); ++k) {
      DpParam& p = *params_[b.members[k]];
      Tensor flag = b.flags[k].device() == kCPU ? b.flags[k] : b.flags[k].to(kCPU);
      // All-reduced, so alike on every rank; it only picks host work below.
      if (TESSEL_UNLIKELY(capture::active() != nullptr)) capture::active()->checked_read(flag);
      if (!(flag.data<float>()[0] > 0)) {  // no rank had a gradient: like one device, none
        p.param.zero_grad();
        if (!p.shard.is_same(p.param)) p.shard.zero_grad();
        continue;
      }
      const MeshPtr& mesh = p.param.mesh();
      p.param.set_grad(raw::make_distributed(b.views[k], mesh, p.geo.full, p.geo.global));
      if (!p.shard.is_same(p.param)) {  // ZeRO-1: the optimizer reads this rank's chunk
        p.shard.set_grad(raw::make_distributed(p.geo.chunk(b.views[k], p.geo.dp_rank), mesh, p.geo.sharded,
                                               p.geo.global));
      }
    }
  }
}

void GradReducer::install_reduce_scattered() {
  for (Bucket& b : buckets_) {
    for (size_t k = 0; k < b.members.size(); ++k) {
      DpParam& p = *params_[b.members[k]];
      p.param.zero_grad();
      if (!b.rs->used(k)) {
        p.shard.zero_grad();
        continue;
      }
      p.shard.set_grad(raw::make_distributed(b.rs->shard_grad(k), p.param.mesh(), p.geo.sharded, p.geo.global));
    }
  }
}

int64_t GradReducer::grad_bytes() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_) {
    if (mode_ == Mode::AllReduce) n += int64_t(b.flat.nbytes()) - int64_t(b.flags.size() * sizeof(float));
    else n += b.rs->shard_bytes();
  }
  return n;
}

int64_t GradReducer::comm_bytes() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_)
    n += mode_ == Mode::AllReduce ? int64_t(b.flags.size() * sizeof(float)) : b.rs->flag_bytes();
  return n;
}

std::vector<std::vector<std::string>> GradReducer::bucket_paths() const {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& b : buckets_) {
    out.emplace_back();
    for (size_t i : b.members) out.back().push_back(params_[i]->path);
  }
  return out;
}

}  // namespace tessel::parallel
