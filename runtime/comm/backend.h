#pragma once
// Internals shared by the backends (not part of the public interface).
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/comm/comm.h"

namespace tessel::comm::detail {

using Clock = std::chrono::steady_clock;

// Which collective a rank is in; exchanged before the data moves so that ranks
// calling different collectives, or the same one with different sizes, fail
// with one clear error on every rank instead of corrupting memory or hanging.
enum class OpKind : int32_t {
  AllReduce, AllGather, AllGatherV, ReduceScatter, ReduceScatterV, AllToAll, AllToAllV, Broadcast, Barrier, Split
};
const char* op_kind_name(OpKind k);

// What one rank announces about its call. Plain data: the MPI backend sends it
// as bytes.
struct Meta {
  int32_t kind = 0;       // OpKind
  int32_t dtype = -1;     // DType, -1 when the op moves no tensor
  int32_t reduce_op = -1; // ReduceOp, -1 for non-reductions
  int32_t root = -1;      // broadcast
  int32_t ndim = 0;       // shape of the input (first kMaxDims dims), for error messages
  uint32_t numerics = 0;  // the caller's numerics::Settings (encode_settings): ranks must agree
  int64_t numel_in = 0;
  int64_t numel_out = 0;
  uint64_t counts_hash = 0;  // the counts vector of the _v variants
  static constexpr int kMaxDims = 6;
  int64_t dims[kMaxDims] = {};
};
static_assert(sizeof(Meta) == 96, "Meta is sent as bytes");

// "Tensor(float32, shape=[4, 5])" from a Meta (what a remote rank passed).
std::string describe_meta(const Meta& m);

Meta make_meta(OpKind kind, const Tensor* in, const Tensor* out, int reduce_op = -1, int root = -1,
               const std::vector<int64_t>* counts = nullptr);
uint64_t hash_counts(const std::vector<int64_t>& counts);

// Compares every rank's Meta with rank 0's; throws the same tessel::Error on
// every rank for the first rank that differs. describe(r) says what rank r
// passed (the local backend shows shapes; MPI shows element counts).
void check_metas(const std::string& where, const Meta* metas, int n, const std::function<std::string(int)>& describe);

// "all_reduce(sum) on 'world' (local backend, rank 1 of 4)"
std::string where(const Communicator& c, const char* op, ReduceOp rop);
std::string where(const Communicator& c, const char* op);

// Argument checks every backend shares (contiguity, device, counts).
void check_tensor(const std::string& where, const Tensor& t, const char* role, DeviceType device);
void check_counts(const std::string& where, const std::vector<int64_t>& counts, int size, const char* role);
int64_t sum_counts(const std::vector<int64_t>& counts);

// The timeout message, shared so every backend words it the same way.
std::string timeout_message(std::chrono::milliseconds t);

// A Work that is already complete.
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};
WorkPtr done_work();

// World registration for backends: the thread's world (local backend) wins
// over the process's (mpi / nccl).
void set_thread_world(CommPtr c);
void set_process_world(CommPtr c);

// Backends linked into the binary register their entry points here, so the
// core library does not depend on MPI or CUDA.
struct BackendHooks {
  void (*init_mpi)() = nullptr;
  void (*finalize_mpi)() = nullptr;
  void (*init_nccl)() = nullptr;
};
BackendHooks& hooks();

}  // namespace tessel::comm::detail
