#pragma once
// KernelTable: the per-device implementations of one kernel.
//
// A kernel family header (kernels/<family>.h) defines its tables (C++17
// inline variables: one object across the program, no .cc to restate them);
// kernels/cpu and kernels/cuda register implementations from static
// initialisers, so an op finds its kernel for a tensor's device without
// knowing which backends were built. Tables are constant-initialised
// (constexpr constructor), so registration order across translation units
// does not matter.
//
// Kernels write into outputs the caller allocated; on the Meta device no
// kernel runs (shapes and dtypes are all a meta tensor has).
#include <utility>

#include "runtime/capture.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/macros.h"

namespace tessel::kernels {

[[noreturn]] void throw_missing_kernel(const char* name, Device d);

template <class Sig> class KernelTable;

template <class... A>
class KernelTable<void(A...)> {
 public:
  using Fn = void (*)(A...);
  // `access`: how the kernel treats its tensors (capture::Access; compile
  // mode fuses runs of Elementwise kernels).
  constexpr explicit KernelTable(const char* name, capture::Access access = capture::Access::Other)
      : name_(name), access_(access), fuse_(nullptr), fns_{} {}

  bool set(DeviceType d, Fn fn) {
    fns_[static_cast<int>(d)] = fn;
    return true;
  }
  bool has(DeviceType d) const { return fns_[static_cast<int>(d)] != nullptr; }
  // How a launch of this table is one step of a fused device kernel
  // (compile mode, docs/compile.md "Fusion"; kernels/fused_chain.cc): it
  // sets the step's kind and op from the launch's arguments (its tensors
  // are unbound then: only the other arguments may be read), or returns
  // false. Set once, at start-up.
  using Fuse = bool (*)(capture::FusedStep*, A...);
  bool set_fusion(Fuse fuse) {
    fuse_ = fuse;
    return true;
  }
  const char* name() const { return name_; }

  template <class... Args>
  void operator()(Device d, Args&&... args) const {
    if (d.type == DeviceType::Meta) return;
    Fn fn = fns_[static_cast<int>(d.type)];
    if (TESSEL_UNLIKELY(!fn)) throw_missing_kernel(name_, d);
    if (TESSEL_UNLIKELY(capture::active() != nullptr)) {  // compile mode: recorded too (runtime/capture.h)
      capture::Recorder& r = *capture::active();
      if (r.depth == 0) r.kernel(name_, access_, fn, fuse_, args...);
      struct Depth {
        int& d;
        ~Depth() { --d; }
      } depth{++r.depth};
      fn(std::forward<Args>(args)...);
      return;
    }
    fn(std::forward<Args>(args)...);
  }

 private:
  const char* name_;
  capture::Access access_;
  Fuse fuse_ = nullptr;
  Fn fns_[kNumDeviceTypes];
};

}  // namespace tessel::kernels

#define TESSEL_KERNEL_CONCAT_(a, b) a##b
#define TESSEL_KERNEL_CONCAT(a, b) TESSEL_KERNEL_CONCAT_(a, b)
// TESSEL_REGISTER_KERNEL(table, DeviceType::CPU, fn) at namespace scope.
#define TESSEL_REGISTER_KERNEL(table, device, fn) \
  static const bool TESSEL_KERNEL_CONCAT(tessel_kernel_reg_, __COUNTER__) = (table).set(device, fn)
