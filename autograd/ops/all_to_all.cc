#include "autograd/ops/all_to_all.h"

#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "kernels/elementwise.h"
#include "runtime/cost.h"

namespace tessel {
namespace {

constexpr const char* kOp = "all_to_all_v";

int64_t total(const std::vector<int64_t>& v) {
  int64_t n = 0;
  for (int64_t c : v) n += c;
  return n;
}

// The exchange itself on plain buffers: rows of x by send_rows out, rows by
// recv_rows in.
Tensor exchange(const Tensor& x, const comm::CommPtr& group, const std::vector<int64_t>& send_rows,
                const std::vector<int64_t>& recv_rows) {
  Dims os = x.shape();
  os[0] = total(recv_rows);
  Tensor out = raw::empty(os, x.dtype(), x.device());
  if (!group) {
    kernels::copy(x.device(), x, out);
    return out;
  }
  cost::add_comm("all_to_all", int64_t(x.nbytes()));  // the planner's counts (runtime/cost.h)
  if (x.device().is_meta()) return out;              // a step simulated on Meta moves nothing
  int64_t inner = 1;  // elements per row
  for (int d = 1; d < x.dim(); ++d) inner *= x.size(d);
  std::vector<int64_t> send(send_rows.size()), recv(recv_rows.size());
  for (size_t r = 0; r < send.size(); ++r) send[r] = send_rows[r] * inner;
  for (size_t r = 0; r < recv.size(); ++r) recv[r] = recv_rows[r] * inner;
  group->all_to_all_v(detail::contiguous_raw(x), send, out, recv)->wait();
  return out;
}

struct AllToAllVOp {
  static constexpr const char* kName = "all_to_all_v";
  comm::CommPtr group;
  std::vector<int64_t> send_rows, recv_rows;

  Tensor forward(const Tensor& x) { return exchange(x, group, send_rows, recv_rows); }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    if (!grads[0].defined() || !ctx.needs(0)) return {Tensor()};
    return {exchange(grads[0], group, recv_rows, send_rows)};  // the reverse exchange
  }
};

}  // namespace

Tensor all_to_all_v(const Tensor& x, const comm::CommPtr& group, const std::vector<int64_t>& send_rows,
                    const std::vector<int64_t>& recv_rows) {
  TESSEL_CHECK(x.defined() && !x.is_distributed() && x.dim() >= 1, kOp,
               "needs a plain local tensor of rows [S, ...], got {}", x.defined() ? x.desc() : "an undefined tensor");
  const size_t n = group ? size_t(group->size()) : 1;
  TESSEL_CHECK(send_rows.size() == n && recv_rows.size() == n, kOp,
               "needs one send and one receive count per rank of '{}' ({} ranks), got {} and {}",
               group ? group->name() : "a single rank", n, send_rows.size(), recv_rows.size());
  for (size_t r = 0; r < n; ++r)
    TESSEL_CHECK(send_rows[r] >= 0 && recv_rows[r] >= 0, kOp, "row counts must be >= 0, got send {} / receive {} for rank {}",
                 send_rows[r], recv_rows[r], r);
  TESSEL_CHECK(total(send_rows) == x.size(0), kOp, "send counts {} sum to {} rows but the input {} has {}",
               fmt::join(send_rows, ","), total(send_rows), x.desc(), x.size(0));
  TESSEL_CHECK(group || send_rows == recv_rows, kOp,
               "on a single rank the receive counts must equal the send counts, got {} and {}", fmt::join(send_rows, ","),
               fmt::join(recv_rows, ","));
  return call(AllToAllVOp{group, send_rows, recv_rows}, x);
}

}  // namespace tessel
