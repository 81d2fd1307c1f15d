#include "nn/parallel/pipeline/schedule.h"

#include <algorithm>
#include <deque>
#include <map>

#include "runtime/error.h"

namespace tessel::parallel::pipeline {
namespace {

constexpr const char* kOp = "pipeline schedule";

// Appends vs's forward with its communication: receive the input (unless vs
// 0), compute, send the output (unless the last stage).
void emit_forward(Schedule& s, int rank, int chunk, int mb) {
  auto& l = s.ranks[size_t(rank)];
  const int vs = s.stage_of(rank, chunk);
  if (vs > 0) l.push_back({Op::RecvAct, chunk, mb});
  l.push_back({Op::Forward, chunk, mb});
  if (vs < s.num_stages() - 1) l.push_back({Op::SendAct, chunk, mb});
}

void emit_backward(Schedule& s, int rank, int chunk, int mb) {
  auto& l = s.ranks[size_t(rank)];
  const int vs = s.stage_of(rank, chunk);
  if (vs < s.num_stages() - 1) l.push_back({Op::RecvGrad, chunk, mb});
  l.push_back({Op::Backward, chunk, mb});
  if (vs > 0) l.push_back({Op::SendGrad, chunk, mb});
}

Schedule empty_schedule(const char* name, int pp, int m, int v) {
  TESSEL_CHECK(pp >= 1, kOp, "{}: pp must be >= 1, got {}", name, pp);
  TESSEL_CHECK(m >= 1, kOp, "{}: micro_batches must be >= 1, got {}", name, m);
  TESSEL_CHECK(v >= 1, kOp, "{}: virtual_stages must be >= 1, got {}", name, v);
  Schedule s;
  s.name = name;
  s.pp = pp;
  s.micro_batches = m;
  s.virtual_stages = v;
  s.ranks.resize(size_t(pp));
  return s;
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::RecvAct: return "RecvAct";
    case Op::Forward: return "Forward";
    case Op::SendAct: return "SendAct";
    case Op::RecvGrad: return "RecvGrad";
    case Op::Backward: return "Backward";
    case Op::SendGrad: return "SendGrad";
  }
  return "?";
}

std::string Schedule::str() const {
  static const char* letter[] = {"ra", "F", "sa", "rg", "B", "sg"};
  std::string out;
  for (int r = 0; r < pp; ++r) {
    out += fmt::format(FMT_STRING("rank {}:"), r);
    for (const Instr& i : ranks[size_t(r)]) out += fmt::format(FMT_STRING(" {}{}.{}"), letter[int(i.op)], i.chunk, i.mb);
    out += "\n";
  }
  return out;
}

Schedule gpipe(int pp, int m) {
  Schedule s = empty_schedule("gpipe", pp, m, 1);
  for (int r = 0; r < pp; ++r) {
    for (int mb = 0; mb < m; ++mb) emit_forward(s, r, 0, mb);
    for (int mb = 0; mb < m; ++mb) emit_backward(s, r, 0, mb);
  }
  return s;
}

Schedule one_f_one_b(int pp, int m) {
  Schedule s = empty_schedule("1f1b", pp, m, 1);
  TESSEL_CHECK(m >= pp, kOp, "1f1b needs micro_batches >= pp (with fewer, every rank only warms up and drains: that "
               "is gpipe); got micro_batches = {}, pp = {}", m, pp);
  for (int r = 0; r < pp; ++r) {
    const int warmup = std::min(pp - r - 1, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) emit_forward(s, r, 0, f);
    for (; f < m; ++f, ++b) {
      emit_forward(s, r, 0, f);
      emit_backward(s, r, 0, b);
    }
    for (; b < m; ++b) emit_backward(s, r, 0, b);
  }
  return s;
}

Schedule interleaved_1f1b(int pp, int m, int v) {
  Schedule s = empty_schedule("interleaved", pp, m, v);
  TESSEL_CHECK(v >= 2, kOp, "interleaved needs virtual_stages >= 2 chunks per rank, got {} (with 1 it is 1f1b)", v);
  TESSEL_CHECK(m >= pp && m % pp == 0, kOp,
               "interleaved needs micro_batches to be a multiple of pp (micro-batches advance through the chunks in "
               "groups of pp); got micro_batches = {}, pp = {}", m, pp);
  const int total = m * v;
  // The k-th forward (backward) of a rank: micro-batches go in groups of pp
  // through chunk 0, then the same group through chunk 1, ...
  auto mb_of = [&](int k) { return (k / (pp * v)) * pp + k % pp; };
  auto fchunk = [&](int k) { return (k / pp) % v; };
  auto bchunk = [&](int k) { return v - 1 - (k / pp) % v; };
  for (int r = 0; r < pp; ++r) {
    const int warmup = m == pp ? total : std::min((pp - r - 1) * 2 + (v - 1) * pp, total);
    int f = 0, b = 0;
    for (; f < warmup; ++f) emit_forward(s, r, fchunk(f), mb_of(f));
    for (; f < total; ++f, ++b) {
      emit_forward(s, r, fchunk(f), mb_of(f));
      emit_backward(s, r, bchunk(b), mb_of(b));
    }
    for (; b < total; ++b) emit_backward(s, r, bchunk(b), mb_of(b));
  }
  return s;
}

Schedule forward_only(int pp, int m, int v) {
  Schedule s = empty_schedule("forward", pp, m, v);
  s.forward_only = true;
  for (int r = 0; r < pp; ++r)
    for (int mb = 0; mb < m; ++mb)
      for (int c = 0; c < v; ++c) emit_forward(s, r, c, mb);
  return s;
}

std::vector<std::string> schedule_names() { return {"gpipe", "1f1b", "interleaved"}; }

Schedule make_schedule(const std::string& name, int pp, int m, int v) {
  if (name == "interleaved") return interleaved_1f1b(pp, m, v);
  TESSEL_CHECK(name == "gpipe" || name == "1f1b", kOp, "unknown pipeline schedule '{}' (one of {})", name,
               fmt::join(schedule_names(), " | "));
  TESSEL_CHECK(v == 1, kOp, "{} runs one chunk per rank; virtual_stages = {} needs the interleaved schedule", name, v);
  return name == "gpipe" ? gpipe(pp, m) : one_f_one_b(pp, m);
}

// ---- checking -------------------------------------------------------------------------

namespace {

// Per rank, per (chunk, mb): where each op sits in the rank's list (-1: absent).
struct Positions {
  std::vector<int> at;  // [chunk][mb][op]
  int m = 0;
  int& operator()(int c, int mb, Op op) { return at[size_t((c * m + mb) * 6 + int(op))]; }
};

void check_structure(const Schedule& s) {
  const int S = s.num_stages(), M = s.micro_batches, V = s.virtual_stages;
  TESSEL_CHECK(int(s.ranks.size()) == s.pp, kOp, "'{}' has {} rank lists for pp = {}", s.name, s.ranks.size(), s.pp);
  for (int r = 0; r < s.pp; ++r) {
    Positions pos{std::vector<int>(size_t(V * M * 6), -1), M};
    const auto& l = s.ranks[size_t(r)];
    for (int i = 0; i < int(l.size()); ++i) {
      const Instr& in = l[size_t(i)];
      TESSEL_CHECK(in.chunk >= 0 && in.chunk < V && in.mb >= 0 && in.mb < M, kOp,
                   "'{}' rank {} instruction {}: {} chunk {} micro-batch {} is out of range (V = {}, M = {})", s.name,
                   r, i, op_name(in.op), in.chunk, in.mb, V, M);
      int& p = pos(in.chunk, in.mb, in.op);
      TESSEL_CHECK(p < 0, kOp, "'{}' rank {}: {} of chunk {} micro-batch {} appears twice (instructions {} and {})",
                   s.name, r, op_name(in.op), in.chunk, in.mb, p, i);
      p = i;
    }
    // Each chunk's backwards in the order of its forwards: the executor posts
    // a gradient's receive when it sends the activation.
    if (!s.forward_only) {
      std::vector<std::vector<int>> fwd(static_cast<size_t>(V)), bwd(static_cast<size_t>(V));
      for (const Instr& in : l) {
        if (in.op == Op::Forward) fwd[size_t(in.chunk)].push_back(in.mb);
        if (in.op == Op::Backward) bwd[size_t(in.chunk)].push_back(in.mb);
      }
      for (int c = 0; c < V; ++c)
        TESSEL_CHECK(fwd[size_t(c)] == bwd[size_t(c)] || bwd[size_t(c)].size() != size_t(M), kOp,
                     "'{}' rank {} chunk {}: backwards run the micro-batches in the order [{}], the forwards in [{}]; "
                     "they must agree (gradient receives are posted when the activation is sent)",
                     s.name, r, c, fmt::join(bwd[size_t(c)], ", "), fmt::join(fwd[size_t(c)], ", "));
    }
    for (int c = 0; c < V; ++c) {
      const int vs = s.stage_of(r, c);
      for (int mb = 0; mb < M; ++mb) {
        auto need = [&](Op op, bool wanted) {
          const int p = pos(c, mb, op);
          TESSEL_CHECK((p >= 0) == wanted, kOp, "'{}' rank {} (stage {} of {}): {} of micro-batch {} {}", s.name, r, vs,
                       S, op_name(op), mb, wanted ? "is missing" : "must not be there");
        };
        auto before = [&](Op a, Op b) {
          const int pa = pos(c, mb, a), pb = pos(c, mb, b);
          if (pa < 0 || pb < 0) return;
          TESSEL_CHECK(pa < pb, kOp, "'{}' rank {} (stage {}): {} of micro-batch {} (instruction {}) must come before {} "
                       "(instruction {})", s.name, r, vs, op_name(a), mb, pa, op_name(b), pb);
        };
        need(Op::Forward, true);
        need(Op::RecvAct, vs > 0);
        need(Op::SendAct, vs < S - 1);
        need(Op::Backward, !s.forward_only);
        need(Op::RecvGrad, !s.forward_only && vs < S - 1);
        need(Op::SendGrad, !s.forward_only && vs > 0);
        before(Op::RecvAct, Op::Forward);
        before(Op::Forward, Op::SendAct);
        before(Op::Forward, Op::Backward);
        before(Op::RecvGrad, Op::Backward);
        before(Op::Backward, Op::SendGrad);
      }
    }
  }
}

}  // namespace

ScheduleStats check_schedule(const Schedule& s) {
  StageCosts unit;
  unit.forward_s.assign(size_t(s.num_stages()), 1.0);
  unit.backward_s.assign(size_t(s.num_stages()), 2.0);
  return simulate_schedule(s, unit);
}

ScheduleStats simulate_schedule(const Schedule& s, const StageCosts& costs) {
  check_structure(s);
  const int S = s.num_stages();
  TESSEL_CHECK(costs.forward_s.size() == size_t(S) && costs.backward_s.size() == size_t(S), kOp,
               "'{}': costs for {} forward and {} backward stages, the schedule has {} virtual stages", s.name,
               costs.forward_s.size(), costs.backward_s.size(), S);
  // Channels: (kind, receiving stage) -> FIFO of (micro-batch, time sent).
  // Activations into vs come from vs - 1, gradients into vs from vs + 1.
  struct Msg {
    int mb;
    double t;
  };
  std::vector<std::deque<Msg>> chan(size_t(2 * S));
  auto channel = [&](bool grad, int vs) -> std::deque<Msg>& { return chan[size_t((grad ? S : 0) + vs)]; };
  std::vector<size_t> pc(size_t(s.pp), 0);
  std::vector<double> clock(size_t(s.pp), 0.0), busy(size_t(s.pp), 0.0);
  std::vector<int> in_flight(size_t(s.pp), 0);
  ScheduleStats st;
  st.peak_in_flight.assign(size_t(s.pp), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.pp; ++r) {
      const auto& l = s.ranks[size_t(r)];
      while (pc[size_t(r)] < l.size()) {
        const Instr& in = l[pc[size_t(r)]];
        const int vs = s.stage_of(r, in.chunk);
        double& t = clock[size_t(r)];
        if (in.op == Op::RecvAct || in.op == Op::RecvGrad) {
          auto& q = channel(in.op == Op::RecvGrad, vs);
          if (q.empty()) break;  // blocked: try the other ranks
          TESSEL_CHECK(q.front().mb == in.mb, kOp,
                       "'{}' rank {} (stage {}): {} expects micro-batch {}, but the next message on that channel is for "
                       "micro-batch {} (sender and receiver disagree on the order)",
                       s.name, r, vs, op_name(in.op), in.mb, q.front().mb);
          t = std::max(t, q.front().t);
          q.pop_front();
        } else if (in.op == Op::SendAct) {
          channel(false, vs + 1).push_back({in.mb, t + costs.transfer_s});
        } else if (in.op == Op::SendGrad) {
          channel(true, vs - 1).push_back({in.mb, t + costs.transfer_s});
        } else {
          const double cost = in.op == Op::Forward ? costs.forward_s[size_t(vs)] : costs.backward_s[size_t(vs)];
          t += cost;
          busy[size_t(r)] += cost;
          int& f = in_flight[size_t(r)];
          f += in.op == Op::Forward ? (s.forward_only ? 0 : 1) : -1;
          st.peak_in_flight[size_t(r)] = std::max(st.peak_in_flight[size_t(r)], f);
        }
        ++pc[size_t(r)];
        progress = true;
      }
    }
  }
  std::vector<std::string> blocked;
  for (int r = 0; r < s.pp; ++r) {
    if (pc[size_t(r)] == s.ranks[size_t(r)].size()) continue;
    const Instr& in = s.ranks[size_t(r)][pc[size_t(r)]];
    blocked.push_back(fmt::format(FMT_STRING("rank {} at instruction {} ({} chunk {} micro-batch {})"), r, pc[size_t(r)],
                                  op_name(in.op), in.chunk, in.mb));
  }
  TESSEL_CHECK(blocked.empty(), kOp, "'{}' deadlocks: {}", s.name, fmt::join(blocked, "; "));
  for (int vs = 0; vs < 2 * S; ++vs)
    TESSEL_CHECK(chan[size_t(vs)].empty(), kOp, "'{}': {} message(s) for stage {} are never received", s.name,
                 chan[size_t(vs)].size(), vs % S);
  double total_busy = 0;
  for (int r = 0; r < s.pp; ++r) {
    st.makespan = std::max(st.makespan, clock[size_t(r)]);
    total_busy += busy[size_t(r)];
  }
  st.bubble = st.makespan > 0 ? 1.0 - total_busy / (double(s.pp) * st.makespan) : 0.0;
  return st;
}

}  // namespace tessel::parallel::pipeline
