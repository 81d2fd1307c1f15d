#pragma once
// Pipeline schedules as data: one instruction list per pipeline rank.
//
// The model's blocks are cut into S = pp * V contiguous *virtual stages*
// (vs = 0 .. S-1: vs 0 also runs the embedding, vs S-1 the head and the loss).
// Rank r holds the V chunks vs = c * pp + r (c = 0 .. V-1), Megatron's
// interleaved layout; with V = 1 rank r is simply stage r. An instruction
// names its micro-batch and its *local* chunk c:
//
//   RecvAct  c mb   receive the input activation of (vs, mb) from vs - 1's rank
//   Forward  c mb   run vs on micro-batch mb (vs 0: from its inputs)
//   SendAct  c mb   send the output of (vs, mb) to vs + 1's rank
//   RecvGrad c mb   receive d loss / d output of (vs, mb) from vs + 1's rank
//   Backward c mb   backward of (vs, mb) (vs S-1: from its loss / M)
//   SendGrad c mb   send d loss / d input of (vs, mb) to vs - 1's rank
//
// A schedule is just these lists; a new schedule is a new generator, and the
// one executor (executor.h) runs any list that passes check_schedule. Sends
// never block (they complete asynchronously); a receive blocks until its
// message is there. check_schedule proves, before any work, that such an
// execution completes: every (vs, mb) is run forward once and backward once
// after it (each chunk's backwards in the order of its forwards: the executor
// posts a gradient's receive when it sends the activation), receives come
// before the compute that needs them and sends after
// the compute that produces them, messages on each channel are received in
// the order they are sent, and a simulation of all ranks ends without a
// deadlock.
#include <cstdint>
#include <string>
#include <vector>

namespace tessel::parallel::pipeline {

enum class Op : uint8_t { RecvAct, Forward, SendAct, RecvGrad, Backward, SendGrad };
const char* op_name(Op op);

struct Instr {
  Op op;
  int32_t chunk;  // local chunk c: virtual stage c * pp + rank
  int32_t mb;     // micro-batch
  friend bool operator==(const Instr& a, const Instr& b) {
    return a.op == b.op && a.chunk == b.chunk && a.mb == b.mb;
  }
};

struct Schedule {
  std::string name;
  int pp = 1;            // pipeline ranks
  int virtual_stages = 1;  // V: chunks per rank
  int micro_batches = 1;   // M
  bool forward_only = false;
  std::vector<std::vector<Instr>> ranks;  // ranks[r]: rank r's program

  int num_stages() const { return pp * virtual_stages; }
  int stage_of(int rank, int chunk) const { return chunk * pp + rank; }
  int rank_of(int stage) const { return stage % pp; }
  int chunk_of(int stage) const { return stage / pp; }
  std::string str() const;  // every rank's list, one line each ("F0.1" = Forward chunk 0 mb 1)
};

// GPipe: all forwards (mb 0..M-1), then all backwards (mb 0..M-1, the order
// in which a single device accumulates the micro-batches' gradients). V = 1.
// Any M >= 1; activations of all M micro-batches are alive at the peak.
Schedule gpipe(int pp, int micro_batches);

// 1F1B (PipeDream-flush): rank r runs min(pp - r - 1, M) warm-up forwards,
// then alternates one forward and one backward, then drains the backwards.
// At most pp - r micro-batches are in flight on rank r. Requires M >= pp (with
// fewer micro-batches it would only be GPipe with a longer name).
Schedule one_f_one_b(int pp, int micro_batches);

// Interleaved 1F1B (Megatron-LM): V >= 2 chunks per rank; forward k of a rank
// runs chunk (k / pp) % V on micro-batch (k / (pp V)) pp + k % pp, backward k
// the chunks in reverse; warm-up (pp - r - 1) * 2 + (V - 1) * pp forwards (all
// of them when M == pp). Cuts the bubble by V at the price of V times the
// point-to-point traffic. Requires M >= pp and M % pp == 0.
Schedule interleaved_1f1b(int pp, int micro_batches, int virtual_stages);

// Forward passes only (evaluation, sampling): every rank runs its chunks in
// stage order for each micro-batch.
Schedule forward_only(int pp, int micro_batches, int virtual_stages);

// By name: "gpipe" | "1f1b" | "interleaved". Throws naming the rule broken
// (micro-batches vs pp, virtual stages) and the values.
Schedule make_schedule(const std::string& name, int pp, int micro_batches, int virtual_stages);
std::vector<std::string> schedule_names();

// What check_schedule learns by simulating the schedule with unit costs
// (Forward = 1, Backward = 2, communication free), or simulate_schedule with
// the costs given.
struct ScheduleStats {
  std::vector<int> peak_in_flight;  // per rank: most (chunk, mb) forwarded and not yet backwarded
  double makespan = 0;              // simulated step time
  double bubble = 0;                // idle share of rank-time: 1 - busy / (pp * makespan)
};

// Throws tessel::Error naming the schedule, the rank, the instruction and
// what is wrong (missing/duplicate compute, a receive with no matching send,
// channel order, a deadlock with the blocked ranks' next instructions).
ScheduleStats check_schedule(const Schedule& s);

// The schedule run with costs: a Forward of virtual stage vs takes
// forward_s[vs], a Backward backward_s[vs], and a message arrives
// transfer_s after its send (sends do not block the sender). The planner's
// step time and in-flight memory of a pipeline (planner/planner.h). Checks
// the schedule as check_schedule does.
struct StageCosts {
  std::vector<double> forward_s, backward_s;  // per virtual stage
  double transfer_s = 0;                      // per activation or gradient message
};
ScheduleStats simulate_schedule(const Schedule& s, const StageCosts& costs);

}  // namespace tessel::parallel::pipeline
