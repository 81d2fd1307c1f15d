#include "nn/context.h"

#include "autograd/ops/random.h"
#include "runtime/capture.h"
#include "runtime/error.h"

namespace tessel::nn {

namespace {
thread_local ForwardContext t_ctx;
}  // namespace

namespace {
void check_context(const ForwardContext& ctx, const char* who) {
  TESSEL_CHECK(ctx.batch_offset >= 0 && ctx.global_batch >= -1, who,
               "batch_offset must be >= 0 and global_batch >= -1 (-1: the local batch is the whole batch), got {} "
               "and {}",
               ctx.batch_offset, ctx.global_batch);
  TESSEL_CHECK(ctx.global_batch >= 0 || ctx.batch_offset == 0, who,
               "batch_offset {} needs global_batch (got -1, meaning the local batch is the whole batch)",
               ctx.batch_offset);
}
}  // namespace

ForwardScope::ForwardScope(const ForwardContext& ctx) : prev_(t_ctx) {
  check_context(ctx, "ForwardScope");
  t_ctx = ctx;
}

ForwardContext set_forward_context(const ForwardContext& ctx) {
  check_context(ctx, "set_forward_context");
  const ForwardContext prev = t_ctx;
  t_ctx = ctx;
  return prev;
}

ForwardScope::~ForwardScope() { t_ctx = prev_; }

const ForwardContext& forward_context() { return t_ctx; }

PhiloxKey random_key(const std::string& site) {
  const PhiloxKey key{t_ctx.seed, stream_for(site, {t_ctx.step})};
  // Compile mode: a replay re-makes the key from the forward context it runs in.
  if (TESSEL_UNLIKELY(capture::active() != nullptr)) capture::active()->key(key, [site] { return random_key(site); });
  return key;
}

GlobalBlock batch_block(const Dims& local_shape, const std::string& who) {
  if (t_ctx.global_batch < 0 || local_shape.empty()) return GlobalBlock{};
  const int64_t local = local_shape[0];
  TESSEL_CHECK(t_ctx.batch_offset + local <= t_ctx.global_batch, who,
               "local batch of {} rows at batch_offset {} does not fit in global_batch {} (input shape {})", local,
               t_ctx.batch_offset, t_ctx.global_batch, local_shape);
  GlobalBlock b;
  b.global_shape = local_shape;
  b.global_shape[0] = t_ctx.global_batch;
  b.offset = Dims::filled(local_shape.size(), 0);
  b.offset[0] = t_ctx.batch_offset;
  // Mixed mode: a module's recording is replayed for every micro-batch; the
  // replay re-makes the block from the forward context it runs in.
  if (TESSEL_UNLIKELY(capture::active() != nullptr))
    capture::active()->block(b, [local_shape, who] { return batch_block(local_shape, who); });
  return b;
}

}  // namespace tessel::nn
