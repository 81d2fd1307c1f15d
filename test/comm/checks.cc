#include "test/comm/checks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "runtime/error.h"

namespace tessel::testing::comm_checks {

using comm::Communicator;
using comm::ReduceOp;

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9e3779b97f4a7c15ull + b + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

namespace {

template <class T>
void fill(Tensor& t, uint64_t seed, bool with_nan) {
  std::mt19937_64 gen(seed);
  T* p = t.data<T>();
  const int64_t n = t.numel();
  std::uniform_int_distribution<int> pick(0, 99);
  if constexpr (std::is_same_v<T, bool>) {
    for (int64_t i = 0; i < n; ++i) p[i] = pick(gen) < 50;
  } else if constexpr (std::is_integral_v<T>) {
    // Large magnitudes so that sums wrap; some small repeated values for ties.
    std::uniform_int_distribution<T> big(std::numeric_limits<T>::min() / 2, std::numeric_limits<T>::max() / 2);
    for (int64_t i = 0; i < n; ++i) p[i] = pick(gen) < 20 ? T(pick(gen) % 3) : big(gen);
  } else {
    // Floats over many binades (the order of a sum matters), ±0 and small
    // integers (ties for max/min), NaN only where asked.
    const bool is16 = sizeof(T) == 2;
    std::uniform_int_distribution<int> expo(is16 ? -10 : -30, is16 ? 10 : 30);
    std::uniform_real_distribution<double> mant(1.0, 2.0);
    for (int64_t i = 0; i < n; ++i) {
      const int k = pick(gen);
      double v;
      if (with_nan && k < 3) {
        v = std::nan("");
      } else if (k < 8) {
        v = (k % 2) ? -0.0 : 0.0;
      } else if (k < 18) {
        v = double(k % 3) - 1.0;
      } else {
        v = std::ldexp(mant(gen), expo(gen)) * (pick(gen) < 50 ? -1.0 : 1.0);
      }
      p[i] = T(static_cast<compute_t<T>>(v));
    }
  }
}

// The reference tree, written out as in the contract.
template <class Acc, class Combine>
Acc ref_tree(std::vector<Acc>& v, Combine combine) {
  const int n = int(v.size());
  for (int w = 1; w < n; w *= 2)
    for (int i = 0; i + w < n; i += 2 * w) v[size_t(i)] = combine(v[size_t(i)], v[size_t(i + w)]);
  return v[0];
}

template <class Acc>
Acc ref_max(Acc a, Acc b) {  // NaN wins, ties keep the left operand
  if (a != a) return a;
  if (b != b) return b;
  return b > a ? b : a;
}
template <class Acc>
Acc ref_min(Acc a, Acc b) {
  if (a != a) return a;
  if (b != b) return b;
  return b < a ? b : a;
}
template <class Acc>
Acc ref_add(Acc a, Acc b) {
  if constexpr (std::is_integral_v<Acc> && !std::is_same_v<Acc, bool>) {
    using U = std::make_unsigned_t<Acc>;
    return Acc(U(a) + U(b));
  } else {
    return a + b;
  }
}

template <class T>
Tensor reference_typed(const std::vector<Tensor>& contrib, ReduceOp op) {
  using Acc = std::conditional_t<std::is_same_v<T, f16> || std::is_same_v<T, bf16>, float, T>;
  const int64_t numel = contrib[0].numel();
  Tensor out = raw::empty({numel}, contrib[0].dtype());
  T* o = out.data<T>();
  std::vector<Acc> v(contrib.size());
  for (int64_t k = 0; k < numel; ++k) {
    for (size_t r = 0; r < contrib.size(); ++r) v[r] = Acc(static_cast<Acc>(contrib[r].data<T>()[k]));
    Acc res;
    switch (op) {
      case ReduceOp::Sum: res = ref_tree<Acc>(v, ref_add<Acc>); break;
      case ReduceOp::Avg: res = Acc(ref_tree<Acc>(v, ref_add<Acc>) / Acc(contrib.size())); break;
      case ReduceOp::Max: res = ref_tree<Acc>(v, ref_max<Acc>); break;
      case ReduceOp::Min: res = ref_tree<Acc>(v, ref_min<Acc>); break;
    }
    o[k] = T(res);
  }
  return out;
}

std::string fmt_case(const char* op, DType dt, int64_t numel, const Communicator& c) {
  return fmt::format(FMT_STRING("{} {} numel={} on '{}' rank {}/{}"), op, dtype_name(dt), numel, c.name(), c.rank(), c.size());
}

void expect_equal(Failures& f, const std::string& what, const Tensor& got, const Tensor& expected) {
  std::string d = compare_bits(got, expected);
  if (!d.empty()) f.push_back(what + ": " + d);
}

// The concatenation of slices [off, off + len) of each tensor.
Tensor concat(const std::vector<Tensor>& parts, const std::vector<int64_t>& offs, const std::vector<int64_t>& lens,
              DType dt) {
  int64_t total = 0;
  for (int64_t l : lens) total += l;
  Tensor out = raw::empty({total}, dt);
  char* o = static_cast<char*>(out.raw_data());
  const size_t isz = itemsize(dt);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (lens[i] > 0) std::memcpy(o, static_cast<const char*>(parts[i].raw_data()) + size_t(offs[i]) * isz,
                                 size_t(lens[i]) * isz);
    o += size_t(lens[i]) * isz;
  }
  return out;
}

Tensor garbage(DType dt, int64_t numel) {
  Tensor t = raw::empty({numel}, dt);
  if (t.nbytes() > 0) std::memset(t.raw_data(), 0x5a, t.nbytes());
  return t;
}

// The same random counts on every rank (the generator is seeded alike).
std::vector<int64_t> random_counts(int n, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> d(0, 9);
  std::vector<int64_t> c(static_cast<size_t>(n));
  for (auto& x : c) {
    int k = d(gen);
    x = k < 2 ? 0 : k < 8 ? k : 40 + k * 7;
  }
  return c;
}

}  // namespace

Tensor make_input(DType dtype, int64_t numel, uint64_t seed, bool with_nan) {
  Tensor t = raw::empty({numel}, dtype);
  dispatch_all(dtype, "make_input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill<T>(t, seed, with_nan);
  });
  return t;
}

Tensor reference_reduce(const std::vector<Tensor>& contrib, ReduceOp op) {
  return dispatch_all(contrib[0].dtype(), "reference_reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return reference_typed<T>(contrib, op);
  });
}

std::string compare_bits(const Tensor& got, const Tensor& expected) {
  if (got.dtype() != expected.dtype() || got.numel() != expected.numel()) {
    return fmt::format(FMT_STRING("got {}, expected {}"), got.desc(), expected.desc());
  }
  const size_t isz = got.itemsize();
  const char* a = static_cast<const char*>(got.raw_data());
  const char* b = static_cast<const char*>(expected.raw_data());
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(a + size_t(i) * isz, b + size_t(i) * isz, isz) != 0) {
      auto x = got.to_vector<double>(), y = expected.to_vector<double>();
      return fmt::format(FMT_STRING("element {} of {} differs: got {} expected {}"), i, got.numel(), x[size_t(i)], y[size_t(i)]);
    }
  }
  return "";
}

std::vector<DType> all_dtypes() {
  return {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int32, DType::Int64, DType::Bool};
}

std::vector<ReduceOp> ops_for(DType dtype) {
  if (dtype == DType::Bool) return {ReduceOp::Max, ReduceOp::Min};
  if (is_integral(dtype)) return {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};
  return {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
}

std::vector<int64_t> test_sizes(int n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> d(2, 3000);
  std::vector<int64_t> s = {0, 1, int64_t(n) - 1, int64_t(n) + 1, 2 * int64_t(n) + 1, 37, 1031, d(gen), d(gen)};
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

void all_reduce_cases(Communicator& c, Failures& f, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  for (DType dt : all_dtypes()) {
    for (ReduceOp op : ops_for(dt)) {
      const bool nan = op == ReduceOp::Max || op == ReduceOp::Min;
      for (int64_t numel : test_sizes(n, mix(seed, 1))) {
        const uint64_t cs = mix(mix(seed, uint64_t(dt)), mix(uint64_t(op), uint64_t(numel)));
        Tensor t = make_input(dt, numel, mix(cs, uint64_t(me)), nan);
        c.all_reduce(t, op);
        std::vector<Tensor> contrib;
        for (int r = 0; r < n; ++r) contrib.push_back(make_input(dt, numel, mix(cs, uint64_t(r)), nan));
        expect_equal(f, fmt_case("all_reduce", dt, numel, c) + " op=" + reduce_op_name(op), t,
                     reference_reduce(contrib, op));
      }
    }
  }
}

void reduce_scatter_cases(Communicator& c, Failures& f, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  std::mt19937_64 gen(mix(seed, 2));
  for (DType dt : all_dtypes()) {
    for (ReduceOp op : ops_for(dt)) {
      // Even blocks.
      for (int64_t block : {int64_t(0), int64_t(1), int64_t(5), int64_t(300)}) {
        const uint64_t cs = mix(mix(seed, uint64_t(dt) * 31 + uint64_t(op)), uint64_t(block));
        Tensor in = make_input(dt, block * n, mix(cs, uint64_t(me)), true);
        Tensor out = garbage(dt, block);
        c.reduce_scatter(in, out, op);
        std::vector<Tensor> contrib;
        for (int r = 0; r < n; ++r) {
          Tensor full = make_input(dt, block * n, mix(cs, uint64_t(r)), true);
          contrib.push_back(concat({full}, {block * me}, {block}, dt));
        }
        expect_equal(f, fmt_case("reduce_scatter", dt, block * n, c) + " op=" + reduce_op_name(op), out,
                     reference_reduce(contrib, op));
      }
      // Uneven blocks, some empty.
      std::vector<int64_t> counts = random_counts(n, gen);
      int64_t total = 0, off = 0;
      for (int r = 0; r < n; ++r) {
        if (r < me) off += counts[size_t(r)];
        total += counts[size_t(r)];
      }
      const uint64_t cs = mix(mix(seed, uint64_t(dt) * 31 + uint64_t(op)), 99);
      Tensor in = make_input(dt, total, mix(cs, uint64_t(me)), true);
      Tensor out = garbage(dt, counts[size_t(me)]);
      c.reduce_scatter_v(in, out, counts, op);
      std::vector<Tensor> contrib;
      for (int r = 0; r < n; ++r) {
        contrib.push_back(concat({make_input(dt, total, mix(cs, uint64_t(r)), true)}, {off}, {counts[size_t(me)]}, dt));
      }
      expect_equal(f, fmt_case("reduce_scatter_v", dt, total, c) + fmt::format(FMT_STRING(" counts=[{}]"), fmt::join(counts, ",")),
                   out, reference_reduce(contrib, op));
    }
  }
}

void all_gather_cases(Communicator& c, Failures& f, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  std::mt19937_64 gen(mix(seed, 3));
  for (DType dt : all_dtypes()) {
    for (int64_t m : {int64_t(0), int64_t(1), int64_t(7), int64_t(513)}) {
      const uint64_t cs = mix(mix(seed, uint64_t(dt)), uint64_t(m));
      Tensor in = make_input(dt, m, mix(cs, uint64_t(me)));
      Tensor out = garbage(dt, m * n);
      c.all_gather(in, out);
      std::vector<Tensor> parts;
      for (int r = 0; r < n; ++r) parts.push_back(make_input(dt, m, mix(cs, uint64_t(r))));
      expect_equal(f, fmt_case("all_gather", dt, m, c), out,
                   concat(parts, std::vector<int64_t>(size_t(n), 0), std::vector<int64_t>(size_t(n), m), dt));
    }
    std::vector<int64_t> counts = random_counts(n, gen);
    const uint64_t cs = mix(mix(seed, uint64_t(dt)), 77);
    Tensor in = make_input(dt, counts[size_t(me)], mix(cs, uint64_t(me)));
    int64_t total = 0;
    for (int64_t x : counts) total += x;
    Tensor out = garbage(dt, total);
    c.all_gather_v(in, out, counts);
    std::vector<Tensor> parts;
    for (int r = 0; r < n; ++r) parts.push_back(make_input(dt, counts[size_t(r)], mix(cs, uint64_t(r))));
    expect_equal(f, fmt_case("all_gather_v", dt, total, c) + fmt::format(FMT_STRING(" counts=[{}]"), fmt::join(counts, ",")), out,
                 concat(parts, std::vector<int64_t>(size_t(n), 0), counts, dt));
  }
}

void all_to_all_cases(Communicator& c, Failures& f, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  std::mt19937_64 gen(mix(seed, 4));
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Int64, DType::Bool}) {
    for (int64_t block : {int64_t(0), int64_t(1), int64_t(33)}) {
      const uint64_t cs = mix(mix(seed, uint64_t(dt)), uint64_t(block));
      Tensor in = make_input(dt, block * n, mix(cs, uint64_t(me)));
      Tensor out = garbage(dt, block * n);
      c.all_to_all(in, out);
      std::vector<Tensor> parts;
      for (int r = 0; r < n; ++r) parts.push_back(make_input(dt, block * n, mix(cs, uint64_t(r))));
      expect_equal(f, fmt_case("all_to_all", dt, block * n, c), out,
                   concat(parts, std::vector<int64_t>(size_t(n), block * me), std::vector<int64_t>(size_t(n), block), dt));
    }
    // counts[s][r]: elements rank s sends to rank r.
    std::vector<std::vector<int64_t>> m(static_cast<size_t>(n));
    for (auto& row : m) row = random_counts(n, gen);
    std::vector<int64_t> send = m[size_t(me)], recv(static_cast<size_t>(n)), offs(static_cast<size_t>(n));
    std::vector<Tensor> parts;
    const uint64_t cs = mix(mix(seed, uint64_t(dt)), 55);
    for (int s = 0; s < n; ++s) {
      recv[size_t(s)] = m[size_t(s)][size_t(me)];
      int64_t total = 0, off = 0;
      for (int r = 0; r < n; ++r) {
        if (r < me) off += m[size_t(s)][size_t(r)];
        total += m[size_t(s)][size_t(r)];
      }
      offs[size_t(s)] = off;
      parts.push_back(make_input(dt, total, mix(cs, uint64_t(s))));
    }
    Tensor in = parts[size_t(me)];
    Tensor out = garbage(dt, [&] {
      int64_t t = 0;
      for (int64_t x : recv) t += x;
      return t;
    }());
    c.all_to_all_v(in, send, out, recv);
    expect_equal(f, fmt_case("all_to_all_v", dt, in.numel(), c), out, concat(parts, offs, recv, dt));
  }
}

void broadcast_cases(Communicator& c, Failures& f, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  for (DType dt : {DType::Float32, DType::Float16, DType::Int32, DType::Bool}) {
    for (int root = 0; root < n; ++root) {
      for (int64_t m : {int64_t(0), int64_t(3), int64_t(1000)}) {
        const uint64_t cs = mix(mix(seed, uint64_t(dt)), uint64_t(m) * 131 + uint64_t(root));
        Tensor t = me == root ? make_input(dt, m, cs) : garbage(dt, m);
        c.broadcast(t, root);
        expect_equal(f, fmt_case("broadcast", dt, m, c) + fmt::format(FMT_STRING(" root={}"), root), t, make_input(dt, m, cs));
      }
    }
  }
}

void p2p_cases(Communicator& c, Failures& f, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  for (int64_t m : {int64_t(0), int64_t(5), int64_t(100000)}) {
    // Async send first, then a blocking receive.
    Tensor x = make_input(DType::Float32, m, mix(seed, uint64_t(me) * 7 + uint64_t(m)));
    Tensor y = garbage(DType::Float32, m);
    auto s = c.send(x, right, 3, true);
    c.recv(y, left, 3);
    s->wait();
    expect_equal(f, fmt_case("send/recv ring", DType::Float32, m, c), y,
                 make_input(DType::Float32, m, mix(seed, uint64_t(left) * 7 + uint64_t(m))));
    // Async receive posted first, then a blocking send.
    Tensor z = garbage(DType::Float32, m);
    auto r = c.recv(z, left, 4, true);
    c.send(x, right, 4);
    r->wait();
    if (!r->is_completed()) f.push_back(fmt_case("recv", DType::Float32, m, c) + ": not completed after wait()");
    expect_equal(f, fmt_case("recv-first ring", DType::Float32, m, c), z,
                 make_input(DType::Float32, m, mix(seed, uint64_t(left) * 7 + uint64_t(m))));
  }
  // Messages with the same (source, tag) arrive in the order they were sent;
  // other tags do not overtake or block them.
  std::vector<Tensor> sent, got;
  std::vector<comm::WorkPtr> works;
  for (int k = 0; k < 4; ++k) {
    sent.push_back(make_input(DType::Int64, 3 + k, mix(seed, uint64_t(me) * 100 + uint64_t(k))));
    works.push_back(c.send(sent.back(), right, k % 2 == 0 ? 10 : 11, true));
  }
  for (int k : {1, 3, 0, 2}) {  // tag 11 first, then tag 10
    Tensor t = garbage(DType::Int64, 3 + k);
    c.recv(t, left, k % 2 == 0 ? 10 : 11);
    expect_equal(f, fmt_case("recv order", DType::Int64, 3 + k, c), t,
                 make_input(DType::Int64, 3 + k, mix(seed, uint64_t(left) * 100 + uint64_t(k))));
  }
  for (auto& w : works) w->wait();
  c.barrier();
}

void async_cases(Communicator& c, Failures& f, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  std::vector<Tensor> ts;
  std::vector<comm::WorkPtr> ws;
  const std::vector<int64_t> sizes = {17, 0, 4096, 3};
  for (size_t i = 0; i < sizes.size(); ++i) {
    ts.push_back(make_input(DType::Float32, sizes[i], mix(seed, i * 1000 + uint64_t(me))));
    ws.push_back(c.all_reduce(ts.back(), ReduceOp::Sum, true));
  }
  Tensor g_in = make_input(DType::BFloat16, 9, mix(seed, 5000 + uint64_t(me)));
  Tensor g_out = garbage(DType::BFloat16, 9 * n);
  ws.push_back(c.all_gather(g_in, g_out, true));
  // Waited for in reverse order: the backend must still issue its messages
  // in the order the operations were started, on every rank.
  for (auto it = ws.rbegin(); it != ws.rend(); ++it) {
    (*it)->wait();
    if (!(*it)->is_completed()) {
      f.push_back(fmt::format(FMT_STRING("async on '{}' rank {}: not completed after wait()"), c.name(), me));
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<Tensor> contrib;
    for (int r = 0; r < n; ++r) contrib.push_back(make_input(DType::Float32, sizes[i], mix(seed, i * 1000 + uint64_t(r))));
    expect_equal(f, fmt_case("async all_reduce", DType::Float32, sizes[i], c), ts[i],
                 reference_reduce(contrib, ReduceOp::Sum));
  }
  std::vector<Tensor> parts;
  for (int r = 0; r < n; ++r) parts.push_back(make_input(DType::BFloat16, 9, mix(seed, 5000 + uint64_t(r))));
  expect_equal(f, fmt_case("async all_gather", DType::BFloat16, 9, c), g_out,
               concat(parts, std::vector<int64_t>(size_t(n), 0), std::vector<int64_t>(size_t(n), 9), DType::BFloat16));
}

void grid_cases(Communicator& world, int rows, int cols, Failures& f, uint64_t seed) {
  const int me = world.rank();
  if (world.size() != rows * cols) {
    f.push_back(fmt::format(FMT_STRING("grid_cases: world has {} ranks, not {}x{}"), world.size(), rows, cols));
    return;
  }
  const int row = me / cols, col = me % cols;
  auto row_comm = world.split(row, col);
  // Columns ordered by descending key: ranks come out in reverse row order.
  auto col_comm = world.split(col, rows - 1 - row);
  auto none = world.split(me == 0 ? -1 : 0, me);
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) f.push_back(fmt::format(FMT_STRING("grid {}x{} world rank {}: {}"), rows, cols, me, what));
  };
  expect(row_comm && row_comm->size() == cols && row_comm->rank() == col, "row communicator size/rank");
  expect(col_comm && col_comm->size() == rows && col_comm->rank() == rows - 1 - row, "column communicator size/rank");
  expect((me == 0) == (none == nullptr), "split with a negative color returns no communicator");
  if (!row_comm || !col_comm) return;
  std::vector<int> row_ranks, col_ranks;
  for (int j = 0; j < cols; ++j) row_ranks.push_back(row * cols + j);
  for (int i = rows - 1; i >= 0; --i) col_ranks.push_back(i * cols + col);
  expect(row_comm->world_ranks() == row_ranks, fmt::format(FMT_STRING("row world_ranks [{}]"), fmt::join(row_comm->world_ranks(), ",")));
  expect(col_comm->world_ranks() == col_ranks, fmt::format(FMT_STRING("column world_ranks [{}]"), fmt::join(col_comm->world_ranks(), ",")));
  expect(row_comm->name() == fmt::format(FMT_STRING("{}/split({})"), world.name(), row), "row name " + row_comm->name());
  // Reductions inside each group (rows then columns, like a 2-D mesh).
  for (auto* sub : {row_comm.get(), col_comm.get()}) {
    const uint64_t cs = mix(seed, sub == row_comm.get() ? 1000 + uint64_t(row) : 2000 + uint64_t(col));
    Tensor t = make_input(DType::Float32, 1001, mix(cs, uint64_t(sub->rank())));
    sub->all_reduce(t, ReduceOp::Sum);
    std::vector<Tensor> contrib;
    for (int r = 0; r < sub->size(); ++r) contrib.push_back(make_input(DType::Float32, 1001, mix(cs, uint64_t(r))));
    expect_equal(f, fmt_case("grid all_reduce", DType::Float32, 1001, *sub), t, reference_reduce(contrib, ReduceOp::Sum));
  }
  all_gather_cases(*row_comm, f, mix(seed, 7));
  reduce_scatter_cases(*col_comm, f, mix(seed, 8));
  // Nested split of a sub-communicator.
  auto single = row_comm->split(row_comm->rank(), 0);
  expect(single && single->size() == 1 && single->world_ranks() == std::vector<int>{me}, "nested split");
}

}  // namespace tessel::testing::comm_checks
