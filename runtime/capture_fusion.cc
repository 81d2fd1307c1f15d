// Fusion of elementwise chains in a recorded program (docs/compile.md,
// "Fusion"): runs of consecutive Elementwise launches over one iteration
// space are replayed tile by tile instead of launch by launch.
//
// Why it keeps every bit: an Elementwise kernel (capture::Access) writes
// element i of its output from element i of its inputs alone, with the same
// arithmetic whatever rows it is given. A chain replayed tile by tile runs
// each launch on every row exactly once, and each element sees the chain's
// launches in their recorded order. What could still break it is memory
// that two launches of the chain see at different places -- a tile-major
// order would let a later launch overwrite what an earlier one has not yet
// read in a later tile. So a chain only takes a launch when every buffer
// that the chain writes is seen through one and the same placement of its
// elements by every launch of the chain, no two held storages of the chain
// overlap where one is written, and the arena gives the chain's buffers
// bytes of their own for the whole chain (their liveness widened to it) --
// or, for one born in the chain, the bytes of one that died in it through
// the same placement, which a tile overwrites only after reading them.
//
// An intermediate that nothing outside the chain uses (a temporary written
// first inside the chain, dead at its end) never goes to memory at all: it
// lives in a tile-sized scratch per worker, which is the "one pass over
// memory" of a fused kernel.
//
// On a device with a FusedBackend (CUDA's) a chain is one kernel instead:
// each thread runs every launch of the chain on its own elements, in order
// (kernels/fused_chain.h), and the intermediates live in registers. The
// same rules make that sound: a written buffer is seen through one
// placement, so element i of it is only ever touched by element i's
// thread; a buffer that takes the bytes of one that died in the chain is
// written at element i after element i of the other was last read. A
// launch joins such a chain only if its table describes it as a fused step
// (KernelTable::set_fusion) with dtypes the kernel takes.
#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "runtime/capture.h"
#include "runtime/threadpool.h"

namespace tessel::capture {

namespace {
constexpr const char* kOp = "compile";
// Elements of one tile: a chain's operands for a tile (a few of these) stay
// in the core's L2 cache between the launches of the chain.
constexpr int64_t kTileElements = 16384;
// A launch this small (a scalar operand's fill) may move ahead of a chain.
constexpr int64_t kHoistElements = 64;

// A tensor argument as a [rows, cols] matrix: its leading dims merged into
// rows (they must merge with one stride: contiguous or broadcast alike),
// the last dim the columns.
struct RowLayout {
  int64_t rows = 0, cols = 0, row_stride = 0, col_stride = 0;
};
bool row_layout(const TensorArg& a, RowLayout* out) {
  const int k = a.shape.size();
  if (k == 0) return false;
  if (k == 1) {  // a vector: one column
    *out = {a.shape[0], 1, a.strides[0], 1};
    return true;
  }
  RowLayout r;
  r.cols = a.shape[k - 1];
  r.col_stride = a.strides[k - 1];
  r.rows = 1;
  bool have = false;
  int64_t expect = 0;
  for (int d = k - 2; d >= 0; --d) {
    r.rows *= a.shape[d];
    if (a.shape[d] == 1) continue;
    if (have && a.strides[d] != expect) return false;
    if (!have) r.row_stride = a.strides[d];
    have = true;
    expect = a.strides[d] * a.shape[d];
  }
  *out = r;
  return true;
}


bool fused_type(DType d, FusedType* t) {
  switch (d) {
    case DType::Float32: *t = FusedType::Float32; return true;
    case DType::BFloat16: *t = FusedType::BFloat16; return true;
    case DType::Float16: *t = FusedType::Float16; return true;
    case DType::Bool: *t = FusedType::Bool; return true;
    default: return false;
  }
}

// The dtypes a fused step takes (the kernels' own rules, within what
// kernels/fused_chain.h computes): floats of one dtype; `copy` between any
// two floats; `where` a bool condition, then floats of one dtype.
bool fused_types_ok(FusedKind kind, const std::vector<const TensorArg*>& args) {
  std::vector<FusedType> t;
  for (const TensorArg* a : args) {
    FusedType f;
    if (!fused_type(a->dtype, &f)) return false;
    t.push_back(f);
  }
  const size_t first = kind == FusedKind::Where ? 1 : 0;
  if (kind == FusedKind::Where && (t.size() != 4 || t[0] != FusedType::Bool)) return false;
  for (size_t k = first; k < t.size(); ++k) {
    if (t[k] == FusedType::Bool) return false;
    if (kind != FusedKind::Copy && t[k] != t[first]) return false;
  }
  return true;
}

// One launch that may join a chain: its tensors and their row layouts, and
// on a device with fusion, the step it is.
struct Candidate {
  std::vector<const TensorArg*> args;
  std::vector<RowLayout> layouts;
  int64_t rows = 0, cols = 0;
  Device device;
  bool fused = false;  // a step of one device kernel (else: a CPU tile)
  FusedStep step;
};
// `cuda_fusion_off`: TESSEL_CUDA_FUSION=0 (each CUDA launch then replays alone).
bool candidate(const Launch& l, bool cuda_fusion_off, Candidate* c) {
  if (l.access != Access::Elementwise) return false;
  c->args.clear();
  c->layouts.clear();
  l.tensor_args(c->args);
  if (c->args.empty()) return false;
  const Dims& shape = c->args[0]->shape;
  c->device = c->args[0]->device;
  for (const TensorArg* a : c->args) {
    RowLayout r;
    if (a->buffer < 0 || !(a->device == c->device) || a->shape != shape || !row_layout(*a, &r)) return false;
    c->layouts.push_back(r);
  }
  c->rows = c->layouts[0].rows;
  c->cols = c->layouts[0].cols;
  // Chains as one kernel on a device type with a FusedBackend.
  if (fused_backend(c->device.type) != nullptr && !(cuda_fusion_off && c->device.type == DeviceType::CUDA)) {
    // One kernel: worth it for any size (it saves a launch and a pass).
    c->fused = true;
    c->step = FusedStep();
    return c->rows * c->cols > 0 && l.fused_step(&c->step) && fused_types_ok(c->step.kind, c->args);
  }
  c->fused = false;
  // Worth it from two tiles on: a smaller chain's operands fit in cache anyway.
  return c->device.is_cpu() && c->rows >= 2 && c->rows * c->cols > kTileElements;
}

// Where element (row, col) of the chain's [rows, cols] lies in a buffer.
struct ElementMap {
  int64_t offset = 0, row_stride = 0, col_stride = 0;
  DType dtype = DType::Float32;
  bool operator==(const ElementMap& o) const {
    return offset == o.offset && row_stride == o.row_stride && col_stride == o.col_stride && dtype == o.dtype;
  }
};
// How a chain sees one buffer so far.
struct Seen {
  ElementMap at;                    // the first access
  bool written = false;
  bool one_layout = true;           // every access had `at`
  bool first_writes_only = false;   // the first launch of the chain that uses it only writes it
};
}  // namespace

void Recorder::plan_fusion(Program& p) {
  if (!fuse_elementwise) return;
  const int64_t n = int64_t(p.launches_.size());
  // Held storages (tensors from before the step, inputs, outputs): their
  // memory, to refuse a chain that sees one piece of memory through two.
  auto range_of = [&](int id) -> std::pair<const char*, const char*> {
    const Buffer& b = buffers_[size_t(id)];
    std::shared_ptr<StorageImpl> s = b.storage ? b.storage : b.weak.lock();
    if (!s || !s->data()) return {nullptr, nullptr};
    const char* at = static_cast<const char*>(s->data());
    return {at, at + s->nbytes()};
  };
  const bool cuda_fusion_off = detail::turned_off("TESSEL_CUDA_FUSION");
  Candidate cand;
  int64_t i = 0;
  while (i < n) {
    if (!candidate(*p.launches_[size_t(i)], cuda_fusion_off, &cand)) {
      ++i;
      continue;
    }
    const int64_t rows = cand.rows, cols = cand.cols;
    const Device device = cand.device;
    const bool fused = cand.fused;
    // A device kernel's operands: each buffer as each placement sees it
    // (a buffer only read may be read through two), at most kMaxFusedOperands.
    std::vector<std::pair<int, ElementMap>> operands;
    int64_t steps = 0;
    std::map<int, Seen> seen;         // buffers the tiled launches use
    std::set<int> before;             // buffers the prologue writes (whole, before any tile)
    std::set<int> prologue_uses;      // every buffer the prologue touches (never a scratch or a register)
    std::vector<int64_t> prologue;    // small launches in the chain, run before its tiles
    int64_t j = i, last_tiled = i;
    // Adds tiled launch j's accesses to `seen` if the chain stays sound;
    // false (and `seen` unchanged) if not.
    auto admit = [&](const Candidate& c) {
      std::map<int, Seen> next = seen;
      for (size_t k = 0; k < c.args.size(); ++k) {
        const TensorArg& a = *c.args[k];
        const bool writes = k + 1 == c.args.size();
        // A written view that holds one element at two positions (zero
        // strides) would be written twice: left to whole launches.
        if (writes && ((c.layouts[k].row_stride == 0 && rows > 1) || (c.layouts[k].col_stride == 0 && cols > 1)))
          return false;
        // Written whole by the prologue before any tile: read it through any
        // view; writing it again would reorder the two writes.
        if (before.count(a.buffer) > 0) {
          if (writes) return false;
          continue;
        }
        const ElementMap at{a.offset, c.layouts[k].row_stride, c.layouts[k].col_stride, a.dtype};
        auto [it, fresh] = next.try_emplace(a.buffer);
        Seen& s = it->second;
        if (fresh) {
          s.at = at;
          s.first_writes_only = writes;  // (the written argument is a launch's last: a read of it comes first)
        } else {
          s.one_layout = s.one_layout && s.at == at;
        }
        s.written = s.written || writes;
        if (s.written && !s.one_layout) return false;
      }
      std::vector<std::pair<int, ElementMap>> more;
      if (fused) {
        more = operands;
        for (size_t k = 0; k < c.args.size(); ++k) {
          const TensorArg& a = *c.args[k];
          const std::pair<int, ElementMap> key{a.buffer, {a.offset, c.layouts[k].row_stride, c.layouts[k].col_stride, a.dtype}};
          if (std::find(more.begin(), more.end(), key) == more.end()) more.push_back(key);
        }
        if (int64_t(more.size()) > kMaxFusedOperands || steps + 1 > kMaxFusedSteps) return false;
      }
      for (const auto& [id, s] : next) {
        if (!s.written) continue;
        const auto [lo, hi] = range_of(id);
        if (!lo) continue;
        for (const auto& [other, t] : next) {
          if (other == id) continue;
          const auto [olo, ohi] = range_of(other);
          if (olo && olo < hi && lo < ohi) return false;
        }
      }
      seen = std::move(next);
      if (fused) operands = std::move(more);
      return true;
    };
    // A small elementwise launch between two of the chain's (the fill of a
    // scalar operand) may run before the chain's tiles: when it touches no
    // buffer the chain's launches before it use, moving it ahead of them
    // changes nothing they compute.
    auto hoist = [&](const Launch& l) {
      if (l.access != Access::Elementwise) return false;
      std::vector<const TensorArg*> args;
      l.tensor_args(args);
      if (args.empty()) return false;
      for (const TensorArg* a : args) {
        if (a->buffer < 0 || !(a->device == device) || seen.count(a->buffer) > 0 || numel_of(a->shape) > kHoistElements)
          return false;
      }
      before.insert(args.back()->buffer);
      for (const TensorArg* a : args) prologue_uses.insert(a->buffer);
      return true;
    };
    for (; j < n; ++j) {
      if (j > i && std::find(boundaries_.begin(), boundaries_.end(), j) != boundaries_.end()) break;
      const Launch& l = *p.launches_[size_t(j)];
      if (j > i && !candidate(l, cuda_fusion_off, &cand)) {
        if (!hoist(l)) break;
        prologue.push_back(j);
        continue;
      }
      if (cand.rows != rows || cand.cols != cols || !(cand.device == device) || cand.fused != fused || !admit(cand))
        break;
      ++steps;
      last_tiled = j;
    }
    // The chain ends at its last tiled launch (a trailing small launch stays alone).
    const int64_t end = last_tiled + 1;
    while (!prologue.empty() && prologue.back() >= end) prologue.pop_back();
    if (end - i - int64_t(prologue.size()) < 2) {
      ++i;
      continue;
    }
    Program::Chain c;
    c.begin = i;
    c.end = end;
    c.rows = rows;
    c.cols = cols;
    c.tile_rows = std::max<int64_t>(1, kTileElements / cols);
    c.prologue = prologue;
    c.name = "fused(";
    for (int64_t l = i; l < end; ++l) {
      if (std::find(prologue.begin(), prologue.end(), l) != prologue.end()) continue;
      if (l > i) c.name += "+";
      c.name += p.launches_[size_t(l)]->name;
    }
    c.name += ")";
    std::vector<int> dying, born;  // arena buffers whose life ends / begins inside the chain
    for (const auto& [id, s] : seen) {
      Buffer& b = buffers_[size_t(id)];
      // Only this chain uses it, and writes it before anything reads it: a
      // tile-sized scratch instead of memory of its own (a device kernel's
      // register).
      if (b.temporary() && !b.output && s.written && s.first_writes_only && b.first >= i && b.last < end &&
          prologue_uses.count(id) == 0) {
        b.scratch = true;
        if (fused) continue;
        c.scratch.push_back({id, c.slot_bytes});
        const int64_t bytes = c.tile_rows * cols * int64_t(itemsize(s.at.dtype));
        c.slot_bytes += detail::arena_bytes(bytes);
        continue;
      }
      if (b.temporary() && s.one_layout && !b.output && b.last < end - 1) dying.push_back(id);
      if (b.temporary() && s.written && s.first_writes_only && b.first > i) born.push_back(id);
    }
    // A buffer born in the chain may take the bytes of one that dies in it
    // when both are seen through one layout (element k at the same bytes)
    // and it is first written at or after the other's last read: a tile
    // then only overwrites what its own launches have read. Without this
    // the two would need bytes of their own for the whole chain, where
    // eager (and an unfused replay) reuses them.
    std::sort(born.begin(), born.end(), [&](int a, int b) { return buffers_[size_t(a)].first < buffers_[size_t(b)].first; });
    for (int id : born) {
      Buffer& b = buffers_[size_t(id)];
      for (auto it = dying.begin(); it != dying.end(); ++it) {
        const Buffer& d = buffers_[size_t(*it)];
        if (d.last > b.first || d.nbytes != b.nbytes || !(d.device == b.device) || !(seen.at(*it).at == seen.at(id).at))
          continue;
        b.shares = *it;
        dying.erase(it);
        break;
      }
    }
    // The rest keep bytes of their own (or shared as above) across the
    // whole chain. (place_in_arenas places buffers that share bytes as one,
    // alive from the first one's first use to the last one's last.)
    auto widen = [&](int id) {
      Buffer& b = buffers_[size_t(id)];
      b.first = std::min(b.first, i);
      b.last = std::max(b.last, end - 1);
    };
    for (const auto& [id, s] : seen)
      if (!buffers_[size_t(id)].scratch) widen(id);
    for (int id : before) widen(id);  // (the prologue's too: they are written before the chain's first launch)
    c.slots = c.slots_now();  // (its scratch is placed in the arena now: place_in_arenas)
    p.chains_.push_back(std::move(c));
    if (fused) plan_device_chain(p, p.chains_.size() - 1);
    i = end;
  }
}

void Recorder::plan_device_chain(Program& p, size_t chain) {
  Program::Chain& c = p.chains_[chain];
  c.on_device = true;
  FusedProgram& fp = c.program;
  fp = FusedProgram();
  fp.rows = c.rows;
  fp.cols = c.cols;
  std::vector<std::pair<int, ElementMap>> keys;  // per operand
  for (int64_t l = c.begin; l < c.end; ++l) {
    if (std::find(c.prologue.begin(), c.prologue.end(), l) != c.prologue.end()) continue;
    const Launch& launch = *p.launches_[size_t(l)];
    FusedStep st;
    const bool described = launch.fused_step(&st);
    std::vector<const TensorArg*> args;
    launch.tensor_args(args);
    TESSEL_CHECK(described && args.size() >= 2 && args.size() <= 4 && fp.num_steps < kMaxFusedSteps, kOp,
                 "fusing launch {} ('{}') of {}: not a fused step (an internal error)", l, launch.name, p.label_);
    for (size_t k = 0; k < args.size(); ++k) {
      const TensorArg& a = *args[k];
      RowLayout r;
      row_layout(a, &r);
      c.device = a.device;
      const bool in_register = buffers_[size_t(a.buffer)].scratch;
      // A register is one per buffer (it is written, so seen through one placement).
      const ElementMap at = in_register ? ElementMap{0, 0, 0, a.dtype} : ElementMap{a.offset, r.row_stride, r.col_stride, a.dtype};
      const std::pair<int, ElementMap> key{a.buffer, at};
      auto it = std::find(keys.begin(), keys.end(), key);
      if (it == keys.end()) {
        TESSEL_CHECK(fp.num_operands < kMaxFusedOperands, kOp, "fusing {}: too many operands (an internal error)",
                     p.label_);
        FusedOperand o;
        o.row_stride = in_register ? 0 : r.row_stride;
        o.col_stride = in_register ? 0 : r.col_stride;
        fused_type(a.dtype, &o.type);
        o.in_register = in_register ? 1 : 0;
        fp.operands[fp.num_operands++] = o;
        c.operand_args.push_back(in_register ? nullptr : &a);
        keys.push_back(key);
        it = keys.end() - 1;
      }
      const int8_t index = int8_t(it - keys.begin());
      if (k + 1 < args.size()) st.in[k] = index;
      else st.out = index;
    }
    fp.steps[fp.num_steps++] = st;
  }
}

int64_t Program::Chain::slots_now() const { return std::max<int64_t>(1, std::min<int64_t>(num_threads(), tile_count())); }

int64_t Program::fused_launches() const {
  int64_t n = 0;
  for (const Chain& c : chains_) n += c.end - c.begin;
  return n;
}

namespace {
// Rows [r0, r1) of `a` (its layout as rows and columns), over `storage`.
Tensor row_view(const TensorArg& a, const std::shared_ptr<StorageImpl>& storage, int64_t r0, int64_t r1) {
  RowLayout r;
  row_layout(a, &r);
  TensorArg t = a;
  t.shape = Dims{r1 - r0, r.cols};
  t.strides = Dims{r.row_stride, r.col_stride};
  t.offset = a.offset + r0 * r.row_stride;
  return detail::view_of(t, storage);
}

// Slot of tile t when `tiles` tiles are split over `slots` workers in
// contiguous runs: tiles [w * tiles / slots, (w + 1) * tiles / slots).
int64_t slot_begin(int64_t w, int64_t tiles, int64_t slots) { return w * tiles / slots; }
}  // namespace

void Program::make_tiles(Chain& c) {
  if (c.on_device) return;  // (one kernel: run_chain)
  const int64_t tiles = c.tile_count();
  const int64_t slots = c.slots;
  c.tiles.clear();
  c.tiles.resize(size_t(tiles));
  for (int64_t w = 0; w < slots; ++w) {
    for (int64_t t = slot_begin(w, tiles, slots); t < slot_begin(w + 1, tiles, slots); ++t) {
      const int64_t r0 = t * c.tile_rows, r1 = std::min(c.rows, r0 + c.tile_rows);
      for (int64_t l = c.begin; l < c.end; ++l) {
        if (std::find(c.prologue.begin(), c.prologue.end(), l) != c.prologue.end()) continue;
        auto view = [&](int, const TensorArg& a) -> Tensor {
          const auto at = std::find_if(c.scratch.begin(), c.scratch.end(),
                                       [&](const Chain::Scratch& s) { return s.buffer == a.buffer; });
          if (at == c.scratch.end()) return row_view(a, a.view.storage(), r0, r1);
          // The scratch: this worker's tile of the buffer, rows packed.
          TensorArg s = a;
          s.shape = Dims{r1 - r0, c.cols};
          s.strides = Dims{c.cols, 1};
          const int64_t bytes = w * c.slot_bytes + at->offset;
          s.offset = bytes / int64_t(itemsize(a.dtype));
          return detail::view_of(s, c.scratch_storage);
        };
        std::unique_ptr<Launch> tile = launches_[size_t(l)]->with_views(view);
        TESSEL_CHECK(tile != nullptr, kOp, "fusing launch {} ('{}') of {}: not a kernel launch (an internal error)", l,
                     launches_[size_t(l)]->name, label_);
        c.tiles[size_t(t)].push_back(std::move(tile));
      }
    }
  }
}

void Program::run_chain(Chain& c) {
  if (c.on_device) {
    for (int64_t l : c.prologue) launches_[size_t(l)]->run();
    FusedProgram p = c.program;
    for (size_t k = 0; k < c.operand_args.size(); ++k) {
      const TensorArg* a = c.operand_args[k];
      if (a == nullptr) continue;  // a register
      char* base = static_cast<char*>(a->view.storage()->data());
      p.operands[k].data = base + a->offset * int64_t(itemsize(a->dtype));
    }
    FusedBackend* backend = fused_backend(c.device.type);
    TESSEL_CHECK(backend != nullptr, kOp, "replaying {}: the fused chain {} on {} has no fused backend any more", label_,
                 c.name, c.device.str());
    backend->launch(c.device, p);
    return;
  }
  const int64_t tiles = int64_t(c.tiles.size());
  const int64_t slots = c.slots;
  for (int64_t l : c.prologue) launches_[size_t(l)]->run();
  // Each worker runs its own slot's tiles (its scratch is its own), each
  // tile through the whole chain before the next.
  parallel_for(slots, 1, [&](int64_t wb, int64_t we) {
    for (int64_t w = wb; w < we; ++w)
      for (int64_t t = slot_begin(w, tiles, slots); t < slot_begin(w + 1, tiles, slots); ++t)
        for (auto& l : c.tiles[size_t(t)]) l->run();
  });
}

}  // namespace tessel::capture
