#pragma once
// Capture: a step's kernel launches recorded once, replayed with no dispatch
// (compile mode; docs/compile.md).
//
// While a Recorder is active on a thread, every kernel launched through a
// KernelTable from that thread's op code (not from inside another kernel) is
// run as usual *and* recorded: the kernel's function pointer with its
// arguments, tensors as views of numbered buffers (their storages), other
// values by copy. Program::replay later runs the same launches on the same
// buffers: no sharding propagation, no autograd graph, no allocation, the
// same kernels with the same arguments -- so the same bits.
//
// What a recording cannot see is refused, never guessed:
//   - a host read of a value a kernel computed in the step (item(),
//     to_vector(), raw data) outside an allowed() scope: the step's later
//     launches may depend on it;
//   - host writes into a buffer the step allocated (a tensor built from host
//     values) are kept as constants: a second capture must give the same
//     contents, else the step is refused (the values are data-dependent);
//   - a kernel with a host pointer argument, unless it has a replay check
//     (index_bounds);
//   - an asynchronous collective whose wait comes after the recording ends.
// A storage released and refilled in place (StorageImpl::release and
// reallocate: FSDP's gathered parameters) is host work the kernels depend
// on: both are recorded as launches and done again, in order, at replay.
// Collectives (runtime/comm) are recorded like kernels: the communicator,
// the call's arguments, tensors as buffer views; an asynchronous one's
// wait() is a launch of its own. Every rank records its own program, and
// the ranks' programs issue the same collectives in the same order, as
// eager did.
// A host read whose value every rank holds alike and which only selects
// host work (DDP's "did any rank have a gradient" flags) can be a checked
// read (checked_read): the replay compares the bytes with the recorded
// ones and throws ReplayDiverged, before any later launch, if they differ.
// Random keys are per-step values: the code that makes one (nn::random_key)
// registers a producer with note_key; a launch argument equal to a noted key
// is re-made by its producer at every replay.
//
// Two captures of consecutive steps are compared launch by launch (names,
// argument fingerprints, buffer numbering) before a program is used: a
// difference (a per-step value with no producer, data-dependent control
// flow) refuses compilation with the first differing launch named.
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "runtime/fused_program.h"
#include "runtime/global_block.h"
#include "runtime/philox.h"
#include "runtime/scalar.h"
#include "runtime/tensor.h"

namespace tessel::capture {

class Recorder;
namespace detail {
extern thread_local Recorder* t_recorder;
}
// The recorder active on this thread (null: not capturing).
inline Recorder* active() { return detail::t_recorder; }

// ---- argument fingerprints (for comparing two captures) -------------------------------------------------
// Overloads for argument types that are not plain values live next to the
// type (found by argument-dependent lookup): kernels/attention.h, random.h.
inline void fingerprint(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
template <class T, std::enable_if_t<std::is_arithmetic_v<T> || std::is_enum_v<T>, int> = 0>
void fingerprint(std::string& out, T v) {
  fingerprint(out, &v, sizeof v);
}
// Plain structs (optimizer scalars): their bytes. A struct with padding
// compares unequal at worst, which refuses a capture -- never a wrong replay.
template <class T, std::enable_if_t<std::is_class_v<T> && std::is_trivially_copyable_v<T>, int> = 0>
void fingerprint(std::string& out, const T& v) {
  fingerprint(out, &v, sizeof v);
}
// Keys are compared by their slot (for_each_key), not their per-step value.
inline void fingerprint(std::string&, const PhiloxKey&) {}
inline void fingerprint(std::string& out, const Dims& d) {
  fingerprint(out, int64_t(d.size()));
  for (int64_t x : d) fingerprint(out, x);
}
inline void fingerprint(std::string& out, const Scalar& s) {
  fingerprint(out, s.to_double());
  fingerprint(out, s.to_int());
  fingerprint(out, int(s.is_floating()) + 2 * int(s.is_bool()));
}
inline void fingerprint(std::string& out, const GlobalBlock& b) {
  fingerprint(out, b.global_shape);
  fingerprint(out, b.offset);
}

// ---- per-step random keys ---------------------------------------------------------------------------
// Argument types that hold PhiloxKeys let a program re-make them at replay:
// for_each_key(value, f) calls f(PhiloxKey&) on each (overloads next to the
// types; PhiloxKey itself below).
inline void for_each_key(PhiloxKey& k, const std::function<void(PhiloxKey&)>& f) { f(k); }
template <class T>
void for_each_key(T&, const std::function<void(PhiloxKey&)>&) {}

// ---- per-call batch blocks ----------------------------------------------------------------------------
// Where a micro-batch sits in the global batch (nn::batch_block: dropout's
// and attention dropout's masks are drawn by global row) differs from one
// micro-batch to the next. A whole-step recording holds every micro-batch,
// each block a constant of its launch; a recording of one module call
// (mixed mode) is replayed for every micro-batch, so there the code that
// makes a block registers a producer (Recorder::block, when the recorder
// asks for it) and a launch argument equal to it is re-made at every replay.
// for_each_block(value, f) calls f(GlobalBlock&) on each (overloads next to
// the types that hold one).
inline void for_each_block(GlobalBlock& b, const std::function<void(GlobalBlock&)>& f) { f(b); }
template <class T>
void for_each_block(T&, const std::function<void(GlobalBlock&)>&) {}

// What a replay re-makes before it runs: the keys and blocks, by slot.
struct PerCall {
  std::vector<PhiloxKey> keys;
  std::vector<GlobalBlock> blocks;
};

// ---- the recorder ---------------------------------------------------------------------------------------

// How a kernel reads and writes its tensor arguments (KernelTable's second
// constructor argument): what lets a replay fuse it with its neighbours.
enum class Access : uint8_t {
  Other,  // anything (the default)
  // Every tensor argument has one shape (broadcast ones by zero strides);
  // the last one is the only one written, and its element i depends on
  // element i of the others alone: no reduction, no position, no state. So
  // running the kernel on row ranges of its arguments, one after another,
  // writes every element with exactly its whole-tensor arithmetic
  // (kernels/elementwise.h's contract). It reads no thread-local setting
  // (bitwise mode, autocast): a fused chain runs it on a pool thread.
  Elementwise,
};

// A tensor argument: a view of buffer `buffer` (-1: an undefined tensor).
struct TensorArg {
  int buffer = -1;
  Dims shape, strides;
  int64_t offset = 0;
  DType dtype = DType::Float32;
  Device device;
  Tensor view;  // bound to the program's buffer
};

// One recorded launch, runnable again.
class Launch {
 public:
  virtual ~Launch() = default;
  virtual void run() = 0;
  // Tensors become views of the program's buffers (after recording ends).
  virtual void bind(const std::vector<std::shared_ptr<StorageImpl>>& buffers) = 0;
  // Keys and blocks re-made for this replay (by slot).
  virtual void refresh(const PerCall& values) = 0;
  // Its tensor arguments, in order (a kernel's; others have none listed).
  virtual void tensor_args(std::vector<const TensorArg*>& out) const { (void)out; }
  // A copy of this launch whose i-th tensor argument is view(i, arg)
  // instead (a fused chain's tile: capture_fusion.cc). Null: not a kernel.
  virtual std::unique_ptr<Launch> with_views(const std::function<Tensor(int, const TensorArg&)>& view) const {
    (void)view;
    return nullptr;
  }
  // May this launch be part of a device graph (Program::use_graphs)? A
  // kernel whose tensors are all on one device (*device set to it; a graph
  // needs that device type's GraphBackend -- the CPU has none), with no
  // per-call value (a key or block re-made at every replay) and no host
  // output. Collectives, waits, checks and storage operations are not.
  virtual bool graphable(Device* device) const {
    (void)device;
    return false;
  }
  // What this launch computes as one step of a fused device kernel
  // (FusedBackend): its kind and op, when its kernel table describes it
  // (KernelTable::set_fusion; the tensors are its tensor_args, the last
  // one written). False: it cannot be a step of one.
  virtual bool fused_step(FusedStep* step) const {
    (void)step;
    return false;
  }
  const char* name = "";
  Access access = Access::Other;
  std::string fingerprint;  // arguments, buffer numbers and key slots
};

// Where a recorded output lies: its local piece's place in a buffer and,
// for a distributed tensor, how to wrap the piece again (mesh, placements,
// global shape). Program::output(layout) makes the view.
struct OutputLayout {
  TensorArg local;  // local.buffer -1: none
  MeshPtr mesh;     // null: a local tensor
  Placements placements;
  Dims global_shape;
};
// `t`, whose local piece is (in) buffer `buffer`, as such a layout.
OutputLayout layout_of(int buffer, const Tensor& t);

namespace detail {
// `a`'s layout over `storage`.
Tensor view_of(const TensorArg& a, std::shared_ptr<StorageImpl> storage);
// TESSEL_CUDA_GRAPHS=0, TESSEL_CUDA_FUSION=0: the environment variable is "0".
bool turned_off(const char* variable);
// Bytes a buffer takes in an arena: rounded up to 64 (every placement
// aligned for any dtype and a cache line).
inline int64_t arena_bytes(int64_t nbytes) { return (nbytes + 63) / 64 * 64; }
}

// ---- device graphs (CUDA graphs) ------------------------------------------------------------------------
// A device backend that can record a run of launches once and launch them
// again as one (kernels/cuda/graph.cc registers CUDA's): Program::use_graphs.
class Graph {
 public:
  virtual ~Graph() = default;
  // Runs the captured launches on the device's current stream (queued: in
  // order after the stream's earlier work, before its later work).
  virtual void launch() = 0;
};
// A capture that failed: `launch` is the index (in the list given to
// capture) of the launch that could not be captured -- it reads a device
// value on the host, synchronises, allocates from the device -- or -1 when
// the capture as a whole failed. Nothing of the list ran.
struct GraphRefused : Error {
  GraphRefused(std::string what, int64_t launch_index) : Error(std::move(what)), launch(launch_index) {}
  int64_t launch = -1;
};
class GraphBackend {
 public:
  virtual ~GraphBackend() = default;
  // Records `launches` (run in order by calling their run()) on `device`
  // into a graph, without running them; throws GraphRefused. Memory a
  // launch allocates while it is recorded comes from a pool private to the
  // graph (its addresses are baked in).
  virtual std::unique_ptr<Graph> capture(Device device, const std::vector<Launch*>& launches) = 0;
};
// The backend of a device type (null: none; the CPU has none). Set once, at
// start-up, by the backend's own code; tests may set a fake one.
void set_graph_backend(DeviceType type, GraphBackend* backend);
GraphBackend* graph_backend(DeviceType type);

// ---- fused chains as one kernel ------------------------------------------------------------------------
// A device backend that runs a fused elementwise chain (runtime/
// fused_program.h) as one kernel on the device's current stream
// (kernels/cuda/fused_chain.cu registers CUDA's). On a device type with
// one, compile mode replays each chain of elementwise launches as one
// kernel; without one (the CPU), tile by tile (docs/compile.md, "Fusion").
class FusedBackend {
 public:
  virtual ~FusedBackend() = default;
  virtual void launch(Device device, const FusedProgram& program) = 0;
};
// Set once, at start-up, by the backend's own code; tests may set one
// (kernels::host_fused_backend(): the same interpreter on the host).
void set_fused_backend(DeviceType type, FusedBackend* backend);
FusedBackend* fused_backend(DeviceType type);

class Program;

// Thrown (and caught by the caller of the capture) when a step cannot be
// recorded faithfully; the message names what and where.
struct NotCapturable : Error {
  using Error::Error;
};

class Recorder {
 public:
  // `label` names the step in messages. Installs itself on this thread.
  explicit Recorder(std::string label);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Buffers whose storage is replaced at every replay by the caller (the
  // step's inputs): numbered now, before any launch uses them.
  int input(const Tensor& t);
  // A tensor the caller reads after a replay (the loss, a gradient): its
  // buffer is kept whole (never shared).
  int output(const Tensor& t);

  // ---- hooks (runtime and kernels call these; nothing else needs to) ----
  // `fuse`: the table's description of a launch as a fused step (null: none).
  template <class... A, class... Args>
  void kernel(const char* name, Access access, void (*fn)(A...), bool (*fuse)(FusedStep*, A...), Args&&... args);
  void storage_created(const StorageImpl* s);
  void storage_destroyed(const StorageImpl* s);
  void host_access(const Tensor& t);
  void storage_released(StorageImpl& s);
  void storage_reallocated(StorageImpl& s);
  void key(const PhiloxKey& k, std::function<PhiloxKey()> producer);
  // Batch blocks: registered only when remake_blocks is set (see above).
  bool remake_blocks = false;
  void block(const GlobalBlock& b, std::function<GlobalBlock()> producer);
  // Depth of kernel and collective calls on this thread: only depth 0 is
  // recorded (what a kernel or a collective does inside runs again inside it).
  int depth = 0;

  // A launch another layer made (a collective, runtime/comm), at depth 0,
  // after registering its tensors with tensor_buffer. Replayed in order.
  void add(std::unique_ptr<Launch> launch);
  // Keeps `buffer` alive (unshared in the arena) up to the next launch: an
  // asynchronous collective's tensors, up to its wait.
  void touch(int buffer);
  // Asynchronous launches started and not yet waited for. finish() refuses
  // a recording that ends with one in flight: its wait would not be replayed.
  void async_started(const char* what);
  void async_waited();
  // This recorder among all made in the process (a wait that arrives after
  // a recorder ended must not reach the next one at the same address).
  uint64_t serial() const { return serial_; }
  // The host reads `t`, whose value is the same on every rank (an
  // all-reduced flag) and only chooses host work: recorded as a check (the
  // replay compares the bytes; ReplayDiverged if they differ). Call before
  // reading. CPU, contiguous tensors.
  void checked_read(const Tensor& t);

  // Work inside this scope is not recorded and may read any value: what the
  // caller does itself again after every replay (a loss read for the log, a
  // guard on the inputs). A tensor made inside it and used by a recorded
  // launch later refuses the recording (the replay would not make it).
  class Unrecorded {
   public:
    explicit Unrecorded(Recorder* r) : r_(r) {
      if (r_) {
        ++r_->depth;
        ++r_->unrecorded_;
      }
    }
    ~Unrecorded() {
      if (r_) {
        --r_->depth;
        --r_->unrecorded_;
      }
    }
    Unrecorded(const Unrecorded&) = delete;
    Unrecorded& operator=(const Unrecorded&) = delete;
   private:
    Recorder* r_;
  };

  // Takes this recorder off its thread (nothing is recorded or seen) and
  // puts it back: a recording in two parts with other work between them
  // (mixed mode, nn/compiled_module.h: a module's forward, then its
  // backward when the engine reaches it). Resuming needs no other recorder
  // active on the thread.
  void suspend();
  void resume();
  // The caller reads each output right after the part that last uses it is
  // replayed (mixed mode copies a module's output out after its forward,
  // its gradients after its backward), not after the whole program: an
  // output's bytes are then free from the end of that part, and the arena
  // holding them goes back with the part's (Program::release_finished).
  bool outputs_read_per_part = false;

  // Runs of elementwise kernels become fused chains of the program, run
  // tile by tile (docs/compile.md, "Fusion"). false: every launch replays
  // as it was recorded (RunOptions::compile_fusion).
  bool fuse_elementwise = true;

  // Ends the recording; throws NotCapturable if anything seen was refused.
  // CompareOnly: a program to compare with the next recording (difference)
  // but never replay -- it holds no memory of the step (no arena, no
  // buffers but the tensors from outside the step).
  enum class Use { Replay, CompareOnly };
  std::unique_ptr<Program> finish(Use use = Use::Replay);

  // For the hooks' templates.
  int tensor_buffer(const Tensor& t, TensorArg* arg);
  int key_slot(const PhiloxKey& k) const;
  // The slot of the registered block with b's global shape (b is it, or
  // derived from it by a shard's offset), or -1.
  int block_slot(const GlobalBlock& b) const;
  const GlobalBlock& block_value(int slot) const { return blocks_[size_t(slot)]; }
  void refuse(std::string why);
  const std::string& label() const { return label_; }
  int64_t launches() const { return int64_t(launches_.size()); }

 private:
  friend class Program;
  struct Buffer {
    // Held for tensors from before the step, inputs, outputs and host
    // constants; the step's own buffers only by weak reference, so the
    // recording frees memory when eager does (and eager's "is this buffer
    // shared?" decisions come out the same).
    std::shared_ptr<StorageImpl> storage;
    std::weak_ptr<StorageImpl> weak;
    size_t nbytes = 0;
    Device device;
    bool died = false;        // freed during the recording
    bool born = false;        // allocated during the recording
    bool input = false;
    bool output = false;
    bool used = false;        // by a recorded launch
    bool host_written = false;  // touched by the host before any launch used it
    std::string constant;     // its bytes at first use (host_written buffers)
    int64_t first = -1, last = -1;  // launch indices
    bool in_arena = false;
    bool scratch = false;     // lives only inside one fused chain: a tile-sized scratch (capture_fusion.cc)
    int shares = -1;          // takes the bytes of this (dead) buffer in the arena (capture_fusion.cc)
    // One of the step's own temporaries: made in the step, used by its
    // launches, dropped by its end or an output (the arena's, unless scratch).
    bool temporary() const { return born && used && !input && !host_written && (output || died); }
  };
  int buffer_of(const std::shared_ptr<StorageImpl>& s);
  // The launch about to be added uses `b` (its liveness for the arena).
  void used_by_next_launch(Buffer& b);
  void place_in_arenas(Program& p);
  void plan_fusion(Program& p);  // capture_fusion.cc
  void plan_device_chain(Program& p, size_t chain);  // its FusedProgram (a device with a FusedBackend)
  void storage_op(StorageImpl& s, bool release);

  std::string label_;
  Recorder* prev_ = nullptr;
  std::vector<std::unique_ptr<Launch>> launches_;
  std::vector<Buffer> buffers_;
  std::unordered_map<const StorageImpl*, int> buffer_ids_;
  std::unordered_set<const StorageImpl*> born_;
  std::vector<PhiloxKey> keys_;
  std::vector<std::function<PhiloxKey()>> producers_;
  std::vector<GlobalBlock> blocks_;
  std::vector<std::function<GlobalBlock()>> block_producers_;
  std::unordered_set<const StorageImpl*> born_unrecorded_;  // made inside an Unrecorded scope
  std::unordered_set<const StorageImpl*> checked_;           // read through checked_read
  std::string refused_;
  int unrecorded_ = 0;
  int in_flight_ = 0;
  std::string in_flight_what_;
  uint64_t serial_ = 0;
  bool suspended_ = false;
  std::vector<int64_t> boundaries_;  // launch counts at suspend(): a fused chain never crosses one
};

// Thrown by Program::replay when a checked read sees other bytes than the
// recording did: the step took another path. Nothing after the check ran;
// the caller runs the step eagerly instead.
struct ReplayDiverged : Error {
  using Error::Error;
};

// A recorded step, ready to replay.
class Program {
 public:
  // Same launches, arguments, buffer numbering and constants as `other`
  // (a capture of the next step)? Empty: yes; else what differs first.
  std::string difference(const Program& other) const;
  // Copies `value` (contiguous, as many bytes on the same device as the
  // recorded input; else an Error naming both) into input buffer i: a memcpy
  // on the CPU, a copy queued on the current stream on a GPU.
  void set_input(int i, const Tensor& value);
  // Points input buffer i at `value`'s memory instead of copying it (on the
  // CPU; on a GPU it copies, as set_input): the replay reads the caller's
  // tensor -- and writes it, if the step writes its input -- as eager
  // does, and the program keeps no copy of its own. It holds value's
  // storage until the next bind_input or set_input. For a whole step's
  // batch; not for a module's input in mixed mode, which eager code could
  // change in place before the module's backward reads it.
  void bind_input(int i, const Tensor& value);
  // A view of a recorded output's buffer (layout.buffer: Recorder::output's
  // number) with layout's shape, strides, offset and dtype. It keeps this
  // replay's values: a replay that finds an output of the last one still
  // held by a caller writes new memory instead, and what a caller holds
  // outlives the program.
  Tensor output(const TensorArg& layout);
  // The same, laid out like `like` (its metadata only).
  Tensor output(int buffer, const Tensor& like);
  // The view of a recorded output, distributed as the recorded tensor was.
  Tensor output(const OutputLayout& layout);
  // Runs every launch; keys re-made by their producers first. A replay (or
  // output) allocates the arenas it uses; the temporaries' arenas are given
  // back at the end (release_finished) and allocated again by the next one.
  void replay();
  // Runs launches [begin, end) only (a program recorded in parts); the keys
  // are re-made when begin is 0, for the whole program. Allocates the
  // arenas these launches use; gives nothing back (release_finished).
  void replay_range(int64_t begin, int64_t end);
  // Gives back the arenas no launch from `end` on uses -- a part's
  // temporaries after it ran, and, once they are read, outputs handed out
  // per part -- unless a caller holds a view of one. replay() calls it.
  void release_finished(int64_t end);
  // Gives back the memory of the input buffers the program owns (not a
  // caller's tensor bound with bind_input) until set_input fills them
  // again; a replay before that is an error. Mixed mode, after a module's
  // backward: its copies of the input and the gradient are dead until the
  // next call.
  void release_inputs();
  // Gives every arena's memory back until the next replay, as eager frees
  // a step's buffers once they are used -- when nothing outside the program
  // holds a view of it (a caller still holding an output, a gradient,
  // keeps the arena). Returns whether it gave any back.
  bool release_unheld();
  // The bytes the program's replay uses: its arenas and the buffers of its
  // own outside them (not the tensors from before the step).
  int64_t bytes() const;
  // Of those, what it holds now, between replays: the temporaries' arenas
  // give their memory back after each replay() (release_finished), and
  // release_unheld() the others. Before the first replay: what replay()
  // alone would leave held.
  int64_t held_bytes() const;
  int64_t launches() const { return int64_t(launches_.size()); }
  const std::string& label() const { return label_; }
  // "" while every tensor from before the step that the recording reads
  // (parameters, buffers, caches: held by their owners) is still held by
  // something besides this program; else which one is not. Its owner
  // replaced it (`module.shift = new_tensor`), and a replay would read the
  // old values: the caller records again. (An old tensor kept alive
  // elsewhere too is not seen: docs/compile.md, "Guards".)
  std::string replaced_outside() const;
  // Fused chains and the launches in them (docs/compile.md, "Fusion").
  int64_t fused_chains() const { return int64_t(chains_.size()); }
  int64_t fused_launches() const;

  // Device graphs (docs/compile.md, "On a GPU"): every run of at least two
  // graphable launches (Launch::graphable) on a device with a graph backend
  // is captured into a graph by the first replay that runs it whole, and
  // launched as one from then on. A launch the capture refuses runs from
  // the host and splits its run; a graph whose buffers moved (an arena
  // given back and allocated elsewhere) is captured again, and after three
  // moves its launches run from the host. While a graph exists the arenas
  // are held between replays (a graph bakes in their addresses). Profiled
  // or traced replays run every launch from the host. Off by default;
  // TESSEL_CUDA_GRAPHS=0 in the environment keeps it off whatever `on` asks.
  void use_graphs(bool on);
  struct GraphStats {
    int64_t graphs = 0;          // graphs in use
    int64_t graph_launches = 0;  // the launches inside them
    int64_t captures = 0;        // captures made, again-captures included
    int64_t refused = 0;         // launches a capture refused, and runs whose buffers kept moving (from the host)
    std::string last_refusal;    // why, the last time
  };
  GraphStats graph_stats() const;

 private:
  friend class Recorder;
  friend class ChainLaunch;
  // Launches [begin, end), all elementwise over one [rows, cols] iteration
  // space, replayed tile by tile: tile t runs every launch of the chain on
  // its rows before tile t + 1 starts, so the chain passes over memory once
  // and its intermediates stay in cache -- or, when nothing outside the
  // chain uses one, live in a tile-sized scratch only (capture_fusion.cc).
  struct Chain {
    int64_t begin = 0, end = 0;
    int64_t rows = 0, cols = 0, tile_rows = 0;
    std::vector<int64_t> prologue;      // small launches in [begin, end) run whole before the tiles (scalar fills)
    struct Scratch {
      int buffer = -1;
      int64_t offset = 0;  // its tile's bytes in a worker's scratch
    };
    std::vector<Scratch> scratch;       // buffers held by the scratch
    int64_t slot_bytes = 0;             // one worker's scratch
    int64_t slots = 0;                  // workers (fixed when the chain is planned: each has its scratch)
    // The workers' scratch: a region of the arena alive across this chain
    // only (other buffers use those bytes before and after it).
    std::shared_ptr<StorageImpl> scratch_storage;
    std::string name;                   // "fused(binary+unary)": profile rows, trace spans
    std::vector<std::vector<std::unique_ptr<Launch>>> tiles;  // per tile, per launch (made by materialize)
    // On a device with a FusedBackend the chain is one kernel instead of
    // tiles: `program`'s steps and strides are fixed when it is planned, and
    // its operands' addresses are read from the bound views at every run
    // (an arena may be given back and allocated elsewhere between replays).
    // Its intermediates are registers: no scratch, no tiles.
    bool on_device = false;
    Device device;
    FusedProgram program;
    std::vector<const TensorArg*> operand_args;  // per operand: where its address comes from (null: a register)
    std::unique_ptr<Launch> as_launch;  // the device chain as one launch of a device graph (plan_segments)
    int64_t tile_count() const { return (rows + tile_rows - 1) / tile_rows; }
    int64_t slots_now() const;  // workers for it with the thread pool as it is now
  };
  void make_tiles(Chain& c);
  void run_chain(Chain& c);
  std::string label_;
  std::vector<std::unique_ptr<Launch>> launches_;
  std::vector<Chain> chains_;  // in launch order
  // Where the step's temporaries and outputs go in a device's arena.
  struct ArenaPlan {
    Device device;
    int64_t bytes = 0;
    std::vector<std::pair<int, int64_t>> buffers;  // (buffer, offset)
    std::vector<std::pair<size_t, int64_t>> chain_scratch;  // (chain, offset): its workers' scratch
    // The launches its buffers are used by, [first_use, last_use]; an
    // output's last use is past the end (the caller reads it), unless the
    // program is replayed in parts that hand their outputs out at once
    // (Recorder::outputs_read_per_part). Its memory is allocated by the
    // first replay_range that uses it and given back by release_finished
    // once last_use is behind (a replay's temporaries are dead between
    // steps, as eager's are).
    int64_t first_use = 0, last_use = 0;
  };
  void materialize();  // allocates the arenas, binds the launches (once)
  void make_input_views();  // (once: input_memory_)
  // Input i's buffer, after checking `value` can fill it (else an Error naming both).
  const std::shared_ptr<StorageImpl>& checked_input(int i, const Tensor& value) const;
  std::vector<std::shared_ptr<StorageImpl>> storages_;  // (arena buffers: null until materialize)
  std::vector<int64_t> sizes_;         // per buffer, bytes
  std::vector<ArenaPlan> arena_plans_;
  bool replayable_ = false;
  bool materialized_ = false;
  // An arena's memory and the buffers (views) placed in it, which follow
  // it when the arena is released and allocated again.
  struct Arena {
    std::shared_ptr<StorageImpl> memory;  // (null until a replay first uses it; shared with the outputs handed out)
    std::vector<std::pair<std::shared_ptr<StorageImpl>, int64_t>> views;  // (view, offset)
    std::vector<long> own_refs;  // per view: references the program itself holds (set by materialize)
    int64_t first_use = 0, last_use = 0;  // ArenaPlan's
    bool allocated() const { return memory && !memory->released(); }
    // An output in it was handed out (Program::output) and is still held.
    bool handed_out() const { return memory && memory.use_count() > 1; }
  };
  void allocate(Arena& a);  // its memory (again), its views pointed at it
  bool held_outside(const Arena& a) const;  // a view of it held by a caller (an output handed out, kept)
  std::vector<int> arena_of_;  // per buffer: its arena, or -1
  std::vector<Arena> arenas_;  // per ArenaPlan
  std::vector<int> inputs_;          // buffer numbers, in Recorder::input order
  // Per input, once materialized (CPU inputs): its buffer is a view of this
  // memory -- the program's own, or the caller's tensor (input_bound_).
  std::vector<std::shared_ptr<StorageImpl>> input_memory_;
  std::vector<char> input_bound_;
  std::vector<long> input_own_refs_;  // per input: references to its view the program holds (materialize)
  std::vector<std::pair<int64_t, int64_t>> input_uses_;  // per input: the first and last launch using it
  std::vector<std::string> constants_;  // per buffer ("" if none)
  std::vector<char> outside_;           // per buffer: from before the step (not an input): must stay the same object
  std::vector<long> own_refs_;          // per outside buffer: references to its storage the program holds (materialize)
  std::vector<char> in_arena_;          // per buffer: a view of an arena
  std::vector<std::function<PhiloxKey()>> producers_;
  std::vector<std::function<GlobalBlock()>> block_producers_;
  PerCall values_;

  // Device graphs (use_graphs): runs of graphable launches [begin, end).
  struct Segment {
    int64_t begin = 0, end = 0;
    Device device;
    std::unique_ptr<Graph> graph;
    // Each storage the graph's launches use, with the address it had at the capture.
    std::vector<std::pair<const StorageImpl*, void*>> addresses;
    int moves = 0;        // captures made again because a buffer moved
    bool direct = false;  // its launches run from the host
  };
  void plan_segments();
  // The chain that begins at launch i (null: none).
  Chain* chain_at(int64_t i);
  // Launches [from, to) from the host, a chain as a whole.
  void run_from_host(int64_t from, int64_t to);
  // Runs segments_[k] (its graph, captured first if need be, or its
  // launches from the host). May split it (a refused launch).
  void run_segment(size_t k);
  bool addresses_unchanged(const Segment& s) const;
  bool graphs_held() const;  // a graph exists: the arenas stay
  bool use_graphs_ = false;
  bool segments_planned_ = false;
  std::vector<Segment> segments_;  // in launch order
  GraphStats graph_stats_;
};

// ---- arguments as stored in a launch -------------------------------------------------------------------
template <class T, class = void>
struct Stored {
  static_assert(std::is_copy_constructible_v<T>, "capture: a kernel argument type that cannot be copied");
  T value;
  std::vector<int> key_slots;  // for_each_key order
  struct BlockSlot {
    int slot = -1;  // -1: a constant of the launch
    Dims delta;     // its offset minus the slot's
  };
  std::vector<BlockSlot> block_slots;  // for_each_block order
  void record(Recorder& r, std::string& fp, const T& v) {
    value = v;
    // A block derived from one a producer makes (the same global shape; a
    // shard's offset added: tensor parallel heads, a sequence piece) is
    // compared by its slot and its offset from the slot's, not by value.
    T masked = v;
    for_each_block(masked, [&](GlobalBlock& b) {
      BlockSlot bs;
      bs.slot = r.block_slot(b);
      if (bs.slot >= 0) {
        bs.delta = b.offset;
        const Dims& base = r.block_value(bs.slot).offset;
        for (size_t d = 0; d < bs.delta.size(); ++d) bs.delta[d] -= base[d];
        b = GlobalBlock{Dims{-1 - int64_t(bs.slot)}, bs.delta};
      }
      block_slots.push_back(std::move(bs));
    });
    fingerprint(fp, masked);
    for_each_key(value, [&](PhiloxKey& k) {
      const int slot = r.key_slot(k);
      key_slots.push_back(slot);
      fingerprint(fp, slot);
      if (slot < 0) {  // a key no producer made: a constant of the program
        fingerprint(fp, k.seed);
        fingerprint(fp, k.stream);
      }
    });
  }
  void bind(const std::vector<std::shared_ptr<StorageImpl>>&) {}
  void refresh(const PerCall& values) {
    size_t i = 0;
    for_each_key(value, [&](PhiloxKey& k) {
      if (key_slots[i] >= 0) k = values.keys[size_t(key_slots[i])];
      ++i;
    });
    size_t j = 0;
    for_each_block(value, [&](GlobalBlock& b) {
      const BlockSlot& bs = block_slots[j++];
      if (bs.slot < 0) return;
      const GlobalBlock& now = values.blocks[size_t(bs.slot)];
      b.global_shape = now.global_shape;
      for (size_t d = 0; d < bs.delta.size(); ++d) b.offset[d] = now.offset[d] + bs.delta[d];
    });
  }
  const T& get() const { return value; }
  // A value re-made at every replay (Launch::graphable).
  bool per_call() const {
    for (int k : key_slots)
      if (k >= 0) return true;
    for (const BlockSlot& b : block_slots)
      if (b.slot >= 0) return true;
    return false;
  }
};

template <>
struct Stored<Tensor> {
  TensorArg arg;
  void record(Recorder& r, std::string& fp, const Tensor& t) {
    fingerprint(fp, r.tensor_buffer(t, &arg));
    if (arg.buffer >= 0) {
      fingerprint(fp, arg.shape);
      fingerprint(fp, arg.strides);
      fingerprint(fp, arg.offset);
      fingerprint(fp, arg.dtype);
    }
  }
  void bind(const std::vector<std::shared_ptr<StorageImpl>>& buffers);
  void refresh(const PerCall&) {}
  const Tensor& get() const { return arg.view; }
  bool per_call() const { return false; }
};
template <class S>
constexpr bool is_stored_tensor_v = std::is_same_v<S, Stored<Tensor>>;

template <>
struct Stored<const char*> {
  std::string value;
  void record(Recorder&, std::string& fp, const char* s) {
    value = s ? s : "";
    fp += value;
    fp.push_back('\0');
  }
  void bind(const std::vector<std::shared_ptr<StorageImpl>>&) {}
  void refresh(const PerCall&) {}
  const char* get() const { return value.c_str(); }
  bool per_call() const { return false; }
};

// Host output pointers (index_bounds' first bad position and value): the
// launch writes into its own slots; the replay checks them (check_host_outputs).
template <>
struct Stored<int64_t*> {
  mutable int64_t slot = 0;
  void record(Recorder&, std::string&, int64_t*) {}
  void bind(const std::vector<std::shared_ptr<StorageImpl>>&) {}
  void refresh(const PerCall&) {}
  int64_t* get() const { return &slot; }
  bool per_call() const { return false; }
};

// After a replayed launch with host output pointers: the check its op makes
// eagerly (throws with the op's message). Registered per kernel name. It
// gets what the launch wrote through its pointers, its by-value integer
// arguments and its first tensor's shape (index_bounds: the bad position and
// value; the limit; the index's shape).
struct HostOutputs {
  std::vector<int64_t> written, integers;
  Dims shape;
};
void check_host_outputs(const char* kernel, const HostOutputs& values);
bool has_host_output_check(const char* kernel);

template <class T>
constexpr bool is_tensor_arg_v = std::is_same_v<std::decay_t<T>, Tensor>;

template <class Fn, class... A>
class KernelLaunch final : public Launch {
 public:
  using Fuse = bool (*)(FusedStep*, A...);
  KernelLaunch(Fn fn, Fuse fuse) : fn_(fn), fuse_(fuse) {}
  template <class... Args>
  void record(Recorder& r, const Args&... args) {
    record_each(r, std::index_sequence_for<A...>{}, args...);
  }
  void run() override {
    std::apply([this](const auto&... s) { fn_(s.get()...); }, args_);
    if constexpr ((std::is_same_v<std::decay_t<A>, int64_t*> || ...)) {
      HostOutputs values;
      std::apply([&](const auto&... s) { (push_host_output(values, s), ...); }, args_);
      check_host_outputs(name, values);
    }
  }
  void bind(const std::vector<std::shared_ptr<StorageImpl>>& buffers) override {
    std::apply([&](auto&... s) { (s.bind(buffers), ...); }, args_);
  }
  void refresh(const PerCall& values) override {
    std::apply([&](auto&... s) { (s.refresh(values), ...); }, args_);
  }
  void tensor_args(std::vector<const TensorArg*>& out) const override {
    std::apply([&](const auto&... s) { (push_tensor(out, s), ...); }, args_);
  }
  std::unique_ptr<Launch> with_views(const std::function<Tensor(int, const TensorArg&)>& view) const override {
    auto copy = std::make_unique<KernelLaunch>(*this);
    int i = 0;
    std::apply([&](auto&... s) { (set_view(view, i, s), ...); }, copy->args_);
    return copy;
  }
  bool graphable(Device* device) const override {
    if constexpr ((std::is_same_v<std::decay_t<A>, int64_t*> || ...)) {
      return false;  // (its replay checks what it wrote on the host)
    } else {
      if (any_per_call()) return false;
      std::vector<const TensorArg*> tensors;
      tensor_args(tensors);
      bool any = false;
      for (const TensorArg* t : tensors) {
        if (t->buffer < 0) continue;
        if (t->device.is_meta() || (any && !(t->device == *device))) return false;
        *device = t->device;
        any = true;
      }
      return any;
    }
  }
  bool fused_step(FusedStep* step) const override {
    // (A value re-made at every replay would be baked into the chain's program.)
    if (!fuse_ || any_per_call()) return false;
    return std::apply([&](const auto&... s) { return fuse_(step, s.get()...); }, args_);
  }

 private:
  // An argument re-made at every replay (a key, a batch block).
  bool any_per_call() const {
    bool per_call = false;
    std::apply([&](const auto&... s) { ((per_call = per_call || s.per_call()), ...); }, args_);
    return per_call;
  }
  template <class S>
  static void push_tensor(std::vector<const TensorArg*>& out, const S& s) {
    if constexpr (is_stored_tensor_v<S>) out.push_back(&s.arg);
  }
  template <class S>
  static void set_view(const std::function<Tensor(int, const TensorArg&)>& view, int& i, S& s) {
    if constexpr (is_stored_tensor_v<S>) s.arg.view = view(i++, s.arg);
  }
  template <class S>
  static void push_host_output(HostOutputs& v, const S& s) {
    if constexpr (std::is_same_v<S, Stored<int64_t*>>) v.written.push_back(s.slot);
    if constexpr (std::is_same_v<S, Stored<int64_t>>) v.integers.push_back(s.value);
    if constexpr (std::is_same_v<S, Stored<Tensor>>)
      if (v.shape.size() == 0 && s.arg.buffer >= 0) v.shape = s.arg.shape;
  }
  template <size_t... I, class... Args>
  void record_each(Recorder& r, std::index_sequence<I...>, const Args&... args) {
    (std::get<I>(args_).record(r, fingerprint, args), ...);
  }
  Fn fn_;
  Fuse fuse_ = nullptr;
  std::tuple<Stored<std::decay_t<A>>...> args_;
};

template <class... A, class... Args>
void Recorder::kernel(const char* name, Access access, void (*fn)(A...), bool (*fuse)(FusedStep*, A...),
                      Args&&... args) {
  // A launch with no tensor is a query of static facts (does the fast
  // attention apply to these shapes?): nothing to replay.
  if constexpr (!(is_tensor_arg_v<A> || ...)) {
    return;
  } else {
    if constexpr (((std::is_pointer_v<std::decay_t<A>> && !std::is_same_v<std::decay_t<A>, const char*>) || ...)) {
      // (const char* arguments are names, kept as strings.)
      constexpr bool only_known = ((!std::is_pointer_v<std::decay_t<A>> || std::is_same_v<std::decay_t<A>, int64_t*> ||
                                    std::is_same_v<std::decay_t<A>, const char*>) && ...);
      if (!only_known || !has_host_output_check(name)) {
        refuse(std::string("kernel '") + name + "' writes host memory through a pointer argument and has no replay check");
        return;
      }
    }
    auto launch = std::make_unique<KernelLaunch<void (*)(A...), A...>>(fn, fuse);
    launch->name = name;
    launch->access = access;
    launch->fingerprint = name;
    launch->fingerprint.push_back('\0');
    launch->record(*this, args...);
    launches_.push_back(std::move(launch));
  }
}

}  // namespace tessel::capture
