// The fused steps' descriptions and the host fused backend
// (kernels/fused_chain.h).
#include "kernels/fused_chain.h"

namespace tessel::kernels {
namespace {

using capture::FusedKind;
using capture::FusedStep;

bool fuse_unary(FusedStep* s, UnaryOp op, const Tensor&, const Tensor&) {
  if (!fusable_unary(op)) return false;
  s->kind = FusedKind::Unary;
  s->op = uint8_t(op);
  return true;
}

bool fuse_unary_backward(FusedStep* s, UnaryOp op, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  if (!fusable_unary(op)) return false;
  s->kind = FusedKind::UnaryBackward;
  s->op = uint8_t(op);
  return true;
}

bool fuse_binary(FusedStep* s, BinaryOp op, const Tensor&, const Tensor&, const Tensor&) {
  if (!fusable_binary(op)) return false;
  s->kind = FusedKind::Binary;
  s->op = uint8_t(op);
  return true;
}

bool fuse_copy(FusedStep* s, const Tensor&, const Tensor&) {
  s->kind = FusedKind::Copy;
  return true;
}

bool fuse_where(FusedStep* s, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  s->kind = FusedKind::Where;
  return true;
}

class HostFusedBackend final : public capture::FusedBackend {
 public:
  void launch(Device, const capture::FusedProgram& p) override {
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t c = 0; c < p.cols; ++c) fused_eval(p, r, c);
  }
};

}  // namespace

void register_fusion() {
  static const bool once = unary.set_fusion(&fuse_unary) && unary_backward.set_fusion(&fuse_unary_backward) &&
                           binary.set_fusion(&fuse_binary) && copy.set_fusion(&fuse_copy) &&
                           where.set_fusion(&fuse_where);
  (void)once;
}

capture::FusedBackend* host_fused_backend() {
  register_fusion();
  static HostFusedBackend backend;
  return &backend;
}

}  // namespace tessel::kernels
