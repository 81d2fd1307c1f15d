#pragma once
// Differentiable all-to-all-v of rows between the ranks of a communicator:
// the token exchange of expert parallelism (nn/parallel/expert_parallel.h).
//
//   y = all_to_all_v(x, group, send_rows, recv_rows)
//
// x [S, ...] is a plain local tensor (this rank's piece of nothing in
// particular: the caller knows what its rows mean). Rows
// [sum(send_rows[0..r)), +send_rows[r]) go to rank r of `group`; y holds
// sum(recv_rows) rows, recv_rows[s] of them from rank s, in rank order.
// Every rank of the group calls it with matching counts (rank r's
// send_rows[s] == rank s's recv_rows[r]).
//
// The backward is the reverse exchange (the counts swapped): the gradient of
// a row goes back to the rank it came from. It is a collective too, so every
// rank of the group must reach it in backward — callers make sure the output
// is consumed on every rank (an empty output still counts), and the engine's
// reverse-recording order (autograd/node.h) keeps the collectives of all ranks
// in the same order.
//
// A null group (one rank) copies x (send_rows == recv_rows == {S}).
#include <cstdint>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/tensor.h"

namespace tessel {

Tensor all_to_all_v(const Tensor& x, const comm::CommPtr& group, const std::vector<int64_t>& send_rows,
                    const std::vector<int64_t>& recv_rows);

}  // namespace tessel
