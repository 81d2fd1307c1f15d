#include "runtime/capture.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <string>

#include "runtime/allocator.h"
#include "runtime/profile.h"
#include "runtime/timeline.h"

namespace tessel::capture {

namespace detail {
thread_local Recorder* t_recorder = nullptr;
}

namespace {
constexpr const char* kOp = "compile";

// The bytes of a CPU buffer (constants are compared between captures).
std::string bytes_of(const StorageImpl& s) {
  if (!s.data() || s.nbytes() == 0) return std::string();
  TESSEL_CHECK(s.device().is_cpu(), kOp, "a tensor built from host values on {} (compile mode keeps such constants on the CPU only)",
               s.device().str());
  return std::string(static_cast<const char*>(s.data()), s.nbytes());
}
}  // namespace

namespace detail {
Tensor view_of(const TensorArg& a, std::shared_ptr<StorageImpl> storage) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = a.shape;
  impl->strides = a.strides;
  impl->offset = a.offset;
  impl->dtype = a.dtype;
  impl->device = a.device;
  return Tensor(std::move(impl));
}
}  // namespace detail

void Stored<Tensor>::bind(const std::vector<std::shared_ptr<StorageImpl>>& buffers) {
  arg.view = arg.buffer < 0 ? Tensor() : detail::view_of(arg, buffers[size_t(arg.buffer)]);
}

// ---- host output checks -----------------------------------------------------------------------------
namespace {
struct HostCheck {
  const char* kernel;
  void (*check)(const HostOutputs&);
};
void check_index_bounds(const HostOutputs& v) {
  // index_bounds(index, limit, &bad_pos, &bad_value): bad_pos = -1 when every index is in range.
  if (v.written.size() != 2 || v.written[0] < 0) return;
  const Dims at = coordinates_of(v.shape, v.written[0]);  // (as eager's message)
  const std::string range =
      v.integers.size() == 1 ? fmt::format(FMT_STRING("[0, {})"), v.integers[0]) : std::string("[0, limit)");
  throw Error(fmt::format(FMT_STRING("{}: index {} at position {} of a replayed step's index tensor (shape {}) is {}; "
                                     "valid range is {} (the check eager mode makes for an embedding id or a "
                                     "gather/index_select index)"),
                          kOp, v.written[1], at.str(), v.shape.str(), v.written[1] < 0 ? "negative" : "out of range",
                          range));
}
constexpr HostCheck kHostChecks[] = {{"index_bounds", &check_index_bounds}};
}  // namespace

bool has_host_output_check(const char* kernel) {
  for (const HostCheck& c : kHostChecks)
    if (std::strcmp(c.kernel, kernel) == 0) return true;
  return false;
}

void check_host_outputs(const char* kernel, const HostOutputs& values) {
  for (const HostCheck& c : kHostChecks)
    if (std::strcmp(c.kernel, kernel) == 0) return c.check(values);
}

// ---- recorder -------------------------------------------------------------------------------------------
Recorder::Recorder(std::string label) : label_(std::move(label)), prev_(detail::t_recorder) {
  static std::atomic<uint64_t> count{0};
  serial_ = ++count;
  TESSEL_CHECK(prev_ == nullptr, kOp, "capturing '{}' while '{}' is being captured on the same thread", label_,
               prev_->label_);
  detail::t_recorder = this;
}

Recorder::~Recorder() {
  if (detail::t_recorder == this) detail::t_recorder = prev_;
}

void Recorder::suspend() {
  TESSEL_CHECK(detail::t_recorder == this && !suspended_, kOp, "suspending '{}', which is not the active recording",
               label_);
  boundaries_.push_back(int64_t(launches_.size()));
  detail::t_recorder = prev_;
  suspended_ = true;
}

void Recorder::resume() {
  TESSEL_CHECK(suspended_ && detail::t_recorder == prev_, kOp,
               "resuming '{}' while another recording ('{}') is active on the thread", label_,
               detail::t_recorder ? detail::t_recorder->label_ : std::string("?"));
  // Buffers freed while suspended were not seen to die: their addresses may
  // name new storages now.
  for (auto it = buffer_ids_.begin(); it != buffer_ids_.end();) {
    Buffer& b = buffers_[size_t(it->second)];
    if (!b.storage && b.weak.expired()) {
      b.died = true;
      born_.erase(it->first);
      it = buffer_ids_.erase(it);
    } else {
      ++it;
    }
  }
  detail::t_recorder = this;
  suspended_ = false;
}

void Recorder::refuse(std::string why) {
  if (refused_.empty()) refused_ = std::move(why);
}

int Recorder::buffer_of(const std::shared_ptr<StorageImpl>& s) {
  auto it = buffer_ids_.find(s.get());
  if (it != buffer_ids_.end()) {
    Buffer& old = buffers_[size_t(it->second)];
    if (old.storage == s || old.weak.lock() == s) return it->second;
    // The address of a buffer that died (freed on another thread, where
    // storage_destroyed did not see it) now names a new storage.
    old.died = true;
    buffer_ids_.erase(it);
  }
  const int id = int(buffers_.size());
  Buffer b;
  b.born = born_.count(s.get()) > 0;
  // A tensor from before the step is held (the program keeps using it); the
  // step's own buffers are not: eager frees them as it goes, and so does the
  // recording (storage_destroyed retires the number).
  if (!b.born) b.storage = s;
  b.weak = s;
  b.nbytes = s->nbytes();
  b.device = s->device();
  buffers_.push_back(std::move(b));
  buffer_ids_.emplace(s.get(), id);
  return id;
}

int Recorder::input(const Tensor& t) {
  TESSEL_CHECK(t.defined() && !t.is_distributed(), kOp, "input {}: a defined, local tensor", t.desc());
  const int id = buffer_of(t.storage());
  buffers_[size_t(id)].input = true;
  buffers_[size_t(id)].storage = t.storage();
  return id;
}

int Recorder::output(const Tensor& t) {
  TESSEL_CHECK(t.defined() && !t.is_distributed(), kOp, "output {}: a defined, local tensor", t.desc());
  const int id = buffer_of(t.storage());
  buffers_[size_t(id)].output = true;
  buffers_[size_t(id)].storage = t.storage();
  return id;
}

int Recorder::tensor_buffer(const Tensor& t, TensorArg* arg) {
  if (!t.defined()) {
    arg->buffer = -1;
    return -1;
  }
  if (t.is_distributed()) {
    refuse(fmt::format(FMT_STRING("a kernel was given the distributed tensor {} (kernels take local pieces)"), t.desc()));
    arg->buffer = -1;
    return -1;
  }
  if (!born_unrecorded_.empty() && born_unrecorded_.count(t.storage().get()) > 0)
    refuse(fmt::format(FMT_STRING("{} was made by work the recording skipped (an Unrecorded scope) and then used by "
                                  "a recorded launch: a replay would not make it"),
                       t.desc()));
  const int id = buffer_of(t.storage());
  Buffer& b = buffers_[size_t(id)];
  if (!b.used && b.host_written) b.constant = bytes_of(*b.storage);
  used_by_next_launch(b);
  arg->buffer = id;
  arg->shape = t.shape();
  arg->strides = t.strides();
  arg->offset = t.offset();
  arg->dtype = t.dtype();
  arg->device = t.device();
  return id;
}

void Recorder::used_by_next_launch(Buffer& b) {
  const int64_t at = int64_t(launches_.size());
  b.used = true;
  if (b.first < 0) b.first = at;
  b.last = at;
}

void Recorder::storage_created(const StorageImpl* s) {
  born_.insert(s);
  if (unrecorded_ > 0) born_unrecorded_.insert(s);
}

void Recorder::storage_destroyed(const StorageImpl* s) {
  born_.erase(s);
  born_unrecorded_.erase(s);
  checked_.erase(s);
  auto it = buffer_ids_.find(s);
  if (it != buffer_ids_.end()) {
    buffers_[size_t(it->second)].died = true;  // a temporary of the step: the arena will hold its bytes
    buffer_ids_.erase(it);
  }
}


void Recorder::host_access(const Tensor& t) {
  if (unrecorded_ > 0 || !t.defined() || !t.storage()) return;
  if (checked_.count(t.storage().get()) > 0) return;  // checked at every replay
  if (born_.count(t.storage().get()) > 0) {
    Buffer& b = buffers_[size_t(buffer_of(t.storage()))];
    if (!b.used) {
      // A tensor the step made and filled on the host (positions, a mask):
      // a constant of the program if the next capture gives the same bytes.
      b.host_written = true;
      b.storage = t.storage();  // kept: the replay reads it
      return;
    }
  }
  refuse(fmt::format(FMT_STRING("the host read the values of {} after {} recorded launch(es) ({}): the step's later "
                                "work may depend on them (item(), to_vector(), a branch on a value), which a replay "
                                "cannot redo"),
                     t.desc(), launches_.size(), launches_.empty() ? "none" : std::string("the last: ") + launches_.back()->name));
}

void Recorder::add(std::unique_ptr<Launch> launch) { launches_.push_back(std::move(launch)); }

namespace {
// StorageImpl::release / reallocate, replayed on the same storage object:
// the kernels after it read its memory through their views, so the replay
// frees and refills it where eager did (FSDP's gathered parameters).
class StorageLaunch final : public Launch {
 public:
  StorageLaunch(int buffer, bool release) : buffer_(buffer), release_(release) {}
  void run() override {
    if (release_) storage_->release();
    else storage_->reallocate();
  }
  void bind(const std::vector<std::shared_ptr<StorageImpl>>& buffers) override { storage_ = buffers[size_t(buffer_)]; }
  void refresh(const PerCall&) override {}

 private:
  int buffer_;
  bool release_;
  std::shared_ptr<StorageImpl> storage_;
};
}  // namespace

void Recorder::storage_released(StorageImpl& s) { storage_op(s, true); }
void Recorder::storage_reallocated(StorageImpl& s) { storage_op(s, false); }

void Recorder::storage_op(StorageImpl& s, bool release) {
  if (depth > 0) return;  // inside a launch or an Unrecorded scope: done again inside it, or not part of the step
  const char* what = release ? "storage_release" : "storage_reallocate";
  std::shared_ptr<StorageImpl> held = s.weak_from_this().lock();
  if (!held) {
    refuse(fmt::format(FMT_STRING("{} of {} bytes on a storage not owned by a shared_ptr"), what, s.nbytes()));
    return;
  }
  const int id = buffer_of(held);
  Buffer& b = buffers_[size_t(id)];
  if (b.born) {
    // Only storages from before the step are released and refilled (the
    // step's own temporaries are placed in the arena, which does not).
    refuse(fmt::format(FMT_STRING("{} of a buffer of {} bytes the step made itself"), what, s.nbytes()));
    return;
  }
  b.storage = held;
  used_by_next_launch(b);
  auto launch = std::make_unique<StorageLaunch>(id, release);
  launch->name = what;
  launch->fingerprint = what;
  launch->fingerprint.push_back('\0');
  fingerprint(launch->fingerprint, id);
  launches_.push_back(std::move(launch));
}

void Recorder::touch(int buffer) {
  if (buffer >= 0) buffers_[size_t(buffer)].last = int64_t(launches_.size());
}

void Recorder::async_started(const char* what) {
  if (in_flight_++ == 0) in_flight_what_ = what;
}

void Recorder::async_waited() { --in_flight_; }

namespace {
// A checked read (Recorder::checked_read), replayed: the bytes the recording saw.
class CheckLaunch final : public Launch {
 public:
  void run() override {
    const Tensor& t = view.get();
    const char* now = static_cast<const char*>(t.storage()->data()) + t.offset() * int64_t(t.itemsize());
    if (std::memcmp(now, expected.data(), expected.size()) != 0)
      throw ReplayDiverged(fmt::format(FMT_STRING("{}: the replayed step read other values of {} than the recorded "
                                                  "step did (it takes another path)"),
                                       kOp, t.desc()));
  }
  void bind(const std::vector<std::shared_ptr<StorageImpl>>& buffers) override { view.bind(buffers); }
  void refresh(const PerCall&) override {}
  Stored<Tensor> view;
  std::string expected;
};
}  // namespace

void Recorder::checked_read(const Tensor& t) {
  if (depth > 0 || !t.defined()) return;
  if (t.is_distributed() || !t.device().is_cpu() || !t.is_contiguous() || !t.storage()) {
    refuse(fmt::format(FMT_STRING("a checked read of {} (only local, contiguous CPU tensors)"), t.desc()));
    return;
  }
  auto check = std::make_unique<CheckLaunch>();
  check->name = "checked_read";
  check->fingerprint = "checked_read";
  check->fingerprint.push_back('\0');
  check->view.record(*this, check->fingerprint, t);
  const char* at = static_cast<const char*>(t.storage()->data()) + t.offset() * int64_t(t.itemsize());
  check->expected.assign(at, t.nbytes());
  // The values themselves are not part of the fingerprint: two recordings
  // may read other flags only if their launches differ elsewhere too.
  checked_.insert(t.storage().get());
  launches_.push_back(std::move(check));
}

void Recorder::key(const PhiloxKey& k, std::function<PhiloxKey()> producer) {
  for (const PhiloxKey& have : keys_)
    if (have.seed == k.seed && have.stream == k.stream) return;  // the same key made twice: one producer suffices
  keys_.push_back(k);
  producers_.push_back(std::move(producer));
}

void Recorder::block(const GlobalBlock& b, std::function<GlobalBlock()> producer) {
  if (!remake_blocks || b.is_whole()) return;
  if (const int slot = block_slot(b); slot >= 0) {
    // Two blocks of one global shape in one call: the same micro-batch, so
    // the same place (a different one could not be told apart: refused).
    if (blocks_[size_t(slot)].offset != b.offset)
      refuse(fmt::format(FMT_STRING("two batch blocks of global shape {} at offsets {} and {} in one recording"),
                         b.global_shape.str(), blocks_[size_t(slot)].offset.str(), b.offset.str()));
    return;
  }
  blocks_.push_back(b);
  block_producers_.push_back(std::move(producer));
}

int Recorder::block_slot(const GlobalBlock& b) const {
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (blocks_[i].global_shape == b.global_shape && blocks_[i].offset.size() == b.offset.size()) return int(i);
  return -1;
}

int Recorder::key_slot(const PhiloxKey& k) const {
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i].seed == k.seed && keys_[i].stream == k.stream) return int(i);
  return -1;
}

// The step's own temporaries -- made during the recording, used only by its
// launches, dropped by its end -- share one arena per device, placed by
// liveness: two buffers share bytes only when no launch from the first use of
// one to the last use of the other touches both. Everything else keeps its
// storage: inputs, outputs, tensors from before the step, tensors still held
// outside (escaping), and constants written on the host.
void Recorder::place_in_arenas(Program& p) {
  constexpr int64_t kForever = std::numeric_limits<int64_t>::max();
  // What is placed: a buffer, with those that take its bytes (Buffer::shares,
  // capture_fusion.cc) -- one region alive from the first one's first use to
  // the last one's last.
  struct Group {
    int64_t nbytes = 0, size = 0, first = kForever, last = -1;
    std::vector<int> members;
  };
  auto root_of = [&](int id) {
    while (buffers_[size_t(id)].shares >= 0) id = buffers_[size_t(id)].shares;
    return id;
  };
  std::unordered_map<int, Group> groups;  // root -> its group
  std::unordered_map<int, std::vector<int>> by_device;  // device index -> roots
  std::vector<Device> devices;
  auto key_of = [&](const Device& d) {
    for (size_t k = 0; k < devices.size(); ++k)
      if (devices[k] == d) return int(k);
    devices.push_back(d);
    return int(devices.size()) - 1;
  };
  // The parts of a program recorded in parts (suspend): part k is launches
  // [boundaries_[k-1], boundaries_[k]).
  const int64_t n_launches = int64_t(p.launches_.size());
  auto part_of = [&](int64_t launch) {
    return int64_t(std::upper_bound(boundaries_.begin(), boundaries_.end(), launch) - boundaries_.begin());
  };
  auto part_end = [&](int64_t part) { return part < int64_t(boundaries_.size()) ? boundaries_[size_t(part)] : n_launches; };
  // An output's last use: past the end, or, read per part, its part's end.
  auto output_last = [&](int64_t last) { return outputs_read_per_part ? part_end(part_of(last)) - 1 : kForever; };
  for (size_t i = 0; i < buffers_.size(); ++i) {
    Buffer& b = buffers_[i];
    // Outputs (losses, gradients) join the arena too, alive from their first
    // use to past the end (the caller reads them through Program::output);
    // eager frees activations as gradients appear, and so does the arena.
    // (A born buffer still alive at the end and not an output is held
    // elsewhere -- a cache, a tensor the step hands out -- and keeps its own.)
    if (!b.temporary() || b.scratch) continue;
    const int root = root_of(int(i));
    auto [it, fresh] = groups.try_emplace(root);
    Group& g = it->second;
    g.members.push_back(int(i));
    g.nbytes = std::max(g.nbytes, int64_t(b.nbytes));
    g.size = detail::arena_bytes(g.nbytes);
    g.first = std::min(g.first, b.first);
    g.last = std::max(g.last, b.output ? output_last(b.last) : b.last);
    if (fresh) by_device[key_of(buffers_[size_t(root)].device)].push_back(root);
  }
  // A fused chain's scratch (one tile-sized slot per worker) is a region of
  // the CPU arena alive from the chain's first launch to its last: numbered
  // -1 - chain among the groups.
  for (size_t k = 0; k < p.chains_.size(); ++k) {
    const Program::Chain& c = p.chains_[k];
    if (c.slot_bytes == 0) continue;
    Group& g = groups[-1 - int(k)];
    g.nbytes = c.slots * c.slot_bytes;
    g.size = detail::arena_bytes(g.nbytes);
    g.first = c.begin;
    g.last = c.end - 1;
    by_device[key_of(kCPU)].push_back(-1 - int(k));
  }
  // Largest first, each at the lowest offset free for its whole lifetime
  // and not across a cut (below): the offset of each root, in `roots`
  // order, and the arena's size.
  struct Offsets {
    std::vector<int64_t> at;
    int64_t total = 0;
  };
  auto place = [&](std::vector<int>& roots, const std::vector<int64_t>& cuts) {
    std::sort(roots.begin(), roots.end(), [&](int a, int b) {
      return groups[a].nbytes > groups[b].nbytes || (groups[a].nbytes == groups[b].nbytes && a < b);
    });
    // Moves a region that would cross a cut to just above it.
    auto past_cuts = [&](int64_t at, int64_t size) {
      for (int64_t c : cuts)
        if (at < c && at + size > c) at = c;
      return at;
    };
    Offsets out;
    for (size_t k = 0; k < roots.size(); ++k) {
      const Group& g = groups[roots[k]];
      std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of regions alive at the same time
      for (size_t j = 0; j < k; ++j) {
        const Group& q = groups[roots[j]];
        if (q.first <= g.last && g.first <= q.last) busy.emplace_back(out.at[j], out.at[j] + q.size);
      }
      std::sort(busy.begin(), busy.end());
      int64_t at = past_cuts(0, g.size);
      for (const auto& [lo, hi] : busy) {
        if (at + g.size <= lo) break;
        at = past_cuts(std::max(at, hi), g.size);
      }
      out.at.push_back(at);
      out.total = std::max(out.total, at + g.size);
    }
    return out;
  };
  // The CPU's pooling allocator serves a block from a size class up to
  // 12.5% larger than asked: one arena of 21.3 MiB (NanoGPT tiny) holds 22,
  // where eager's many blocks round by less in all. So the arena is cut into
  // blocks of exactly a class's size (20 MiB, 1.25 MiB, ...) and a small
  // last one, no region across a cut, when that holds fewer bytes than one
  // block. Each block is an arena of its own (Program::ArenaPlan).
  // (Other devices' arenas stay one block.)
  auto block_cuts = [&](const Device& device, int64_t total) {
    std::vector<int64_t> cuts;
    if (!device.is_cpu() || !cpu_allocator_pools()) return cuts;
    constexpr int64_t kSmallest = 64 << 10;  // below it a block's rounding is a few KiB at most
    for (int64_t at = 0; total - at > kSmallest;) {
      at += int64_t(cpu_size_class_at_most(size_t(total - at)));
      cuts.push_back(at);
    }
    return cuts;
  };
  // Bytes the allocator holds for a placement cut at `cuts`: each block that
  // holds a region, whole, and the last one rounded up to its class.
  auto held = [&](const Offsets& placed, const std::vector<int64_t>& cuts) {
    std::vector<int64_t> ends = cuts;
    ends.erase(std::remove_if(ends.begin(), ends.end(), [&](int64_t c) { return c >= placed.total; }), ends.end());
    ends.push_back(placed.total);
    int64_t n = 0, lo = 0;
    for (int64_t hi : ends) {
      bool used = false;
      for (int64_t at : placed.at) used = used || (lo <= at && at < hi);
      if (used) n += int64_t(cpu_size_class(size_t(hi - lo)));
      lo = hi;
    }
    return n;
  };
  // `placed`: place(roots, {}), which left `roots` in its order.
  auto add_plans = [&](const Device& device, std::vector<int>& roots, Offsets placed) {
    std::vector<int64_t> cuts = block_cuts(device, placed.total);
    if (!cuts.empty()) {
      Offsets cut = place(roots, cuts);
      if (held(cut, cuts) < held(placed, {})) {
        placed = std::move(cut);
      } else {
        cuts.clear();
      }
    }
    // One plan per block [lo, hi) that holds a region; offsets from its start.
    std::vector<int64_t> ends;
    for (int64_t c : cuts)
      if (c < placed.total) ends.push_back(c);
    ends.push_back(placed.total);
    int64_t lo = 0;
    for (int64_t hi : ends) {
      Program::ArenaPlan plan;
      plan.device = device;
      plan.bytes = hi - lo;
      plan.first_use = kForever;
      plan.last_use = -1;
      for (size_t k = 0; k < roots.size(); ++k) {
        const int64_t at = placed.at[k];
        if (at < lo || at >= hi) continue;
        const int root = roots[k];
        plan.first_use = std::min(plan.first_use, groups[root].first);
        plan.last_use = std::max(plan.last_use, groups[root].last);
        if (root < 0) plan.chain_scratch.emplace_back(size_t(-1 - root), at - lo);
        for (int id : groups[root].members) {
          Buffer& b = buffers_[size_t(id)];
          plan.buffers.emplace_back(id, at - lo);
          b.storage.reset();  // (an output's eager tensor is no longer held)
          b.in_arena = true;
        }
      }
      lo = hi;
      // The arena itself is allocated by the first replay that uses it
      // (Program::allocate): until then the eager step's outputs (its
      // gradients) are alive, and both at once would be a peak eager never has.
      if (!plan.buffers.empty() || !plan.chain_scratch.empty()) p.arena_plans_.push_back(std::move(plan));
    }
  };
  for (auto& [key, roots] : by_device) {
    const Device device = devices[size_t(key)];
    // The outputs (alive to the end) in an arena of their own when that
    // costs no bytes -- when no output could take bytes a temporary left,
    // as on a mesh, where the gradients live in the data-parallel buckets
    // and the outputs are the losses. The temporaries' arena then gives its
    // memory back between replays (Program::replay), as eager frees the
    // step's temporaries before the optimizer runs.
    if (!boundaries_.empty()) {
      // Recorded in parts, replayed apart with other work between them (a
      // module's forward, the rest of the model, its backward): what one
      // part alone uses goes in an arena of that part, allocated while the
      // part runs; what lives across parts (activations kept for the
      // backward, outputs) in one of its own, allocated from the first part
      // to the last. (The last part's own stay apart: joined to those, they
      // would be held from the first part on.)
      std::map<int64_t, std::vector<int>> within;  // part -> roots used in it alone
      std::vector<int> across;
      for (int root : roots) {
        const Group& g = groups[root];
        if (g.last != kForever && part_of(g.first) == part_of(g.last)) within[part_of(g.first)].push_back(root);
        else across.push_back(root);
      }
      if (!across.empty()) add_plans(device, across, place(across, {}));
      for (auto& [part, in_part] : within) add_plans(device, in_part, place(in_part, {}));
      continue;
    }
    std::vector<int> outputs, temporaries;
    for (int root : roots) (groups[root].last == kForever ? outputs : temporaries).push_back(root);
    Offsets all = place(roots, {});
    if (!outputs.empty() && !temporaries.empty()) {
      Offsets out = place(outputs, {}), temp = place(temporaries, {});
      if (out.total + temp.total <= all.total) {
        add_plans(device, outputs, std::move(out));
        add_plans(device, temporaries, std::move(temp));
        continue;
      }
    }
    add_plans(device, roots, std::move(all));
  }
}

std::unique_ptr<Program> Recorder::finish(Use use) {
  if (detail::t_recorder == this) detail::t_recorder = prev_;
  if (refused_.empty() && in_flight_ > 0)
    refused_ = fmt::format(FMT_STRING("{} asynchronous collective(s) started in the step (the first: {}) were waited "
                                      "for after it, where a replay cannot wait for them"),
                           in_flight_, in_flight_what_);
  if (!refused_.empty()) throw NotCapturable(fmt::format(FMT_STRING("{}: cannot capture {}: {}"), kOp, label_, refused_));
  auto p = std::make_unique<Program>();
  p->label_ = label_;
  p->launches_ = std::move(launches_);
  p->producers_ = std::move(producers_);
  p->values_.keys = std::move(keys_);
  p->block_producers_ = std::move(block_producers_);
  p->values_.blocks = std::move(blocks_);
  for (Buffer& b : buffers_)  // (dead without storage_destroyed seeing it: freed on another thread)
    if (!b.storage && b.weak.expired()) b.died = true;
  const bool replay = use == Use::Replay;
  if (replay) {
    plan_fusion(*p);  // first: it widens its buffers' liveness, and takes some out of the arena
    place_in_arenas(*p);
  }
  for (size_t i = 0; i < buffers_.size(); ++i) {
    Buffer& b = buffers_[i];
    p->sizes_.push_back(int64_t(b.nbytes));
    if (!replay) {
      // Only compared: tensors from outside the step are compared by
      // identity; nothing else needs memory.
      p->storages_.push_back(!b.born && !b.input ? std::move(b.storage) : nullptr);
      p->constants_.push_back(std::move(b.constant));
      p->outside_.push_back(!b.born && !b.input);
      p->in_arena_.push_back(0);
      continue;
    }
    if (!b.storage && !b.in_arena) b.storage = b.weak.lock();  // alive at the end, held elsewhere (escaping)
    TESSEL_CHECK(b.storage != nullptr || b.in_arena || b.scratch, kOp, "capturing {}: buffer {} ({} bytes) was freed during the step but is not "
                 "a temporary of it (an internal error of the recorder)", label_, i, b.nbytes);
    p->storages_.push_back(std::move(b.storage));
    p->constants_.push_back(std::move(b.constant));
    p->outside_.push_back(!b.born && !b.input);
    p->in_arena_.push_back(b.in_arena);
    if (b.input) {
      p->inputs_.push_back(int(i));
      p->input_uses_.emplace_back(b.first, b.last);
    }
  }
  p->replayable_ = replay;  // (bound to the buffers at the first replay: materialize)
  return p;
}

// ---- program --------------------------------------------------------------------------------------------
std::string Program::difference(const Program& o) const {
  if (launches_.size() != o.launches_.size())
    return fmt::format(FMT_STRING("{} launches, then {}"), launches_.size(), o.launches_.size());
  for (size_t i = 0; i < launches_.size(); ++i) {
    if (launches_[i]->fingerprint != o.launches_[i]->fingerprint)
      return fmt::format(FMT_STRING("launch {} ('{}' then '{}') has other arguments (a value that changes from step "
                                    "to step with no producer, or another control flow)"),
                         i, launches_[i]->name, o.launches_[i]->name);
  }
  if (storages_.size() != o.storages_.size())
    return fmt::format(FMT_STRING("{} buffers, then {}"), sizes_.size(), o.sizes_.size());
  for (size_t i = 0; i < storages_.size(); ++i) {
    if (constants_[i] != o.constants_[i])
      return fmt::format(FMT_STRING("buffer {} ({} bytes) was filled on the host with other values (data-dependent "
                                    "host work)"),
                         i, sizes_[i]);
    // Buffers from outside the step (parameters, state) must be the same
    // objects in both: the replay keeps using them. (The step's own buffers
    // and its inputs are new every step by nature.)
    if (outside_[i] != o.outside_[i] || (outside_[i] && storages_[i] != o.storages_[i]))
      return fmt::format(FMT_STRING("buffer {} ({} bytes) is a tensor from outside the step that was replaced "
                                    "between the two steps (a parameter or a state the step reads, made anew)"),
                         i, sizes_[i]);
  }
  return std::string();
}

const std::shared_ptr<StorageImpl>& Program::checked_input(int i, const Tensor& value) const {
  TESSEL_CHECK(i >= 0 && size_t(i) < inputs_.size(), kOp, "input {} of {}", i, inputs_.size());
  const auto& s = storages_[size_t(inputs_[size_t(i)])];
  TESSEL_CHECK(value.defined() && !value.is_distributed() && value.is_contiguous() && value.nbytes() == s->nbytes() &&
                   value.device() == s->device(),
               kOp, "replaying {}: input {} is {}, the recorded one held {} bytes on {}", label_, i, value.desc(),
               s->nbytes(), s->device().str());
  return s;
}

void Program::set_input(int i, const Tensor& value) {
  const auto& s = checked_input(i, value);
  if (value.storage() == s && value.offset() == 0) return;
  if (s->device().is_cpu()) {
    make_input_views();
    const auto& view = storages_[size_t(inputs_[size_t(i)])];
    if (view->nbytes() == 0 || value.raw_data() == view->data()) return;  // nothing to copy, or the tensor it reads
    std::shared_ptr<StorageImpl>& memory = input_memory_[size_t(i)];
    if (memory && memory->released()) {  // (release_inputs)
      memory->reallocate();
      view->rebind(memory->data());
    }
    if (input_bound_[size_t(i)] || memory.use_count() > 1) {
      // A caller's tensor (bound, or the batch the step was recorded with,
      // still held): the copy goes to memory of the program's own.
      memory = std::make_shared<StorageImpl>(view->nbytes(), view->device());
      input_bound_[size_t(i)] = 0;
      view->rebind(memory->data());
    }
    std::memcpy(view->data(), value.raw_data(), view->nbytes());
    return;
  }
  // A device buffer: a copy queued on the device's current stream, before
  // the replay's launches on the same stream.
  TensorArg whole;
  whole.buffer = inputs_[size_t(i)];
  whole.shape = value.shape();
  whole.strides = value.strides();
  whole.dtype = value.dtype();
  whole.device = value.device();
  device_copy(value, detail::view_of(whole, s));
}

// A CPU input buffer is a view of memory the program holds, so that
// bind_input can point it at a caller's tensor instead. (Before the arenas
// are allocated: a bound input frees the recording's batch first.)
void Program::make_input_views() {
  if (input_memory_.size() == inputs_.size()) return;
  input_memory_.assign(inputs_.size(), nullptr);
  input_bound_.assign(inputs_.size(), 0);
  for (size_t k = 0; k < inputs_.size(); ++k) {
    std::shared_ptr<StorageImpl>& s = storages_[size_t(inputs_[k])];
    if (!s || !s->device().is_cpu() || s->nbytes() == 0) continue;
    input_memory_[k] = s;
    s = std::make_shared<StorageImpl>(s->data(), s->nbytes(), s->device(), std::function<void(void*)>());
  }
}

void Program::bind_input(int i, const Tensor& value) {
  TESSEL_CHECK(replayable_, kOp, "{} was recorded to be compared only (Recorder::finish(Use::CompareOnly))", label_);
  make_input_views();  // (first: the buffer checked_input returns is the view bind_input points)
  const auto& s = checked_input(i, value);
  if (!s->device().is_cpu()) return set_input(i, value);
  if (s->nbytes() == 0) return;
  input_memory_[size_t(i)] = value.storage();  // (the program's own copy, if it was, is freed)
  input_bound_[size_t(i)] = 1;
  s->rebind(const_cast<void*>(value.raw_data()));
}

void Program::materialize() {
  TESSEL_CHECK(replayable_, kOp, "{} was recorded to be compared only (Recorder::finish(Use::CompareOnly))", label_);
  if (materialized_) return;
  // References to the tensors from before the step: one (storages_) until
  // the launches are bound to views of them (replaced_outside).
  std::vector<long> unbound(storages_.size(), 0);
  for (size_t i = 0; i < storages_.size(); ++i)
    if (outside_[i] && storages_[i]) unbound[i] = storages_[i].use_count();
  arena_of_.assign(storages_.size(), -1);
  for (const ArenaPlan& plan : arena_plans_) {
    // The memory comes with the first replay that uses it (allocate).
    Arena arena;
    arena.first_use = plan.first_use;
    arena.last_use = plan.last_use;
    // Views of the arena (external memory to them; the program holds the arena itself).
    auto view = [&](int64_t offset, int64_t nbytes) {
      auto v = std::make_shared<StorageImpl>(nullptr, size_t(nbytes), plan.device, std::function<void(void*)>());
      arena.views.emplace_back(v, offset);
      return v;
    };
    for (const auto& [id, offset] : plan.buffers) {
      storages_[size_t(id)] = view(offset, sizes_[size_t(id)]);
      arena_of_[size_t(id)] = int(arenas_.size());
    }
    for (const auto& [k, offset] : plan.chain_scratch) {
      Chain& c = chains_[k];
      c.scratch_storage = view(offset, c.slots * c.slot_bytes);
    }
    arenas_.push_back(std::move(arena));
  }
  make_input_views();
  for (auto& l : launches_) l->bind(storages_);
  for (Chain& c : chains_) make_tiles(c);  // views of the bound buffers and of the scratch
  own_refs_.assign(storages_.size(), 1);
  for (size_t i = 0; i < storages_.size(); ++i)
    if (outside_[i] && storages_[i]) own_refs_[i] = 1 + (storages_[i].use_count() - unbound[i]);
  // The arenas' views were made just now: every reference to them is the
  // program's own (release_unheld).
  for (Arena& a : arenas_)
    for (const auto& [v, offset] : a.views) a.own_refs.push_back(v.use_count());
  input_own_refs_.assign(inputs_.size(), 0);
  for (size_t k = 0; k < inputs_.size(); ++k)
    if (input_memory_[k]) input_own_refs_[k] = storages_[size_t(inputs_[k])].use_count();
  materialized_ = true;
}

void Program::allocate(Arena& a) {
  if (a.allocated()) return;
  if (a.memory) {
    a.memory->reallocate();
  } else {
    const ArenaPlan& plan = arena_plans_[size_t(&a - arenas_.data())];  // (arenas_ is in arena_plans_ order)
    a.memory = std::make_shared<StorageImpl>(size_t(plan.bytes), plan.device);
  }
  char* base = static_cast<char*>(a.memory->data());
  for (auto& [v, offset] : a.views) v->rebind(base + offset);
}

bool Program::held_outside(const Arena& a) const {
  if (a.handed_out()) return true;
  for (size_t k = 0; k < a.views.size(); ++k)
    if (a.views[k].first.use_count() > a.own_refs[k]) return true;
  return false;
}

void Program::release_finished(int64_t end) {
  if (!materialized_ || graphs_held()) return;
  for (Arena& a : arenas_)
    if (a.allocated() && a.last_use < end && !held_outside(a)) a.memory->release();
}

void Program::release_inputs() {
  if (!materialized_) return;
  for (size_t k = 0; k < inputs_.size(); ++k) {
    std::shared_ptr<StorageImpl>& memory = input_memory_[k];
    const auto& view = storages_[size_t(inputs_[k])];
    // Not a caller's tensor, not the recorded one still held, not viewed by a caller (an output that is the input).
    if (!memory || input_bound_[k] || memory.use_count() > 1 || memory->released() ||
        view.use_count() > input_own_refs_[k])
      continue;
    memory->release();
    view->rebind(nullptr);
  }
}

bool Program::release_unheld() {
  if (!materialized_ || graphs_held()) return false;
  bool released = false;
  for (Arena& a : arenas_) {
    if (!a.allocated() || held_outside(a)) continue;
    a.memory->release();  // (allocated again, and its views re-pointed, by the next replay)
    released = true;
  }
  return released;
}

std::string Program::replaced_outside() const {
  for (size_t i = 0; i < storages_.size(); ++i) {
    if (!outside_[i] || !storages_[i]) continue;
    const long own = materialized_ ? own_refs_[i] : 1;
    if (storages_[i].use_count() > own) continue;
    return fmt::format(FMT_STRING("buffer {} ({} bytes on {}), a tensor from before the step that {} reads, is held "
                                  "by nothing else any more: its owner replaced it (a module's tensor assigned anew)"),
                       i, sizes_[i], storages_[i]->device().str(), label_);
  }
  return std::string();
}

Tensor Program::output(const TensorArg& a) {
  materialize();
  const int k = arena_of_[size_t(a.buffer)];
  if (k < 0) return detail::view_of(a, storages_[size_t(a.buffer)]);
  Arena& arena = arenas_[size_t(k)];
  allocate(arena);  // (before a replay has used it, its memory: the values are not the step's yet)
  // Handed out on a storage of its own that holds the arena's memory: a
  // caller who keeps the tensor past the step keeps these values -- the
  // next replay finds the memory held and takes new memory (replay_range),
  // as eager's next step allocates anew -- even past the program's end.
  const StorageImpl& buffer = *storages_[size_t(a.buffer)];
  auto handed_out = std::make_shared<StorageImpl>(buffer.data(), buffer.nbytes(), buffer.device(),
                                                  [memory = arena.memory](void*) {});
  return detail::view_of(a, std::move(handed_out));
}

Tensor Program::output(int buffer, const Tensor& like) {
  TensorArg a;
  a.buffer = buffer;
  a.shape = like.shape();
  a.strides = like.strides();
  a.offset = like.offset();
  a.dtype = like.dtype();
  a.device = like.device();
  return output(a);
}

Tensor Program::output(const OutputLayout& layout) {
  const Tensor local = output(layout.local);
  return layout.mesh ? raw::make_distributed(local, layout.mesh, layout.placements, layout.global_shape) : local;
}

OutputLayout layout_of(int buffer, const Tensor& t) {
  OutputLayout o;
  if (!t.defined()) return o;
  const Tensor& local = raw::local_of(t);
  o.local.buffer = buffer;
  o.local.shape = local.shape();
  o.local.strides = local.strides();
  o.local.offset = local.offset();
  o.local.dtype = local.dtype();
  o.local.device = local.device();
  if (t.is_distributed()) {
    o.mesh = t.mesh();
    o.placements = t.placements();
    o.global_shape = t.shape();
  }
  return o;
}

void Program::replay() {
  replay_range(0, int64_t(launches_.size()));
  // The step's temporaries are dead now: their memory goes back to the
  // allocator until the next replay (what the step hands out, its outputs,
  // is in an arena that stays).
  release_finished(int64_t(launches_.size()));
}

void Program::replay_range(int64_t begin, int64_t end) {
  TESSEL_CHECK(0 <= begin && begin <= end && end <= int64_t(launches_.size()), kOp,
               "replaying launches [{}, {}) of {}'s {}", begin, end, label_, launches_.size());
  materialize();
  for (size_t k = 0; k < inputs_.size(); ++k) {
    const bool used = input_uses_[k].first < end && input_uses_[k].second >= begin;
    TESSEL_CHECK(!used || !input_memory_[k] || !input_memory_[k]->released(), kOp,
                 "replaying {}: input {} was given back (release_inputs) and not set again (set_input)", label_, k);
  }
  for (Arena& a : arenas_) {  // the arenas these launches use
    if (a.first_use >= end || a.last_use < begin) continue;
    // Writes it from its first use on, and a caller still holds an output
    // of the last replay in it: the memory is theirs now (output), this
    // replay takes new memory (a graph over it is captured again).
    if (a.first_use >= begin && a.handed_out()) a.memory.reset();
    allocate(a);
  }
  if (begin == 0 && (!producers_.empty() || !block_producers_.empty())) {
    for (size_t i = 0; i < producers_.size(); ++i) values_.keys[i] = producers_[i]();
    for (size_t i = 0; i < block_producers_.size(); ++i) values_.blocks[i] = block_producers_[i]();
    for (auto& l : launches_) l->refresh(values_);
    for (Chain& c : chains_)
      for (auto& tile : c.tiles)
        for (auto& l : tile) l->refresh(values_);
  }
  // Profiled (`--profile`, TESSEL_PROFILE=1) or traced: each launch (or
  // fused chain) is a row / span of its own under its kernel's name, so a
  // replayed step's profile says where its time goes (the eager profile's
  // op rows include dispatch).
  const bool timed = profile::current() != nullptr || timeline::current() != nullptr;
  auto run = [timed](const char* name, auto&& work) {
    if (!timed) return work();
    profile::Timer timer(name, nullptr, "kernel");
    work();
  };
  const auto around = std::lower_bound(chains_.begin(), chains_.end(), begin,
                                       [](const Chain& c, int64_t at) { return c.end <= at; });
  TESSEL_CHECK(around == chains_.end() || around->begin >= begin, kOp,
               "replaying launches [{}, {}) of {}: launch {} is inside the fused chain [{}, {})", begin, end, label_,
               begin, around->begin, around->end);
  // Device graphs (use_graphs): the first segment from `begin` on.
  const bool graphs = use_graphs_ && !timed;
  if (graphs && !segments_planned_) plan_segments();
  auto next_segment = [&](int64_t at) {
    return size_t(std::lower_bound(segments_.begin(), segments_.end(), at,
                                   [](const Segment& s, int64_t x) { return s.begin < x; }) -
                  segments_.begin());
  };
  size_t seg = graphs ? next_segment(begin) : segments_.size();
  for (int64_t i = begin; i < end;) {
    if (seg < segments_.size() && segments_[seg].begin == i && segments_[seg].end <= end) {
      const int64_t past = segments_[seg].end;
      run_segment(seg);  // (may split it)
      i = past;
      seg = next_segment(i);
      continue;
    }
    if (Chain* chain = chain_at(i)) {
      TESSEL_CHECK(chain->end <= end, kOp, "replaying launches [{}, {}) of {}: the range ends inside the fused chain [{}, {})",
                   begin, end, label_, chain->begin, chain->end);
      run(chain->name.c_str(), [&] { run_chain(*chain); });
      i = chain->end;
      continue;
    }
    Launch& l = *launches_[size_t(i++)];
    run(l.name, [&] { l.run(); });
    if (seg < segments_.size() && segments_[seg].begin < i) seg = next_segment(i);  // (a range starting inside one)
  }
}

// ---- device backends: graphs, fused chains ------------------------------------------------------------------
namespace {
// One backend per device type, set at start-up (as runtime/allocator.cc's registry).
template <class Backend>
struct PerDeviceType {
  Backend* backends[kNumDeviceTypes] = {};
  void set(DeviceType type, Backend* b, const char* what) {
    TESSEL_CHECK(size_t(type) < std::size(backends), kOp, "{}: device type {}", what, int(type));
    backends[size_t(type)] = b;
  }
  Backend* get(DeviceType type) const { return size_t(type) < std::size(backends) ? backends[size_t(type)] : nullptr; }
};
PerDeviceType<GraphBackend> g_graph_backends;
PerDeviceType<FusedBackend> g_fused_backends;
}  // namespace

void set_graph_backend(DeviceType type, GraphBackend* backend) { g_graph_backends.set(type, backend, "set_graph_backend"); }
GraphBackend* graph_backend(DeviceType type) { return g_graph_backends.get(type); }
void set_fused_backend(DeviceType type, FusedBackend* backend) { g_fused_backends.set(type, backend, "set_fused_backend"); }
FusedBackend* fused_backend(DeviceType type) { return g_fused_backends.get(type); }

// ---- device graphs -------------------------------------------------------------------------------------------

namespace detail {
bool turned_off(const char* variable) {
  const char* e = std::getenv(variable);
  return e != nullptr && std::string(e) == "0";
}
}  // namespace detail

void Program::use_graphs(bool on) {
  on = on && !detail::turned_off("TESSEL_CUDA_GRAPHS");  // (a whole process's escape hatch: docs/compile.md)
  if (on == use_graphs_) return;
  use_graphs_ = on;
  segments_.clear();  // (off: the graphs go; on: planned at the next replay)
  segments_planned_ = false;
}

// A device chain (a fused elementwise chain as one kernel) as one launch of
// a device graph's capture.
class ChainLaunch final : public Launch {
 public:
  ChainLaunch(Program* program, size_t chain) : program_(program), chain_(chain) {
    name = program->chains_[chain].name.c_str();
  }
  void run() override { program_->run_chain(program_->chains_[chain_]); }
  void bind(const std::vector<std::shared_ptr<StorageImpl>>&) override {}
  void refresh(const PerCall&) override {}

 private:
  Program* program_;
  size_t chain_;
};

Program::Chain* Program::chain_at(int64_t i) {
  auto it = std::lower_bound(chains_.begin(), chains_.end(), i, [](const Chain& c, int64_t at) { return c.begin < at; });
  return it != chains_.end() && it->begin == i ? &*it : nullptr;
}

void Program::run_from_host(int64_t from, int64_t to) {
  for (int64_t i = from; i < to;) {
    if (Chain* c = chain_at(i)) {
      run_chain(*c);
      i = c->end;
    } else {
      launches_[size_t(i++)]->run();
    }
  }
}

void Program::plan_segments() {
  segments_.clear();
  segments_planned_ = true;
  Segment cur;
  auto close = [&](int64_t at) {
    if (cur.end - cur.begin >= 2) segments_.push_back(std::move(cur));  // (one launch: nothing to save)
    cur = Segment();
    cur.begin = cur.end = at;
  };
  close(0);
  size_t k = 0;  // the next chain
  for (int64_t i = 0; i < int64_t(launches_.size());) {
    // A unit: one launch, or a whole chain -- graphable when it is one
    // device kernel whose launches are all graphable on that device (a CPU
    // chain's tiles never are).
    Device d;
    bool ok = false;
    int64_t next = i + 1;
    if (k < chains_.size() && chains_[k].begin == i) {
      Chain& c = chains_[k];
      next = c.end;
      d = c.device;
      ok = c.on_device && graph_backend(d.type) != nullptr;
      for (int64_t l = c.begin; ok && l < c.end; ++l) {
        Device dl;
        ok = launches_[size_t(l)]->graphable(&dl) && dl == d;
      }
      if (ok && !c.as_launch) c.as_launch = std::make_unique<ChainLaunch>(this, k);
      ++k;
    } else {
      ok = launches_[size_t(i)]->graphable(&d) && graph_backend(d.type) != nullptr;
    }
    if (!ok || (cur.end > cur.begin && !(d == cur.device))) close(ok ? i : next);
    if (ok) {
      if (cur.end == cur.begin) cur.begin = i;
      cur.device = d;
      cur.end = next;
    }
    i = next;
  }
  close(int64_t(launches_.size()));
}

bool Program::addresses_unchanged(const Segment& s) const {
  for (const auto& [storage, data] : s.addresses)
    if (storage->data() != data) return false;
  return true;
}

bool Program::graphs_held() const {
  for (const Segment& s : segments_)
    if (s.graph) return true;
  return false;
}

void Program::run_segment(size_t k) {
  Segment& s = segments_[k];
  if (s.graph && !addresses_unchanged(s)) {
    // A buffer moved (an arena given back and allocated elsewhere, a
    // storage refilled in place): the graph would use the old memory.
    s.graph.reset();
    if (++s.moves > 3) {
      s.direct = true;
      ++graph_stats_.refused;
      graph_stats_.last_refusal = fmt::format(
          FMT_STRING("launches [{}, {}) of {}: their buffers moved between replays more than 3 times"), s.begin, s.end,
          label_);
    }
  }
  if (s.direct) return run_from_host(s.begin, s.end);
  if (!s.graph) {
    // Its units in order: launches, and device chains as one launch each
    // (starts: where each begins, to map a refusal back to launches).
    std::vector<Launch*> list;
    std::vector<int64_t> starts;
    for (int64_t i = s.begin; i < s.end;) {
      starts.push_back(i);
      if (Chain* c = chain_at(i)) {
        list.push_back(c->as_launch.get());
        i = c->end;
      } else {
        list.push_back(launches_[size_t(i++)].get());
      }
    }
    ++graph_stats_.captures;
    try {
      s.graph = graph_backend(s.device.type)->capture(s.device, list);
    } catch (const GraphRefused& e) {
      // Nothing of the segment ran: it runs from the host now. A launch the
      // capture refused runs from the host from now on; the launches before
      // and after it become segments of their own (captured at the next
      // replay).
      ++graph_stats_.refused;
      graph_stats_.last_refusal = e.what();
      const int64_t begin = s.begin, end = s.end;
      const Device device = s.device;
      if (e.launch < 0 || e.launch >= int64_t(starts.size())) {
        s.direct = true;
        return run_from_host(begin, end);
      }
      const int64_t bad = starts[size_t(e.launch)];
      const int64_t bad_end = e.launch + 1 < int64_t(starts.size()) ? starts[size_t(e.launch + 1)] : end;
      std::vector<Segment> parts;
      auto part = [&](int64_t b, int64_t e2, bool direct) {
        if (e2 <= b) return;
        Segment p;
        p.begin = b;
        p.end = e2;
        p.device = device;
        p.direct = direct || e2 - b < 2;
        parts.push_back(std::move(p));
      };
      part(begin, bad, false);
      part(bad, bad_end, true);
      part(bad_end, end, false);
      segments_.erase(segments_.begin() + std::ptrdiff_t(k));
      segments_.insert(segments_.begin() + std::ptrdiff_t(k), std::make_move_iterator(parts.begin()),
                       std::make_move_iterator(parts.end()));
      return run_from_host(begin, end);
    }
    s.addresses.clear();
    std::vector<const TensorArg*> args;
    for (int64_t i = s.begin; i < s.end; ++i) launches_[size_t(i)]->tensor_args(args);
    for (const TensorArg* a : args)  // (a device chain's registers have no storage)
      if (a->buffer >= 0 && a->view.defined() && a->view.storage())
        s.addresses.emplace_back(a->view.storage().get(), a->view.storage()->data());
    std::sort(s.addresses.begin(), s.addresses.end());
    s.addresses.erase(std::unique(s.addresses.begin(), s.addresses.end()), s.addresses.end());
  }
  s.graph->launch();
}

Program::GraphStats Program::graph_stats() const {
  GraphStats g = graph_stats_;
  for (const Segment& s : segments_)
    if (s.graph) {
      ++g.graphs;
      g.graph_launches += s.end - s.begin;
    }
  return g;
}

int64_t Program::held_bytes() const {
  int64_t n = bytes();
  for (size_t k = 0; k < arena_plans_.size(); ++k) {
    const bool given_back = materialized_ ? !arenas_[k].allocated() : arena_plans_[k].last_use < launches();
    if (given_back) n -= arena_plans_[k].bytes;
  }
  for (size_t k = 0; k < input_memory_.size(); ++k)  // (release_inputs)
    if (input_memory_[k] && !input_bound_[k] && input_memory_[k]->released()) n -= int64_t(input_memory_[k]->nbytes());
  return n;
}

int64_t Program::bytes() const {
  int64_t n = 0;
  for (const ArenaPlan& a : arena_plans_) n += a.bytes;
  for (size_t i = 0; i < storages_.size(); ++i)
    if (storages_[i] && !in_arena_[i] && !outside_[i]) n += int64_t(storages_[i]->nbytes());
  for (size_t k = 0; k < input_bound_.size(); ++k)  // a caller's tensor, not the program's
    if (input_bound_[k]) n -= int64_t(storages_[size_t(inputs_[k])]->nbytes());
  return n;
}

}  // namespace tessel::capture
